"""Score distributions and spectra of a fact model's weights, with the linear-memory theory beside them.

Scores: per query, the target logit and the N-1 competitor logits at the answer
position, in units of that query's competitor std (as for linear memories):
``z_target = (target - mean) / std`` and ``z_max = (max competitor - mean) / std``,
with the extreme-value line ``sqrt(2 ln(N-1))`` and the exact expected maximum of
N-1 Gaussians (:mod:`mechfact.randmat`).

Spectra: singular values (normalised to unit mean square, compared with the
quarter-circle law of a random square matrix by
:func:`mechfact.randmat.spectrum_summary`) of

* ``W_in W_out`` (the MLP as if linear) and, per relation r, the effective map
  ``W_in diag(g_r) W_out`` where ``g_r`` is the fraction of relation-r queries
  on which each ReLU unit is active (the selector: each relation switches on
  its own units);
* ``W_E_ent`` (subject embeddings) and ``W_U`` (unembedding).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import torch

from .. import hooks
from .. import randmat as theory
from ..randmat import spectrum_summary
from ..results import Result, scalar_row
from .patching import run_with_interventions
from .protocols import HookedModel
from .queries import ProbeSet, check_hooks, model_device


@dataclass(frozen=True)
class ScoresResult(Result):
    accuracy: float
    n_competitors: int
    z_target_mean: float
    z_target_std: float
    z_max_competitor_mean: float
    z_max_competitor_std: float
    z_margin_min: float
    evt_sqrt_2lnn: float
    expected_max_gaussian: float
    frac_target_above_evt: float
    z_target: list[float]
    z_max: list[float]
    spectra: dict
    gate_fraction: list[list[float]]  # (R, m): share of relation-r queries on which unit u is active

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def records(self) -> list[dict]:
        """One row: the score statistics (per-query scores and spectra stay in the fields)."""
        return [scalar_row(self)]


@torch.no_grad()
def logit_scores(model, ps: ProbeSet) -> tuple[np.ndarray, np.ndarray, float]:
    logits = run_with_interventions(model, ps, []).double()
    n = logits.shape[0]
    t = ps.object_tokens
    target = logits[torch.arange(n), t]
    comp = logits.clone()
    comp[torch.arange(n), t] = float("nan")
    mean = torch.nanmean(comp, 1)
    std = torch.sqrt(torch.nanmean((comp - mean[:, None]) ** 2, 1)).clamp_min(1e-12)
    cmax = torch.nan_to_num(comp, nan=-float("inf")).max(1).values
    acc = float((logits.argmax(-1) == t).double().mean())
    return ((target - mean) / std).numpy(), ((cmax - mean) / std).numpy(), acc


@torch.no_grad()
def gate_fractions(model, ps: ProbeSet, site: str | None = None) -> np.ndarray:
    """(R, m): share of relation-r queries on which each unit's pre-activation is positive, at the answer position."""
    site = site or hooks.mlp_pre(0)
    check_hooks(model, [site])
    _, cache = model.run_with_cache(ps.tokens.to(model_device(model)), names_filter=lambda n: n == site)
    pre = cache[site][torch.arange(len(ps)), ps.answer_pos.to(cache[site].device)].cpu()
    return np.stack([(pre[ps.relations == r] > 0).double().mean(0).numpy() for r in ps.relation_ids])


def scores_and_spectra(model: HookedModel, queries, layer: int = 0) -> ScoresResult:
    """Both analyses, at the MLP of block ``layer`` (needs ``blocks[layer].mlp.W_in/W_out`` and ``W_U``).

    ``queries``: a ProbeSet or a FactWorld. For a gated MLP (pretrained Llama / Qwen / Phi) ``W_in W_out``
    is the up-projection path and the gate fractions count positive pre-activations.
    """
    from .queries import as_probe_set

    ps = as_probe_set(queries)
    zt, zm, acc = logit_scores(model, ps)
    n_comp = int(model.W_U.shape[1]) - 1
    blocks = getattr(model, "blocks", None)
    if blocks is None and hasattr(model, "bridge"):
        blocks = model.bridge.blocks
    mlp = getattr(blocks[layer], "mlp", None) if blocks is not None and layer < len(blocks) else None
    if mlp is None or getattr(mlp, "W_in", None) is None or getattr(mlp, "W_out", None) is None:
        raise ValueError(f"{type(model).__name__}: spectra need blocks[{layer}].mlp.W_in and W_out")
    W_in = mlp.W_in.detach().double().cpu().numpy()
    W_out = mlp.W_out.detach().double().cpu().numpy()
    g = gate_fractions(model, ps, hooks.mlp_pre(layer))
    fams = {"W_in W_out": [W_in @ W_out]}
    for i, r in enumerate(ps.relation_ids):
        fams[f"relation {r}"] = [W_in @ np.diag(g[i]) @ W_out]
    fams["W_E_ent"] = [getattr(model, "W_E_ent").detach().double().cpu().numpy()] if hasattr(model, "W_E_ent") else []
    fams["W_U"] = [model.W_U.detach().double().cpu().numpy()]
    fams = {k: v for k, v in fams.items() if v}
    spec = spectrum_summary(fams)
    ranks = {k: int(np.linalg.matrix_rank(v[0], tol=1e-6 * max(np.abs(v[0]).max(), 1e-300))) for k, v in fams.items()}
    spec["numerical_rank"] = ranks
    return ScoresResult(
        accuracy=acc, n_competitors=n_comp, z_target_mean=float(zt.mean()), z_target_std=float(zt.std()),
        z_max_competitor_mean=float(zm.mean()), z_max_competitor_std=float(zm.std()),
        z_margin_min=float((zt - zm).min()), evt_sqrt_2lnn=theory.evt_sqrt(n_comp),
        expected_max_gaussian=theory.expected_max_gaussian(n_comp),
        frac_target_above_evt=float((zt > theory.evt_sqrt(n_comp)).mean()),
        z_target=zt.tolist(), z_max=zm.tolist(), spectra=spec, gate_fraction=g.tolist())

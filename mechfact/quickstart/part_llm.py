"""Part 4: the embedded pretrained model's relational readout, LRE and superposition test; other installed model
families beside it (``families``)."""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

import torch

from .claims_llm import claim_llm_readout, claim_llm_skipped, claim_llm_superposition, claim_lre, claim_trace
from .layout import Part
from .layout_llm import families_section, llm_section, skipped_section, trace_section
from .sizes import Sizes, llm_layers, sizes_for

logger = logging.getLogger(__name__)


def _llm_runs(lm, out: Path, *, device, seed: int, fast: bool = False, lre: bool = True,
              sizes: Sizes | None = None) -> dict:
    """The readout, (LRE) and superposition runs of one loaded model into ``out``."""
    from ..llm.lre import LreConfig, run_llm_lre
    from ..llm.readout import quick_probe_config, run_llm_probe
    from ..llm.superposition import LlmSuperpositionConfig, run_llm_superposition

    sz = sizes or sizes_for(fast)
    small = sz.llm_fast
    n = lm.n_layers
    layers = llm_layers(n, sz)
    pcfg = quick_probe_config(layers=layers["readout"], max_samples=24 if small else 40,
                              **({"relation_names": ["animal_class", "country_continent"]} if small else {}))
    logger.info("LLM %s: layer-wise readout (%d relations, %d layers)", lm.name, len(pcfg.relation_names),
                len(layers["readout"]))
    runs = {"probe": run_llm_probe(pcfg, out / "llm_probe", device=device, seed=seed, lm=lm)}
    if lre:
        # one relation, one trial of the authors' protocol (5 Jacobians); `mechfact llm lre` runs every relation, 3 trials
        lcfg = LreConfig(relation_names=["country_capital"], max_samples=24 if small else 40,
                         max_test=6 if small else 10, n_trials=1, ranks=[64, lm.d_model])
        logger.info("LLM %s: linear relational embeddings at layer %d", lm.name, n // 2)
        runs["lre"] = run_llm_lre(lcfg, out / "llm_lre", device=device, seed=seed, lm=lm)
        from ..llm.trace import TraceConfig, run_llm_trace

        tcfg = TraceConfig(relation_names=["country_capital"], kinds=["state"], max_facts=sz.trace_facts,
                           layers=layers["trace"])
        logger.info("LLM %s: causal trace of %d known facts (%d layers)", lm.name, sz.trace_facts,
                    len(layers["trace"]))
        runs["trace"] = run_llm_trace(tcfg, out / "llm_trace", device=device, seed=seed, lm=lm)
    sl = layers["superposition"]
    logger.info("LLM %s: superposition of the countries' attributes at layers %s", lm.name, sl)
    with warnings.catch_warnings():  # sklearn: "unique classes > 50% of samples" (one-to-one attributes; expected)
        warnings.filterwarnings("ignore", message="The number of unique classes", category=UserWarning)
        # words before the subject: with the subject right after BOS one massive coordinate holds most of the
        # states' variance (SmolLM2, Qwen), and the pooled R^2 measures that coordinate
        runs["superposition"] = run_llm_superposition(LlmSuperpositionConfig(layers=sl, prompt="words"),
                                                      out / "llm_superposition", device=device, seed=seed, lm=lm)
    runs["n_layers"], runs["d_model"] = n, lm.d_model
    return runs


def _installed_families(families) -> list[str]:
    from ..llm.models.registry import ALIASES, status

    default = ALIASES["default"]
    if not families:
        return []
    installed = [r["name"] for r in status() if r["installed"] and r["name"] != default]
    if families is True:
        return installed
    missing = [f for f in families if f not in installed and f != default]
    if missing:
        logger.warning("families not installed (skipped): %s", ", ".join(missing))
    return [f for f in families if f in installed]


def llm_part(out: Path, *, device: torch.device, seed: int = 0, fast: bool = False, families=False,
             sizes: Sizes | None = None) -> Part:
    """The embedded pretrained model: readout, LRE and superposition; other installed families beside it."""
    sz = sizes or sizes_for(fast)
    try:
        from ..llm.models.loading import load_model

        logger.info("LLM: loading the embedded default model (first time: converts the GGUF once, ~20 s)")
        lm = load_model("default", device=device)
    except (ValueError, RuntimeError, OSError) as exc:  # no embedded model installed, ...
        logger.warning("LLM part skipped: %s", exc)
        return Part([skipped_section(exc)], [claim_llm_skipped(exc)])
    from ..llm import plots

    runs = _llm_runs(lm, out, device=device, seed=seed, sizes=sz)
    pr, lr, sup = runs["probe"], runs["lre"], runs["superposition"]
    figs = out / "figures"
    figs.mkdir(exist_ok=True)
    plots.plot_readout(pr, figs / "llm_readout.png", cols=2)
    plots.plot_lre_detail(lr, figs / "llm_lre.png")
    sec = llm_section(out, figs, runs)
    tsec = trace_section(out, runs["trace"])
    part = Part([sec, tsec], [claim_lre(lr, pr["model"], sec.anchor), claim_llm_readout(pr, pr["model"], sec.anchor),
                              claim_llm_superposition(sup, pr["model"], sec.anchor),
                              claim_trace(runs["trace"], tsec.anchor)])
    del lm
    fam = _installed_families(families)
    if fam:
        part = _families(out, fam, {pr["model"]: runs}, part, device=device, seed=seed, sizes=sz)
    return part


def _families(out: Path, names: list[str], done: dict, part: Part, *, device, seed: int, fast: bool = False,
              sizes: Sizes | None = None) -> Part:
    from ..llm import plots
    from ..llm.models.loading import load_model

    sz = sizes or sizes_for(fast)
    allruns = dict(done)
    for name in names:
        logger.info("LLM family %s", name)
        try:
            lm = load_model(name, device=device)
        except (ValueError, RuntimeError, OSError) as exc:
            logger.warning("family %s skipped: %s", name, exc)
            continue
        allruns[lm.name] = _llm_runs(lm, out / "families" / name, device=device, seed=seed, lre=False, sizes=sz)
        del lm
    figs = out / "figures"
    plots.plot_families({m: {"probe": r["probe"], "superposition": r["superposition"]} for m, r in allruns.items()},
                        figs / "llm_families.png")
    sec = families_section(figs, allruns)
    part.sections.append(sec)
    for m, r in allruns.items():
        if m in done:
            continue
        part.claims += [claim_llm_readout(r["probe"], m, sec.anchor),
                        claim_llm_superposition(r["superposition"], m, sec.anchor)]
    return part

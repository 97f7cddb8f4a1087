"""Which training factor makes gradient descent find the geometric solution? One factor at a time around the
default regime, in attribute-pool worlds (docs/results_pool.md, section 3).

    python -m synthetic.regime_map --out runs/regime_map --subjects 256 --relations 8 --attributes 64 \\
        --capacity runs/facts/pool_N256 [--seeds 0 1] [--variants default loss-mse ...]
    python -m synthetic.regime_map --out runs/regime_map --table        # markdown table + figure from the runs
    python -m synthetic.regime_map --out runs/regime_map --export docs/runs/pool   # into DIR/map

The centre is the ``default`` regime of :mod:`synthetic.threshold_study` (cross-entropy, entity input embeddings
N(0, I/d), no L2, Adam 3e-2 with warm-up and cosine decay, 2000 steps, stopped at 99% train accuracy, MLP width
64) at d = 3 d* (d*: the world's capacity threshold). Each variant changes ONE of: the loss, the coupled L2, the
entity-embedding init scale, the training length (no early stop), the width d, the MLP width, the pool size A (d
kept). Reference points change more than one: the full budget with L2 (``budget-l2``) and the ``geometric``
regime itself (squared error + L2 1e-3 + zero init + 3000 steps at lr 1e-2), at 3 d* and at its own shape (d =
128, MLP width 256: ``geometric-wide``). The ``geo-*`` knock-outs put one of the geometric regime's factors back
(cross-entropy, no L2, the normal init, stopping at 99%) at that shape. The coupled L2's pull on a parameter
(L2 x its value) does not depend on N, while a subject's share of the mean loss falls as 1/N: ``geometric-l2-scaled``
and ``geo-l2-scaled`` run the geometric regime at 3 d* and at its own shape with the L2 scaled by 256 / N (the
balance of N = 256, where the regime was found; equal to ``geometric`` / ``geometric-wide`` there). Every model is
probed as in the threshold study (held-out superposition R^2 with its control, per-relation readout, selector
ablation, zero-shot freeze-and-swap with its control). Runs:
``<out>/map_N<N>_R<R>_A<A>/<variant>_seed<s>/summary.json``, written when a run finishes; a rerun skips finished
runs and resumes a stopped one's training from its ``checkpoint.pt`` (saved every 500 steps).
"""

from __future__ import annotations

import argparse
import math
import statistics
from pathlib import Path
from typing import NamedTuple

from synthetic.threshold_study import (GEOMETRIC, add_executor_flags, d_star_arg, executor_of, median_cell, run_many,
                                      train_config)

BASE_FACTOR = 3.0  # the centre's width, in units of d*
L2_REF_SUBJECTS = 256  # the N at which the geometric regime (L2 1e-3) was found; ``*-l2-scaled`` variants scale to it
SEEDS = (0, 1)  # the map's seeds (--seeds)


class Variant(NamedTuple):
    what: str  # what it changes, for the table
    regime: str  # threshold_study regime it starts from
    train: dict  # TrainConfig overrides
    model: dict  # FactModelConfig overrides
    factor: float = BASE_FACTOR  # width d in units of d*
    attributes: int | str | None = None  # None: the world's A; "N": the bijection limit
    mlp_width: int | None = None  # None: the study's width (--mlp-width)
    l2_ref: int | None = None  # the regime's L2 scaled by l2_ref / N: the same pull per subject as at N = l2_ref

    def pool(self, n: int, a: int) -> int:
        """The attributes A this variant trains with in a world of ``n`` subjects and pool ``a``."""
        return n if self.attributes == "N" else (self.attributes or a)


VARIANTS: dict[str, Variant] = {
    "default": Variant("the centre: default regime at 3 d*", "default", {}, {}),
    "loss-mse": Variant("loss: squared error on the logits", "default", {"loss": "mse"}, {}),
    "l2-1e-4": Variant("coupled L2 1e-4", "default", {"l2": 1e-4}, {}),
    "l2-1e-3": Variant("coupled L2 1e-3", "default", {"l2": 1e-3}, {}),
    "init-0.1": Variant("entity init scale 0.1", "default", {}, {"entity_init_scale": 0.1}),
    "init-0": Variant("entity init zero", "default", {}, {"entity_init": "zero"}),
    "budget": Variant("3000 steps, no early stop", "default", {"steps": 3000, "target_accuracy": None}, {}),
    "d-x1": Variant("width d = d*", "default", {}, {}, factor=1.0),
    "d-x10": Variant("width d = 10 d*", "default", {}, {}, factor=10.0),
    "mlp-256": Variant("MLP width 256", "default", {}, {}, mlp_width=256),
    "A-16": Variant("pool A = 16 (d kept)", "default", {}, {}, attributes=16),
    "A-N": Variant("pool A = N, bijections (d kept)", "default", {}, {}, attributes="N"),
    "budget-l2": Variant("two factors: 3000 steps, no early stop, L2 1e-3", "default",
                         {"steps": 3000, "target_accuracy": None, "l2": 1e-3}, {}),
    "geometric": Variant("all: the geometric regime (mse, L2 1e-3, zero init, 3000 steps, lr 1e-2)", "geometric",
                         {}, {}),
    "geometric-wide": Variant("the geometric regime at its own shape (d = 128, MLP width 256)", "geometric", {}, {},
                              factor=0.0, mlp_width=256),
    # knock-outs: the geometric regime at its own shape with ONE of its factors back at the default's
    "geo-ce": Variant("geometric-wide with cross-entropy", "geometric", {"loss": "ce"}, {}, factor=0.0,
                      mlp_width=256),
    "geo-no-l2": Variant("geometric-wide without L2", "geometric", {"l2": 0.0}, {}, factor=0.0, mlp_width=256),
    "geo-init-normal": Variant("geometric-wide with the normal entity init", "geometric", {},
                               {"entity_init": "normal"}, factor=0.0, mlp_width=256),
    "geo-stop": Variant("geometric-wide stopped at 99% train accuracy", "geometric",
                        {"target_accuracy": 0.99, "eval_every": 50}, {}, factor=0.0, mlp_width=256),
    # the coupled L2 acts per parameter while the loss is a mean over the N R facts, so one subject's share of the
    # loss gradient falls as 1/N against a fixed pull: at a larger N the same L2 is relatively stronger. These scale
    # it by L2_REF_SUBJECTS / N; at N = 256 they equal ``geometric`` and ``geometric-wide``
    "geometric-l2-scaled": Variant(f"the geometric regime, L2 1e-3 x {L2_REF_SUBJECTS} / N", "geometric", {}, {},
                                   l2_ref=L2_REF_SUBJECTS),
    "geo-l2-scaled": Variant(f"geometric-wide with L2 1e-3 x {L2_REF_SUBJECTS} / N", "geometric", {}, {},
                             factor=0.0, mlp_width=256, l2_ref=L2_REF_SUBJECTS),
}
GEOMETRIC_D = 128  # the geometric regime's own width (factor 0 above: d fixed, not scaled by d*)


def world_dir(out: Path, n: int, r: int, a: int) -> Path:
    return out / f"map_N{n}_R{r}_A{a}"


def run(out: Path, n: int, r: int, a: int, d_star: int, variants: list[str], seeds: list[int], mlp_width: int = 64,
        steps: int = 2000, device: str = "cpu", executor=None) -> list[dict]:
    """Train and probe every (variant, seed) not yet finished (``executor``: see
    :func:`synthetic.threshold_study.run_many`); the summaries."""
    specs = []
    for name in variants:
        v = VARIANTS[name]
        d = int(math.ceil(v.factor * d_star)) if v.factor else GEOMETRIC_D
        a_run = v.pool(n, a)
        train = dict(v.train)
        if v.l2_ref:
            train["l2"] = train_config(v.regime, steps)[0].l2 * v.l2_ref / n
        for s in seeds:
            print(f"{name} ({v.what}): d={d}, A={a_run}, seed {s}", flush=True)
            specs.append((world_dir(out, n, r, a) / f"{name}_seed{s}",
                          dict(regime=v.regime, n=n, r=r, a=a_run, d=d, mlp_width=v.mlp_width or mlp_width, seed=s,
                               steps=steps, device=device,
                               extra={"variant": name, "factor": v.factor or None, "d_star": d_star,
                                      "world_attributes": a},
                               train_overrides=train, model_overrides=v.model)))
    return run_many(specs, executor)


def collect(out: Path) -> list[dict]:
    from synthetic.pool_runs import read_summaries

    return read_summaries(out, "map_N*_R*_A*/*/summary.json")


def export(out: Path, dest: Path) -> int:
    """Copies every finished map run's summary.json to ``dest/map`` (same layout)."""
    from synthetic.pool_runs import copy_summaries

    return copy_summaries(out, "map_N*_R*_A*/*/summary.json", dest / "map")


def _groups(rows: list[dict]) -> dict[tuple, list[dict]]:
    groups: dict[tuple, list[dict]] = {}
    for x in rows:
        groups.setdefault((x["subjects"], x["relations"], x["world_attributes"], x["variant"]), []).append(x)
    order = list(VARIANTS)
    return dict(sorted(groups.items(), key=lambda kv: (kv[0][:3], order.index(kv[0][3]) if kv[0][3] in order
                                                         else len(order))))


def table(rows: list[dict]) -> str:
    """One line per (world, variant): medians over seeds [range], and how many seeds show the mechanism."""
    lines = ["| world (N, R, A) | variant | what changes | d | MLP | A | seeds | train acc | steps | R^2 held-out | "
             "control R^2 | readout embed (min) | zero-shot | zero-shot control | chance | geometric (seeds) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for (n, r, a, name), g in _groups(rows).items():
        what = VARIANTS[name].what if name in VARIANTS else name
        geo = sum(x["r2_heldout"] >= GEOMETRIC and x["zero_shot_accuracy"] >= GEOMETRIC for x in g)
        steps = sorted({x["steps"] for x in g})
        lines.append(f"| {n}, {r}, {a} | {name} | {what} | {g[0]['d']} | {g[0]['mlp_width']} | {g[0]['attributes']} "
                     f"| {len(g)} | {median_cell([x['train_accuracy'] for x in g])} | "
                     f"{'-'.join(map(str, (steps[0], steps[-1]) if len(steps) > 1 else steps))} | "
                     + " | ".join(median_cell([x[k] for x in g]) for k in (
                         "r2_heldout", "control_r2_heldout", "readout_embed_min", "zero_shot_accuracy",
                         "zero_shot_control_accuracy"))
                     + f" | {g[0]['chance']:.3f} | {geo} of {len(g)} |")
    return "\n".join(lines)


def reading(rows: list[dict]) -> str:
    """Per world: the median change of held-out R^2 and of zero-shot accuracy of each variant against its
    reference (the centre; for the ``geo-*`` knock-outs, ``geometric-wide``), and the variants that reach the
    mechanism."""
    groups = _groups(rows)
    lines = []
    for n, r, a in sorted({k[:3] for k in groups}):
        diffs = {"default": [], "geometric-wide": []}
        for (n2, r2, a2, name), g in groups.items():
            ref = "geometric-wide" if name.startswith("geo-") else "default"
            base = groups.get((n, r, a, ref))
            if (n2, r2, a2) != (n, r, a) or name == ref or not base:
                continue
            med = {k: statistics.median(x[k] for x in g) - statistics.median(x[k] for x in base)
                   for k in ("r2_heldout", "zero_shot_accuracy")}
            diffs[ref].append(f"{name} {med['r2_heldout']:+.2f} / {med['zero_shot_accuracy']:+.2f}")
        reached = [name for (n2, r2, a2, name), g in groups.items() if (n2, r2, a2) == (n, r, a)
                   and any(x["r2_heldout"] >= GEOMETRIC and x["zero_shot_accuracy"] >= GEOMETRIC for x in g)]
        lines.append(f"- N = {n}, R = {r}, A = {a}. Change of the medians (held-out R^2 / zero-shot accuracy) "
                     "against the centre: " + ("; ".join(diffs["default"]) or "—")
                     + (". Knock-outs against geometric-wide: " + "; ".join(diffs["geometric-wide"])
                        if diffs["geometric-wide"] else "")
                     + f". Variants with a seed showing the mechanism (held-out R^2 >= {GEOMETRIC} and zero-shot "
                     f">= {GEOMETRIC}): " + (", ".join(reached) if reached else "none") + ".")
    return "\n".join(lines)


def figure(rows: list[dict], path: Path) -> None:
    """Held-out R^2 and zero-shot accuracy per variant (one dot per seed; hollow: the controls)."""
    from mechfact.plotting import save, subplots

    groups = _groups(rows)
    names = [k[3] for k in groups]
    worlds = list(dict.fromkeys(k[:3] for k in groups))
    fig, axes = subplots(1, 2, figsize=(11.0, 4.2))
    for ax, key, ctl, label in zip(axes, ("r2_heldout", "zero_shot_accuracy"),
                                   ("control_r2_heldout", "zero_shot_control_accuracy"),
                                   ("superposition R^2 (held-out subjects)", "zero-shot freeze-and-swap accuracy")):
        seen = set()
        for i, (k, g) in enumerate(groups.items()):
            w = worlds.index(k[:3])
            ax.plot([i] * len(g), [x[key] for x in g], "o", color=f"C{w % 10}",
                    label=None if w in seen else f"N={k[0]}, R={k[1]}, A={k[2]}")
            ax.plot([i] * len(g), [x[ctl] for x in g], "o", mfc="none", color="C7",
                    label="control" if i == 0 else None)
            if i and k[:3] != list(groups)[i - 1][:3]:
                ax.axvline(i - 0.5, color="k", lw=0.6)
            seen.add(w)
        ax.axhline(GEOMETRIC, color="C3", lw=0.8, ls="--")
        ax.set_xticks(range(len(names)))
        ax.set_xticklabels(names, rotation=60, ha="right", fontsize=7)
        ax.set_ylabel(label)
    axes[0].legend(fontsize=7)
    save(fig, path)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="runs/regime_map")
    ap.add_argument("--subjects", type=int, default=256)
    ap.add_argument("--relations", type=int, default=8)
    ap.add_argument("--attributes", type=int, default=64)
    ap.add_argument("--capacity", default=None, help="a `mechfact facts capacity --outputs attributes` run folder")
    ap.add_argument("--d-star", type=int, default=None, help="d* itself (instead of --capacity)")
    ap.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    ap.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    ap.add_argument("--mlp-width", type=int, default=64)
    ap.add_argument("--device", default="cpu")
    add_executor_flags(ap)
    ap.add_argument("--table", action="store_true", help="print the table of every finished run and draw the figure")
    ap.add_argument("--export", default=None, metavar="DIR", help="copy the finished runs' summaries to DIR/map")
    a = ap.parse_args(argv)
    out = Path(a.out)
    if a.export:
        print(f"{export(out, Path(a.export))} files copied to {a.export}/map")
        return
    if a.table:
        rows = collect(out)
        print(table(rows))
        if rows:
            figure(rows, out / "fig_regime_map.png")
        return
    d_star = d_star_arg(ap, a)
    with executor_of(ap, a) as ex:
        run(out, a.subjects, a.relations, a.attributes, d_star, a.variants, a.seeds, a.mlp_width, device=a.device,
            executor=ex)
    print(table(collect(out)))


if __name__ == "__main__":
    main()

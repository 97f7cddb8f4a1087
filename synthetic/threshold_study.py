"""The mechanism at the capacity threshold (paper B): near d*, where brute-force memorising no longer fits, does
gradient descent find the geometric solution?

    python -m synthetic.threshold_study --out runs/threshold --subjects 256 --relations 4 --attributes 16 \\
        --capacity runs/facts/pool_N256 [--factors 1 1.5 3] [--regimes default geometric] [--seeds 0 1]
    python -m synthetic.threshold_study --out runs/threshold --table     # markdown table + figure from the runs

For one attribute-pool world shape (N subjects, R relations into a pool of A attributes; the model predicts over
the A attributes) and each regime, factor f and seed: train a one-layer fact model at d = ceil(f d*), then run
every probe (:func:`mechfact.probe_all`: held-out superposition R^2 with its shuffled control, readout from the
embedding, selector ablation per relation, relation-token swap, zero-shot freeze-and-swap with its control).

* ``d*``: the median over seeds of ``mechfact facts capacity --outputs attributes`` thresholds for that (N, R,
  A) read from ``--capacity`` (a capacity run folder), or given with ``--d-star``;
* ``default``: the capacity search's own training (cross-entropy, default init, Adam 3e-2 warmup-cosine,
  ``--steps``, stopped at 99%): the model exactly as the threshold search judged it;
* ``geometric``: squared error on the logits + coupled L2 1e-3, subject embeddings initialised at zero, 3000
  full-batch steps (:data:`mechfact.facts.regimes.REGIMES` ``geometric``), at the same d and MLP width.

Each run is ``<out>/N<N>_R<R>_A<A>/<regime>_x<f>_seed<s>/summary.json`` (+ ``probes.json``), written atomically
when it finishes; a rerun skips finished runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import statistics
import time
from pathlib import Path

REGIMES = ("default", "geometric")
FACTORS = (1.0, 1.5, 3.0)


def d_star_from(capacity: Path, n: int, r: int, a: int) -> int:
    """Median threshold over the seeds of a ``facts capacity`` run for (N, R, A) (ValueError if none)."""
    from mechfact.runs import read_json

    res = read_json(capacity / "result.json")
    got = [t["threshold"] for t in res["thresholds"] if (t["subjects"], t["relations"], t.get("attributes")) == (n, r, a)
           and t["embeddings"] == "trainable" and t["threshold"] is not None]
    if not got:
        raise ValueError(f"--capacity {capacity}: no trainable-embedding threshold for N={n}, R={r}, A={a}")
    return int(math.ceil(statistics.median(got)))


def train_config(regime: str, steps: int):
    from mechfact.facts import REGIMES as NAMED
    from mechfact.facts import TrainConfig

    if regime == "default":
        return TrainConfig(lr=3e-2, schedule="warmup-cosine", steps=steps, target_accuracy=0.99, eval_every=50,
                           patience=0), {}
    geo = NAMED["geometric"]
    return geo.train, dict(geo.model)


def run_one(out: Path, regime: str, n: int, r: int, a: int, d: int, mlp_width: int, seed: int, steps: int,
            device: str = "cpu", extra: dict | None = None) -> dict:
    """Train one model and probe it; the summary, with ``extra`` in it (read back when the run already
    finished)."""
    import mechfact
    from mechfact.facts.model import FactModel, FactModelConfig
    from mechfact.runs import read_json, write_json_atomic

    path = out / "summary.json"
    if path.is_file():
        return read_json(path)
    world = mechfact.FactWorld(n, r, seed=seed, attributes=a)
    tcfg, model_options = train_config(regime, steps)
    model = FactModel(FactModelConfig(n, r, d=d, mlp_width=mlp_width, seed=seed, n_special=world.n_special,
                                      n_outputs=0 if a == n else a, **model_options))
    t0 = time.time()
    fit = mechfact.train(model, world, tcfg, device=device)
    model.eval()
    probes = mechfact.probe_all(model, world, seed=seed)
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / "probes.json", {"probes": probes.to_dict(), "history": fit.history})
    summ = {"regime": regime, "subjects": n, "relations": r, "attributes": a, "d": d, "mlp_width": mlp_width,
            "seed": seed, "train_accuracy": fit.accuracy, "steps": fit.steps, "stopped": fit.stopped,
            "train_config": dataclasses.asdict(tcfg), **probes.records[0], "chance": 1.0 / a,
            "wall_time_s": round(time.time() - t0, 1), **(extra or {})}
    write_json_atomic(path, summ)  # last: marks the run finished
    return summ


def run(a) -> list[dict]:
    d_star = a.d_star or d_star_from(Path(a.capacity), a.subjects, a.relations, a.attributes)
    world_dir = Path(a.out) / f"N{a.subjects}_R{a.relations}_A{a.attributes}"
    rows = []
    for regime in a.regimes:
        for f in a.factors:
            d = int(math.ceil(f * d_star))
            for s in a.seeds:
                print(f"{regime} d={d} ({f:g} d*, d* = {d_star}) seed {s}", flush=True)
                rows.append(run_one(world_dir / f"{regime}_x{f:g}_seed{s}", regime, a.subjects, a.relations,
                                    a.attributes, d, a.mlp_width, s, a.steps, a.device,
                                    extra={"factor": f, "d_star": d_star}))
    return rows


def collect(out: Path) -> list[dict]:
    from mechfact.runs import read_json

    return [read_json(summ) for summ in sorted(out.glob("N*_R*_A*/*/summary.json"))]


def table(rows: list[dict]) -> str:
    """One line per (world, regime, factor): medians over seeds, with the seeds' range."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["subjects"], r["relations"], r["attributes"], r["regime"], r.get("factor")), []).append(r)
    keys = ("train_accuracy", "r2_heldout", "control_r2_heldout", "readout_embed_min", "zero_shot_accuracy",
            "zero_shot_control_accuracy")
    lines = ["| N | R | A | regime | d (x d*) | seeds | train acc | R^2 held-out | control R^2 | readout embed (min) | "
             "zero-shot | zero-shot control | ablation on / off relation (mean) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]

    def cell(vals):
        vals = [v for v in vals if v is not None]
        if not vals:
            return "—"
        med = statistics.median(vals)
        return f"{med:.2f}" if len(vals) == 1 else f"{med:.2f} [{min(vals):.2f}, {max(vals):.2f}]"
    for (n, r, a, regime, f), g in sorted(groups.items(), key=lambda kv: tuple(str(x) for x in kv[0])):
        on = cell([statistics.mean(x["ablation_on_relation"]) for x in g])
        off = cell([statistics.mean(x["ablation_on_others"]) for x in g])
        lines.append(f"| {n} | {r} | {a} | {regime} | {g[0]['d']} ({f:g}) | {len(g)} | "
                     + " | ".join(cell([x[k] for x in g]) for k in keys) + f" | {on} / {off} |")
    return "\n".join(lines)


def figure(rows: list[dict], path: Path) -> None:
    from mechfact.plotting import save, subplots

    fig, axes = subplots(1, 2, figsize=(9.6, 3.8))
    for regime, marker in zip(REGIMES, "os"):
        pts = sorted((r["factor"], r["r2_heldout"], r["zero_shot_accuracy"]) for r in rows
                     if r["regime"] == regime and r.get("factor") is not None)
        if pts:
            axes[0].plot([p[0] for p in pts], [p[1] for p in pts], marker, label=regime)
            axes[1].plot([p[0] for p in pts], [p[2] for p in pts], marker, label=regime)
    axes[0].set_ylabel("superposition R^2 (held-out subjects)")
    axes[1].set_ylabel("zero-shot freeze-and-swap accuracy")
    for ax in axes:
        ax.set_xlabel("d / d*")
        ax.legend(fontsize=8)
    save(fig, path)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="runs/threshold")
    ap.add_argument("--subjects", type=int, default=256)
    ap.add_argument("--relations", type=int, default=4)
    ap.add_argument("--attributes", type=int, default=16)
    ap.add_argument("--capacity", default=None, help="a `mechfact facts capacity --outputs attributes` run folder")
    ap.add_argument("--d-star", type=int, default=None, help="d* itself (instead of --capacity)")
    ap.add_argument("--factors", type=float, nargs="+", default=list(FACTORS))
    ap.add_argument("--regimes", nargs="+", choices=REGIMES, default=list(REGIMES))
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--mlp-width", type=int, default=64, help="the capacity search's width (default 64)")
    ap.add_argument("--steps", type=int, default=2000, help="default regime's budget (the capacity search's)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--table", action="store_true", help="print the table of every finished run and draw the figure")
    a = ap.parse_args(argv)
    if a.table:
        rows = collect(Path(a.out))
        print(table(rows))
        if rows:
            figure(rows, Path(a.out) / "fig_threshold.png")
        return
    if (a.capacity is None) == (a.d_star is None):
        ap.error("give one of --capacity RUN_FOLDER or --d-star D")
    if any(f <= 0 for f in a.factors):
        ap.error(f"--factors {' '.join(map(str, a.factors))}: each must be > 0")
    run(a)
    print(table(collect(Path(a.out))))


if __name__ == "__main__":
    main()

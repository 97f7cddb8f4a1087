"""The mechanism at the capacity threshold (paper B): near d*, where brute-force memorising no longer fits, does
gradient descent find the geometric solution?

    python -m synthetic.threshold_study --out runs/threshold --subjects 256 --relations 4 --attributes 16 \\
        --capacity runs/facts/pool_N256 [--factors 1 1.5 3] [--regimes default geometric] [--seeds 0 1]
    ... --executor ray [--workers K] [--ray-address HOST:6379]   # each (regime, factor, seed) run a Ray task
    python -m synthetic.threshold_study --out runs/threshold --table     # markdown table + figure from the runs

The page and its export: :mod:`synthetic.results_pool`.

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
when it finishes; while a model trains its state is saved to ``checkpoint.pt`` beside them every 500 steps; a rerun
skips finished runs and resumes a stopped one's training from its checkpoint.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import statistics
import time
from pathlib import Path

REGIMES = ("default", "geometric")
NEW_WORLD_SEED = 1000  # + the model's seed: the freeze-and-swap world (never a trained world's seed)
FACTORS = (1.0, 1.5, 3.0)


def d_star_from(capacity: Path, n: int, r: int, a: int) -> int:
    """Median threshold over the seeds of a ``facts capacity`` run for (N, R, A) (ValueError if none)."""
    from mechfact.runs import read_json

    res = read_json(capacity / "result.json")
    got = [t["threshold"] for t in res["thresholds"] if (t["subjects"], t["relations"], t.get("attributes")) == (n, r, a)
           and t["embeddings"] == "trainable" and t.get("searched", "d") == "d" and t["threshold"] is not None]
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
            device: str = "cpu", extra: dict | None = None, train_overrides: dict | None = None,
            model_overrides: dict | None = None) -> dict:
    """Train one model and probe it; the summary, with ``extra`` in it (read back when the run already
    finished). ``train_overrides`` / ``model_overrides``: TrainConfig / FactModelConfig fields that replace the
    regime's."""
    from mechfact.runs import read_json

    path = out / "summary.json"
    if path.is_file():
        return read_json(path)
    summary = write_one(out, compute_one(regime, n, r, a, d, mlp_width, seed, steps, device, extra, train_overrides,
                                         model_overrides, checkpoint=str(out / CHECKPOINT)))
    (out / CHECKPOINT).unlink(missing_ok=True)
    return summary


CHECKPOINT = "checkpoint.pt"  # a run's training state while it trains (deleted once summary.json is written)


def compute_one(regime: str, n: int, r: int, a: int, d: int, mlp_width: int, seed: int, steps: int,
                device: str = "cpu", extra: dict | None = None, train_overrides: dict | None = None,
                model_overrides: dict | None = None, checkpoint: str | None = None) -> dict:
    """:func:`run_one`'s work, writing nothing but the training ``checkpoint`` (when given: saved every 500 steps
    and resumed from, so a stopped run keeps its training; the driver deletes it): ``{"summary": ...,
    "probes": ...}`` (what a Ray task returns to the driver, which writes it with :func:`write_one`).
    ``wall_time_s`` counts earlier processes' training up to their last checkpoint."""
    import mechfact
    from mechfact.facts.model import FactModel, FactModelConfig
    from mechfact.facts.train import train_resumable
    from mechfact.runs import config_sha256
    from mechfact.targets import SwapConfig

    world = mechfact.FactWorld(n, r, seed=seed, attributes=a)
    tcfg, model_options = train_config(regime, steps)
    tcfg = dataclasses.replace(tcfg, **(train_overrides or {}))
    model_options = {**model_options, **(model_overrides or {})}
    model = FactModel(FactModelConfig(n, r, d=d, mlp_width=mlp_width, seed=seed, n_special=world.n_special,
                                      n_outputs=0 if a == n else a, **model_options))
    t0 = time.time()
    what = dict(regime=regime, n=n, r=r, a=a, d=d, mlp_width=mlp_width, seed=seed, steps=steps,
                train=dataclasses.asdict(tcfg), model=model_options)  # the checkpoint's tag: what it trains
    fit, before = train_resumable(model, world, tcfg, Path(checkpoint) if checkpoint else None, device=device,
                                  tag=config_sha256(what))
    model.eval()
    # the new facts of freeze-and-swap: a world seed no model of the study trains on
    probes = mechfact.probe_all(model, world, seed=seed, swap=SwapConfig(new_seed=NEW_WORLD_SEED + seed))
    summ = {"regime": regime, "subjects": n, "relations": r, "attributes": a, "d": d, "mlp_width": mlp_width,
            "seed": seed, "swap_new_seed": NEW_WORLD_SEED + seed, "train_accuracy": fit.accuracy, "steps": fit.steps,
            "stopped": fit.stopped,
            "train_config": dataclasses.asdict(tcfg), "model_options": model_options, **probes.records[0],
            "chance": 1.0 / a,
            "wall_time_s": round(before + time.time() - t0, 1), "device": str(device), **(extra or {})}
    return {"summary": summ, "probes": {"probes": probes.to_dict(), "history": fit.history}}


def write_one(out: Path, res: dict) -> dict:
    """Writes a :func:`compute_one` result into ``out``: probes.json, then summary.json (last: it marks the run
    finished); returns the summary."""
    from mechfact.runs import write_json_atomic

    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / "probes.json", res["probes"])
    write_json_atomic(out / "summary.json", res["summary"])
    return res["summary"]


def run_many(specs: list[tuple[Path, dict]], executor=None) -> list[dict]:
    """:func:`run_one` for every ``(folder, keyword arguments)``: finished runs are read back, the others run as
    jobs of ``executor`` (default local: one after another in this process; Ray: one task each, on this
    machine's cores or a cluster's) and are written by this process as each finishes, so a stopped study loses
    only the runs in flight. Summaries in the order of ``specs``."""
    import functools

    from mechfact.executor import Job, LocalExecutor, on_this_machine
    from mechfact.runs import read_json

    done = {out: read_json(out / "summary.json") for out, _ in specs if (out / "summary.json").is_file()}
    local = on_this_machine(executor)  # a cluster's workers may not see these folders: no checkpoints there
    jobs = [Job(key=str(out), fn=functools.partial(compute_one, **kw, checkpoint=str(out / CHECKPOINT) if local
                                                   else None), cost=kw["n"] * kw["r"] * kw["d"] / 1e4)
            for out, kw in specs if out not in done]

    def on_result(job, res):
        done[Path(job.key)] = write_one(Path(job.key), res)
        (Path(job.key) / CHECKPOINT).unlink(missing_ok=True)
        s = res["summary"]
        print(f"finished {Path(job.key).name}: train accuracy {s['train_accuracy']:.3f}, R^2 {s['r2_heldout']:.2f}, "
              f"zero-shot {s['zero_shot_accuracy']:.2f} ({s['wall_time_s']:.0f} s)", flush=True)

    (executor or LocalExecutor(progress=False, desc="runs")).map(jobs, on_result)
    return [done[out] for out, _ in specs]


def executor_of(ap: argparse.ArgumentParser, a):
    """The executor the --executor / --workers / --ray-address flags ask for (argparse's error on bad ones)."""
    from mechfact.executor import make_executor

    try:
        return make_executor(a.executor, workers=a.workers, address=a.ray_address, device=a.device,
                             progress=False, desc="runs", gpus_per_task=a.gpus_per_task)
    except ValueError as e:
        ap.error(str(e))


def add_executor_flags(ap: argparse.ArgumentParser) -> None:
    """--executor, --workers, --ray-address, --gpus-per-task: the CLI's own flags (each model a job)."""
    from mechfact.commands._args import executor_args

    executor_args(ap)


def d_star_arg(ap: argparse.ArgumentParser, a) -> int:
    """d* from the command line: ``--d-star`` itself, or the median threshold of the ``--capacity`` run (exactly
    one of them; argparse's error otherwise)."""
    if (a.capacity is None) == (a.d_star is None):
        ap.error("give one of --capacity RUN_FOLDER or --d-star D")
    if a.d_star is not None and a.d_star < 1:
        ap.error(f"--d-star {a.d_star}: must be >= 1")
    return a.d_star or d_star_from(Path(a.capacity), a.subjects, a.relations, a.attributes)


def run(a, d_star: int, executor=None) -> list[dict]:
    world_dir = Path(a.out) / f"N{a.subjects}_R{a.relations}_A{a.attributes}"
    specs = []
    for regime in a.regimes:
        for f in a.factors:
            d = int(math.ceil(f * d_star))
            for s in a.seeds:
                print(f"{regime} d={d} ({f:g} d*, d* = {d_star}) seed {s}", flush=True)
                specs.append((world_dir / f"{regime}_x{f:g}_seed{s}",
                              dict(regime=regime, n=a.subjects, r=a.relations, a=a.attributes, d=d,
                                   mlp_width=a.mlp_width, seed=s, steps=a.steps, device=a.device,
                                   extra={"factor": f, "d_star": d_star})))
    return run_many(specs, executor)


def collect(out: Path) -> list[dict]:
    from synthetic.pool_runs import read_summaries

    return read_summaries(out, "N*_R*_A*/*/summary.json")


def median_cell(vals) -> str:
    """``median [min, max]`` of the non-null values (the median alone for one value; a dash for none)."""
    vals = [v for v in vals if v is not None]
    if not vals:
        return "—"
    med = statistics.median(vals)
    return f"{med:.2f}" if len(vals) == 1 else f"{med:.2f} [{min(vals):.2f}, {max(vals):.2f}]"


def table(rows: list[dict]) -> str:
    """One line per (world, regime, factor): medians over seeds, with the seeds' range."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["subjects"], r["relations"], r["attributes"], r["regime"], r.get("factor")), []).append(r)
    keys = ("train_accuracy", "r2_heldout", "control_r2_heldout", "readout_embed_min", "zero_shot_accuracy",
            "zero_shot_control_accuracy")
    lines = ["| N | R | A | regime | d (x d*) | seeds | train acc | R^2 held-out | control R^2 | readout embed (min) | "
             "zero-shot | zero-shot control | accuracy after ablating a relation's most selective units: "
             "that relation / the others / random units, that relation (mean over relations) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]

    for (n, r, a, regime, f), g in sorted(groups.items(),
                                          key=lambda kv: (kv[0][:3], REGIMES.index(kv[0][3]), kv[0][4] or 0)):
        # a relation with no selective unit has no ablation (null): the means are over the relations that have one
        with_units = [[i for i, v in enumerate(x["ablation_on_others"]) if v is not None] for x in g]
        on, off, rnd = (median_cell([statistics.mean(x[k][i] for i in idx) if idx else None
                              for x, idx in zip(g, with_units)])
                        for k in ("ablation_on_relation", "ablation_on_others", "ablation_random_on_relation"))
        lines.append(f"| {n} | {r} | {a} | {regime} | {g[0]['d']} ({f:g}) | {len(g)} | "
                     + " | ".join(median_cell([x[k] for x in g]) for k in keys) + f" | {on} / {off} / {rnd} |")
    return "\n".join(lines)


def figure(rows: list[dict], path: Path) -> None:
    """Held-out superposition R^2 and zero-shot accuracy against d / d*: one line per (world, regime), the
    median over seeds."""
    from mechfact.plotting import save, subplots

    fig, axes = subplots(1, 2, figsize=(10.4, 4.0))
    worlds = sorted({(r["subjects"], r["relations"], r["attributes"]) for r in rows})
    colors = {w: f"C{i % 10}" for i, w in enumerate(worlds)}
    for w in worlds:
        for regime, style in zip(REGIMES, ("o-", "s--")):
            g: dict[float, list] = {}
            for r in rows:
                if (r["subjects"], r["relations"], r["attributes"]) == w and r["regime"] == regime \
                        and r.get("factor") is not None:
                    g.setdefault(r["factor"], []).append(r)
            if not g:
                continue
            fs = sorted(g)
            for ax, key in zip(axes, ("r2_heldout", "zero_shot_accuracy")):
                ax.plot(fs, [statistics.median(x[key] for x in g[f]) for f in fs], style, color=colors[w],
                        label=f"{regime}, N={w[0]} R={w[1]} A={w[2]}")
    axes[0].set_ylabel("superposition R^2 (held-out subjects)")
    axes[1].set_ylabel("zero-shot freeze-and-swap accuracy")
    for ax in axes:
        ax.set_xlabel("d / d*")
    axes[1].legend(fontsize=7, loc="center left", bbox_to_anchor=(1.02, 0.5))
    save(fig, path)


# ---- the page: d* in pool worlds and the mechanism at the threshold, from run files alone ----

GEOMETRIC = 0.9  # held-out R^2 and zero-shot accuracy of the geometric mechanism (results_probes.md, section 4)


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
    add_executor_flags(ap)
    ap.add_argument("--table", action="store_true", help="print the table of every finished run and draw the figure")
    a = ap.parse_args(argv)
    if a.table:
        rows = collect(Path(a.out))
        print(table(rows))
        if rows:
            figure(rows, Path(a.out) / "fig_threshold.png")
        return
    d_star = d_star_arg(ap, a)
    if any(f <= 0 for f in a.factors):
        ap.error(f"--factors {' '.join(map(str, a.factors))}: each must be > 0")
    with executor_of(ap, a) as ex:
        run(a, d_star, ex)
    print(table(collect(Path(a.out))))


if __name__ == "__main__":
    main()

"""The page ``docs/results_pool.md``'s cost lines: settings searched twice, what ran on a GPU, and the CPU-hours
of the parts and regime maps not run here, estimated from the timed runs."""

from __future__ import annotations

import functools
import math
import statistics
from pathlib import Path

from synthetic.pool_runs import _capacity_part, _pool_parts, on_cpu, pool_thresholds

MAP_SCALE = (4096, 8, 64)  # the regime map the paper's scale asks for


def _twice_line(src: Path) -> list[str]:
    """The d* settings searched in two parts (a pool's own part and the part of every pool, on their own grids and
    perhaps devices): how many agree, and the ones that do not."""
    seen: dict[tuple, list] = {}
    for name, thresholds in _pool_parts(src):
        for t in thresholds:
            if t.get("searched", "d") == "d" and t["embeddings"] == "trainable":
                key = (t["subjects"], t["relations"], t["attributes"], t["seed"])
                seen.setdefault(key, []).append((name, t["threshold"], t.get("device", "cpu")))
    twice = {k: v for k, v in seen.items() if len(v) > 1}
    if not twice:
        return []
    same = [k for k, v in twice.items() if len({x[1] for x in v}) == 1]
    diff = [f"N = {k[0]}, R = {k[1]}, A = {k[2]}, seed {k[3]}: " + " vs ".join(
        f"{x[1]} ({x[0]}, {x[2]})" for x in v) for k, v in twice.items() if k not in same]
    return [f"Settings searched in two parts (their own grids, perhaps devices): {len(same)} of {len(twice)} give the "
            "same d*" + (f"; differ: {'; '.join(diff)} (the table takes the pool's own part)" if diff else "") + ".",
            ""]


def _device_line(src: Path, recs: list[dict], summaries: list[dict]) -> list[str]:
    """Which records of the page (d* thresholds ``recs``, m* thresholds, model ``summaries``) were made on a GPU
    (their ``device``); none: nothing."""
    gpu_t = [t for t in recs + pool_thresholds(src, "mlp-width", "_width")[0] if not on_cpu(t)]
    rows = [x for x in summaries if not on_cpu(x)]
    if not gpu_t and not rows:
        return []
    devs = sorted({x["device"] for x in gpu_t + rows})
    what = ([f"{len(gpu_t)} of the thresholds in section 1 (searched there, the rest on one CPU "
             "thread)"] if gpu_t else []) + \
        ([f"{len(rows)} of the trained models in sections 2 and 3 ("
          + ", ".join(f"N = {x['subjects']}, R = {x['relations']}, A = {x['world_attributes']} "
                      f"{x.get('variant') or x['regime'] + ' x' + format(x['factor'], 'g')} seed {x['seed']}"
                      if "world_attributes" in x else
                      f"N = {x['subjects']}, R = {x['relations']}, A = {x['attributes']} {x['regime']} "
                      f"x{x['factor']:g} seed {x['seed']}" for x in rows) + ")"] if rows else [])
    return [f"Made on a GPU ({', '.join(devs)}; each record's `device`): " + "; ".join(what) + ". Same code and "
            "seeds; floating-point sums differ between devices, so such a model is another draw of the same "
            "training, not the CPU's numbers. The CPU-hour estimates below use CPU-timed runs alone.", ""]


def _map_estimate(rows: list[dict]) -> str:
    """The regime map at N = 4096, R = 8, A = 64: what is left of it and its cost from the measured models (each
    missing model at its variant's finished seed's time, else at a finished variant's of the same regime, width
    and MLP width, else the median model's); before any model there, the largest measured map's CPU time scaled
    by the facts (a lower bound)."""
    from synthetic import regime_map

    if not rows:
        return ""
    n, r, a = MAP_SCALE
    cmd = (f"`python -m synthetic.regime_map --out runs/regime_map --subjects {n} --relations {r} --attributes {a} "
           f"--capacity runs/facts/{_capacity_part(n, a)} --executor ray --ray-address HEAD:6379` (each variant and "
           "seed a task), or `--device cuda`")
    big = [x for x in rows if (x["subjects"], x["relations"], x["world_attributes"]) == MAP_SCALE]
    if big:
        done = {(x["variant"], x["seed"]) for x in big}
        big = [x for x in big if on_cpu(x)] or big  # CPU hours from CPU-timed models
        missing = [(v, s) for v in regime_map.VARIANTS for s in regime_map.SEEDS if (v, s) not in done]
        if not missing:
            return ""
        median = statistics.median(x["wall_time_s"] for x in big)
        own = {x["variant"]: x["wall_time_s"] for x in big}

        def shape(v: str) -> tuple:
            var = regime_map.VARIANTS[v]
            return var.regime, var.factor, var.mlp_width, var.pool(n, a) > a

        def cost(v: str) -> float:  # its own time, else a measured variant of the same regime and shape, else median
            same = [t for u, t in own.items() if u in regime_map.VARIANTS and shape(u) == shape(v)]
            return own.get(v, statistics.median(same) if same else median)

        larger = sorted({v for v, _ in missing if regime_map.VARIANTS[v].pool(n, a) > a and not any(
            u in regime_map.VARIANTS and shape(u) == shape(v) for u in own)})
        hours = sum(cost(v) for v, _ in missing) / 3600
        return (f"\n- The regime map at N = {n}, R = {r}, A = {a}: {len(done)} of "
                f"{len(regime_map.VARIANTS) * len(regime_map.SEEDS)} models in section 3; the other {len(missing)} ("
                + ", ".join(f"{v} seed {s}" for v, s in missing)
                + f") about {hours:.1f} CPU hours on one thread (each at its variant's measured time, else at that of "
                "a measured variant of the same regime and shape, else the median model's, "
                f"{median / 60:.0f} min"
                + (f"; a lower bound for {', '.join(larger)}, whose pool is larger than any measured model's"
                   if larger else "") + f"): {cmd}, after `cp -r docs/runs/pool/map runs/regime_map` (a rerun skips the "
                "finished models in its `--out` and resumes a stopped one's training from its checkpoint).")
    world = max({(x["subjects"], x["relations"], x["world_attributes"]) for x in rows}, key=lambda w: (w[1], w))
    total = sum(x["wall_time_s"] for x in rows if (x["subjects"], x["relations"], x["world_attributes"]) == world)
    hours = total * n / world[0] / 3600
    return (f"\n- The regime map at N = {n}, R = {r} (the same variants and seeds): about {hours:.1f} CPU hours on "
            f"one thread (the N = {world[0]}, R = {world[1]}, A = {world[2]} map took {total / 60:.0f} min, scaled "
            "by the number of facts; d* and the steps to 99% grow with N, and the map ran before training ran the "
            "block at the supervised position alone and the per-token part on tables, 2-3x faster in pool worlds): "
            f"{cmd}.")


def _estimate(src: Path) -> str:
    """The pool parts not in ``src/capacity``, each with a cost estimate scaled from the finished part of its kind
    (same name but N) with the largest N by N (the parts share their R and A grids) and the seeds: a lower bound
    (d*, fixed costs and early stopping also move it)."""
    import re

    from mechfact.runs import read_json
    from synthetic.facts_study import PARTS, part_command

    def kind(p: str) -> tuple[str, int]:  # (the budget suffix, N): pool_N4096_A64_s2_8k -> ("_8k", 4096)
        m = re.fullmatch(r"pool_N(\d+)(?:_A(?:\d+|N))?(?:_R\d+(?:-\d+)*)?(?:_s\d+)?(.*)", p)
        return m.group(2), int(m.group(1))

    def size(q: str) -> float:  # what a part's cost scales with besides N: its relations, pools and seeds
        c = part_command(q)
        return sum(c.relations) * len(c.attributes or [None]) * c.seeds

    pools = [p for p in PARTS if p.startswith("pool_N")]
    done = {p: read_json(src / "capacity" / p / "meta.json") for p in pools
            if (src / "capacity" / p / "meta.json").is_file()}
    lines = []
    for p in pools:
        cmd = (f"`python -m synthetic.facts_study --out runs/facts --part {p} --executor ray "
               "--ray-address HEAD:6379`")
        if p in done:
            continue
        # an A = N part from an A = N part, scaled by N^2 (its A-way output layer grows with N too: pool_N4096_AN
        # scaled from pool_N4096_A64 by N alone was a 1.5 h estimate for about 12 h of work)
        bij = "_AN" in p
        same = [q for q in done if kind(q)[0] == kind(p)[0] and on_cpu(done[q]) and ("_AN" in q) == bij]
        cost = ""
        if p.endswith("_width"):  # from the finished m* parts of its own budget, else from the 2000-step ones
            widths = [q for q in done if q.endswith("_width")]
            base = [q for q in widths if kind(q)[0] == "_width"]  # the 2000-step m* parts
            cost = _width_cost(p, src, [q for q in widths if kind(q)[0] == kind(p)[0]] or base,
                               [q for q in base if kind(p)[0] != "_width"])
        elif p.endswith("_asc"):
            cost = _ascending_cost(p, src, done)
        elif kind(p)[0] in ("_8k", "_32k", "_128k"):
            cost = _budget_cost(p, src, done)
        elif same:
            base = max(same, key=lambda q: (kind(q)[1], size(q)))
            n0, n1 = kind(base)[1], kind(p)[1]
            hours = _cpu_s(done[base]) * (n1 / n0) ** (2 if bij else 1) * (size(p) / size(base)) / 3600
            spent = f"{hours:.1f} CPU hours" if hours >= 0.1 else f"{hours * 60:.0f} CPU minutes"
            cost = (f"about {spent} on one thread in all ({base} took "
                    f"{_cpu_s(done[base]) / 60:.0f} CPU-min, scaled by {'N^2 (A = N)' if bij else 'N'}, the "
                    "relations' sum, the pools and the seeds; more where d* grows faster than ln N)")
        # a part of one pool at the same N (pool_N4096_A64 beside pool_N4096) holds some of this part's settings
        alone = [f"A = {q.rsplit('_A', 1)[1]} is {q} ({'finished' if q in done else 'unfinished'})" for q in pools
                 if re.fullmatch(rf"{re.escape(p)}_A\d+", q)]
        if alone:
            cost += ("; " if cost else "") + f"of its settings, {' and '.join(alone)}"
        if (src / "capacity" / p / "result.json").is_file():
            got = read_json(src / "capacity" / p / "result.json")["thresholds"]
            if _covered(p, got, [q for q in done if re.fullmatch(rf"{re.escape(p)}_A\d+", q)]):
                continue  # what it lacks ran to the end in its finished _A parts
            got = len(got)
            lines.append(f"- `{p}`: unfinished, {got} thresholds so far (in the tables above){'; ' + cost if cost else ''}; "
                         f"it continues from the shipped runs with {cmd[:-1]} --resume-from docs/runs/pool/capacity`.")
        elif cost:
            lines.append(f"- `{p}`: {cost}: {cmd}, or `--device cuda`.")
        else:
            lines.append(f"- `{p}`: {cmd} (or `--device cuda`).")
    return "\n".join(lines) if lines else "Every pool part has run."


def _cpu_s(meta: dict) -> float:
    """A finished part's CPU-seconds on one thread (an upper bound): its wall time times the jobs it ran at once
    (``workers`` in its meta.json; a part from before it was recorded counts as one job at a time)."""
    return meta["wall_time_s"] * meta.get("workers", 1)


@functools.lru_cache(maxsize=512)
def _read_once(path: str, mtime_ns: int) -> dict:
    from mechfact.runs import read_json

    return read_json(Path(path))


def _read(path: Path) -> dict:
    """A run file read once per version (its modification time): the cost of every part re-reads the same parts.
    The result is shared: read it, never change it."""
    return _read_once(str(path), path.stat().st_mtime_ns)


def _budget_cost(part: str, src: Path, done: dict) -> str:
    """A budget part's CPU hours on one thread: its evaluations, each a model trained for the part's steps on N R
    facts, at the median CPU-seconds per 10^9 facts x steps trained of the finished CPU parts (those of A = N for
    an A = N part: its output layer grows with N). An ascending scan trains every grid value up to the seed's
    threshold at the largest smaller budget run (the whole grid where none is known), a bisection log2 of the grid;
    thresholds fall with the budget, so the count is an upper bound, as is the full budget for the reaching one."""
    from mechfact.commands.facts import capacity_config
    from mechfact.facts.capacity import parse_eval_key, search_units
    from synthetic.facts_study import part_command

    a = part_command(part)
    cfg = capacity_config(a)
    steps, grid, an = cfg.train.steps, sorted(cfg.grid), "_AN" in part
    before: dict[tuple, tuple] = {}  # (N, R, A, seed) -> (steps, threshold) at the largest smaller budget run
    rates = []
    for q, meta in done.items():
        if not (src / "capacity" / q / "result.json").is_file():
            continue
        res, conf = _read(src / "capacity" / q / "result.json"), src / "capacity" / q / "config.json"
        n_steps = (_read(conf)["config"] if conf.is_file() else {}).get("train", {}).get("steps", 2000)
        for t in res["thresholds"]:
            key = (t["subjects"], t["relations"], t["attributes"], t["seed"])
            if t.get("searched", "d") == "d" and t["embeddings"] == "trainable" and n_steps < steps \
                    and n_steps > before.get(key, (0, None))[0]:
                before[key] = (n_steps, t["threshold"])
        trained = sum(k["N"] * k["R"] * ev["steps"] for k, ev in
                      ((parse_eval_key(k), ev) for k, ev in res.get("evaluations", {}).items()) if ev.get("steps"))
        if trained and on_cpu(meta) and ("_AN" in q) == an:
            rates.append(_cpu_s(meta) / trained)
    if not rates:
        return ""
    evals = unknown = work = 0
    for emb, A, n, r, s in search_units(cfg, a.seed):
        if cfg.scan == "ascending":
            t = before.get((n, r, A, s), (0, None))[1]
            unknown += t is None
            k = len(grid) if t is None else min(len(grid), sum(g < t for g in grid) + 1)
        else:
            k = math.ceil(math.log2(len(grid) + 1))
        evals += k
        work += k * n * r * steps
    rate = statistics.median(rates)
    hours = work * rate / 3600
    return (f"about {hours:.1f} CPU hours on one thread in all ({evals} evaluations of {steps} steps"
            + (f", each grid value up to the seed's threshold at the largest smaller budget run"
               + (f" ({unknown} without one: the whole grid)" if unknown else "") if cfg.scan == "ascending" else "")
            + f"; at {rate * 1e9:.0f} s per 10^9 facts x steps trained, the median of {len(rates)} finished CPU "
            f"parts{' of A = N' if an else ''}: an upper bound where thresholds fall with the budget)")


def _ascending_cost(part: str, src: Path, done: dict) -> str:
    """An ascending re-scan's CPU hours on one thread: every grid value below a setting's first reaching one that
    the reused runs (read from ``src/capacity``) lack, each taken to fail and so to run its full budget (an upper
    bound), at the wall time per relation-evaluation of the finished 2000-step part of its N."""
    from mechfact.commands.facts import capacity_config
    from mechfact.facts.capacity import _eval_key, parse_eval_key, reusable_evaluations, search_units
    from synthetic.facts_study import part_command

    a = part_command(part)
    cfg = capacity_config(a)
    try:
        memo = reusable_evaluations(cfg, [src / "capacity" / Path(d).name for d in a.reuse_evaluations or []
                                          if (src / "capacity" / Path(d).name / "result.json").is_file()])
    except ValueError:  # a folder the re-scan would refuse: no estimate (the run itself says why)
        return ""
    todo = 0
    for emb, A, n, r, s in search_units(cfg, a.seed):
        for d in sorted(cfg.grid):
            ev = memo.get(_eval_key(n, r, emb, d, cfg.mlp_width, s, A))
            if ev is not None and ev["accuracy"] >= cfg.target_accuracy:
                break
            todo += r if ev is None else 0
    base = f"pool_N{cfg.subjects[0]}"
    if base not in done or not todo:
        return ""
    evs = _read(src / "capacity" / base / "result.json")["evaluations"]
    per = _cpu_s(done[base]) / sum(parse_eval_key(k)["R"] for k in evs)
    return (f"at most {todo * per / 3600:.1f} CPU hours on one thread ({todo} relation-evaluations to train, at "
            f"the {per:.1f} s each of {base})")


def _width_cost(part: str, src: Path, finished: list[str], fallback: list[str] = ()) -> str:
    """An m* part's CPU hours on one thread, and the memory its widest model needs: each setting's search over the
    part's grid (its scan: bisection, or every width in ascending order) run to a predicted m* (the finished width
    parts' median m* of the same R, A and embeddings at their largest N, scaled by N, as m* grows with N R; above
    the grid when that one never reached), every evaluation at its full budget and at the cost per fact, MLP unit
    and step measured over the evaluations of the finished parts at the largest N (their wall time over the sum of
    N R m steps). ``fallback``: finished parts (of another budget) whose m* stands in for a setting that
    ``finished`` lacks. "" without a finished width part."""
    import re

    from mechfact.facts.capacity import parse_eval_key, scan_grid
    from synthetic.facts_study import part_command

    if not finished:
        return ""
    work = wall = 0.0
    best: dict[tuple, tuple[int, list]] = {}  # (R, A, embeddings) -> (N, thresholds) at the largest finished N
    n_of = {q: int(re.match(r"pool_N(\d+)", q).group(1)) for q in finished}
    timed = [q for q in finished if n_of[q] == max(n_of.values())]  # the rate at the largest N run
    for q in finished:
        res = _read(src / "capacity" / q / "result.json")
        if q in timed:
            wall += _cpu_s(_read(src / "capacity" / q / "meta.json"))
            for key, ev in res.get("evaluations", {}).items():
                f = parse_eval_key(key)
                work += f["N"] * f["R"] * f["m"] * ev["steps"]
        _largest_n(best, res["thresholds"])
    stand_in: dict[tuple, tuple[int, list]] = {}
    for q in fallback:
        _largest_n(stand_in, _read(src / "capacity" / q / "result.json")["thresholds"])
    borrowed = {k for k in stand_in if k not in best}
    best.update({k: stand_in[k] for k in borrowed})
    if not work:
        return ""
    rate = wall / work  # seconds per fact, MLP unit and step
    cmd = part_command(part)
    grid = sorted(set(cmd.grid))
    seconds, guessed, used = 0.0, 0, set()
    for n in cmd.subjects:
        for r in cmd.relations:
            for a in cmd.attributes:
                for e in cmd.embeddings:
                    if (r, a, e) in best:
                        n0, ts = best[(r, a, e)]
                        if (r, a, e) in borrowed:
                            used.add((r, a, e))
                        m = math.inf if None in ts else statistics.median(ts) * n / n0
                    else:
                        m, guessed = grid[-1], guessed + 1
                    tried = []  # the widths the search's own scan evaluates, were m its threshold

                    def reaches(i: int, m=m) -> bool:
                        tried.append(grid[i])
                        return grid[i] >= m

                    scan_grid(len(grid), cmd.scan, reaches)
                    seconds += sum(rate * n * r * g * cmd.steps * cmd.seeds for g in tried)
    from mechfact.facts.spec import ModelSpec, training_cost

    need = max(training_cost(max(cmd.subjects), max(cmd.relations), cmd.d, grid[-1], ModelSpec(outputs=cmd.outputs),
                             embeddings=e, attributes=min(cmd.attributes))[0] for e in cmd.embeddings)
    hours = seconds / 3600
    return (f"about {f'{hours:.2g}' if hours < 10 else f'{hours:.0f}'} CPU hours on one thread in all (each setting's "
            f"{'scan' if cmd.scan == 'ascending' else 'bisection'} to the m* of "
            f"{', '.join(finished)} at the same R and A scaled by N, every evaluation at its full budget at "
            f"{rate * 1e9:.2f} s per 10^9 facts x MLP units x steps, measured over {', '.join(timed)}"
            + (f"; {len(used)} settings' m* from {', '.join(fallback)}, at fewer steps" if used else "")
            + (f"; {guessed} settings with no measured m*, at the grid's top" if guessed else "") + ")"
            + f"; its widest model needs about {need / 2**30:.2g} GiB to train (the run refuses to start where that "
            "does not fit)")


def _largest_n(best: dict, thresholds: list[dict]) -> None:
    """Into ``best`` ((R, A, embeddings) -> (N, thresholds)): each setting's thresholds at its largest N."""
    for t in thresholds:
        k = (t["relations"], t["attributes"], t["embeddings"])
        if best.get(k, (0,))[0] < t["subjects"]:
            best[k] = (t["subjects"], [])
        if best[k][0] == t["subjects"]:
            best[k][1].append(t["threshold"])


def _covered(part: str, thresholds: list[dict], finished: list[str]) -> bool:
    """Whether every (R, A, seed) setting of ``part``'s command has a threshold, in ``thresholds`` (the part's own)
    or in one of the ``finished`` parts that run one of its pools alone (``pool_N4096_A64``: every setting of
    A = 64, since that part has finished)."""
    from synthetic.facts_study import part_command

    cmd = part_command(part)
    alone = {int(q.rsplit("_A", 1)[1]) for q in finished}
    have = {(t["relations"], t["attributes"], t.get("embeddings", "trainable"), t["seed"]) for t in thresholds}
    return all((r, a, e, s) in have or a in alone for r in cmd.relations for a in cmd.attributes
               for e in cmd.embeddings for s in range(cmd.seeds))

"""The pool thresholds against the step budget: each (N, R, A, seed)'s d* at 2000 steps and at the budget parts'
4x, 16x, 64x the steps (``pool_N*_8k`` / ``_32k`` / ``_128k``), read once for the page's budget table
(:func:`synthetic.results_pool._budget_section`), and the laws of :mod:`mechfact.facts.laws` compared at each budget
and on the thresholds that have converged.

A threshold is a value only where it did not sit at its grid's smallest width (there it is a bound); a law
comparison uses a setting only where every seed has a value at each budget compared, so that the budgets are
compared on the same settings and seeds.
"""

from __future__ import annotations

from pathlib import Path

BUDGETS = ("_8k", "_32k", "_128k")  # the budget parts beyond the 2000-step thresholds: pool_N<N><suffix>


class Ladder:
    """The budget parts of ``src/capacity`` with the 2000-step records ``base``: ``records[(N, R, A, seed)]`` maps
    steps to a threshold record, ``grids[steps][(N, R, A)]`` is the (grid, scan) that the part of that setting ran,
    ``parts`` the part names read."""

    def __init__(self, src: Path, base: list[dict]):
        from mechfact.runs import read_json
        from synthetic.pool_runs import pool_thresholds

        self.records: dict[tuple, dict[int, dict]] = {}
        self.grids: dict[int, dict[tuple, tuple]] = {}
        self.parts: list[str] = []
        for suffix in BUDGETS:
            recs, names = pool_thresholds(src, "d", suffix)
            self.parts += names
            for name in names:
                c = read_json(src / "capacity" / name / "config.json")["config"]
                n = int(name.split("_")[1][1:])  # pool_N<N>[_R<R>]<suffix>
                rs = set(c.get("relations") or [t["relations"] for t in recs if t["subjects"] == n])
                as_ = set(c.get("attributes") or [t["attributes"] for t in recs])  # this part's settings only
                for t in recs:
                    if t["subjects"] == n and t["relations"] in rs and t["attributes"] in as_:
                        self.grids.setdefault(c["train"]["steps"], {})[(n, t["relations"], t["attributes"])] = (
                            c["grid"], c.get("scan", "bisect"))
                        self.records.setdefault((n, t["relations"], t["attributes"], t["seed"]), {})[
                            c["train"]["steps"]] = t
        if self.records:
            for t in base:
                key = (t["subjects"], t["relations"], t["attributes"], t["seed"])
                if key in self.records:
                    self.records[key][2000] = t
        self.budgets = sorted({b for v in self.records.values() for b in v} | {2000})

    def grid_of(self, t: dict, steps: int) -> list:
        return self.grids.get(steps, {}).get((t["subjects"], t["relations"], t["attributes"]), ([], ""))[0]

    def at_min(self, t: dict, steps: int) -> bool:
        """Reached at the grid's smallest value: the threshold is at most that value, not equal to it."""
        grid = self.grid_of(t, steps)
        return bool(t.get("at_grid_min")) or (t["threshold"] is not None and bool(grid)
                                               and t["threshold"] == min(grid))

    def settings(self) -> dict[tuple, list[int]]:
        """(N, R, A) -> its seeds, in order."""
        out: dict[tuple, list[int]] = {}
        for (n, r, a, seed) in sorted(self.records):
            out.setdefault((n, r, a), []).append(seed)
        return out

    def budgets_run(self, setting: tuple, seeds: list[int]) -> list[int]:
        """The budgets at which any of the setting's seeds ran, ascending."""
        return [b for b in self.budgets if any(self.records[(*setting, s)].get(b) for s in seeds)]

    def value(self, key: tuple, steps: int) -> int | None:
        """The seed's d* at ``steps`` where it is a value (run, reached, not at the grid's smallest width)."""
        t = self.records[key].get(steps)
        return None if t is None or t["threshold"] is None or self.at_min(t, steps) else t["threshold"]


def _records(values: dict[tuple, int]) -> list[dict]:
    return [{"subjects": n, "relations": r, "attributes": a, "seed": s, "threshold": d, "embeddings": "trainable",
             "searched": "d"} for (n, r, a, s), d in sorted(values.items())]


def _paired(ladder: Ladder, budgets: tuple[int, ...]) -> dict[int, dict[tuple, int]]:
    """Per budget, the d* of the settings whose every seed has a value at every one of ``budgets``."""
    out: dict[int, dict[tuple, int]] = {b: {} for b in budgets}
    for (n, r, a), seeds in ladder.settings().items():
        vals = {b: [ladder.value((n, r, a, s), b) for s in seeds] for b in budgets}
        if all(v is not None for vs in vals.values() for v in vs):
            for b in budgets:
                out[b].update({(n, r, a, s): v for s, v in zip(seeds, vals[b])})
    return out


def converged(ladder: Ladder) -> dict[tuple, int]:
    """The d* of the settings that have converged: every seed has a value at its setting's two largest budgets run,
    and the two are equal (the larger budget's records)."""
    out = {}
    for (n, r, a), seeds in ladder.settings().items():
        run = ladder.budgets_run((n, r, a), seeds)
        if len(run) < 2:
            continue
        pairs = [(ladder.value((n, r, a, s), run[-2]), ladder.value((n, r, a, s), run[-1])) for s in seeds]
        if all(x is not None and x == y for x, y in pairs):
            out.update({(n, r, a, s): y for s, (_, y) in zip(seeds, pairs)})
    return out


def _ns(values: dict[tuple, int]) -> list[int]:
    return sorted({k[0] for k in values})


def _thin_folds(values: dict[tuple, int]) -> list[int]:
    """The N whose leave-one-N-out fold (the settings of every other N) spans fewer than two values of R or of A:
    a law fitted there would be extrapolated along a factor it was never fitted along."""
    keys = {k[:3] for k in values}
    return [n for n in _ns(values)
            if min(len({k[i] for k in keys if k[0] != n}) for i in (1, 2)) < 2]


def _counts(values: dict[tuple, int]) -> str:
    return ", ".join(f"{len({k[:3] for k in values if k[0] == n})} at N = {n}" for n in _ns(values))


def _refused(values: dict[tuple, int]) -> str:
    """Why a leave-one-N-out comparison of ``values`` is not made ("" where it is): three N are needed, and each
    fold of the others must span two values of R and of A."""
    if not values:
        return "no setting"
    if len(_ns(values)) < 3:
        return f"settings at N = {', '.join(map(str, _ns(values)))} only"
    thin = _thin_folds(values)
    return (f"settings {_counts(values)}; held out N = {', '.join(map(str, thin))}, the other N span one value of R "
            "or of A") if thin else ""


def _where(values: dict[tuple, int]) -> str:
    by: dict[tuple, list[int]] = {}
    for (n, r, a, _), d in sorted(values.items()):
        by.setdefault((n, r, a), []).append(d)
    return "; ".join(f"N = {n}, R = {r}, A = {a}: {', '.join(map(str, ds))}" for (n, r, a), ds in by.items())


def laws_section(ladder: Ladder) -> list[str]:
    """Paper B's laws at each larger budget beside the 2000-step thresholds of the same settings and seeds, and on
    the converged thresholds; where fewer than three N qualify, which settings do (nothing without budget parts)."""
    from mechfact.facts.laws import bits_summary, compare_laws, table_rows, verdict

    if not ladder.records:
        return []
    lines = ["#### The laws at each budget", "",
             "The laws of the held-out comparison below, refitted at each larger budget on the settings whose every "
             "seed has a threshold (not a bound) at that budget and at 2000 steps, beside the same settings and seeds "
             "at 2000 steps: whether the verdict moves with the budget. A budget is compared where its settings "
             "cover three N and, with any one N held out, the others still span two values of R and two of A (else a "
             "law would be asked to predict along a factor it was never fitted along).", ""]
    for b in ladder.budgets[1:]:
        vals = _paired(ladder, (2000, b))
        why = _refused(vals[b])
        if why:
            lines += [f"- {b} steps: {why}; not compared.", ""]
            continue
        got = {s: compare_laws(_records(vals[s])) for s in (2000, b)}
        c = got[b]
        lines += [f"At {b} steps: {c['n_points']} thresholds, {c['n_settings']} settings, N = "
                  f"{', '.join(map(str, c['n_values']))}.", "", *table_rows(c), "",
                  f"- At {b} steps: {verdict(c)}", f"- The same settings and seeds at 2000 steps: {verdict(got[2000])}",
                  f"- Bits per parameter at the median d* over seeds, {b} steps: {bits_summary(_records(vals[b]))}; "
                  f"2000 steps, the same settings: {bits_summary(_records(vals[2000]))}.", ""]
    conv = converged(ladder)
    why = _refused(conv)
    if not why:
        c = compare_laws(_records(conv))
        lines += [f"At convergence (the two largest budgets run agree on every seed): {c['n_points']} thresholds, "
                  f"{c['n_settings']} settings, N = {', '.join(map(str, c['n_values']))}.", "", *table_rows(c), "",
                  f"- At convergence: {verdict(c)}", ""]
    else:
        lines += ["At convergence: " + ("no setting has converged" if not conv else f"the converged settings "
                                        f"({_where(conv)}) lie at N = {', '.join(map(str, _ns(conv)))} only"
                                        if len(_ns(conv)) < 3 else f"the converged settings ({_where(conv)}): {why}")
                  + "; the law comparison at convergence waits for converged settings at three N, each fold of two N "
                  "spanning two values of R and of A (the budget parts under \"Not run here\").", ""]
    return lines


__all__ = ["BUDGETS", "Ladder", "converged", "laws_section"]

"""Number formatting shared by the claim rules (:mod:`.claims`) and the report's tables (:mod:`.layout`)."""

from __future__ import annotations

from ..report import fmt


def medians(summary: list[dict]) -> list[tuple[int, float]]:
    """(d, median alpha_c) per d of a capacity summary, by d."""
    return sorted((int(s["d"]), float(s["alpha_c_median"])) for s in summary)


def alpha_text(summary: list[dict], extrap: dict) -> str:
    per_d = ", ".join(f"{fmt(a)} (d={d})" for d, a in medians(summary))
    a, se = extrap.get("alpha_inf"), extrap.get("alpha_inf_se")
    fit = f"; fit a + b/ln p_c: alpha_inf = {fmt(a)} ± {fmt(se)}" if a is not None and se is not None else ""
    return f"alpha_c = {per_d}{fit}"


def as_int(v):
    """A threshold from a grid (a float median) as the integer it is."""
    return str(int(v)) if isinstance(v, float) and v.is_integer() else fmt(v)


def r2_cell(v) -> float:
    """An R^2 (or accuracy) rounded to two decimals for a table cell."""
    return round(float(v), 2) + 0.0


def f2(v) -> str:
    """Two decimals (accuracies, R^2, controls): -0.0024 -> 0.00."""
    return fmt(round(float(v), 2)) if v is not None else fmt(v)


def rel(xs) -> str:
    """Per-relation numbers in relation order: 1.00 · 0.02 · 0.00."""
    return " · ".join(fmt(float(x)) for x in xs)


def with_ci(r: dict, key: str) -> str:
    """``r[key]`` with its ``r[key + '_ci']`` interval in brackets when there is one."""
    ci = r.get(f"{key}_ci")
    return fmt(r.get(key)) if not ci or ci[0] is None else f"{fmt(r.get(key))} [{fmt(ci[0])}, {fmt(ci[1])}]"

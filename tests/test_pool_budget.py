"""The laws at each step budget (:mod:`synthetic.pool_budget`): compared on the same settings and seeds at 2000
steps and at the larger budget, refused where a held-out fold cannot fit a factor, and at convergence."""

import json
import math

from synthetic import pool_budget as PB
from synthetic import results_pool as P

SETTINGS = [(n, r, a) for n in (256, 1024, 4096) for r in (2, 4, 8) for a in (16, 64)]


def _part(root, name, steps, recs, grid=(1, 1000)):
    (root / "capacity" / name).mkdir(parents=True)
    (root / "capacity" / name / "result.json").write_text(json.dumps({"thresholds": recs}))
    (root / "capacity" / name / "config.json").write_text(json.dumps({"config": {
        "grid": list(grid), "scan": "ascending", "relations": sorted({t["relations"] for t in recs}),
        "attributes": sorted({t["attributes"] for t in recs}), "train": {"steps": steps}}}))


def _recs(settings, law, seeds=3):
    return [{"subjects": n, "relations": r, "attributes": a, "embeddings": "trainable", "searched": "d", "seed": s,
             "threshold": int(round(law(n, r, a))) + s % 2} for n, r, a in settings for s in range(seeds)]


def facts_law(n, r, a):  # 2000 steps: d* proportional to the facts
    return 0.01 * n * r + 5


def log_law(n, r, a):  # at more steps: d* proportional to R ln N
    return 2 * r * math.log(n)


def test_each_budget_names_its_own_best_law_on_the_same_settings_and_at_convergence(tmp_path):
    """2000-step thresholds planted proportional to N R and 8000- / 32000-step ones to R ln N: the 8000-step
    comparison calls R ln N best while the same settings at 2000 steps call N R best; with 32000 steps equal to
    8000 on every seed the thresholds have converged at three N and the comparison at convergence is made."""
    base = _recs(SETTINGS, facts_law)
    for n in (256, 1024, 4096):
        for steps, suffix in ((8000, "_8k"), (32000, "_32k")):
            _part(tmp_path, f"pool_N{n}{suffix}", steps, _recs([s for s in SETTINGS if s[0] == n], log_law))
    lad = PB.Ladder(tmp_path, base)
    assert lad.budgets == [2000, 8000, 32000] and len(PB.converged(lad)) == len(SETTINGS) * 3
    text = "\n".join(PB.laws_section(lad))
    assert "At 8000 steps: 54 thresholds, 18 settings, N = 256, 1024, 4096." in text
    assert "- At 8000 steps: Held out, **R ln N** predicts best" in text
    assert "- The same settings and seeds at 2000 steps: Held out, **N R** predicts best" in text
    assert "- At convergence: Held out, **R ln N** predicts best" in text
    assert "At convergence (the two largest budgets run agree on every seed): 54 thresholds, 18 settings" in text
    # bits per parameter at each budget's own d* (the R ln N thresholds at 8000 steps, the N R ones at 2000)
    from mechfact.facts.laws import bits_summary

    at = {steps: bits_summary([t for t in recs if t["seed"] == 0]) for steps, recs in
          ((8000, _recs(SETTINGS, log_law, 1)), (2000, _recs(SETTINGS, facts_law, 1)))}
    assert at[8000] != at[2000] and (f"- Bits per parameter at the median d* over seeds, 8000 steps: {at[8000]}; "
                                     f"2000 steps, the same settings: {at[2000]}.") in text
    # the page's budget section carries it
    assert "#### The laws at each budget" in "\n".join(P._budget_section(tmp_path, base))


def test_a_budget_whose_held_out_folds_span_one_relation_count_is_not_compared(tmp_path):
    """8000 steps run at every R for N = 256 but only at R = 8, A = 64 for N = 1024 and 4096: holding N = 256 out
    leaves one value of R and of A to fit, so the budget is not compared; a seed at the grid's smallest value is a
    bound and drops its setting; thresholds that moved are not converged."""
    base = _recs(SETTINGS, facts_law)
    _part(tmp_path, "pool_N256_8k", 8000, _recs([s for s in SETTINGS if s[0] == 256], log_law))
    for n in (1024, 4096):
        _part(tmp_path, f"pool_N{n}_8k", 8000, _recs([(n, 8, 64)], log_law))
    text = "\n".join(PB.laws_section(PB.Ladder(tmp_path, base)))
    assert ("- 8000 steps: settings 6 at N = 256, 1 at N = 1024, 1 at N = 4096; held out N = 256, the other N span "
            "one value of R or of A; not compared.") in text
    assert "At convergence: no setting has converged;" in text
    # converged at three N, but holding N = 256 out leaves one R and one A: refused for that reason, not for its N
    for n in (256, 1024, 4096):
        _part(tmp_path, f"pool_N{n}_32k", 32000, _recs([s for s in SETTINGS if s[0] == 256] if n == 256
                                                        else [(n, 8, 64)], log_law))
    text = "\n".join(PB.laws_section(PB.Ladder(tmp_path, base)))
    assert "At convergence: the converged settings (N = 256, R = 2, A = 16: 22, 23, 22;" in text
    assert ("held out N = 256, the other N span one value of R or of A; the law comparison at convergence waits"
            in text) and "At convergence (the two largest" not in text
    # a bound at the grid minimum is not a value: that setting leaves the pairing
    low = tmp_path / "low"
    _part(low, "pool_N256_8k", 8000, _recs([(256, 2, 16)], log_law), grid=(22, 30))
    lad = PB.Ladder(low, base)
    assert lad.value((256, 2, 16, 0), 8000) is None and lad.value((256, 2, 16, 1), 8000) == 23
    assert "- 8000 steps: no setting; not compared." in "\n".join(PB.laws_section(lad))

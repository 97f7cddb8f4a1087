"""`mechfact facts ...`: run directories, determinism, resume, constructions, capacity, multi-hop, bad input."""

import json
import math

import pytest
import torch

from mechfact.cli import main
from mechfact.facts import build_fact_model, evaluate
from mechfact.facts import experiments as ex
from mechfact.facts.runio import load_fact_run
from mechfact.facts.train import TrainConfig

pytestmark = pytest.mark.usefixtures("one_thread")
CPU = torch.device("cpu")


def _tiny_train_cfg(**over):
    base = dict(subjects=32, relations=2, d=8, mlp_width=16,
                train=TrainConfig(steps=60, target_accuracy=None, eval_every=10))
    base.update(over)
    return ex.FactsTrainConfig(**base)


def test_train_same_seed_same_result_file(tmp_path):
    for name in ("a", "b"):
        assert main(["facts", "train", "--subjects", "32", "--relations", "2", "--d", "8", "--mlp-width", "16",
                     "--steps", "40", "--eval-every", "10", "--quiet", "--out", str(tmp_path / name)]) == 0
    a, b = ((tmp_path / n / "result.json").read_bytes() for n in ("a", "b"))
    assert a == b
    model, world = load_fact_run(tmp_path / "a")
    import json

    assert evaluate(model, world)["accuracy"] == json.loads(a)["accuracy"]


def test_interrupted_training_resumes_to_the_same_numbers(tmp_path):
    cfg = _tiny_train_cfg()
    full = ex.run_train(cfg, tmp_path / "full", device=CPU, progress=False, checkpoint_every=20)

    class Stop(Exception):
        pass

    def interrupt(state):
        if state["step"] == 20:
            raise Stop

    with pytest.raises(Stop):
        ex.run_train(cfg, tmp_path / "cut", device=CPU, progress=False, checkpoint_every=20, _after_checkpoint=interrupt)
    assert not (tmp_path / "cut" / "result.json").exists()
    resumed = ex.run_train(cfg, tmp_path / "cut", device=CPU, progress=False, checkpoint_every=20)
    assert resumed["history"] == full["history"] and resumed["accuracy"] == full["accuracy"]
    assert (tmp_path / "cut" / "result.json").read_bytes() == (tmp_path / "full" / "result.json").read_bytes()


def test_trainable_embeddings_memorise_with_small_d():
    """N=64, R=2, d=8, MLP width 8: trainable embeddings store all 128 facts; frozen ones (measured 0.16) cannot,
    and freezing only the input embeddings lets the unembedding store them (measured 0.99)."""
    res = {}
    for emb in ("trainable", "frozen", "frozen-input"):
        cfg = _tiny_train_cfg(subjects=64, d=8, mlp_width=8, model=ex.ModelSpec(embeddings=emb),
                              train=TrainConfig(steps=600, target_accuracy=0.99, eval_every=25))
        world = ex.FactWorld(64, 2, 0)
        model = build_fact_model(world, cfg.d, cfg.mlp_width, **cfg.model.model_kwargs())
        res[emb] = ex.train(model, world, cfg.train, progress=False)["accuracy"]
    assert res["trainable"] >= 0.99
    assert res["frozen"] < 0.4, res
    assert res["frozen-input"] > 0.9, res


def test_construction_reaches_99_and_scales_like_r_log_n(tmp_path):
    ratios = []
    for N in (64, 1024):
        for R in (2, 4):
            r = ex.run_construct(ex.ConstructConfig(subjects=N, relations=R), tmp_path / f"c{N}_{R}", device=CPU)
            assert r["accuracy"] >= 0.99
            ratios.append(r["d"] / (R * math.log(N)))
    # measured 3.85-4.04; d proportional to N (or to R N) would give ratios spread over 10x
    assert max(ratios) / min(ratios) < 1.3, ratios
    assert all(3.0 < x < 5.5 for x in ratios), ratios
    model, world = load_fact_run(tmp_path / "c64_2")
    assert evaluate(model, world)["accuracy"] >= 0.99


def test_cot_construction_and_too_small_d(tmp_path):
    r = ex.run_construct(ex.ConstructConfig(subjects=32, relations=2, hops=3, cot=True), tmp_path / "c", device=CPU)
    assert r["accuracy"] >= 0.99 and r["hops"] == 3
    r2 = ex.run_construct(ex.ConstructConfig(subjects=256, relations=2, d=10), tmp_path / "small", device=CPU)
    assert r2["d"] <= 10 and r2["accuracy"] < 0.5  # block size 4 cannot separate 256 attributes


def test_capacity_thresholds_and_unreached_settings(tmp_path):
    cfg = ex.FactsCapacityConfig(subjects=[32], relations=[1, 4], grid=[1, 2, 4, 8, 16], mlp_width=16,
                                 train=TrainConfig(steps=400, eval_every=25, patience=200))
    res = ex.run_facts_capacity(cfg, tmp_path / "cap", device=CPU)
    th = {t["relations"]: t for t in res["thresholds"]}
    for t in th.values():
        assert {"subjects", "relations", "embeddings", "d", "mlp_width", "searched", "threshold"} <= set(t)
    assert th[1]["threshold"] is not None and th[4]["threshold"] is not None
    assert th[4]["threshold"] > th[1]["threshold"]  # 4x the facts need a wider model
    assert (tmp_path / "cap" / "fig_capacity.png").exists()
    # an unreachable grid is reported as such, not dropped
    cfg2 = ex.FactsCapacityConfig(subjects=[32], relations=[4], grid=[1], mlp_width=16,
                                  train=TrainConfig(steps=50, eval_every=25))
    res2 = ex.run_facts_capacity(cfg2, tmp_path / "cap2", device=CPU)
    assert res2["thresholds"][0]["threshold"] is None and "never reached" in res2["thresholds"][0]["note"]



def test_a_search_stopped_part_way_on_ray_keeps_its_evaluations_for_the_next_run_and_the_export(
        tmp_path, monkeypatch):
    """A Ray search (not in the driver) writes its evaluations to its spill file after every training: stopped
    part way, what it trained is there; the next run of the folder takes them (no training for them), and an
    export of the stopped folder folds them into result.json; a finished run leaves no spill files."""
    from mechfact import executor as E
    from mechfact.facts import capacity as C
    from synthetic.facts_study import export_run_json

    class Remote:
        in_process = False

    spill = E.spill_file(tmp_path / "run", "trainable N=32 R=2 seed=0")

    def search(memo, on_eval):
        memo["N=32 R=2 emb=trainable d=2 m=64 seed=0"] = {"accuracy": 0.5, "steps": 10, "stopped": "budget"}
        on_eval()
        raise KeyboardInterrupt  # stopped before the next evaluation finished

    job = E.memo_job(Remote(), search, {"N=64 R=2 emb=trainable d=2 m=64 seed=0": {}}, lambda k: "N=32" in k,
                     "record", spill=spill)
    with pytest.raises(KeyboardInterrupt):
        job()
    assert E.read_spills(tmp_path / "run") == {"N=32 R=2 emb=trainable d=2 m=64 seed=0": {
        "accuracy": 0.5, "steps": 10, "stopped": "budget"}}
    cfg = ex.FactsCapacityConfig(subjects=[32], relations=[2], embeddings=["trainable"], grid=[2, 4],
                                 scan="ascending", train=TrainConfig(steps=10))
    run = tmp_path / "run"
    (run / "result.json").write_text(json.dumps({"thresholds": [], "evaluations": {}}))
    assert export_run_json(run, tmp_path / "out") == 1
    assert "N=32 R=2 emb=trainable d=2 m=64 seed=0" in json.loads((tmp_path / "out/result.json").read_text())[
        "evaluations"]
    (run / "result.json").unlink()
    trained = []
    monkeypatch.setattr(C, "train", lambda model, world, tcfg, **kw: trained.append(model.cfg.d) or {
        "accuracy": 1.0, "steps": 5, "stopped": "target"})
    got = C.run_facts_capacity(cfg, run, device=CPU)
    assert trained == [4] and got["thresholds"][0]["threshold"] == 4 and not (run / E.SPILLS).exists()
    assert got["evaluations"]["N=32 R=2 emb=trainable d=2 m=64 seed=0"]["accuracy"] == 0.5


def test_evaluation_keys_parse_back_and_a_run_lists_its_searches_in_order():
    """The fields read back from an evaluation key are those it was built from (a pool size only in a pool
    world); a key of another shape is refused by name; the searches of a run are every (embeddings, pool, N, R,
    seed) from its first seed, embeddings outermost."""
    from mechfact.facts.capacity import _eval_key, parse_eval_key, search_units

    assert parse_eval_key(_eval_key(4096, 8, "trainable", 20, 64, 2, 64)) == {
        "N": 4096, "R": 8, "A": 64, "emb": "trainable", "d": 20, "m": 64, "seed": 2}
    assert "A" not in parse_eval_key(_eval_key(32, 2, "frozen", 8, 16, 0))
    with pytest.raises(ValueError, match="'N=32 R=two'"):
        parse_eval_key("N=32 R=two")
    cfg = ex.FactsCapacityConfig(subjects=[32, 64], relations=[2], embeddings=["trainable", "frozen"], seeds=2,
                                 attributes=[8], train=TrainConfig(steps=10))
    units = list(search_units(cfg, seed=3))
    assert units[:3] == [("trainable", 8, 32, 2, 3), ("trainable", 8, 32, 2, 4), ("trainable", 8, 64, 2, 3)]
    assert len(units) == 8 and units[-1] == ("frozen", 8, 64, 2, 4)


def test_an_ascending_scan_finds_the_smallest_value_that_reaches_where_a_bisection_does_not(tmp_path):
    """A wider model can fail where a narrower one reached (a loss spike at a fixed learning rate): on the memoised
    grid 2 .. 64 reaching at 4, 32 and 64 only, bisection tries 8 (fails), 32, 16 (fails) and says 32; the
    ascending scan says 4, tries nothing above it, and a run folder re-searched with the other scan searches again
    from its memoised evaluations (no training: every evaluation is in the memo)."""
    from mechfact.facts.capacity import _eval_key, capacity_search

    reach = {2: 0.5, 4: 0.995, 8: 0.4, 16: 0.45, 32: 0.999, 64: 1.0}
    memo = {_eval_key(32, 2, "frozen", 8, m, 0): {"accuracy": a, "steps": 10, "stopped": "budget"}
            for m, a in reach.items()}
    seen = []

    def cfg(scan):
        return ex.FactsCapacityConfig(subjects=[32], relations=[2], embeddings=["frozen"], search="mlp-width",
                                      scan=scan, d=8, grid=sorted(reach), train=TrainConfig(steps=10))

    bis = capacity_search(32, 2, "frozen", 0, cfg("bisect"), CPU, memo, on_eval=lambda: seen.append(1))
    asc = capacity_search(32, 2, "frozen", 0, cfg("ascending"), CPU, memo, on_eval=lambda: seen.append(1))
    assert (bis["threshold"], bis["scan"], asc["threshold"], asc["scan"]) == (32, "bisect", 4, "ascending")
    assert not seen and not asc.get("at_grid_min")
    low = capacity_search(32, 2, "frozen", 0, cfg("ascending"), CPU, {
        **memo, _eval_key(32, 2, "frozen", 8, 2, 0): {"accuracy": 0.99, "steps": 10, "stopped": "target"}})
    assert low["threshold"] == 2 and low["at_grid_min"]
    run = tmp_path / "cap"
    run.mkdir()
    (run / "result.json").write_text(json.dumps({"evaluations": memo, "thresholds": [bis]}))
    got = ex.run_facts_capacity(cfg("ascending"), run, device=CPU)["thresholds"]
    assert [(t["threshold"], t["scan"]) for t in got] == [(4, "ascending")]
    with pytest.raises(ValueError, match="--scan up"):
        cfg("up")


def test_a_threshold_at_the_grid_minimum_is_marked_censored(tmp_path):
    cfg = ex.FactsCapacityConfig(subjects=[32], relations=[1], grid=[16, 32], mlp_width=16,
                                 train=TrainConfig(steps=400, eval_every=25, patience=200))
    t = ex.run_facts_capacity(cfg, tmp_path / "cap", device=CPU)["thresholds"][0]
    assert t["threshold"] == 16 and t["at_grid_min"] and "<= it" in t["note"]
    row = ex.summarise_thresholds([t])["table"][0]
    assert row["at_grid_min"] and row["median_threshold"] == 16


def test_threshold_fit_slopes_carry_a_bootstrap_interval_over_seeds():
    import math

    import numpy as np

    rng = np.random.default_rng(0)
    ts = [{"subjects": N, "relations": R, "embeddings": "trainable", "seed": s, "attributes": N,
           "r_log_n": R * math.log(N), "n_facts": N * R, "r_log_a": R * math.log(N),
           "threshold": round(0.5 * R * math.log(N) + rng.normal(0, 0.5))}
          for N in (64, 256, 1024) for R in (2, 4, 8) for s in range(4)]
    fit = ex.summarise_thresholds(ts)["fits"]["trainable"]["r_log_n"]
    lo, hi = fit["slope_ci"]
    assert fit["n_seeds"] == 4 and lo < fit["slope"] < hi
    assert 0.4 < lo and hi < 0.6  # the planted slope 0.5, resolved by 4 seeds
    one_seed = ex.summarise_thresholds([t for t in ts if t["seed"] == 0])["fits"]["trainable"]["r_log_n"]
    assert one_seed["slope_ci"] == [None, None] and one_seed["n_seeds"] == 1

BAD = [
    (["facts", "train", "--relations", "0"], "--relations 0"),
    (["facts", "train", "--subjects", "1"], "--subjects 1"),
    (["facts", "train", "--hops", "0"], "--hops 0"),
    (["facts", "train", "--d", "0"], "--d 0"),
    (["facts", "train", "--d", "-4"], "--d -4"),
    (["facts", "train", "--embeddings", "glued"], "--embeddings"),
    (["facts", "train", "--attention", "sparse"], "--attention"),
    (["facts", "train", "--schedule", "linear"], "--schedule"),
    (["facts", "train", "--hops", "2"], "--attention uniform"),
    (["facts", "train", "--cot"], "--cot"),
    (["facts", "train", "--lr", "0"], "--lr 0"),
    (["facts", "train", "--loss", "hinge"], "--loss"),
    (["facts", "train", "--l2", "-1"], "--l2 -1"),
    (["facts", "train", "--target-logit", "0"], "--target-logit 0"),
    (["facts", "train", "--target-accuracy", "most"], "'most': expected a number in (0, 1] or 'none'"),
    (["facts", "train", "--entity-init", "uniform"], "--entity-init"),
    (["facts", "train", "--entity-init", "zero", "--tied"], "entity_init='zero' needs trainable, untied"),
    (["facts", "capacity", "--search", "depth"], "--search"),
    (["facts", "capacity", "--relations", "2", "0"], "--relations 0"),
    (["facts", "capacity", "--grid", "8", "0"], "--grid"),
    (["facts", "construct", "--relations", "4", "--d", "6"], "--d 6"),
    (["facts", "construct", "--hops", "2"], "--cot"),
    (["facts", "multihop", "--hops", "0"], "--hops 0"),
]


@pytest.mark.parametrize("argv,needle", BAD)
def test_bad_input_exits_2_with_one_line(argv, needle, tmp_path, capsys):
    assert main(argv + ["--out", str(tmp_path / "o"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and needle in err and "Traceback" not in err, err


def test_geometric_flags_reach_the_saved_config(tmp_path):
    """--loss mse --l2 --entity-init zero --target-accuracy none: every step runs, the run dir records them."""
    import json

    out = tmp_path / "g"
    assert main(["facts", "train", "--subjects", "16", "--relations", "2", "--attributes", "4", "--d", "8",
                 "--mlp-width", "16", "--steps", "30", "--eval-every", "10", "--loss", "mse", "--l2", "1e-3",
                 "--entity-init", "zero", "--target-accuracy", "none", "--quiet", "--out", str(out)]) == 0
    cfg = json.loads((out / "config.json").read_text())
    train = cfg["config"]["train"]
    assert (train["loss"], train["l2"], train["target_accuracy"]) == ("mse", 1e-3, None)
    assert cfg["config"]["model"]["entity_init"] == "zero"
    res = json.loads((out / "result.json").read_text())
    assert res["steps"] == 30 and res["stopped"] == "budget"
    model, _ = load_fact_run(out)
    assert model.cfg.entity_init == "zero"


def test_attribute_outputs_from_the_command_line(tmp_path):
    """--outputs attributes: the saved model scores the pool only, learns the pool world, and reloads."""
    import json

    out = tmp_path / "a"
    assert main(["facts", "train", "--subjects", "128", "--relations", "2", "--attributes", "8", "--d", "16",
                 "--mlp-width", "64", "--lr", "0.03", "--steps", "600", "--eval-every", "100", "--outputs",
                 "attributes", "--quiet", "--out", str(out)]) == 0
    assert json.loads((out / "config.json").read_text())["config"]["model"]["outputs"] == "attributes"
    model, world = load_fact_run(out)
    assert model.cfg.outputs == 8 and tuple(model.W_U.shape) == (16, 8)
    assert evaluate(model, world)["accuracy"] >= 0.99


def test_corrupted_checkpoint_exits_2(tmp_path, capsys):
    argv = ["facts", "train", "--subjects", "16", "--relations", "1", "--d", "4", "--mlp-width", "8", "--steps", "5",
            "--eval-every", "5", "--quiet", "--out", str(tmp_path / "r")]
    assert main(argv) == 0
    ck = tmp_path / "r" / "checkpoint.pt"
    ck.write_bytes(ck.read_bytes()[:100])
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "corrupted checkpoint" in err and "checkpoint.pt" in err, err


@pytest.mark.slow
def test_chain_of_thought_beats_direct_at_three_hops(tmp_path):
    """Same d=16, width 32 and budget: direct 3-hop must store N R^3 = 2048 chains, CoT only N R = 128 facts."""
    cfg = ex.MultihopConfig(subjects=32, relations=4, hops=[3], d=16, mlp_width=32,
                            train=TrainConfig(lr=3e-2, schedule="warmup-cosine", steps=600, target_accuracy=0.99,
                                              eval_every=50))
    res = ex.run_multihop(cfg, tmp_path / "mh", device=CPU)
    acc = {p["mode"]: p["accuracy"] for p in res["points"]}
    assert acc["cot"] >= 0.9, acc
    assert acc["direct"] < 0.6, acc
    assert (tmp_path / "mh" / "fig_multihop.png").exists()


def test_world_and_init_seeds_are_separate(tmp_path):
    """--world-seed fixes the facts, --init-seed the initialisation; --seed alone still sets both (as before)."""
    import json

    base = ["facts", "train", "--subjects", "16", "--relations", "2", "--d", "8", "--mlp-width", "8", "--steps", "3",
            "--eval-every", "3", "--quiet"]
    runs = {"a": ["--seed", "0"], "b": ["--seed", "5", "--world-seed", "0", "--init-seed", "0"],
            "c": ["--world-seed", "0", "--init-seed", "7"], "d": ["--world-seed", "3", "--init-seed", "0"]}
    for name, extra in runs.items():
        assert main(base + extra + ["--out", str(tmp_path / name)]) == 0
    world = {n: json.loads((tmp_path / n / "world.json").read_text())["perms"] for n in runs}
    init = {n: load_fact_run(tmp_path / n)[0].blocks[0].mlp.W_in for n in runs}
    assert world["a"] == world["b"] == world["c"] != world["d"]
    assert json.loads((tmp_path / "c" / "config.json").read_text())["config"]["init_seed"] == 7
    assert not torch.equal(init["a"], init["c"])  # same facts, another initialisation
    model, _ = load_fact_run(tmp_path / "d")
    assert model.cfg.seed == 0 and load_fact_run(tmp_path / "c")[0].cfg.seed == 7


@pytest.mark.slow  # seconds of training: the slow tier keeps the fast one under 5 minutes
def test_capacity_in_attribute_pool_worlds_follows_the_pool(tmp_path, one_thread):
    """d* searched per pool size A: a smaller pool needs a smaller width at every R, d* grows with R, and across
    the grid d* follows R ln A (the pool's entropy) better than R ln N (the same N throughout)."""
    import json

    cfg = ex.FactsCapacityConfig(subjects=[64], relations=[2, 4], attributes=[4, 64], grid=[2, 3, 4, 6, 8, 12, 16, 24],
                                 mlp_width=64, model=ex.ModelSpec(outputs="attributes"),
                                 train=TrainConfig(lr=3e-2, steps=800, target_accuracy=0.99, eval_every=50,
                                                   patience=300))
    res = ex.run_facts_capacity(cfg, tmp_path / "c", device=torch.device("cpu"))
    d = {(t["attributes"], t["relations"]): t["threshold"] for t in res["thresholds"]}
    assert set(d) == {(4, 2), (4, 4), (64, 2), (64, 4)} and None not in d.values()
    assert d[4, 2] < d[64, 2] and d[4, 4] < d[64, 4]  # a pool of 4 needs less than a bijection of 64
    assert d[4, 2] < d[4, 4] and d[64, 2] < d[64, 4]  # more relations, more width
    fits = res["summary"]["fits"]["trainable"]
    assert fits["r_log_a"]["r2"] > fits["r_log_n"]["r2"]
    keys = json.loads((tmp_path / "c" / "result.json").read_text())["evaluations"]
    assert all(" A=4 " in k or " A=64 " in k for k in keys)
    again = ex.run_facts_capacity(cfg, tmp_path / "c", device=torch.device("cpu"))  # resumes: nothing re-run
    assert again["thresholds"] == res["thresholds"]


def test_capacity_refuses_a_pool_larger_than_the_subjects():
    with pytest.raises(ValueError, match=r"--attributes 512: a pool is entities 0\.\.A-1, so A must be <= the "
                                         r"smallest --subjects \(256\)"):
        ex.FactsCapacityConfig(subjects=[256, 1024], attributes=[16, 512])


def test_the_power_law_fit_recovers_the_exponents_and_drops_bounds_and_constant_factors():
    """d* = C R^a N^b A^c on logs of the medians: exact data give the exponents back (R ln N-like against N R-like
    growth tell apart by the N exponent); a setting with a seed at the grid's smallest value is a bound and left
    out; with one N there is no N exponent."""
    from mechfact.facts.capacity import power_law_fit

    def recs(f, ns=(256, 1024)):
        return [{"subjects": n, "relations": r, "attributes": a, "embeddings": "trainable", "seed": s,
                 "threshold": f(n, r, a) * (1 + 0.01 * s)} for n in ns for r in (2, 4, 8) for a in (16, 64)
                for s in range(3)]

    facts = power_law_fit(recs(lambda n, r, a: 0.01 * n * r))
    assert facts["exponents"]["N"]["value"] == pytest.approx(1.0, abs=1e-6)
    assert facts["exponents"]["R"]["value"] == pytest.approx(1.0, abs=1e-6)
    assert facts["exponents"]["A"]["value"] == pytest.approx(0.0, abs=1e-6)
    lo, hi = facts["exponents"]["N"]["ci"]
    # the seeds of each setting resampled independently (a seed's 1% offset then differs between settings): the
    # interval covers the exponent and stays within the seeds' spread; 12 settings of 3 seeds: 10^12 resamples
    assert lo <= 1.0 <= hi and hi - lo < 0.03 and facts["resamples_distinct"] == 10 ** 12
    assert facts["r2"] == pytest.approx(1.0) and facts["n_points"] == 12
    logn = power_law_fit(recs(lambda n, r, a: 0.3 * r * math.log(n) * a ** 0.25))
    assert logn["exponents"]["N"]["value"] == pytest.approx(math.log(math.log(1024) / math.log(256)) / math.log(4),
                                                            abs=1e-6)
    assert logn["exponents"]["A"]["value"] == pytest.approx(0.25, abs=1e-6)
    bounded = recs(lambda n, r, a: 0.01 * n * r)
    bounded[0] = {**bounded[0], "threshold": 1000.0, "at_grid_min": True}  # a wild bound would skew the fit
    assert power_law_fit(bounded)["n_points"] == 11
    assert power_law_fit(bounded)["exponents"]["N"]["value"] == pytest.approx(1.0, abs=1e-6)
    one_n = power_law_fit(recs(lambda n, r, a: 0.5 * r, ns=(256,)))
    assert set(one_n["exponents"]) == {"R", "A"} and power_law_fit([]) == {}


@pytest.mark.slow
def test_pool_d_star_grows_with_n_far_slower_than_the_facts(tmp_path, one_thread):
    """The pool page's trend at small scale (R = 4, A = 8, the page's schedule): d* grows with N at fixed R and A,
    and from N = 32 to 512 (16x the facts, 1.8x ln N) by far less than the facts (measured: 3 -> 6 in both seeds,
    ~1 min on one thread)."""
    cfg = ex.FactsCapacityConfig(subjects=[32, 512], relations=[4], attributes=[8], grid=[2, 3, 4, 5, 6, 8, 10, 12, 16],
                                 mlp_width=64, seeds=2, model=ex.ModelSpec(outputs="attributes"),
                                 train=TrainConfig(lr=3e-2, steps=1000, target_accuracy=0.99, eval_every=50,
                                                   patience=0, schedule="warmup-cosine"))
    res = ex.run_facts_capacity(cfg, tmp_path / "c", device=torch.device("cpu"))
    d = {(t["subjects"], t["seed"]): t["threshold"] for t in res["thresholds"]}
    assert None not in d.values() and len(d) == 4
    for s in (0, 1):
        assert d[32, s] < d[512, s] <= 3 * d[32, s]


def test_a_stopped_multihop_run_resumes_its_point_in_training_to_the_same_numbers(tmp_path, train_spy):
    """Each multihop point trains with a checkpoint in the run folder: a run stopped mid-point resumes that point
    from its checkpoint (not from step 0) and ends with the uninterrupted run's result.json; no checkpoint is left
    once the points are written."""
    from mechfact.facts import multihop as mh

    cfg = ex.MultihopConfig(subjects=8, relations=2, hops=[2], d=8, mlp_width=16,
                            train=TrainConfig(steps=60, target_accuracy=None, eval_every=10))
    train_spy(mh, 20)
    full = ex.run_multihop(cfg, tmp_path / "full", device=CPU)
    train_spy.stop_at = 40
    with pytest.raises(train_spy.Stop):
        ex.run_multihop(cfg, tmp_path / "cut", device=CPU)
    assert (tmp_path / "cut" / mh.point_checkpoint(2, "direct")).is_file()
    train_spy.stop_at = None
    resumed = ex.run_multihop(cfg, tmp_path / "cut", device=CPU)
    assert train_spy.starts == [0, 0, 0, 40, 0]  # full: direct, cot; cut: direct stopped at 40; resumed: direct, cot
    assert resumed["points"] == full["points"]
    assert (tmp_path / "cut" / "result.json").read_bytes() == (tmp_path / "full" / "result.json").read_bytes()
    assert not list((tmp_path / "cut").glob("checkpoint*"))


def test_line_fit_recovers_a_planted_line_and_refuses_an_r2_on_constant_data():
    from mechfact.facts.capacity import line_fit

    slope, intercept, r2 = line_fit([1, 2, 3, 5], [3.0, 5.0, 7.0, 11.0])
    assert (slope, intercept, r2) == pytest.approx((2.0, 1.0, 1.0))
    slope, intercept, r2 = line_fit([1, 2, 3], [1.0, 3.0, 2.0])
    assert slope == pytest.approx(0.5) and intercept == pytest.approx(1.0) and r2 == pytest.approx(0.25)
    assert line_fit([1, 2, 3], [4.0, 4.0, 4.0])[2] is None


def test_the_threshold_summary_lists_each_settings_thresholds_in_seed_order_whatever_the_record_order():
    """Parts that add seeds 3 and 4 are read before the part of seeds 0-2: the table's per-seed list is by seed."""
    from mechfact.facts.capacity import summarise_thresholds

    base = {"embeddings": "trainable", "subjects": 256, "relations": 2, "attributes": 16}
    recs = [{**base, "seed": s, "threshold": t} for s, t in ((3, 3), (4, 2), (0, 2), (1, 3), (2, 3))]
    (row,) = summarise_thresholds(recs)["table"]
    assert row["thresholds"] == [2, 3, 3, 3, 2] and row["median_threshold"] == 3


def test_an_ascending_scan_reuses_a_bisections_evaluations_and_refuses_runs_that_trained_otherwise(
        tmp_path, monkeypatch):
    """Reaching at d = 16, 32, 64 only: a bisection evaluates 8, 32, 16 and says 16; an ascending scan given that
    run's folder trains 2 and 4 alone (8 and 16 are the bisection's) and says 16. A folder whose training or
    device differ is refused, naming what differs, before anything is written; another setting's evaluations are
    not copied."""
    from mechfact.facts import capacity as C

    reach = {2: 0.4, 4: 0.4, 8: 0.4, 16: 0.995, 32: 0.999, 64: 1.0}
    trained = []
    monkeypatch.setattr(C, "build_fact_model", lambda world, d, m, **kw: d)
    monkeypatch.setattr(C, "train", lambda d, world, cfg, **kw: trained.append(d) or {
        "accuracy": reach[d], "steps": cfg.steps, "stopped": "budget"})

    def cfg(scan, steps=10):
        return ex.FactsCapacityConfig(subjects=[32], relations=[2], grid=sorted(reach), scan=scan,
                                      train=TrainConfig(steps=steps))

    bis = ex.run_facts_capacity(cfg("bisect"), tmp_path / "bis", device=CPU)["thresholds"][0]
    assert (bis["threshold"], trained) == (16, [8, 32, 16])
    assert json.loads((tmp_path / "bis" / "meta.json").read_text())["workers"] == 1  # jobs at once: CPU time bound
    src = json.loads((tmp_path / "bis" / "result.json").read_text())
    src["evaluations"]["N=32 R=4 emb=trainable d=2 m=64 seed=0"] = {"accuracy": 1.0, "steps": 1, "stopped": "x"}
    (tmp_path / "bis" / "result.json").write_text(json.dumps(src))
    trained.clear()
    res = ex.run_facts_capacity(cfg("ascending"), tmp_path / "asc", device=CPU, reuse=[tmp_path / "bis"])
    assert (res["thresholds"][0]["threshold"], res["thresholds"][0]["scan"], trained) == (16, "ascending", [2, 4])
    assert not any(k.startswith("N=32 R=4 ") for k in res["evaluations"])
    with pytest.raises(ValueError, match=r"--reuse-evaluations .*bis: its train differ"):
        ex.run_facts_capacity(cfg("ascending", steps=20), tmp_path / "asc20", device=CPU, reuse=[tmp_path / "bis"])
    assert not (tmp_path / "asc20").exists()
    meta = json.loads((tmp_path / "bis" / "meta.json").read_text())
    (tmp_path / "bis" / "meta.json").write_text(json.dumps({**meta, "device": "cuda:0"}))
    with pytest.raises(ValueError, match=r"its device \(cuda:0, this run cpu\) differ"):
        ex.run_facts_capacity(cfg("ascending"), tmp_path / "asc2", device=CPU, reuse=[tmp_path / "bis"])
    with pytest.raises(ValueError, match="no facts capacity run there"):
        ex.run_facts_capacity(cfg("ascending"), tmp_path / "asc3", device=CPU, reuse=[tmp_path / "nothing"])

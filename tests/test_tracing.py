"""Causal tracing: where restoring one clean piece brings a corrupted fact back.

On the explicit construction the answer is known (attributes in the subject embedding, attention carrying them
to the last position, the MLP there selecting): the trace must put the effect exactly there. On random weights it
must find nothing. On tiny pretrained-architecture models, the batched trace equals a hand-written per-cell loop
in plain hooks, the way the tracing authors' code runs it."""

from pathlib import Path

import numpy as np
import pytest
import torch

from llm_tiny import build_gemma3, build_model, write_relations


def _aie(res, bucket):
    return {x["layer"]: x["aie"] for x in res.summary()["aie"][bucket]}


def test_the_trace_finds_the_construction_where_it_stores_and_selects(construction, one_thread):
    import mechfact

    model, world = construction
    state = mechfact.causal_trace(model, world, kind="state", max_facts=40)
    s = state.summary()
    te = s["total_effect"]
    assert s["n_facts"] == 40 and te > 0.5, s["total_effect"]
    subj, last = _aie(state, "last_subject"), _aie(state, "last")
    assert subj[-1] > 0.95 * te  # the subject's embedding holds the fact
    assert abs(subj[0]) < 0.01  # the subject's output state is read by nothing in one layer
    assert last[0] > 0.95 * te and abs(last[-1]) < 1e-6  # the relation token's embedding is not corrupted
    for kind in ("mlp", "attn"):
        r = mechfact.causal_trace(model, world, kind=kind, window=1, max_facts=40)
        assert _aie(r, "last")[0] > 0.9 * te, kind  # the selector (MLP) and the carrier (attention) at the end
        assert abs(_aie(r, "last_subject")[0]) < 0.01, kind  # nothing at the subject position
    lo, hi = s["peak_last_subject"]["aie_ci"]
    assert lo <= s["peak_last_subject"]["aie"] <= hi and hi - lo < 0.3


def test_random_weights_show_no_effect(construction, one_thread):
    from mechfact.facts.model import build_fact_model
    from mechfact.probes import tracing
    from mechfact.probes.queries import ProbeSet

    _, world = construction
    model = build_fact_model(world, d=32, mlp_width=64, seed=3)
    res = tracing.causal_trace_queries(model, tracing.fact_queries(ProbeSet.from_world(world), range(60)),
                                       kind="state")
    ie = res.indirect_effects()
    top = max(f.clean for f in res.facts)
    assert top < 0.1  # nothing is known: the top-1 of a random model is barely above 1/64
    assert np.nanmax(np.abs(np.nanmean(ie[:, [0, 2, 3, 5]], 0))) < 0.01  # (a one-token subject: no middle)


def test_noise_scale_is_three_times_the_subject_embedding_std(construction):
    from mechfact.probes import tracing
    from mechfact.probes.queries import ProbeSet

    model, world = construction
    q = tracing.fact_queries(ProbeSet.from_world(world), range(20))
    nu = tracing.noise_scale(model, [x["tokens"] for x in q], [x["subject"] for x in q])
    emb = model.W_E.detach()[torch.tensor([int(x["tokens"][0]) for x in q])]
    assert nu == pytest.approx(3 * float(emb.reshape(-1).std()), rel=1e-5)


@pytest.fixture(scope="module")
def tiny_gemma3(tmp_path_factory):
    """A tiny Gemma-3 (sliding window 4 below the prompts' length, sliding and full layers alternating)."""
    from mechfact.llm.models.loading import load_model

    root = tmp_path_factory.mktemp("trace_gemma3")
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    lm = load_model(str(build_gemma3(root / "gemma3")))
    torch.set_num_threads(n)
    return lm, write_relations(root / "relations")


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    from mechfact.llm.models.loading import load_model

    root = tmp_path_factory.mktemp("trace_tiny")
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    lm = load_model(str(build_model("llama", root / "llama")))
    torch.set_num_threads(n)
    return lm, write_relations(root / "relations")


def _reference(lm, tokens, subject, y, cells, kind, window, noise, n_draws, seed, index, sever=None, exclude=()):
    """The tracing authors' loop: one forward pass per cell, every token unembedded, plain hooks."""
    from mechfact import hooks
    from mechfact.probes.tracing import window_layers
    from mechfact.seeding import derive_seed

    s0, s1 = subject
    L = lm.n_layers
    g = torch.Generator().manual_seed(derive_seed(seed, "probes.tracing.noise", index))
    eps = torch.randn(n_draws, s1 - s0 + 1, lm.d_model, generator=g) * noise
    _, clean = lm.run_with_cache(tokens[None])
    base = tokens[None].repeat(n_draws, 1)

    def add_noise(x, hook):
        x[:, s0:s1 + 1] += eps
        return x

    corrupt = {}
    if sever:
        names = [hooks.mlp_out(l) if sever == "mlp" else hooks.attn_out(l) for l in range(L)]
        store = {}

        def grab(name):
            def fn(x, hook):
                store[name] = x.clone()
            return fn
        lm.run_with_hooks(base, fwd_hooks=[(hooks.embed(), add_noise)] + [(n, grab(n)) for n in names])
        corrupt = store
    out = []
    for t, layer in cells:
        fh = [(hooks.embed(), add_noise)]
        if kind == "state":
            name = hooks.embed() if layer < 0 else hooks.resid(layer, "post")
            targets = [(name, clean[name][0, t])]
            if sever:
                for l2 in range(layer + 1, L):
                    nm = hooks.mlp_out(l2) if sever == "mlp" else hooks.attn_out(l2)
                    targets.append((nm, corrupt[nm][:, t]))
        else:
            names = [hooks.mlp_out(l) if kind == "mlp" else hooks.attn_out(l) for l in window_layers(layer, window, L)
                     if l not in exclude]
            targets = [(nm, clean[nm][0, t]) for nm in names]
        for nm, v in targets:
            def put(x, hook, v=v):
                x[:, t] = v
                return x
            fh.append((nm, put))
        logits = lm.run_with_hooks(base, fwd_hooks=fh)
        out.append(float(torch.softmax(logits[:, -1].float(), -1)[:, y].mean()))
    return out


@pytest.mark.parametrize("model,kind,sever,window,exclude,suffix", [
    ("llama", "state", None, 1, (), True), ("llama", "mlp", None, 2, (), True), ("llama", "attn", None, 3, (), True),
    ("llama", "state", "mlp", 1, (), True), ("llama", "mlp", None, 3, (0,), True),
    ("llama", "state", None, 1, (), False), ("llama", "mlp", None, 2, (), False),
    ("gemma3", "state", None, 1, (), True), ("gemma3", "mlp", None, 2, (), True), ("gemma3", "state", "attn", 1, (), True),
    ("gemma3", "state", None, 1, (), False), ("gemma3", "mlp", None, 2, (), False)])
def test_batched_trace_equals_the_per_cell_loop(request, model, kind, sever, window, exclude, suffix, one_thread):
    """Both paths (``suffix``: only the tokens and blocks a restoration changes; else every token of the blocks after
    the first difference) on a Llama and on a Gemma-3 whose sliding and full layers take different masks and
    rotary embeddings (a path that hands a block another block's arguments fails there). (exclude (0,): the
    MLP-0-excluded check restores the window's other layers only.)"""
    from mechfact.llm.prompts import build_prompts
    from mechfact.llm.relations import load_relations
    from mechfact.probes import tracing

    lm, rels = request.getfixturevalue(f"tiny_{model}")
    rel = load_relations(rels, ["tiny_colour"])[0]
    p = build_prompts(rel, lm.tokenizer, lm.bos_id, k=1, template=1, seed=0)[2]
    tokens = torch.tensor(p.tokens)
    q = {"tokens": tokens, "subject": (p.subject_first, p.subject_last), "index": 7}
    res = tracing.causal_trace_queries(lm, [q], kind=kind, window=window, sever=sever, noise=3.0, n_draws=4,
                                       batch_rows=12, seed=1, exclude=exclude, suffix=suffix)
    f = res.facts[0]
    L = lm.n_layers
    n = len(tokens)
    cells = [(t, l) for t in (p.subject_first, p.subject_last, n - 1) for l in ([-1, 0, L - 1] if kind == "state"
                                                                              else [0, L - 1])]
    want = _reference(lm, tokens, q["subject"], f.target, cells, kind, window, 3.0, 4, 1, 7, sever, exclude)
    got = [f.scores[t, res.layers.index(l)] for t, l in cells]
    assert np.allclose(got, want, rtol=1e-5, atol=1e-9), (got, want)
    # the restorations move the probability by far more than the tolerance: the comparison has teeth
    assert max(want) - min(want) > 100 * 1e-5 * max(want), (min(want), max(want))
    assert np.all(f.scores[:p.subject_first] == f.corrupt)  # before the subject nothing differs


def test_bad_input_is_named(tiny_llama, construction):
    import mechfact
    from mechfact.llm.relations import Relation

    lm, rels = tiny_llama
    model, world = construction
    with pytest.raises(ValueError, match=r"window 5: must be an integer in 1\.\.1"):
        mechfact.causal_trace(model, world, kind="mlp", window=5)
    with pytest.raises(ValueError, match="kind 'resid'"):
        mechfact.causal_trace(model, world, kind="resid")
    with pytest.raises(ValueError, match="logit_diff' needs corruption 'replace'"):
        mechfact.causal_trace(model, world, metric="logit_diff")
    with pytest.raises(ValueError, match="no known facts"):
        mechfact.causal_trace(lm, rels)  # a random tiny model knows none of them
    with pytest.raises(ValueError, match="must contain exactly one '{}'"):  # a template without the subject slot
        mechfact.causal_trace(lm, Relation("r", ["The colour is"], [("a", "b"), ("c", "d")]))
    from mechfact.probes import tracing

    with pytest.raises(ValueError, match=r"subject tokens 1\.\.1 must lie inside the prompt before its last"):
        tracing.trace_query(model, torch.tensor([0, 65]), (1, 1), noise=1.0)


@pytest.mark.parametrize("metric", ["prob", "logit_diff"])
def test_token_replacement_finds_the_same_places_on_the_construction(construction, metric, one_thread):
    """Another subject swapped in (Zhang & Nanda): the effect sits where the noise trace puts it, in both
    metrics; the logit difference of the clean run is positive and that of a corrupted run negative."""
    import mechfact

    model, world = construction
    res = mechfact.causal_trace(model, world, kind="state", corruption="replace", metric=metric, n_replace=3,
                                max_facts=30)
    s = res.summary()
    te = s["total_effect"]
    assert te > (0.5 if metric == "prob" else 1.0)
    if metric == "logit_diff":
        assert s["clean"] > 0 > s["corrupt"]
    subj, last = _aie(res, "last_subject"), _aie(res, "last")
    assert subj[-1] == pytest.approx(te, rel=1e-4) and abs(subj[0]) < 0.01 * abs(te)
    assert last[0] == pytest.approx(te, rel=1e-4)
    assert all(f.scores.shape == (2, 2) for f in res.facts) and len(res.records) == 30 * 6 * 2


def test_trace_command_refuses_bad_input_with_one_line(tiny_llama, tmp_path, capsys):
    import json

    from mechfact.cli import main

    lm, rels = tiny_llama
    folder = str(tmp_path / "m")
    model_dir = str(rels.parent / "llama")
    no_slot = tmp_path / "no_slot.json"
    no_slot.write_text(json.dumps({"name": "capital", "prompt_templates": ["The capital is"],
                                   "samples": [{"subject": "France", "object": "Paris"}]}))
    cases = [(["--model", model_dir, "--relations", str(rels)], "no known facts to trace"),
             (["--model", model_dir, "--relations", str(no_slot)], "must contain exactly one '{}'"),
             (["--relation-names", "country_capital", "--window", "99"], "--window 99: larger than the depth"),
             (["--kinds", "resid"], "kinds")]
    for argv, msg in cases:
        code = main(["llm", "trace", *argv, "--out", folder, "--quiet"])
        err = capsys.readouterr().err
        assert code == 2 and msg in err, (argv, code, err[-500:])
        assert len(err.strip().splitlines()) <= 2, err  # usage line + the error, no traceback
    assert not (tmp_path / "m" / "result.json").exists()


def test_a_trace_stopped_after_its_screening_resumes_without_screening_again(tiny_llama, tmp_path, monkeypatch,
                                                                             one_thread):
    """The screening (every fact's top-1 token, one forward pass per fact: most of a run's start on a large
    relation set) is written to the run folder relation by relation; a resumed run reads it back instead of running
    those forward passes again, and traces what an uninterrupted run traces; a screen made with another model or
    prompt is not used."""
    import json

    from mechfact.llm import trace as T

    lm, rels = tiny_llama
    calls = []

    def spelled(model, ps, batch_size=16):  # a model that knows every fact: its top-1 token starts the object
        calls.append(len(ps))
        return torch.tensor([lm.tokenizer.encode(" " + o, add_special_tokens=False)[0] for o in objects])

    rel = T.load_sources([str(rels)], ["tiny_colour"])[0]
    objects = rel.objects
    monkeypatch.setattr(T, "predictions", spelled)
    cfg = T.TraceConfig(relations=[str(rels)], relation_names=["tiny_colour"], kinds=["state"], max_facts=2,
                        n_draws=2, known="prefix")

    def stop(*a, **k):
        raise RuntimeError("stopped")

    monkeypatch.setattr(T, "_trace_row", stop)
    with pytest.raises(RuntimeError, match="stopped"):
        T.run_llm_trace(cfg, tmp_path / "t", lm=lm)
    kept = json.loads((tmp_path / "t" / T.SCREEN).read_text())
    assert calls == [len(rel)] and len(kept["top1"]["tiny_colour"]) == len(rel)
    assert not (tmp_path / "t" / "result.json").exists()
    monkeypatch.undo()
    monkeypatch.setattr(T, "predictions", spelled)
    res = T.run_llm_trace(cfg, tmp_path / "t", lm=lm)
    assert calls == [len(rel)] and res["pooled"]["state"]["n_facts"] == 2  # not screened again
    fresh = T.run_llm_trace(cfg, tmp_path / "fresh", lm=lm)  # an uninterrupted run: the same numbers
    assert len(calls) == 2 and res["noise"] == fresh["noise"]
    assert json.dumps(fresh["pooled"], sort_keys=True) == json.dumps(res["pooled"], sort_keys=True)
    other = T.TraceConfig(**{**cfg.to_dict(), "template": 1})  # another prompt: screened anew
    T.run_llm_trace(other, tmp_path / "t2", lm=lm)
    (tmp_path / "t2" / T.SCREEN).write_text((tmp_path / "t" / T.SCREEN).read_text())
    (tmp_path / "t2" / "result.json").unlink()
    T.run_llm_trace(other, tmp_path / "t2", lm=lm)
    assert len(calls) == 4


def test_a_resumed_noise_trace_refuses_a_screen_that_changes_its_noise_scale(tiny_llama, tmp_path, monkeypatch,
                                                                          one_thread):
    """One run, one noise scale: the scale comes from every known fact's subject embeddings, so a screen that
    changed under a stopped run (copied in, edited) would trace the remaining rows at another scale and pool them
    with the first; the resumed run refuses, naming both scales, instead of mixing them."""
    import json

    from mechfact.llm import trace as T

    lm, rels = tiny_llama
    rel = T.load_sources([str(rels)], ["tiny_colour"])[0]
    first = [lm.tokenizer.encode(" " + o, add_special_tokens=False)[0] for o in rel.objects]
    monkeypatch.setattr(T, "predictions", lambda model, ps, batch_size=16: torch.tensor(first))
    cfg = T.TraceConfig(relations=[str(rels)], relation_names=["tiny_colour"], kinds=["state", "mlp"],
                        max_facts=2, n_draws=2, known="prefix")
    row = T._trace_row

    def state_only(lm_, name, kind, *a, **k):
        if kind != "state":
            raise RuntimeError("stopped")
        return row(lm_, name, kind, *a, **k)

    monkeypatch.setattr(T, "_trace_row", state_only)
    with pytest.raises(RuntimeError, match="stopped"):
        T.run_llm_trace(cfg, tmp_path / "t", lm=lm)
    kept = json.loads((tmp_path / "t" / "result.json").read_text())
    known = [i for i, ok in enumerate(T.knows(lm.tokenizer, torch.tensor(first), rel.objects, "prefix")) if ok]
    assert [r["kind"] for r in kept["per_relation"]] == ["state"] and kept["noise_facts"] == len(known) > 2
    monkeypatch.setattr(T, "_trace_row", row)
    screen = json.loads((tmp_path / "t" / T.SCREEN).read_text())
    i = known[-1]  # one known fact now answered with another object's first token
    screen["top1"]["tiny_colour"][i] = next(t for t in first if t != first[i])
    (tmp_path / "t" / T.SCREEN).write_text(json.dumps(screen))
    with pytest.raises(ValueError, match=rf"1 traced rows used the noise scale {kept['noise']:.6g} \(from "
                                         rf"{len(known)} known facts\).*now gives .* \(from {len(known) - 1}\)"):
        T.run_llm_trace(cfg, tmp_path / "t", lm=lm)
    assert json.loads((tmp_path / "t" / "result.json").read_text()) == kept  # nothing written at the other scale
    screen["top1"]["tiny_colour"][i] = first[i]  # the screen the row was traced on: the run resumes
    (tmp_path / "t" / T.SCREEN).write_text(json.dumps(screen))
    res = T.run_llm_trace(cfg, tmp_path / "t", lm=lm)
    assert [r["kind"] for r in res["per_relation"]] == ["state", "mlp"] and res["noise"] == kept["noise"]


@pytest.mark.slow
def test_trace_run_on_the_default_model_finds_the_published_pattern_and_resumes(tmp_path):
    """SmolLM2 on known capitals: restoring the last subject token's state works in early-middle layers and the
    last token's only late (Meng et al.'s pattern); with the MLPs at that token severed the early effect mostly
    goes (their MLP-severing result); a rerun reads everything back."""
    import json

    from mechfact.llm.trace import TraceConfig, run_llm_trace

    cfg = TraceConfig(relation_names=["country_capital"], kinds=["state", "severed_mlp"], max_facts=3, n_draws=5)
    res = run_llm_trace(cfg, tmp_path / "t")
    st = res["pooled"]["state"]
    subj = {r["layer"]: r["aie"] for r in st["aie"]["last_subject"]}
    last = {r["layer"]: r["aie"] for r in st["aie"]["last"]}
    sev = {r["layer"]: r["aie"] for r in res["pooled"]["severed_mlp"]["aie"]["last_subject"]}
    assert st["n_facts"] == 3 and st["total_effect"] > 0.2
    early = range(0, 9)
    assert min(subj[l] for l in early) > 0.3 * st["total_effect"]
    assert max(last[l] for l in early) < 0.05 and max(last[l] for l in range(24, 30)) > 0.3 * st["total_effect"]
    assert np.mean([sev[l] for l in early]) < 0.5 * np.mean([subj[l] for l in early])
    assert (tmp_path / "t" / "fig_trace.png").stat().st_size > 10_000
    before = (tmp_path / "t" / "result.json").read_text()
    again = run_llm_trace(cfg, tmp_path / "t")
    assert json.dumps(again, sort_keys=True) == json.dumps(json.loads(before), sort_keys=True)


def test_noise_scale_on_a_pretrained_architecture_reads_the_embedding_hook(tiny_llama):
    """The noise scale stops each prompt's run at the embedding: the same value as reading the full run's cache."""
    from mechfact import hooks
    from mechfact.llm.prompts import build_prompts
    from mechfact.llm.relations import load_relations
    from mechfact.probes import tracing

    lm, rels = tiny_llama
    ps = build_prompts(load_relations(rels, ["tiny_colour"])[0], lm.tokenizer, lm.bos_id, k=1, template=1, seed=0)[:4]
    toks = [torch.tensor(p.tokens) for p in ps]
    spans = [(p.subject_first, p.subject_last) for p in ps]
    want = []
    for t, (s0, s1) in zip(toks, spans):
        _, cache = lm.run_with_cache(t[None], names_filter=lambda n: n == hooks.embed())
        want.append(cache[hooks.embed()][0, s0:s1 + 1].reshape(-1))
    assert tracing.noise_scale(lm, toks, spans) == pytest.approx(3 * float(torch.cat(want).std()), rel=1e-6)


@pytest.mark.parametrize("model", ["llama", "gemma3"])
def test_suffix_runs_equal_full_runs_under_token_replacement(request, model, one_thread):
    """Replacement prompts differ from row to row before the restored token: each row reads its own prefix."""
    from mechfact.llm.prompts import build_prompts
    from mechfact.llm.relations import load_relations
    from mechfact.probes import tracing

    lm, rels = request.getfixturevalue(f"tiny_{model}")
    p = build_prompts(load_relations(rels, ["tiny_colour"])[0], lm.tokenizer, lm.bos_id, k=1, template=1, seed=0)[3]
    tokens = torch.tensor(p.tokens)
    s0, s1 = p.subject_first, p.subject_last
    g = torch.Generator().manual_seed(5)
    reps = tokens[None].repeat(3, 1)
    reps[:, s0:s1 + 1] = torch.randint(3, int(lm.W_U.shape[1]), (3, s1 - s0 + 1), generator=g)
    for kind, sever in (("state", None), ("mlp", None), ("state", "attn")):
        out = [tracing.trace_query(lm, tokens, (s0, s1), kind=kind, sever=sever, corruption="replace",
                                   metric="logit_diff", replacements=reps, window=2, batch_rows=9, suffix=sfx)
               for sfx in (True, False)]
        assert np.allclose(out[0].scores, out[1].scores, rtol=1e-5, atol=1e-6), (kind, sever)
        assert np.ptp(out[1].scores) > 1e-3  # the restorations move the score: the comparison has teeth


def test_fact_models_and_language_models_are_hooked_models(construction, tiny_llama):
    """The probe contract: both model kinds carry every attribute the probes use."""
    from mechfact.probes.protocols import HookedModel

    model, _ = construction
    lm, _ = tiny_llama
    for m in (model, lm):
        assert isinstance(m, HookedModel), type(m).__name__
        x = torch.zeros(2, m.W_U.shape[0])
        assert len(m.blocks) == m.n_layers and m.final_logits(x).shape == (2, m.W_U.shape[1])

    class NoFinalLogits:
        hook_dict, n_layers, blocks = {}, 1, []

        def run_with_cache(self, tokens, *a, **k): ...

        def run_with_hooks(self, tokens, *a, **k): ...
    assert not isinstance(NoFinalLogits(), HookedModel)


@pytest.mark.parametrize("kind,window", [("state", 1), ("mlp", 2)])
def test_the_benchmarks_flop_count_is_the_rows_the_suffix_runs_compute(tiny_llama, kind, window, one_thread):
    """``benchmarks/trace_bench.py`` bounds an exact tracer by the FLOP it counts: its token-block rows must be the
    rows the decoder blocks are handed (the clean and the corrupted runs aside), so a count that skips or invents
    work fails here."""
    import importlib.util

    from mechfact.llm.prompts import build_prompts
    from mechfact.llm.relations import load_relations
    from mechfact.probes import tracing
    from mechfact.probes.trace_suffix import _block_list

    spec = importlib.util.spec_from_file_location("trace_bench", Path(__file__).parents[1] / "benchmarks" /
                                                  "trace_bench.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    lm, rels = tiny_llama
    rel = load_relations(rels, ["tiny_colour"])[0]
    p = build_prompts(rel, lm.tokenizer, lm.bos_id, k=1, template=1, seed=0)[2]
    tokens, subject, draws = torch.tensor(p.tokens), (p.subject_first, p.subject_last), 3
    seen = []

    def count(module, args, kwargs):
        h = args[0] if args else kwargs["hidden_states"]
        seen.append(h.shape[0] * h.shape[1])
    handles = [b.register_forward_pre_hook(count, with_kwargs=True) for b in _block_list(lm)]
    try:
        tracing.trace_query(lm, tokens, subject, kind=kind, window=window, noise=3.0, n_draws=draws, batch_rows=6)
    finally:
        for h in handles:
            h.remove()
    L, n = lm.n_layers, len(tokens)
    layers = tracing.traced_layers(L, kind)
    rows, last, cells, idle = bench.trace_rows(n, subject, kind, window, L, layers)
    assert sum(seen) - L * n * (1 + draws) == draws * rows
    assert cells == (n - subject[0]) * len(layers) and idle == (n - subject[0] if kind == "state" else 0)
    assert 0 < last < rows

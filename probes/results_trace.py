"""Where models recall a fact: causal tracing on the packaged models and on fact models, beside the published
GPT-2 XL pattern, each published claim decided by a test stated before the run.

    python -m probes.results_trace --run --lre-data DIR [--models M ...]     # missing runs into runs/trace
    python -m probes.results_trace --run --lre-data DIR --resume-from docs/runs/trace   # continue the shipped runs
    python -m probes.results_trace --out runs/trace --export docs/runs/trace  # the run JSON, for a clone
    python -m probes.results_trace --out docs/runs/trace --doc docs/results_trace.md  # the page, from runs alone

What it runs, per packaged model (``mechfact llm models``; a model that is not installed is skipped), with the
arguments of :func:`trace_argv` (the page's configuration; ``DIR``: the LRE authors' ``data/`` folder):

* ``mechfact llm trace --kinds state mlp attn severed_mlp severed_attn mlp_w1 mlp_no0`` on ``SHIPPED_FACTUAL``
  and every factual file of ``DIR`` (zero-shot prompts, the facts whose top-1 token spells the object,
  ``MAX_FACTS`` per relation; Gaussian noise of 3 x the std of every known subject's embeddings, 10 draws)
  -> ``<out>/<model>/noise``;
* the same with ``--corruption replace --kinds state mlp`` (another subject of the same token length, 5 per
  fact) -> ``<out>/<model>/replace``;

and on fact models (:func:`mechfact.causal_trace` on a world): the explicit construction and a model trained in
the geometric regime, ``<out>/facts/<name>/result.json``. The tests of the published claims:
:mod:`mechfact.probes.trace_tests`.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

MODELS = ("smollm2-135m-instruct", "gemma3-270m", "qwen2.5-coder-0.5b-instruct")
RELATIONS = ("country_capital", "city_country", "company_country", "country_language", "element_symbol",
             "country_continent")
NOISE_KINDS = "state,mlp,attn,severed_mlp,severed_attn,mlp_w1,mlp_no0"
REPLACE_KINDS = "state,mlp"
# the shipped relations that state facts about the world (the linguistic ones left out), traced beside every factual
# file of the LRE authors' data
SHIPPED_FACTUAL = ("animal_class", "city_country", "company_country", "country_capital", "country_continent",
                   "country_language", "element_symbol", "fruit_color", "instrument_family", "occupation_workplace")
MAX_FACTS = 14  # known facts traced per relation (a seeded choice): >= 200 facts over >= 10 relations on SmolLM2
# Meng et al. (2022), GPT-2 XL (48 layers), 1000 known facts, Gaussian noise 3 sigma, window 10: clean 27.0%,
# corrupted 8.47%, total effect 18.6%; single-state AIE peak 8.7% at layer 15 on the last subject token; MLP
# window peak 6.6% near layer 17 on the last subject token; attention at the last token in later layers.
PUBLISHED = {"model": "GPT-2 XL (Meng et al. 2022)", "n_layers": 48, "clean": 0.270, "corrupt": 0.0847,
             "total_effect": 0.186, "state_last_subject": (15, 0.087), "mlp_last_subject": (17, 0.066),
             "attn_last": (32, None)}


def _read(path: Path):
    return json.loads(path.read_text()) if path.is_file() else None


def _installed(model: str) -> bool:
    from mechfact.llm.models.registry import status

    ok = {r["name"]: r["installed"] for r in status()}.get(model, False)
    if not ok:
        print(f"{model}: not installed; skipped (mechfact llm models shows its install line)", file=sys.stderr)
    return ok


def trace_argv(model: str, corruption: str, lre_data: str | Path, max_facts: int = MAX_FACTS,
               names: list[str] | None = None) -> list[str]:
    """The ``mechfact llm trace`` arguments of one of the page's runs (its configuration: a test holds the shipped
    runs' config equal to what these arguments make). ``names``: the relations (default :func:`trace_relations`
    of the data folder)."""
    kinds = NOISE_KINDS if corruption == "noise" else REPLACE_KINDS
    return ["--model", model, "--relations", "shipped", str(Path(lre_data) / "factual"), "--relation-names",
            *(trace_relations(lre_data) if names is None else names), "--kinds", *kinds.split(","),
            "--corruption", corruption, "--max-facts", str(max_facts), "--known", "spells"]


def trace_relations(lre_data: str | Path) -> list[str]:
    """The traced relations: the shipped factual relations and every factual file of the LRE authors' data."""
    from mechfact.llm.relations import load_relations

    lre = [r.name for r in load_relations(Path(lre_data) / "factual")]
    return list(SHIPPED_FACTUAL) + lre


def check_lre_data(lre_data) -> Path:
    """The LRE authors' data folder (with factual/), or SystemExit naming what is missing."""
    if lre_data is None or not (Path(lre_data) / "factual").is_dir():
        raise SystemExit(f"--lre-data {lre_data}: the traced relations include the LRE authors' factual files; pass "
                         "their data folder (github evandez/relations, data/, holding factual/)")
    return Path(lre_data)


def run(out: Path, models, max_facts: int = MAX_FACTS, lre_data=None, workers: int = 1) -> None:
    cli = [sys.executable, "-m", "mechfact.cli", "llm", "trace"]
    lre = check_lre_data(lre_data)
    for m in models:
        for corruption in ("noise", "replace"):
            folder = out / m / corruption
            if (folder / "meta.json").is_file():
                continue
            _share_screen(out / m / "noise", folder)
            ex = ["--executor", "ray", "--workers", str(workers)] if workers > 1 else []
            subprocess.run(cli + trace_argv(m, corruption, lre, max_facts) + ex + ["--threads", "1", "--quiet",
                                                                                  "--out", str(folder)], check=True)
    run_facts(out / "facts")


def _share_screen(src: Path, dst: Path) -> None:
    """The replace run screens the same prompts of the same model as the noise run: it starts from that screen
    (the run reads it only where the model and prompts match)."""
    from mechfact.llm.trace import SCREEN
    from mechfact.runs import atomic_path

    if src != dst and (src / SCREEN).is_file() and not (dst / SCREEN).exists():
        dst.mkdir(parents=True, exist_ok=True)
        with atomic_path(dst / SCREEN) as tmp:
            tmp.write_bytes((src / SCREEN).read_bytes())


def run_facts(out: Path) -> None:
    """The construction (N = 256, R = 4, bijections), a geometric-regime model (N = 256, R = 4, a pool of 16
    attributes: the world where that regime finds the geometric solution) and a default-regime model (cross-entropy,
    d = 64, the same pool world), every kind, noise (probability) and
    token replacement (logit difference: a squared-error model's probabilities stay near 1 / N)."""
    import mechfact
    from mechfact.facts.construct import construct
    from mechfact.facts.regimes import REGIMES
    from mechfact.facts.world import FactWorld
    from mechfact.runs import write_json_atomic

    worlds = {"construction": FactWorld(256, 4, seed=0), "geometric": FactWorld(256, 4, seed=0, attributes=16),
              "default": FactWorld(256, 4, seed=0, attributes=16)}
    build = {"construction": lambda w: construct(w)[0], "geometric": lambda w: REGIMES["geometric"].fit(w)[0],
             "default": lambda w: REGIMES["plain"].fit(w)[0]}
    for name, world in worlds.items():
        path = out / name / "result.json"
        if path.is_file():
            continue
        model = build[name](world)
        rows = []
        for corruption, metric in (("noise", "prob"), ("replace", "logit_diff")):
            for kind in ("state", "mlp", "attn"):
                res = mechfact.causal_trace(model, world, kind=kind, corruption=corruption, metric=metric, window=1,
                                            max_facts=200)
                rows.append({"kind": kind, "corruption": corruption, "metric": metric, "summary": res.summary()})
        write_json_atomic(path, {"model": name, "world": {"n_entities": 256, "n_relations": 4, "seed": 0,
                                                          "attributes": world.n_attributes
                                                          if hasattr(world, "n_attributes") else None},
                                 "rows": rows})


def _pct(x, ci=None) -> str:
    if x is None:
        return "—"
    s = f"{100 * x:.1f}%"
    return s if not ci or ci[0] is None else f"{s} [{100 * ci[0]:.1f}, {100 * ci[1]:.1f}]"


def _label(m: str) -> str:
    from mechfact.llm.models.registry import label

    return label(m)


def models_legend(models=MODELS) -> str:
    """One line per packaged model: its short name (as the page's tables print it) and what it is exactly."""
    from mechfact.llm.models.registry import MODELS as PACKAGED

    return "Models (short name: family, size, base / instruct, the GGUF quantisation its weights were dequantised " \
           "from, run in float32):\n\n" + "\n".join(f"- `{m}`: {_label(m)}; {PACKAGED[m].note}" for m in models) + "\n"


def _kinds(r: dict) -> dict:
    """The run's traces per kind (:class:`mechfact.probes.trace_tests.Traces`), on the facts every kind has."""
    from mechfact.probes.trace_tests import Traces

    rows = r.get("per_relation", [])
    kinds = list(dict.fromkeys(x["kind"] for x in rows if x.get("facts")))
    full = [n for n in dict.fromkeys(x["relation"] for x in rows)
            if all(any(x["relation"] == n and x["kind"] == k and x.get("facts") for x in rows) for k in kinds)]
    rows = [x for x in rows if x["relation"] in full]  # a partial run: the relations every kind has finished
    return {k: t for k in kinds if (t := Traces.from_rows(rows, k, r["n_layers"])) is not None}


def _analysis(out: Path, m: str, corruption: str) -> tuple[dict | None, dict, dict]:
    """(the run's result, its traces per kind, the pre-stated tests) of one model and corruption."""
    from mechfact.probes.trace_tests import decide

    r = _read(out / m / corruption / "result.json")
    if not r:
        return None, {}, {}
    kinds = _kinds(r)
    return r, kinds, (decide(kinds, r["n_layers"], seed=0) if kinds else {})


def _peak_cell(t, bucket: str, idx) -> str:
    from mechfact.probes.trace_tests import MIN_RELATIONS, peak

    p = peak(t, bucket, idx)
    layer = "emb" if p["layer"] == -1 else p["layer"]
    if len(set(t.relations)) < MIN_RELATIONS:
        return f"layer {layer} ({p['depth']:.2f}): {_pct(p['aie'])} (no interval: fewer than {MIN_RELATIONS} relations)"
    lo, hi = ("emb" if v == -1 else v for v in p["layer_ci"])
    return f"layer {layer} ({p['depth']:.2f}), layers [{lo}, {hi}] over draws: {_pct(p['aie'], p['aie_ci'])}"


KIND_NAMES = {"state": "state", "mlp": "mlp (window w)", "attn": "attn (window w)", "severed_mlp": "severed_mlp",
              "severed_attn": "severed_attn", "mlp_w1": "mlp (window 1)", "mlp_no0": "mlp (window w, MLP 0 excluded)"}


def _facts_of(r: dict, kind: str, relations) -> list[dict]:
    """The traced facts of ``kind`` in ``relations`` (the relations every kind has: :func:`_kinds`), in run order."""
    keep = set(relations)
    return [f for x in r["per_relation"] if x["kind"] == kind and x.get("facts") and x["relation"] in keep
            for f in x["facts"]]


def llm_table(out: Path) -> str:
    from mechfact.probes.trace_tests import draws

    rows = ["| model | corruption | kind | facts / relations | clean | corrupted | total effect [95%] | peak at the "
            "last subject token: layer (depth), 95% interval of the peak layer, AIE [95%] | peak at the last token "
            "(same) |", "|---|---|---|---|---|---|---|---|---|"]
    p = PUBLISHED
    rows.append(f"| {p['model']} | noise | state | 1000 | {_pct(p['clean'])} | {_pct(p['corrupt'])} | "
                f"{_pct(p['total_effect'])} | layer {p['state_last_subject'][0]} ({15 / 48:.2f}): "
                f"{_pct(p['state_last_subject'][1])} | later layers |")
    rows.append(f"| {p['model']} | noise | mlp (window 10) | 1000 | | | | layer {p['mlp_last_subject'][0]} "
                f"({17 / 48:.2f}): {_pct(p['mlp_last_subject'][1])} | |")
    for m in MODELS:
        for corruption in ("noise", "replace"):
            r, kinds, _ = _analysis(out, m, corruption)
            if not kinds:
                rows.append(f"| {_label(m)} | {corruption} | not run at this configuration | | | | | | |")
                continue
            done = "" if (out / m / corruption / "meta.json").is_file() else ", partial run"
            base = next(iter(kinds.values()))
            idx = draws(base.relations, seed=0)
            facts = _facts_of(r, "state", base.relations)
            clean, corrupt = (np.array([f[k] for f in facts]) for k in ("clean", "corrupt"))
            te = [float(np.mean((clean - corrupt)[i])) for i in idx]
            from mechfact.probes.trace_tests import MIN_RELATIONS, _interval

            te_ci = _interval(np.array(te)) if len(set(base.relations)) >= MIN_RELATIONS else None

            for kind, t in kinds.items():
                rows.append(f"| {_label(m)} ({r['n_layers']} layers{done}) | {corruption} | {KIND_NAMES[kind]} | "
                            f"{t.ie.shape[0]} / {len(set(t.relations))} | {_pct(clean.mean())} | "
                            f"{_pct(corrupt.mean())} | {_pct(float((clean - corrupt).mean()), te_ci)} "
                            f"| {_peak_cell(t, 'last_subject', idx)} | {_peak_cell(t, 'last', idx)} |")
    return "\n".join(rows)


def tests_table(out: Path) -> str:
    """Each GPT-2 XL claim as a test on each model's noise traces (the rules of
    :data:`mechfact.probes.trace_tests.RULES`, fixed before the runs)."""
    from mechfact.probes.trace_tests import MIN_RELATIONS, MLP0_RULE, RULES, VARIANTS

    rows = ["| claim (GPT-2 XL, Meng et al. 2022) | statistic | rule: holds when the 95% interval is | model | "
            "facts / relations | value [95%] | verdict |", "|---|---|---|---|---|---|---|"]
    tests = {m: _analysis(out, m, "noise")[2] for m in MODELS}  # every rule of a model from one set of draws
    for rule in (RULES[0], *VARIANTS.values(), MLP0_RULE, *RULES[1:]):
        name, claim, statistic, side, thr = rule
        where = f"inside [{thr[0]}, {thr[1]}]" if side == "inside" else f"above {thr}"
        for m in MODELS:
            x = tests[m].get(name)
            if x is None:
                continue
            ci = x["ci"]
            val = f"{x['value']:.2f}" + (f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci[0] is not None else
                                         f" (no interval: fewer than {MIN_RELATIONS} relations)")
            rows.append(f"| {claim} | {statistic} | {where} | {_label(m)} | {x['n_facts']} / {x['n_relations']} "
                        f"| {val} | {x['verdict']} |")
    return "\n".join(rows)


def corruptions(out: Path) -> str:
    """The last subject token's state peak under the two corruptions, each with its interval over draws, and per
    model with both runs the pre-stated test of :data:`mechfact.probes.trace_tests.CORRUPTION_RULE`."""
    from mechfact.probes.trace_tests import CORRUPTION_RULE, MIN_RELATIONS, compare_corruptions, draws, peak

    def name(layer: int):
        return "emb" if layer == -1 else layer

    lines, tests = [], []
    for m in MODELS:
        said, states = [], []
        for corruption in ("noise", "replace"):
            _, kinds, _ = _analysis(out, m, corruption)
            t = kinds.get("state")
            if t is None:
                continue
            states.append(t)
            p = peak(t, "last_subject", draws(t.relations, seed=0))
            n_rel = len(set(t.relations))
            spread = (f"no interval: fewer than {MIN_RELATIONS} relations" if n_rel < MIN_RELATIONS else
                      f"mode {name(p['mode'])}, 95% of draws in layers {name(p['layer_ci'][0])}-"
                      f"{name(p['layer_ci'][1])}")
            said.append(f"{corruption}: layer {name(p['layer'])} ({spread}; {t.ie.shape[0]} facts, {n_rel} "
                        f"relation{'s' if n_rel != 1 else ''})")
        if said:
            lines.append(f"- {_label(m)}: the last subject token's state peaks at " + "; ".join(said) + ".")
        if len(states) == 2:
            x = compare_corruptions(*states)
            ci = x["ci"]
            val = f"{x['value']:+.2f}" + (f" [{ci[0]:+.2f}, {ci[1]:+.2f}]" if ci[0] is not None else
                                          f" (no interval: fewer than {MIN_RELATIONS} shared relations)")
            tests.append(f"| {_label(m)} | {x['n_facts']['noise']} / {x['n_facts']['replace']} facts, "
                         f"{x['n_relations']} relations | layer {name(x['layers']['noise'])} / "
                         f"{name(x['layers']['replace'])} | {val} | {x['verdict']} |")
    _, claim, statistic, side, thr = CORRUPTION_RULE
    if tests:
        lines += ["", f"Test: {claim}. Statistic: {statistic}. Rule: holds when the interval lies {side} "
                  f"[{thr[0]}, {thr[1]}], does not when it lies wholly outside, else undecided. The rule was written "
                  "after SmolLM2-135M-Instruct's two peak layers were seen and before any other model's "
                  "replace traces ran.", "", "| model | noise / replace, shared | peak layer, noise / replace | "
                  "depth difference [95%] | verdict |", "|---|---|---|---|---|", *tests]
    return "\n".join(lines)


def counts_table(out: Path) -> str:
    rows = ["| model | relation | samples | top-1 a prefix of the object (the LRE rule) | top-1 spells the object "
            "(traced rule) | traced |", "|---|---|---|---|---|---|"]
    for m in MODELS:
        r = _read(out / m / "noise" / "result.json")
        seen = set()
        tot = [0, 0, 0, 0]
        for x in (r or {}).get("per_relation", []):
            if x["relation"] in seen:
                continue
            seen.add(x["relation"])
            n = [x["n_samples"], x.get("n_known_prefix", x["n_known"]), x.get("n_known_spells", x["n_known"]),
                 x["n_traced"]]
            tot = [a + b for a, b in zip(tot, n)]
            rows.append(f"| {_label(m)} | {x['relation']} | " + " | ".join(map(str, n)) + " |")
        if seen:
            rows.append(f"| {_label(m)} | all {len(seen)} | " + " | ".join(f"**{v}**" for v in tot) + " |")
    return "\n".join(rows)


def facts_table(out: Path) -> str:
    rows = ["| fact model | corruption (metric) | kind | facts | total effect | embedding, subject | layer 0, subject "
            "| layer 0, last token |", "|---|---|---|---|---|---|---|---|"]
    for name in ("construction", "geometric", "default"):
        r = _read(out / "facts" / name / "result.json")
        for x in (r or {}).get("rows", []):
            s = x["summary"]
            aie = {b: {row["layer"]: row["aie"] for row in s["aie"][b]} for b in ("last_subject", "last")}
            fmt = _pct if x.get("metric", "prob") == "prob" else (lambda v: "—" if v is None else f"{v:.2f}")
            rows.append(f"| {name} | {x['corruption']} ({x.get('metric', 'prob')}) | {x['kind']} | {s['n_facts']} | "
                        f"{fmt(s['total_effect'])} | {fmt(aie['last_subject'].get(-1))} | "
                        f"{fmt(aie['last_subject'].get(0))} | {fmt(aie['last'].get(0))} |")
    return "\n".join(rows)


DOC_HEAD = """# Where models recall a fact: causal tracing

This page is written by `python -m probes.results_trace --out docs/runs/trace --doc docs/results_trace.md` from
the run files under `docs/runs/trace` alone. `python -m probes.results_trace --run --lre-data DIR` makes the run
folders under `runs/trace` with the page's configuration as its defaults (DIR: the LRE authors' `data/` folder,
github evandez/relations); `--export docs/runs/trace` copies their JSON.

Protocol (Meng et al. 2022, "Locating and Editing Factual Associations in GPT"), on the shipped factual relations
and the LRE authors' factual files, zero-shot prompts:

- **Facts traced**: those whose top-1 token *spells* the object: the decoded token, stripped, is a prefix of the
  object that is the whole object or at least two characters long, and not a generic word (articles,
  prepositions: " the" before "the United States" does not count). The tracing authors trace facts whose
  prediction IS the attribute; the LRE authors' looser first-token prefix rule is counted beside it. At most
  `MAX_FACTS` known facts per relation, a seeded choice.
- **Noise**: Gaussian noise on the subject tokens' embeddings, scale 3 x ONE standard deviation measured over the
  subject-token embeddings of every known fact of the model (as the tracing authors), 10 draws per fact shared by
  every restoration; **replace**: the subject swapped for another of the same token length, 5 per fact (Zhang &
  Nanda, "Towards Best Practices of Activation Patching").
- **Restorations**: the residual state after a block (`state`; layer -1 / emb: the embedding); the MLP / attention
  outputs of a window of w layers (10 of 48 scaled to the depth); the MLP output of one layer (window 1); the
  window-w MLP restoration with MLP 0 never copied back (an effect that sits in MLP 0 alone -- the detokenising
  MLP under embedding noise -- vanishes there); `severed_*`: the state restored with the later MLP / attention
  outputs at that token held at their corrupted values. Metric: the probability of the clean top-1 token.
- **Intervals**: 95%, from one bootstrap that resamples RELATIONS (a relation's facts stay together; 2000 draws);
  every statistic of a model is computed on the same draws, so differences and ratios are paired. A peak is a
  distribution: the full-data peak layer (its depth), the 95% interval of the peak layer over draws, the peak's
  AIE with its interval (a best-of-layers value in every draw). A partial run counts the relations every kind has
  finished.
"""


def write_doc(out: Path, path: Path) -> None:
    from mechfact.probes.trace_tests import MIN_RELATIONS, early_layers
    from mechfact.runs import atomic_path

    head = DOC_HEAD.replace("`MAX_FACTS`", str(MAX_FACTS))
    parts = [head, "## Pretrained models beside GPT-2 XL\n", llm_table(out), "",
             "## Each published claim as a test\n",
             "Fixed before these runs' results existed (`mechfact.probes.trace_tests.RULES`; the thresholds are "
             "those the page stated before): each claim of the GPT-2 XL pattern, the "
             "statistic that decides it and the side of the threshold its 95% relation-clustered interval must lie "
             "on. **holds**: the whole interval on the claim's side; **does not**: wholly on the other side; "
             "**undecided**: the interval straddles the threshold. Early layers (severing): the first quarter of "
             f"the depth ({', '.join(f'{m}: 0-{early_layers(n)[-1]}' for m, n in _depths(out))}). Fewer than "
             f"{MIN_RELATIONS} relations: no interval. Every test run is listed, on every model with a noise "
             "run.\n", tests_table(out), "",
             "## The two corruptions\n", corruptions(out), "",
             "## Facts traced\n", counts_table(out), "",
             "## Fact models: where the construction stores and selects\n",
             "Window 1 (one layer). The construction puts each subject's attributes in its embedding, attention "
             "carries them to the last position, the MLP there selects: restoring the subject's embedding or the "
             "last position's attention / MLP output should bring the fact back, the subject's own output state "
             "(read by nothing in one layer) should not. The trained models (the geometric regime: squared error, "
             "L2, zero-init embeddings, d = 128; the default regime: cross-entropy, d = 64; both in the pool world "
             "of 16 attributes) show the same places; the squared-error model's probabilities stay near uniform, "
             "so its logit differences are the readable rows. In the default regime the last position's MLP "
             "restores only part of the effect: the attention output already carries some of the answer.\n",
             facts_table(out), ""]
    drawn = [m for m in MODELS if _noise(out, m)]
    if drawn:
        parts.append("The noise traces, one row per kind: the average indirect effect on the facts every kind has "
                     "traced (the facts the tables and tests pool), the last-subject-token and last-token curves "
                     f"with relation-clustered 95% bands (none below {MIN_RELATIONS} relations).\n")
    for m in drawn:
        parts.append(f"![{_label(m)}](img/trace_{m}.png)\n")
    with atomic_path(path) as tmp:
        tmp.write_text("\n".join(parts))


def _depths(out: Path) -> list[tuple[str, int]]:
    return [(_label(m), r["n_layers"]) for m in MODELS if (r := _noise(out, m))]


def _noise(out: Path, m: str) -> dict | None:
    """``m``'s noise run when it has traced a relation (a run stopped after its screening has not)."""
    r = _read(out / m / "noise" / "result.json")
    return r if r and r.get("per_relation") else None


def figure_input(r: dict) -> dict:
    """A noise run as :func:`mechfact.llm.plots.plot_trace` draws it for the page: per kind, every token bucket's
    curve on the facts every kind has (the facts the tables and tests pool), with the relation-clustered 95% band
    (none below the tests' minimum number of relations), and the total effect of those facts."""
    from mechfact.probes.trace_tests import MIN_RELATIONS, curve, draws, n_clusters
    from mechfact.probes.tracing import BUCKETS

    pooled = {}
    for kind, t in _kinds(r).items():
        idx = draws(t.relations, seed=0)
        few = n_clusters(t.relations) < MIN_RELATIONS
        facts = _facts_of(r, kind, t.relations)
        pooled[kind] = {"aie": {b: [{**c, "aie_ci": None} if few else c for c in curve(t, b, idx)]
                                for b in BUCKETS},
                        "n_facts": len(t.relations), "n_relations": n_clusters(t.relations),
                        "total_effect": float(np.mean([f["clean"] - f["corrupt"] for f in facts]))}
    return {"model": r.get("model"), "pooled": pooled}


def figures(out: Path, img: Path) -> None:
    from mechfact.llm.plots import plot_trace

    for m in MODELS:
        r = _noise(out, m)
        if r:
            plot_trace(figure_input(r), img / f"trace_{m}.png")


def main(argv=None) -> None:
    from probes import study
    from probes.families import export, resume_shipped

    ap = study.parser(__doc__.split("\n")[0], "runs/trace", "docs/results_trace.md", MODELS)
    ap.add_argument("--max-facts", type=int, default=MAX_FACTS,
                    help=f"known facts traced per relation (default {MAX_FACTS})")
    ap.add_argument("--lre-data", default=None, metavar="DIR",
                    help="with --run: the LRE authors' data folder (github evandez/relations, data/)")
    ap.add_argument("--workers", type=int, default=1, help="with --run: Ray workers per run (default 1: in process)")
    ap.add_argument("--resume-from", default=None, metavar="DIR",
                    help="with --run: first copy the exported runs in DIR (e.g. docs/runs/trace) that --out lacks, "
                         "their data folder rewritten to --lre-data, so a stopped run continues relation by relation")
    ap.add_argument("--img", default="docs/img")
    a = study.parse(ap, argv, MODELS)
    out = Path(a.out)
    if a.run:
        if a.resume_from:
            for f in resume_shipped(Path(a.resume_from), out, check_lre_data(a.lre_data)):
                print(f"{f}: resumed from {a.resume_from}", file=sys.stderr)
        run(out, [m for m in a.models if _installed(m)], a.max_facts, a.lre_data, a.workers)
    study.finish(a, export, write_doc, figures=lambda: figures(out, Path(a.img)),
                 tables=lambda: f"{llm_table(out)} \n\n {facts_table(out)}")

if __name__ == "__main__":
    main()

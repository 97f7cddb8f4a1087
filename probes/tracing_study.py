"""Where models recall a fact: causal tracing on the packaged models and on fact models, beside the published
GPT-2 XL pattern.

    python -m probes.tracing_study --run [--models smollm2-135m] [--max-facts 8]   # missing runs into runs/trace
    python -m probes.tracing_study --out runs/trace --export docs/runs/trace         # the run JSON, for a clone
    python -m probes.tracing_study --out docs/runs/trace --doc docs/results_trace.md  # the page, from runs alone

What it runs, per packaged model (``mechfact llm models``; a model that is not installed is skipped):

* ``mechfact llm trace --kinds state mlp attn severed_mlp severed_attn`` on the shipped relations of
  ``RELATIONS`` (zero-shot prompts, the known facts, ``--max-facts`` per relation; Gaussian noise of 3 x the
  subject embeddings' std, 10 draws) -> ``<out>/<model>/noise``;
* the same with ``--corruption replace --kinds state mlp`` (another subject of the same token length, 5 per
  fact) -> ``<out>/<model>/replace``;

and on fact models (:func:`mechfact.causal_trace` on a world): the explicit construction and a model trained in
the geometric regime, ``<out>/facts/<name>/result.json``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

MODELS = ("smollm2-135m", "gemma3-270m", "qwen2.5-0.5b")
RELATIONS = ("country_capital", "city_country", "company_country", "country_language", "element_symbol",
             "country_continent")
NOISE_KINDS = "state,mlp,attn,severed_mlp,severed_attn"
REPLACE_KINDS = "state,mlp"
# Meng et al. (2022), GPT-2 XL (48 layers), 1000 known facts, Gaussian noise 3 sigma, window 10: clean 27.0%,
# corrupted 8.47%, total effect 18.6%; single-state AIE peak 8.7% at layer 15 on the last subject token; MLP
# window peak 6.6% near layer 17 on the last subject token; attention at the last token in later layers.
PUBLISHED = {"model": "GPT-2 XL (Meng et al. 2022)", "n_layers": 48, "clean": 0.270, "corrupt": 0.0847,
             "total_effect": 0.186, "state_last_subject": (15, 0.087), "mlp_last_subject": (17, 0.066),
             "attn_last": (32, None)}


def _read(path: Path):
    return json.loads(path.read_text()) if path.is_file() else None


def _installed(model: str) -> bool:
    from mechfact.llm.registry import status

    ok = {r["name"]: r["installed"] for r in status()}.get(model, False)
    if not ok:
        print(f"{model}: not installed; skipped (mechfact llm models shows its install line)", file=sys.stderr)
    return ok


def run(out: Path, models, max_facts: int) -> None:
    cli = [sys.executable, "-m", "mechfact.cli", "llm", "trace"]
    for m in models:
        for corruption, kinds in (("noise", NOISE_KINDS), ("replace", REPLACE_KINDS)):
            folder = out / m / corruption
            if (folder / "meta.json").is_file():
                continue
            subprocess.run(cli + ["--model", m, "--relation-names", *RELATIONS, "--kinds", *kinds.split(","), "--corruption",
                                  corruption, "--max-facts", str(max_facts), "--threads", "1", "--quiet", "--out",
                                  str(folder)], check=True)
    run_facts(out / "facts")


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


def _peak(summary: dict, bucket: str, n_layers: int | None = None) -> str:
    p = summary.get(f"peak_{bucket}")
    if not p:
        return "—"
    layer = "emb" if p["layer"] == -1 else p["layer"]
    depth = f" ({max(p['layer'], 0) / n_layers:.2f} of the depth)" if n_layers else ""
    return f"layer {layer}{depth}: {_pct(p['aie'], p['aie_ci'])}"


def llm_table(out: Path) -> str:
    rows = ["| model | corruption | kind | facts | clean | corrupted | total effect [95%] | peak at the last subject "
            "token [95%] | peak at the last token [95%] |", "|---|---|---|---|---|---|---|---|---|"]
    p = PUBLISHED
    rows.append(f"| {p['model']} | noise | state | 1000 | {_pct(p['clean'])} | {_pct(p['corrupt'])} | "
                f"{_pct(p['total_effect'])} | layer {p['state_last_subject'][0]} ({15 / 48:.2f} of the depth): "
                f"{_pct(p['state_last_subject'][1])} | later layers |")
    rows.append(f"| {p['model']} | noise | mlp (window 10) | 1000 | | | | layer {p['mlp_last_subject'][0]} "
                f"({17 / 48:.2f} of the depth): {_pct(p['mlp_last_subject'][1])} | |")
    for m in MODELS:
        for corruption in ("noise", "replace"):
            r = _read(out / m / corruption / "result.json")
            if not r:
                rows.append(f"| {m} | {corruption} | not run | | | | | | |")
                continue
            done = "" if (out / m / corruption / "meta.json").is_file() else ", partial run"
            for kind, s in r.get("pooled", {}).items():
                rows.append(f"| {m} ({r['n_layers']} layers{done}) | {corruption} | {kind}"
                            f"{'' if kind.startswith(('state', 'severed')) else ' (window ' + str(r['window']) + ')'} "
                            f"| {s['n_facts']} | {_pct(s['clean'])} | {_pct(s['corrupt'])} | "
                            f"{_pct(s['total_effect'], s.get('total_effect_ci'))} | "
                            f"{_peak(s, 'last_subject', r['n_layers'])} | {_peak(s, 'last', r['n_layers'])} |")
    return "\n".join(rows)


def statements(out: Path) -> str:
    """Computed from the pooled curves: the early-layer effect at the last subject token restored alone and with
    that token's MLPs / attention severed (the published result: severing MLPs removes it, severing attention
    does not), and where the last token takes over."""
    lines = []
    for m in MODELS:
        r = _read(out / m / "noise" / "result.json")
        pooled = (r or {}).get("pooled", {})
        if "state" not in pooled:
            continue
        L = r["n_layers"]
        early = range(0, max(1, L // 4))

        def mean_early(kind):
            rows = {x["layer"]: x["aie"] for x in pooled[kind]["aie"]["last_subject"] if x["aie"] is not None}
            return sum(rows[l] for l in early if l in rows) / len(early)
        parts = [f"restored alone {100 * mean_early('state'):.1f}%"]
        for k in ("severed_mlp", "severed_attn"):
            if k in pooled:
                parts.append(f"with {k.split('_')[1].upper()} severed {100 * mean_early(k):.1f}% "
                             f"({pooled[k]['n_facts']} facts)")
        last = [x for x in pooled["state"]["aie"]["last"] if x["aie"] is not None]
        top = max(x["aie"] for x in last)
        handoff = next((x["layer"] for x in last if x["aie"] >= top / 2), None)
        lines.append(f"- {m}: mean indirect effect of the last subject token's state over layers 0-{early[-1]} "
                     f"({pooled['state']['n_facts']} facts): {', '.join(parts)}; the last token's state reaches half "
                     f"its peak at layer {handoff} of {L}.")
        rep = ((_read(out / m / "replace" / "result.json") or {}).get("pooled") or {}).get("state")
        if rep and rep.get("peak_last_subject") and pooled["state"].get("peak_last_subject"):
            a, b = pooled["state"]["peak_last_subject"], rep["peak_last_subject"]
            lines.append(f"- {m}, the two corruptions: the last subject token's state peaks at layer {a['layer']} "
                         f"({100 * a['aie']:.1f}%) under noise and at layer {b['layer']} ({100 * b['aie']:.1f}%) "
                         f"under token replacement ({rep['n_facts']} facts), total effects "
                         f"{100 * pooled['state']['total_effect']:.1f}% and {100 * rep['total_effect']:.1f}%.")
    return "\n".join(lines)


BUCKET_NAMES = {"first_subject": "first subject token", "middle_subject": "middle subject tokens",
                "last_subject": "last subject token", "first_after": "first token after the subject",
                "further": "further tokens", "last": "last token"}


def _strongest(summary: dict) -> tuple[str, dict]:
    """(bucket, its peak) of the token bucket whose best layer has the largest average indirect effect."""
    peaks = {b: summary[f"peak_{b}"] for b in BUCKET_NAMES if summary.get(f"peak_{b}")}
    b = max(peaks, key=lambda k: peaks[k]["aie"])
    return b, peaks[b]


def _early_mean(pooled: dict, kind: str, L: int) -> float:
    early = range(0, max(1, L // 4))
    rows = {x["layer"]: x["aie"] for x in pooled[kind]["aie"]["last_subject"] if x["aie"] is not None}
    return sum(rows[l] for l in early if l in rows) / len(early)


def comparison(out: Path) -> str:
    """Each model against the three parts of the published GPT-2 XL pattern, by stated rules: (1) the MLP effect
    is strongest at the last subject token, at an early-middle depth (0.15-0.55 of the depth; GPT-2 XL 0.35);
    (2) the attention effect is strongest at the last token, in the later half; (3) severing the last subject
    token's later MLPs removes most (> half) of its early-layer effect while severing attention keeps more than
    half of it."""
    lines = []
    for m in MODELS:
        r = _read(out / m / "noise" / "result.json")
        pooled = (r or {}).get("pooled", {})
        if not all(k in pooled for k in ("state", "mlp", "attn")):
            continue
        L = r["n_layers"]
        said = []
        b, pk = _strongest(pooled["mlp"])
        depth = max(pk["layer"], 0) / L
        where = "agrees" if b == "last_subject" else f"differs: strongest at the {BUCKET_NAMES[b]}"
        when = ("agrees" if 0.15 <= depth <= 0.55 else
                f"differs: {'earlier' if depth < 0.15 else 'later'} than early-middle")
        said.append(f"MLP: strongest at the {BUCKET_NAMES[b]}, layer {pk['layer']} ({depth:.2f} of the depth, "
                    f"{_pct(pk['aie'], pk['aie_ci'])}); place {where}; depth {when}")
        b, pk = _strongest(pooled["attn"])
        depth = max(pk["layer"], 0) / L
        ok = b == "last" and depth >= 0.5
        said.append(f"attention: strongest at the {BUCKET_NAMES[b]}, layer {pk['layer']} ({depth:.2f} of the depth, "
                    f"{_pct(pk['aie'], pk['aie_ci'])}); {'agrees' if ok else 'differs'}")
        if "severed_mlp" in pooled and "severed_attn" in pooled:
            alone, mlp, attn = (_early_mean(pooled, k, L) for k in ("state", "severed_mlp", "severed_attn"))
            ok_mlp, ok_attn = mlp < alone / 2, attn > alone / 2
            verdict = ("agrees" if ok_mlp and ok_attn else
                       "differs: severing attention removes it too" if ok_mlp else
                       "differs: severing the MLPs does not remove it")
            said.append(f"severing, early layers at the last subject token: {100 * alone:.1f}% alone, "
                        f"{100 * mlp:.1f}% with MLPs severed, {100 * attn:.1f}% with attention severed; {verdict}")
        lines.append(f"- {m} ({pooled['state']['n_facts']} facts): " + "; ".join(said) + ".")
    return "\n".join(lines)


def counts_table(out: Path) -> str:
    rows = ["| model | relation | samples | known (zero-shot) | traced |", "|---|---|---|---|---|"]
    for m in MODELS:
        r = _read(out / m / "noise" / "result.json")
        seen = set()
        for x in (r or {}).get("per_relation", []):
            if x["relation"] in seen:
                continue
            seen.add(x["relation"])
            rows.append(f"| {m} | {x['relation']} | {x['n_samples']} | {x['n_known']} | {x['n_traced']} |")
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

This page is written by `python -m probes.tracing_study --out docs/runs/trace --doc docs/results_trace.md` from
the run files under `docs/runs/trace` alone (`python -m probes.tracing_study --run` makes the run folders under
`runs/trace`; `--export docs/runs/trace` copies their JSON). Protocol (Meng et al. 2022, "Locating and Editing
Factual Associations in GPT"): zero-shot prompts of the facts a model knows (its top-1 token is a prefix of the
object); the subject tokens' embeddings corrupted by Gaussian noise of 3 x their standard deviation (10 draws
shared by every restoration), or the subject replaced by another of the same token length (Zhang & Nanda,
"Towards Best Practices of Activation Patching"); one clean piece restored per cell: the residual state after a
block (`state`; layer -1 / emb: the embedding), or the MLP / attention outputs of a window of layers (10 of 48
scaled to the depth); `severed_*`: the state restored with the later MLP / attention outputs at that token held
at their corrupted values. Metric: the probability of the clean top-1 token. Intervals: 95% bootstrap over facts.
A partial run pools, per kind, the facts of the relations it has finished (so the counts differ between kinds);
the peaks are the best layer of the average curve, with that layer's interval (a best-of-layers value).
"""


def write_doc(out: Path, path: Path) -> None:
    from mechfact.runs import atomic_path

    parts = [DOC_HEAD, "## Pretrained models beside GPT-2 XL\n", llm_table(out), "",
             "What the curves say (computed from them):\n", statements(out), "",
             "Beside the published pattern, by the rules of `comparison` in the page's script: (1) the MLP "
             "effect is strongest at the last subject token at an early-middle depth (0.15-0.55 of the depth; "
             "GPT-2 XL: layer 17 of 48, 0.35); (2) the attention effect is strongest at the last token in the "
             "later half; (3) severing the last subject token's later MLPs removes more than half of its "
             "early-layer effect while severing attention keeps more than half (Meng et al., Figure 3). The "
             "peaks are best-of-layers values.\n", comparison(out), "",
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
    for m in MODELS:
        if (out / m / "noise" / "result.json").is_file():
            parts.append(f"![{m}](img/trace_{m}.png)\n")
    with atomic_path(path) as tmp:
        tmp.write_text("\n".join(parts))


def figures(out: Path, img: Path) -> None:
    from mechfact.llm.plots import plot_trace

    for m in MODELS:
        r = _read(out / m / "noise" / "result.json")
        if r:
            plot_trace(r, img / f"trace_{m}.png")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="runs/trace")
    ap.add_argument("--run", action="store_true", help="run what is missing first")
    ap.add_argument("--models", nargs="+", default=list(MODELS))
    ap.add_argument("--max-facts", type=int, default=8, help="known facts traced per relation (default 8)")
    ap.add_argument("--export", default=None, metavar="DIR", help="copy the run JSON to DIR (e.g. docs/runs/trace)")
    ap.add_argument("--doc", default=None, metavar="MD", help="write the page there (e.g. docs/results_trace.md)")
    ap.add_argument("--img", default="docs/img")
    a = ap.parse_args(argv)
    out = Path(a.out)
    bad = [m for m in a.models if m not in MODELS]
    if bad:
        ap.error(f"--models {' '.join(bad)}: allowed {', '.join(MODELS)}")
    if a.run:
        run(out, [m for m in a.models if _installed(m)], a.max_facts)
    if a.export:
        from probes.families import export

        print(f"{export(out, Path(a.export))} files copied from {out} to {a.export}")
    if a.doc:
        write_doc(out, Path(a.doc))
        figures(out, Path(a.img))
        print(f"{a.doc} written from {out}")
    else:
        print(llm_table(out), "\n\n", facts_table(out))


if __name__ == "__main__":
    main()

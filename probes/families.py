"""The runs behind ``docs/results_llm.md``: three real model families side by side (readout, LRE in the authors'
protocol, superposition). The page and its command are :mod:`probes.results_llm`
(``python -m probes.results_llm --run --relations DIR`` runs what is missing); this module holds what runs, the
run-folder layout, the export and the status of each part.

``DIR`` is the LRE authors' data folder (github evandez/relations, ``data/``: ``factual/`` and ``linguistic/``).
What it runs, per packaged model (``mechfact llm models``; install lines in the README):

* ``mechfact llm probe --layers all --k-shot 3 --max-samples 40`` (the 14 shipped relations);
* ``mechfact llm lre --relations DIR/{factual,linguistic}``: the authors' protocol with its defaults (whole
  relation files, 8 trials, fixed beta 2.25, rank chosen on training facts) at the middle layer, the causality
  edits of factual files above ``LARGE_FILE`` facts capped at ``SWEEP_MAX_CAUSALITY`` per trial; a layer
  sweep (``--layers``; faithfulness and edit layers chosen on training facts) on the relations of ``SWEEP``, its
  causality edits capped at ``SWEEP_MAX_CAUSALITY`` per trial and layer (``--max-causality``); where
  ``PLANNED`` lists the model and part: faithfulness alone at 24 trials (``lre_trials24_<part>``), and the
  authors' edit-rank grid ``range(0, 320, 8)`` on the relations of ``SWEEP`` at the middle layer, with the same
  edits as the authors'-protocol run (``lre_ranks_<part>``);
* ``mechfact llm superposition`` on the shipped countries at every ``STRIDE``-th layer.

Run folders: ``runs/fam/<model>/{probe,lre_authors_<part>,lre_layers_<part>,lre_trials24_<part>,lre_ranks_<part>,
superposition}``.
Reruns skip finished runs (and a stopped run resumes relation by relation). Every number printed comes from
these run folders; a part split over several processes (``lre_authors_<part>_*``, each with its own
``--relation-names``) is read as one, and ``--run`` finishes it without running a relation twice, each relation
with the settings :func:`part_plan` gives it (:func:`part_jobs`).
"""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from pathlib import Path

from mechfact.llm.models.registry import MODELS as PACKAGED

MODELS = tuple(PACKAGED)  # every packaged model, in its record's order (mechfact.llm.models.registry)
PARTS = ("factual", "linguistic")  # folders of the LRE authors' data/ (github evandez/relations)
SWEEP = {"factual": ("country capital city", "person native language", "landmark on continent"),
         "linguistic": ("adjective comparative", "word first letter")}
# the layer sweep runs on every model (Qwen's: ~20 min a relation on one CPU core); the layers each model is
# run at are its record's analysis defaults (mechfact.llm.models.registry)
SWEEP_LAYERS = {m: ",".join(map(str, PACKAGED[m].defaults.sweep_layers)) for m in MODELS}
STRIDE = {m: ",".join(map(str, PACKAGED[m].defaults.superposition_layers)) for m in MODELS}
# Faithfulness-only runs at the paper's 24 trials (no edits: --max-causality 0), where every test fact's outcome
# is kept for the per-relation paired tests against the constants: (model, part)
TRIALS24 = (("smollm2-135m-instruct", "factual"),)
# The authors' edit-rank grid (range(0, 320, 8): 40 ranks, about 7x the default grid's edits) on the sweep's
# relations at the middle layer, with the authors'-protocol run's edits; on a CPU it fits SmolLM2: (model, part)
RANK_GRID = (("smollm2-135m-instruct", "factual"), ("smollm2-135m-instruct", "linguistic"))
PLANNED = {"trials24": TRIALS24, "ranks": RANK_GRID}  # LRE runs made on some (model, part) only
SWEEP_MAX_CAUSALITY = 64  # the sweep's edits per trial and layer: edits are most of its cost on a known relation
LRE_LAYER = {m: PACKAGED[m].defaults.lre_layer for m in MODELS}  # n_layers // 2, the default
# The authors' LRE faithfulness (recall@1, in-context prompt) per relation for GPT-J and LLaMA-13B, as stored in
# their repository evandez/relations, notebooks/figures/relation_order_{gptj,llama-13b}.json (commit 093c389),
# the data of their relation-wise faithfulness figure; LLaMA's president relations failed in their sweep (None).
PUBLISHED = {  # relation: (GPT-J, LLaMA-13B)
    "company CEO": (0.06, 0.02), "person father": (0.07, 0.02), "person mother": (0.14, 0.01),
    "pokemon evolution": (0.15, 0.07), "company hq": (0.21, 0.30), "superhero archnemesis": (0.30, 0.16),
    "product by company": (0.31, 0.59), "landmark in country": (0.36, 0.62), "star constellation name": (0.41, 0.08),
    "person sport position": (0.42, 0.64), "superhero person": (0.44, 0.31), "city in country": (0.44, 0.55),
    "person occupation": (0.49, 0.60), "food from country": (0.51, 0.71), "president election year": (0.52, None),
    "president birth year": (0.54, None), "landmark on continent": (0.56, 0.69), "word last letter": (0.57, 0.39),
    "country currency": (0.58, 0.32), "word first letter": (0.58, 0.85), "person plays instrument": (0.59, 0.41),
    "person lead singer of band": (0.64, 0.68), "person university": (0.64, 0.19),
    "person native language": (0.65, 0.88), "adjective antonym": (0.69, 0.45), "plays pro sport": (0.75, 0.84),
    "country capital city": (0.88, 0.65), "country language": (0.88, 0.88), "country largest city": (0.92, 0.58),
    "adjective superlative": (0.93, 0.83), "verb past tense": (0.95, 0.92), "adjective comparative": (0.98, 0.90),
}
COLORS = {"smollm2-135m-instruct": "tab:blue", "gemma3-270m": "tab:orange", "qwen2.5-coder-0.5b-instruct": "tab:green"}


def _read(path: Path):
    return json.loads(path.read_text()) if path.is_file() else None


def run(out: Path, data: Path) -> None:
    cli = [sys.executable, "-m", "mechfact.cli"]
    for m in MODELS:
        jobs = [(out / m / "probe", ["llm", "probe", "--model", m, "--layers", "all", "--k-shot", "3",
                                      "--max-samples", "40"])]
        for name in [*(f"lre_{k}_{p}" for k in ("authors", "layers") for p in PARTS),
                     *(f"lre_{k}_{p}" for k, runs in PLANNED.items() for mm, p in runs if mm == m)]:
            jobs += part_jobs(out, m, name, data)
        jobs.append((out / m / "superposition", ["llm", "superposition", "--model", m, "--layers", STRIDE[m]]))
        jobs.append((out / m / "superposition_words", ["llm", "superposition", "--model", m, "--layers", STRIDE[m],
                                                       "--prompt", "words"]))
        for folder, argv in jobs:
            if (folder / "meta.json").is_file() and not _stale_rows(folder, argv):
                continue
            subprocess.run(cli + argv + ["--threads", "1", "--quiet", "--out", str(folder)], check=True)


def _stale_rows(folder: Path, argv: list[str]) -> bool:
    """A finished superposition run whose rows an earlier version wrote: the command resumes it, recomputing
    those rows (the LRE and readout runs have no row format: finished is finished)."""
    from mechfact.llm.superposition_stats import ROW_FORMAT

    if argv[:2] != ["llm", "superposition"]:
        return False
    rows = (_read(folder / "result.json") or {}).get("per_layer", [])
    return any(r.get("format") != ROW_FORMAT for r in rows)


# LreConfig fields a split part's folder may set, and their flags (the rest must be at their defaults)
_LRE_FLAGS = {"relation_names": "--relation-names", "max_causality": "--max-causality", "n_trials": "--trials",
              "max_samples": "--max-samples", "max_test": "--max-test", "n_train": "--n-train", "beta": "--beta",
              "layer": "--layer", "layers": "--layers", "ranks": "--ranks", "k_shot": "--k-shot",
              "template": "--template", "facts": "--facts"}
LARGE_FILE = 100  # facts: a factual relation file above this has its causality edits capped (authors' protocol)


def authors_cap(part: str, n_facts: int) -> int | None:
    """The causality edits per trial of one relation in the page's authors'-protocol run: all (None), except in a
    factual file of more than ``LARGE_FILE`` facts, capped at ``SWEEP_MAX_CAUSALITY`` (its edits are most of its
    cost on a CPU; the cap is printed beside the relation's causality)."""
    return SWEEP_MAX_CAUSALITY if part == "factual" and n_facts > LARGE_FILE else None


def pages_row(name: str, row: dict) -> bool:
    """Whether a row of the LRE run ``name`` was made with the page's settings for its relation: an
    authors'-protocol or rank-grid row with the causality cap :func:`authors_cap` gives it (other runs: every
    row)."""
    kind, _, part = name.removeprefix("lre_").partition("_")
    return kind not in ("authors", "ranks") or row.get("max_causality") == authors_cap(part, row["n_samples"])


def _lre_args(folder: Path) -> list[str]:
    """The ``mechfact llm lre`` flags (beyond --model, --relations, --out) that rebuild ``folder``'s config."""
    from mechfact.llm.lre import LreConfig

    cfg, default = (_read(folder / "config.json") or {}).get("config") or {}, LreConfig().to_dict()
    args = []
    for k, v in cfg.items():
        if k in ("model", "relations") or v == default.get(k, v):
            continue
        if k not in _LRE_FLAGS:
            raise ValueError(f"{folder}: config field {k} = {v!r} has no flag here; resume it by hand")
        vals = v if k == "relation_names" else [",".join(map(str, v))] if isinstance(v, list) else [str(v)]
        args += [_LRE_FLAGS[k], *vals]
    return args


def _flags(args: list[str]) -> dict[str, tuple[str, ...]]:
    """``--flag value ...`` as {flag: values}, without ``--relation-names``: a run's settings for each relation."""
    out, flag = {}, None
    for a in args:
        if a.startswith("--"):
            flag = a
            out[flag] = ()
        else:
            out[flag] += (a,)
    out.pop("--relation-names", None)
    return out


def part_plan(m: str, name: str, data: Path) -> dict[str, tuple[str, list[str]]]:
    """The page's configuration of the LRE run ``name`` (``lre_authors_<part>``, ``lre_layers_<part>``,
    ``lre_trials24_<part>``, ``lre_ranks_<part>``) of model ``m``, relation by relation: relation -> (label of the
    folder it runs in when the part is split, its ``mechfact llm lre`` flags beyond --model, --relations,
    --relation-names)."""
    kind, _, part = name.removeprefix("lre_").partition("_")
    if part not in PARTS or kind not in ("authors", "layers", *PLANNED):
        raise ValueError(f"{name}: not an LRE run of the page; allowed: lre_authors_<part>, lre_layers_<part>, "
                         f"lre_trials24_<part>, lre_ranks_<part> with <part> one of {', '.join(PARTS)}")
    sizes = _file_sizes(str(data / part))
    if kind == "authors":
        caps = {n: authors_cap(part, k) for n, k in sizes.items()}
        return {n: ("capped", ["--max-causality", str(c)]) if c is not None else ("", []) for n, c in caps.items()}
    if kind == "layers":
        return {n: ("", ["--layers", SWEEP_LAYERS[m], "--max-causality", str(SWEEP_MAX_CAUSALITY)])
                for n in SWEEP[part]}
    if kind == "ranks":  # the same edits as the authors'-protocol run, on the authors' rank grid
        from mechfact.llm.lre.protocol_authors import AUTHORS_RANKS

        grid = ["--ranks", ",".join(map(str, AUTHORS_RANKS))]
        return {n: ("capped", [*grid, "--max-causality", str(c)]) if c is not None else ("", grid)
                for n, c in ((n, authors_cap(part, sizes[n])) for n in SWEEP[part])}
    return {n: ("", ["--trials", "24", "--max-causality", "0"]) for n in sizes}


@functools.lru_cache(maxsize=None)
def _file_sizes(folder: str) -> dict[str, int]:
    """Each relation file of the data folder ``folder``: its relation's name and number of facts (read once per
    process: the plan and the jobs of every model and part ask for it)."""
    from mechfact.llm.relations import load_relations

    return {r.name: len(r.samples) for r in load_relations(folder)}


def part_jobs(out: Path, m: str, name: str, data: Path) -> list[tuple[Path, list[str]]]:
    """The runs that make model ``m``'s LRE run ``name`` as :func:`part_plan` says, relation by relation.

    From nothing: one folder ``name`` (the plain command where every relation takes the same flags), or one per
    label (``name`` and ``name_capped``, each with its ``--relation-names``). A part split over several folders
    (as the shipped runs are, processes started by hand) is finished without running a relation twice: a relation
    counts as done where a folder holds its row and that folder's settings are the plan's for it (a row made
    otherwise is not the page's and runs again); an unfinished folder resumes with its own config when every
    relation it still asks for takes its settings and no other folder holds or will run it; what is left goes to
    new folders (``name_2``, ``name_capped2``, ...)."""
    plan, part = part_plan(m, name, data), name.removeprefix("lre_").split("_", 1)[1]
    whole = list(_file_sizes(str(data / part)))
    base = out / m / name
    lre = ["llm", "lre", "--model", m, "--relations", str(data / part)]
    folders = [f for f in [base, *sorted((out / m).glob(f"{name}_*"))] if (f / "config.json").is_file()]
    flags = {f: _flags(_lre_args(f)) for f in folders}
    rows = {f: {x["relation"] for x in (_read(f / "result.json") or {}).get("per_relation", [])} for f in folders}
    held = {r for f in folders for r in rows[f] if r in plan and flags[f] == _flags(plan[r][1])}
    jobs, coming = [], set()
    for f in folders:
        if (f / "meta.json").is_file():
            continue
        asked = ((_read(f / "config.json") or {}).get("config") or {}).get("relation_names") or whole
        left = set(asked) - rows[f]
        if left and all(r in plan and flags[f] == _flags(plan[r][1]) for r in left) and not left & (held | coming):
            jobs.append((f, lre + _lre_args(f)))
            coming |= left
    missing = [r for r in plan if r not in held | coming]
    groups: dict[tuple, list[str]] = {}
    for r in missing:
        groups.setdefault((plan[r][0], tuple(plan[r][1])), []).append(r)
    for (label, args), names in groups.items():
        stem = f"{name}_{label}" if label else name
        folder, k = out / m / stem, 2
        while (folder / "config.json").is_file():
            folder, k = out / m / (f"{stem}{k}" if label else f"{stem}_{k}"), k + 1
        every = not folders and names == whole  # the plain command: every relation of the data folder
        jobs.append((folder, lre + ([] if every else ["--relation-names", *names]) + list(args)))
    return jobs


# .elapsed.json: an unfinished run's time; screen.json: a trace's screening (a resumed trace reads it back)
RUN_FILES = ("config.json", "result.json", "meta.json", ".elapsed.json", "screen.json")
DATA_NAME = "evandez-relations/data"  # what an exported config says in place of this machine's data folder


def _portable(x, roots: set[str]):
    """``x`` with every string naming a relations data folder (a ``roots`` path) rewritten to ``DATA_NAME/...``."""
    if isinstance(x, dict):
        return {k: _portable(v, roots) for k, v in x.items()}
    if isinstance(x, list):
        return [_portable(v, roots) for v in x]
    if isinstance(x, str) and x in roots:
        return f"{DATA_NAME}/{Path(x).name}"
    return x


def export(out: Path, dest: Path) -> int:
    """Copies every run folder's JSON files (not figures or caches) and its trial checkpoints (a relation stopped
    part way) from ``out`` to ``dest`` with the same layout,
    the relations data paths in configs written as ``DATA_NAME/<part>``: the numbers a clone rebuilds the page
    from. Returns the number of files written."""
    from mechfact.runs import atomic_path

    n = 0
    for folder in sorted(p for p in out.glob("*/*") if (p / "result.json").is_file()):
        cfg = _read(folder / "config.json") or {}
        rel = (cfg.get("config", cfg) or {}).get("relations")
        rels = rel if isinstance(rel, list) else [rel]  # one source, or several (trace: shipped + a data folder)
        roots = {r for r in rels if isinstance(r, str) and Path(r).name in PARTS}
        for name in RUN_FILES:
            if (folder / name).is_file():
                target = dest / folder.relative_to(out) / name
                target.parent.mkdir(parents=True, exist_ok=True)
                with atomic_path(target) as tmp:
                    tmp.write_text(json.dumps(_portable(_read(folder / name), roots), indent=1) + "\n")
                n += 1
        n += _copy_trials(folder, dest / folder.relative_to(out))
    return n


def _copy_trials(src: Path, dst: Path) -> int:
    """Copies a run's trial checkpoints (``trials/*.npz``: a relation stopped part way, kept trial by trial) and
    drops those ``src`` no longer has (the relation finished); returns the number copied."""
    from mechfact.llm.lre import TRIALS_DIR
    from mechfact.runs import atomic_path

    have = {f.name: f for f in sorted((src / TRIALS_DIR).glob("*.npz"))}
    for old in (dst / TRIALS_DIR).glob("*.npz"):
        if old.name not in have:
            old.unlink()
    for name, f in have.items():
        with atomic_path(dst / TRIALS_DIR / name) as tmp:
            tmp.write_bytes(f.read_bytes())
    if (dst / TRIALS_DIR).is_dir() and not have:
        (dst / TRIALS_DIR).rmdir()
    return len(have)


def resume_shipped(shipped: Path, out: Path, data: Path) -> list[str]:
    """Copies the run folders of ``shipped`` (written by :func:`export`, e.g. docs/runs/fam) that ``out`` lacks
    into ``out``, each ``DATA_NAME/<part>`` written back as ``data/<part>`` and each result's config hash
    recomputed for the config that now names ``data``: the configs are otherwise the shipped ones, so ``--run``
    then skips the shipped finished runs and continues a stopped one relation by relation, instead of starting
    over. Folders already in ``out`` are left as they are. Returns the folders copied (``<model>/<run>``)."""
    from mechfact.runs import config_sha256, write_json_atomic

    def local(x):
        if isinstance(x, dict):
            return {k: local(v) for k, v in x.items()}
        if isinstance(x, list):
            return [local(v) for v in x]
        if isinstance(x, str) and x.startswith(DATA_NAME + "/") and x[len(DATA_NAME) + 1:] in PARTS:
            return str(data / x[len(DATA_NAME) + 1:])
        return x

    copied = []
    for folder in sorted(p for p in shipped.glob("*/*") if (p / "result.json").is_file()):
        target = out / folder.relative_to(shipped)
        if target.exists():
            continue
        files = {name: local(_read(folder / name)) for name in RUN_FILES if (folder / name).is_file()}
        if "config.json" in files and isinstance(files["result.json"], dict) \
                and "config_sha256" in files["result.json"]:
            files["result.json"]["config_sha256"] = config_sha256(files["config.json"])
        _copy_trials(folder, target)  # a relation stopped part way resumes at its next trial
        for name, value in files.items():  # result.json last: a folder with it is a run (see the glob above)
            if name != "result.json":
                write_json_atomic(target / name, value)
        write_json_atomic(target / "result.json", files["result.json"])
        copied.append(str(folder.relative_to(shipped)))
    return copied


SUPERPOSITION_RUNS = {"superposition": "the subject alone after BOS", "superposition_words":
                      "'Some facts about {subject}'"}


def _relation_names(folder: Path) -> set[str]:
    """The relations a run folder holds or was asked for (its config's ``relation_names``)."""
    names = {x["relation"] for x in (_read(folder / "result.json") or {}).get("per_relation", [])}
    asked = ((_read(folder / "config.json") or {}).get("config") or {}).get("relation_names") or []
    return names | set(asked)


def _part_folders(out: Path, m: str, name: str) -> list[Path]:
    siblings = sorted((out / m).glob(f"{name}_*")) if name.startswith("lre_") else []
    return [f for f in [out / m / name, *siblings] if (f / "result.json").is_file()]


def _part_status(out: Path, m: str, name: str) -> str:
    """finished / partial / not run, over the folder and its ``<name>_*`` siblings (a part split over several
    processes); LRE parts say how many relations their folders hold, of all those any model's folders of the part
    hold or were asked for."""
    folders = _part_folders(out, m, name)
    if not folders:
        return "not run"
    done = all((f / "meta.json").is_file() for f in folders)
    state = "finished" if done else "partial (stopped or running; rerun --run to resume)"
    kept = _kept(folders) if name.startswith("lre_") else []  # relations kept part way: (name, done, asked)
    aside = 0  # authors'-protocol rows made with another causality cap than the page's (not read)
    if name.startswith("lre_"):
        rels = []
        for f in folders:
            xs = (_read(f / "result.json") or {}).get("per_relation", [])
            ok = [x for x in xs if pages_row(name, x)]
            rels.append([x["relation"] for x in ok])
            aside += len(xs) - len(ok)
        n, held = sum(map(len, rels)), set().union(*map(set, rels))
        every = set().union(*[_relation_names(f) for mm in MODELS for f in _part_folders(out, mm, name)],
                            [rel for rel, _, _ in kept])  # a relation kept part way has not finished
        if name.startswith("lre_trials24_"):  # its part's relations: those of the part's full runs
            part = name.removeprefix("lre_trials24_")
            every |= set().union(*[_relation_names(f) for mm in MODELS
                                   for f in _part_folders(out, mm, f"lre_authors_{part}")])
        if len(held) >= len(every) and not done:  # a stopped folder whose relations left ran in another
            stopped = sum(not (f / "meta.json").is_file() for f in folders)
            state = (f"finished ({stopped} folder stopped early, what it left ran in another)" if stopped == 1 else
                     f"finished ({stopped} folders stopped early, what they left ran in others)")
        if n < len(every):
            state = (f"{state}, {n} of {len(every)} relations" if not done
                     else f"{n} of {len(every)} relations (the rest not run)")
        else:
            state += f", {n} relations"
    return (state + (f", {len(folders)} folders" if len(folders) > 1 else "")
            + (f"; {aside} row{'s' * (aside != 1)} made with another causality cap not read" if aside else "")
            + "".join(f"; {rel} at {k} of {t} trials" for rel, k, t in kept))


def _kept(folders: list[Path]) -> list[tuple[str, int, int]]:
    """(relation, finished trials, trials asked for) of each relation the folders keep part way (its trial
    checkpoint; an unreadable one left out)."""
    from mechfact.llm.lre import TRIALS_DIR
    from mechfact.llm.lre.protocol_authors import trials_kept

    kept = [trials_kept(f) for folder in folders for f in sorted((folder / TRIALS_DIR).glob("*.npz"))]
    return [k for k in kept if k is not None]


def runs_status(out: Path) -> str:
    """Which run folders exist: every table below says what it rests on."""
    some = {f"lre_{k}_{p}": {m for m, pp in runs if pp == p} for k, runs in PLANNED.items() for _, p in runs}
    names = ["probe", *[f"lre_authors_{p}" for p in PARTS], *[f"lre_layers_{p}" for p in PARTS], *some,
             *SUPERPOSITION_RUNS]
    rows = ["| run | " + " | ".join(MODELS) + " |", "|---|" + "---|" * len(MODELS)]
    for n in names:
        planned = some.get(n, MODELS)
        rows.append(f"| {n} | " + " | ".join(_part_status(out, m, n) if m in planned else "not planned"
                                             for m in MODELS) + " |")
    return "\n".join(rows)

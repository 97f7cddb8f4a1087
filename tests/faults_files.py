"""Fault cases: damaged files mechfact reads (issue: nothing a user does corrupts a run or ends in a traceback).

Every file mechfact reads is checked: a damaged one is one line ``<path>: <what is wrong>; <what to do>`` with exit 2,
and a damaged CACHE entry is rebuilt (exit 0, the same numbers as a clean run). Groups:

* model files -- a Hugging Face model folder (a copy of the tiny Llama) or a ``.gguf`` file with one file damaged;
* run files -- a fact-model run directory (``facts train``) or a finished run with one file damaged;
* caches -- the hidden-state cache under ``$MECHFACT_CACHE`` damaged between two runs;
* data files -- relation files that are malformed in ways a user can write.

Setups never touch the shared assets: they copy the tiny model / the shared fact run into ``{tmp}`` first.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from contextlib import contextmanager
from pathlib import Path

from faults_common import Case, read, write

CACHE_ENV = {"MECHFACT_CACHE": "{tmp}/cache"}

# the smallest fact-model run that still has every file of one (well under a second of training)
FACT_TRAIN = ["facts", "train", "--subjects", "8", "--relations", "2", "--d", "4", "--mlp-width", "8", "--steps", "10",
              "--eval-every", "5", "--device", "cpu", "--quiet"]
LLM_PROBE = ["llm", "probe", "--relations", "{relations}", "--layers", "1", "--k-shot", "1", "--splits", "1",
             "--device", "cpu", "--quiet"]


def _llm_probe(model: str = "{tmp}/model", out: str = "{out}", *extra: str) -> list[str]:
    return [*LLM_PROBE, "--model", model, "--out", out, *extra]


# ---- helpers of the setups ---------------------------------------------------------------------------

def _truncate(path: Path | str, keep: float = 0.5) -> None:
    data = Path(path).read_bytes()
    Path(path).write_bytes(data[: int(len(data) * keep)])


def _edit_json(path: Path | str, **changes) -> None:
    data = json.loads(Path(path).read_text())
    data.update(changes)
    Path(path).write_text(json.dumps(data))


def _model(p: dict) -> Path:
    """A private copy of the tiny model in {tmp}/model (the shared one is never touched)."""
    dest = Path(p["tmp"]) / "model"
    if not dest.exists():
        shutil.copytree(p["model"], dest)
    return dest


@contextmanager
def _cache_env(p: dict):
    """MECHFACT_CACHE pointed at {tmp}/cache while a setup runs a command (restored after)."""
    old = os.environ.get("MECHFACT_CACHE")
    os.environ["MECHFACT_CACHE"] = str(Path(p["tmp"]) / "cache")
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("MECHFACT_CACHE", None)
        else:
            os.environ["MECHFACT_CACHE"] = old


def _cli(argv: list[str], p: dict) -> None:
    from mechfact.cli import main

    with _cache_env(p):
        rc = main([a.format(**p) for a in argv])
    assert rc == 0, f"setup command failed ({rc}): {argv}"


def _fact_base(p: dict) -> Path:
    """The shared tiny fact run (trained once next to the shared assets; written by one rename)."""
    base = Path(p["model"]).parent / "fact_run"
    if not (base / "result.json").is_file():
        import tempfile

        tmp = Path(tempfile.mkdtemp(dir=base.parent, prefix=".fact_run."))
        _cli([*FACT_TRAIN, "--out", str(tmp / "run")], p)
        try:
            os.replace(tmp / "run", base)
        except OSError:  # another process trained it first
            pass
        shutil.rmtree(tmp, ignore_errors=True)
    return base


def _fact_run(p: dict) -> Path:
    """A private copy of the shared fact run in {tmp}/run."""
    dest = Path(p["tmp"]) / "run"
    if not dest.exists():
        shutil.copytree(_fact_base(p), dest, ignore=shutil.ignore_patterns(".lock"))
    return dest


def _digests(folder: Path, skip: str) -> dict[str, str]:
    return {str(f.relative_to(folder)): hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(folder.rglob("*"))
            if f.is_file() and f.name != ".lock" and str(f.relative_to(folder)) != skip}


def _snapshot(p: dict, folder: Path, damaged: str) -> None:
    """Remember every file of ``folder`` but the damaged one (checked untouched after the command)."""
    write(Path(p["tmp"]) / "snapshot.json", json.dumps({"folder": str(folder), "damaged": damaged,
                                                        "files": _digests(folder, damaged)}))


def _untouched(p: dict) -> None:
    snap = read(Path(p["tmp"]) / "snapshot.json")
    now = _digests(Path(snap["folder"]), snap["damaged"])
    assert now == snap["files"], f"files changed or appeared: {sorted(set(now.items()) ^ set(snap['files'].items()))}"


# ---- model files ---------------------------------------------------------------------------------------

def _damage_model(name: str, how):
    def setup(p: dict) -> None:
        how(_model(p) / name)
    return setup


def _weights_to_bin(p: dict) -> None:
    """The tiny model with its weights as a truncated pytorch_model.bin instead of model.safetensors."""
    import torch
    from safetensors.torch import load_file

    m = _model(p)
    state = load_file(str(m / "model.safetensors"))
    (m / "model.safetensors").unlink()
    torch.save(state, m / "pytorch_model.bin")
    _truncate(m / "pytorch_model.bin")


def _missing_shard(p: dict) -> None:
    m = _model(p)
    (m / "model.safetensors").rename(m / "model-00001-of-00002.safetensors")
    weight_map = {"model.embed_tokens.weight": "model-00001-of-00002.safetensors",
                  "lm_head.weight": "model-00002-of-00002.safetensors"}
    write(m / "model.safetensors.index.json", json.dumps({"metadata": {}, "weight_map": weight_map}))


def _no_tokenizer(p: dict) -> None:
    m = _model(p)
    for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (m / f).unlink(missing_ok=True)


def _gguf(p: dict, keep: float | None = None) -> Path:
    """A small file in the GGUF format (header, metadata, one tensor), optionally truncated."""
    import gguf
    import numpy as np

    path = Path(p["tmp"]) / "model.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.arange(16 * 8, dtype=np.float32).reshape(16, 8))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    if keep is not None:
        _truncate(path, keep)
    return path


MODEL_CASES = [
    Case("truncated model.safetensors in a model folder (llm probe)", _llm_probe(), 2, "model.safetensors: truncated",
         _damage_model("model.safetensors", _truncate)),
    Case("truncated model.safetensors in a model folder (llm lre)",
         ["llm", "lre", "--model", "{tmp}/model", "--relations", "{relations}", "--layer", "1", "--device", "cpu",
          "--out", "{out}", "--quiet"], 2, "model.safetensors: truncated",
         _damage_model("model.safetensors", _truncate)),
    Case("truncated model.safetensors in a model folder (probe readout)",
         ["probe", "readout", "--model", "{tmp}/model", "--relations", "{relations}", "--layers", "1",
          "--device", "cpu", "--out", "{out}", "--quiet"], 2, "model.safetensors: truncated",
         _damage_model("model.safetensors", _truncate)),
    Case("empty model.safetensors", _llm_probe(), 2, "model.safetensors: empty",
         _damage_model("model.safetensors", lambda f: f.write_bytes(b""))),
    Case("model.safetensors replaced by random bytes", _llm_probe(), 2, "model.safetensors: not a safetensors file",
         _damage_model("model.safetensors", lambda f: f.write_bytes(os.urandom(4096)))),
    Case("model.safetensors with bytes appended", _llm_probe(), 2, "model.safetensors: longer than its tensors",
         _damage_model("model.safetensors", lambda f: f.write_bytes(f.read_bytes() + b"\0" * 100))),
    Case("model folder without its weights", _llm_probe(), 2, "no weights (model.safetensors or pytorch_model.bin)",
         _damage_model("model.safetensors", lambda f: f.unlink())),
    Case("sharded model whose index names a missing shard", _llm_probe(), 2,
         "shard model-00002-of-00002.safetensors listed in model.safetensors.index.json is missing", _missing_shard),
    Case("truncated pytorch_model.bin", _llm_probe(), 2, "pytorch_model.bin: truncated or damaged PyTorch checkpoint",
         _weights_to_bin),
    Case("model config.json is {}", _llm_probe(), 2, "config.json: no 'model_type'",
         _damage_model("config.json", lambda f: f.write_text("{}"))),
    Case("model config.json is []", _llm_probe(), 2, "config.json: a JSON list",
         _damage_model("config.json", lambda f: f.write_text("[]"))),
    Case("truncated model config.json", _llm_probe(), 2, "config.json: not valid JSON",
         _damage_model("config.json", _truncate)),
    Case("model config.json with a wrongly typed value", _llm_probe(), 2, "config.json: not a usable model config",
         _damage_model("config.json", lambda f: _edit_json(f, num_hidden_layers="three"))),
    Case("model config.json that does not match the weights", _llm_probe(), 2,
         "the weights do not match config.json", _damage_model("config.json", lambda f: _edit_json(f, hidden_size=64))),
    Case("model folder without config.json", _llm_probe(), 2, "nor a Hugging Face model folder (config.json)",
         _damage_model("config.json", lambda f: f.unlink())),
    Case("model folder without tokenizer files", _llm_probe(), 2, "no tokenizer", _no_tokenizer),
    Case("truncated tokenizer.json", _llm_probe(), 2, "tokenizer.json: not valid JSON",
         _damage_model("tokenizer.json", _truncate)),
    Case("tokenizer.json that is not a tokenizer", _llm_probe(), 2, "tokenizer.json: not a readable tokenizer",
         _damage_model("tokenizer.json", lambda f: f.write_text('{"version": "1.0"}'))),
    Case("tokenizer_config.json of random bytes", _llm_probe(), 2, "tokenizer_config.json: not valid JSON",
         _damage_model("tokenizer_config.json", lambda f: f.write_bytes(b"\xff\xfe\x00 not json"))),
    Case("a .gguf file that is not GGUF", _llm_probe("{tmp}/model.gguf"), 2, "not a GGUF file",
         lambda p: write(Path(p["tmp"]) / "model.gguf", "just some text\n")),
    Case("an empty .gguf file", _llm_probe("{tmp}/model.gguf"), 2, "empty file, not a GGUF model",
         lambda p: write(Path(p["tmp"]) / "model.gguf", "")),
    Case("a truncated .gguf file", _llm_probe("{tmp}/model.gguf"), 2, "cannot be read as a GGUF model",
         lambda p: _gguf(p, keep=0.6)),
]
for _c in MODEL_CASES:
    _c.group, _c.env = "model files", dict(CACHE_ENV)


# ---- run files -----------------------------------------------------------------------------------------

def _damage_run(name: str, how):
    def setup(p: dict) -> None:
        run = _fact_run(p)
        how(run / name)
        _snapshot(p, run, name)
    return setup


def _probe(kind: str, *extra: str) -> list[str]:
    return ["probe", kind, "--model", "{tmp}/run", *extra, "--device", "cpu", "--out", "{out}", "--quiet"]


READOUT = _probe("readout", "--sites", "hook_embed@subject")


def _loads_again(p: dict) -> None:
    from mechfact.facts.runio import load_fact_run

    model, world = load_fact_run(Path(p["tmp"]) / "run")
    assert world.n_entities == 8 and model.cfg.d == 4


def _result_rewritten(p: dict) -> None:
    res = read(Path(p["tmp"]) / "run" / "result.json")
    assert 0 <= res["accuracy"] <= 1 and res["subjects"] == 8


def _llm_run(p: dict, damage) -> None:
    """A finished `llm probe` run in {out}, then one of its files damaged."""
    _cli([*LLM_PROBE, "--model", "{model}", "--no-state-cache", "--out", "{out}"], p)
    out = Path(p["out"])
    name = damage(out)
    _snapshot(p, out, name)


def _result(how):
    def damage(out: Path) -> str:
        how(out / "result.json")
        return "result.json"
    return damage


def _config(how):
    def damage(out: Path) -> str:
        how(out / "config.json")
        return "config.json"
    return damage


LLM_RERUN = [*LLM_PROBE, "--model", "{model}", "--no-state-cache", "--out", "{out}"]

RUN_CASES = [
    Case("fact run with a truncated model.safetensors (probe readout)", READOUT, 2,
         "model/model.safetensors: truncated or not a safetensors file",
         _damage_run("model/model.safetensors", _truncate),
         _untouched),
    Case("fact run with an empty model.safetensors (probe superposition)", _probe("superposition"), 2,
         "model/model.safetensors: empty", _damage_run("model/model.safetensors", lambda f: f.write_bytes(b""))),
    Case("fact run with random bytes as model.safetensors (probe scores)", _probe("scores"), 2,
         "model/model.safetensors: truncated or not a safetensors file",
         _damage_run("model/model.safetensors", lambda f: f.write_bytes(os.urandom(999)))),
    Case("fact run without model.safetensors", READOUT, 2, "model/model.safetensors: missing",
         _damage_run("model/model.safetensors", lambda f: f.unlink())),
    Case("fact run whose model/config.json is {}", READOUT, 2, "model/config.json: not a valid fact-model config",
         _damage_run("model/config.json", lambda f: f.write_text("{}")), _untouched),
    Case("fact run whose model/config.json is []", _probe("superposition"), 2, "model/config.json: a JSON list",
         _damage_run("model/config.json", lambda f: f.write_text("[]"))),
    Case("fact run with a truncated model/config.json", _probe("intervene"), 2, "model/config.json: not valid JSON",
         _damage_run("model/config.json", _truncate)),
    Case("fact run whose model/config.json has a wrongly typed value", READOUT, 2,
         "model/config.json: not a valid fact-model config (d='four'",
         _damage_run("model/config.json", lambda f: _edit_json(f, d="four"))),
    Case("fact run whose model/config.json does not match the weights", READOUT, 2,
         "does not match", _damage_run("model/config.json", lambda f: _edit_json(f, d=6))),
    Case("fact run without model/config.json", READOUT, 2, "model/config.json: missing",
         _damage_run("model/config.json", lambda f: f.unlink())),
    Case("fact run with a truncated world.json", READOUT, 2, "world.json: not valid JSON",
         _damage_run("world.json", _truncate), _untouched),
    Case("fact run with an empty world.json", _probe("swap", "--steps", "2"), 2, "world.json: empty",
         _damage_run("world.json", lambda f: f.write_text(""))),
    Case("fact run whose world.json is {}", READOUT, 2, "world.json: not a valid fact world",
         _damage_run("world.json", lambda f: f.write_text("{}"))),
    Case("fact run whose world.json has non-integer permutations", READOUT, 2,
         "world.json: not a valid fact world (perms is not a table of integers",
         _damage_run("world.json", lambda f: _edit_json(f, perms=[["a", "b"], ["c", "d"]]))),
    Case("fact run whose world.json has the wrong sizes", READOUT, 2, "world.json: not a valid fact world",
         _damage_run("world.json", lambda f: _edit_json(f, n_entities=9))),
    Case("fact run without world.json", READOUT, 2, "missing world.json",
         _damage_run("world.json", lambda f: f.unlink())),
    Case("fact run with a truncated model.safetensors, trained again with the same --out", [*FACT_TRAIN, "--out",
         "{tmp}/run"], 0, None, _damage_run("model/model.safetensors", _truncate), _loads_again),
    Case("fact run with a truncated world.json, trained again with the same --out", [*FACT_TRAIN, "--out", "{tmp}/run"],
         0, None, _damage_run("world.json", _truncate), _loads_again),
    Case("fact run with a truncated result.json, trained again with the same --out",
         [*FACT_TRAIN, "--out", "{tmp}/run"], 0, None, _damage_run("result.json", _truncate), _result_rewritten),
    Case("fact run with a truncated checkpoint.pt, trained again with the same --out",
         [*FACT_TRAIN, "--out", "{tmp}/run"], 2, "checkpoint.pt: corrupted checkpoint",
         _damage_run("checkpoint.pt", _truncate), _untouched),
    Case("fact run with a truncated config.json, trained again with the same --out",
         [*FACT_TRAIN, "--out", "{tmp}/run"], 2, "config.json: not valid JSON", _damage_run("config.json", _truncate),
         _untouched),
    Case("fact run whose config.json is [], trained again with the same --out", [*FACT_TRAIN, "--out", "{tmp}/run"], 2,
         "config.json: not a mechfact run config", _damage_run("config.json", lambda f: f.write_text("[]")),
         _untouched),
    Case("a finished llm probe run passed as the model of probe readout",
         ["probe", "readout", "--model", "{tmp}/llm_run", "--out", "{out}", "--quiet"], 2,
         "a mechfact llm.probe run directory, not a model",
         lambda p: _cli([*LLM_PROBE, "--model", "{model}", "--no-state-cache", "--out", "{tmp}/llm_run"], p)),
    Case("llm probe run with a truncated result.json, rerun with the same arguments", LLM_RERUN, 2,
         "result.json: not valid JSON", lambda p: _llm_run(p, _result(_truncate)), _untouched),
    Case("llm probe run whose result.json has the wrong shape, rerun with the same arguments", LLM_RERUN, 2,
         "result.json: key 'model' is missing", lambda p: _llm_run(p, _result(lambda f: f.write_text('{"x": 1}'))),
         _untouched),
    Case("llm probe run whose result.json is a list, rerun with the same arguments", LLM_RERUN, 2,
         "result.json: the top level is a JSON list", lambda p: _llm_run(p, _result(lambda f: f.write_text("[]"))),
         _untouched),
    Case("llm probe run with a truncated config.json, rerun with the same arguments", LLM_RERUN, 2,
         "config.json: not valid JSON", lambda p: _llm_run(p, _config(_truncate)), _untouched),
]
for _c in RUN_CASES:
    _c.group, _c.env = "run files", dict(CACHE_ENV)


# ---- caches --------------------------------------------------------------------------------------------

def _damage_cache(how):
    """A clean `llm probe` run in {tmp}/clean fills the hidden-state cache; then every entry is damaged."""
    def setup(p: dict) -> None:
        _cli(_llm_probe("{model}", "{tmp}/clean"), p)
        entries = sorted((Path(p["tmp"]) / "cache" / "states").glob("*.pt"))
        assert entries, "the clean run wrote no hidden-state cache"
        for f in entries:
            how(f)
    return setup


def _wrong_tensors(f: Path) -> None:
    import torch

    torch.save({"states": [torch.zeros(3, 2)], "next_token": torch.zeros(3, dtype=torch.long)}, f)


def _same_as_clean(p: dict) -> None:
    import torch

    clean, again = read(Path(p["tmp"]) / "clean" / "result.json"), read(Path(p["out"]) / "result.json")
    assert again["per_layer"] and again["per_layer"] == clean["per_layer"], "rebuilt cache gave other numbers"
    assert again["relations"] == clean["relations"]
    for f in (Path(p["tmp"]) / "cache" / "states").glob("*.pt"):
        d = torch.load(f, weights_only=True)  # rewritten whole
        assert d["states"][0].shape[0] == d["next_token"].shape[0]


def _has_result(p: dict) -> None:
    assert read(Path(p["out"]) / "result.json")["per_layer"]


CACHE_CASES = [
    Case("hidden-state cache entry truncated", _llm_probe("{model}"), 0, None, _damage_cache(_truncate),
         _same_as_clean),
    Case("hidden-state cache entry emptied", _llm_probe("{model}"), 0, None,
         _damage_cache(lambda f: f.write_bytes(b"")), _same_as_clean),
    Case("hidden-state cache entry replaced by random bytes", _llm_probe("{model}"), 0, None,
         _damage_cache(lambda f: f.write_bytes(os.urandom(2000))), _same_as_clean),
    Case("hidden-state cache entry holding tensors of the wrong shape", _llm_probe("{model}"), 0, None,
         _damage_cache(_wrong_tensors), _same_as_clean),
    Case("hidden-state cache folder that cannot be written (a file in its place)", _llm_probe("{model}"), 0, None,
         lambda p: write(Path(p["tmp"]) / "cache" / "states", "not a folder"), _has_result),
    Case("MECHFACT_CACHE naming a file", _llm_probe("{model}"), 2, "not a folder; point $MECHFACT_CACHE at",
         lambda p: write(Path(p["tmp"]) / "cache", "not a folder")),
]
for _c in CACHE_CASES:
    _c.group, _c.env = "caches", dict(CACHE_ENV)


# ---- data files (relations) ----------------------------------------------------------------------------

def _relation(p: dict, name: str = "rel.json", **changes) -> Path:
    data = {**read(p["relations"]), **changes}
    path = Path(p["tmp"]) / name
    write(path, json.dumps(data))
    return path


def _rel_samples(fn):
    def setup(p: dict) -> None:
        _relation(p, samples=fn(read(p["relations"])["samples"]))
    return setup


REL = _llm_probe("{model}", "{out}")
REL[REL.index("{relations}")] = "{tmp}/rel.json"
REL_DIR = list(REL)
REL_DIR[REL_DIR.index("{tmp}/rel.json")] = "{tmp}/rels"


def _folder_with_one_bad(p: dict) -> None:
    folder = Path(p["tmp"]) / "rels"
    shutil.copytree(p["relations_dir"], folder)
    write(folder / "broken.json", '{"name": "broken", "prompt_templates": ["{} is"], "samples": [')


def _n_samples(n: int):
    def check(p: dict) -> None:
        assert [r["n_samples"] for r in read(Path(p["out"]) / "result.json")["relations"]] == [n]
    return check


DATA_CASES = [
    Case("relation file listing the same facts twice", REL, 0, None, _rel_samples(lambda s: s + s[:4]), _n_samples(12)),
    Case("relation file with a sample without object", REL, 2, "sample 2 must be an object with string 'subject'",
         _rel_samples(lambda s: s[:2] + [{"subject": "blorp"}] + s[2:])),
    Case("relation file with an empty samples list", REL, 2, "relation has no samples", _rel_samples(lambda s: [])),
    Case("relation file with a single sample", REL, 2, "1 distinct fact; a relation needs at least 2",
         _rel_samples(lambda s: s[:1])),
    Case("relation file whose samples are one fact repeated", REL, 2, "1 distinct fact (5 listed",
         _rel_samples(lambda s: s[:1] * 5)),
    Case("relation file whose samples are an object, not a list", REL, 2, "'samples' must be a list",
         _rel_samples(lambda s: {"zorb": "red"})),
    Case("truncated relation file", REL, 2, "rel.json: not valid JSON",
         lambda p: (_relation(p), _truncate(Path(p["tmp"]) / "rel.json"))),
    Case("relation file of random bytes", REL, 2, "rel.json: not valid JSON",
         lambda p: (Path(p["tmp"]) / "rel.json").write_bytes(b"\x00\x9f\x92\x96 binary")),
    Case("relation file that is a JSON list", REL, 2, "not a relation (expected a JSON object",
         lambda p: write(Path(p["tmp"]) / "rel.json", "[]")),
    Case("relation file with a byte-order mark", REL, 0, None,
         lambda p: (Path(p["tmp"]) / "rel.json").write_bytes(b"\xef\xbb\xbf" + Path(p["relations"]).read_bytes()),
         _n_samples(12)),
    Case("relation folder with one malformed file among good ones", REL_DIR, 2, "broken.json: not valid JSON",
         _folder_with_one_bad),
]
for _c in DATA_CASES:
    _c.group, _c.env = "data files", dict(CACHE_ENV)

CASES: list[Case] = MODEL_CASES + RUN_CASES + CACHE_CASES + DATA_CASES

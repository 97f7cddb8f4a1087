"""Damaged files: every case of ``faults_files.CASES`` through ``mechfact.cli.main`` in-process (one stderr line naming
the file, or a rebuilt cache), plus focused tests of the checks (state cache, converted-model cache, loaders)."""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

import pytest
import torch

import faults_common
import faults_files


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    return faults_common.assets(tmp_path_factory.mktemp("assets"))


@pytest.fixture(autouse=True)
def _env(tmp_path, monkeypatch):
    monkeypatch.setenv("MECHFACT_CACHE", str(tmp_path / "default_cache"))  # never the user's cache
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    n = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors run fastest on one thread
    yield
    torch.set_num_threads(n)


def test_enough_cases_in_every_group():
    groups = {c.group for c in faults_files.CASES}
    assert groups == {"model files", "run files", "caches", "data files"}
    assert len(faults_files.CASES) >= 35
    assert len({c.name for c in faults_files.CASES}) == len(faults_files.CASES)
    assert all(c.needle for c in faults_files.CASES if c.exit != 0)


@pytest.mark.parametrize("case", faults_files.CASES, ids=lambda c: c.name)
def test_case(case, shared, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    paths = faults_common.paths_for(tmp_path / "case", shared)
    rc, err = faults_common.run_in_process(case, paths, monkeypatch, capsys)
    faults_common.assert_clean_exit(case, rc, err)
    if case.exit == 0:
        assert not [ln for ln in err if ln.startswith("mechfact:")], err
    else:  # exactly one line: `mechfact: error: <file>: <what is wrong>; <what to do>`
        assert len(err) == 1 and err[0].startswith("mechfact: error: ") and case.needle in err[0], err
    if case.check is not None:
        case.check(paths)


# ---- the hidden-state cache -------------------------------------------------------------------------------

@pytest.fixture
def fact_model():
    from mechfact.facts import FactWorld, build_single_hop

    world = FactWorld(16, 2, seed=0)
    model = build_single_hop(world, 12)
    model.model_id = "test-fact-model"  # collect caches only models with an identity
    return model, world


SITES = ["hook_embed@subject", "blocks.0.hook_resid_post@last"]


@pytest.mark.parametrize("damage", ["truncate", "garbage", "empty", "wrong_shape", "wrong_dtype", "not_a_dict"])
def test_a_damaged_state_cache_entry_is_deleted_and_recomputed(fact_model, tmp_path, caplog, damage):
    from mechfact.probes.queries import collect

    model, world = fact_model
    clean = collect(model, world, SITES, cache=True)
    entries = list((tmp_path / "default_cache" / "states").glob("*.pt"))
    assert len(entries) == 1
    f = entries[0]
    if damage == "truncate":
        f.write_bytes(f.read_bytes()[:200])
    elif damage == "garbage":
        f.write_bytes(os.urandom(1000))
    elif damage == "empty":
        f.write_bytes(b"")
    elif damage == "wrong_shape":
        torch.save({"states": [torch.zeros(3, 2)] * 2, "next_token": torch.zeros(3, dtype=torch.long)}, f)
    elif damage == "wrong_dtype":
        d = torch.load(f, weights_only=True)
        torch.save({"states": [s.double() for s in d["states"]], "next_token": d["next_token"]}, f)
    else:
        torch.save([1, 2, 3], f)
    with caplog.at_level(logging.WARNING, logger="mechfact.probes.queries"):
        again = collect(model, world, SITES, cache=True)
    assert any(str(f) in r.getMessage() and "damaged" in r.getMessage() for r in caplog.records), caplog.text
    for s in SITES:
        assert torch.equal(again[s], clean[s])
    assert torch.equal(again.next_token, clean.next_token)
    d = torch.load(f, weights_only=True)  # rewritten, whole
    assert all(torch.equal(a, clean[s]) for a, s in zip(d["states"], SITES))
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="mechfact.probes.queries"):
        third = collect(model, world, SITES, cache=True)  # a plain hit now
    assert not caplog.records and torch.equal(third[SITES[1]], clean[SITES[1]])


def test_a_state_cache_that_cannot_be_written_is_a_warning(fact_model, tmp_path, monkeypatch, caplog):
    from mechfact.probes.queries import collect

    model, world = fact_model
    (tmp_path / "default_cache").mkdir()
    (tmp_path / "default_cache" / "states").write_text("not a folder")  # its entries cannot be written
    with caplog.at_level(logging.WARNING, logger="mechfact.probes.queries"):
        acts = collect(model, world, SITES, cache=True)
    assert acts[SITES[0]].shape[0] == len(world.single_hop())
    assert "not written" in caplog.text


# ---- converted GGUF caches --------------------------------------------------------------------------------

@pytest.fixture
def fake_gguf(shared, tmp_path, monkeypatch):
    """convert_gguf with the GGUF reader replaced by the tiny HF model (counts its calls)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from mechfact.llm.models import gguf as loading

    calls = []

    def load(path, dtype=torch.float32):
        calls.append(path)
        return (AutoModelForCausalLM.from_pretrained(shared["model"]).eval(),
                AutoTokenizer.from_pretrained(shared["model"]))

    monkeypatch.setattr(loading, "_load_gguf_hf", load)
    src = tmp_path / "tiny.gguf"
    src.write_bytes(b"GGUF" + b"\0" * 60)
    return src, calls


def test_converted_cache_has_a_manifest_and_is_reused(fake_gguf, tmp_path):
    from mechfact.llm.models.loading import MANIFEST, check_converted, convert_gguf

    src, calls = fake_gguf
    dest = tmp_path / "models" / "Tiny-fp32"
    convert_gguf(src, dest)
    man = json.loads((dest / MANIFEST).read_text())
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(man["files"])
    assert check_converted(dest) is None
    convert_gguf(src, dest)
    assert len(calls) == 1
    assert not [p for p in dest.parent.iterdir() if p.name.startswith(".")]  # no temp folder left behind


@pytest.mark.parametrize("damage", ["truncate_weights", "delete_tokenizer", "flip_byte", "no_manifest_partial",
                                    "bad_manifest"])
def test_a_damaged_converted_cache_is_rebuilt(fake_gguf, tmp_path, caplog, damage):
    from mechfact.llm.models.loading import MANIFEST, check_converted, convert_gguf

    src, calls = fake_gguf
    dest = tmp_path / "models" / "Tiny-fp32"
    convert_gguf(src, dest)
    good = (dest / "model.safetensors").read_bytes()
    w = dest / "model.safetensors"
    if damage == "truncate_weights":
        w.write_bytes(good[: len(good) // 2])
    elif damage == "delete_tokenizer":
        (dest / "tokenizer.json").unlink()
    elif damage == "flip_byte":  # same size, new mtime: the SHA-256 catches it
        data = bytearray(good)
        data[len(data) // 2] ^= 0xFF
        w.write_bytes(bytes(data))
        os.utime(w, ns=(w.stat().st_atime_ns, w.stat().st_mtime_ns + 10**9))
    elif damage == "no_manifest_partial":  # a conversion interrupted by an older mechfact
        (dest / MANIFEST).unlink()
        w.unlink()
    else:
        (dest / MANIFEST).write_text("{ not json")
    assert check_converted(dest) is not None
    with caplog.at_level(logging.WARNING, logger="mechfact.llm.models.loading"):
        convert_gguf(src, dest)
    assert len(calls) == 2
    assert str(dest) in caplog.text and "damaged" in caplog.text
    assert check_converted(dest) is None and (dest / "model.safetensors").read_bytes() == good


def test_touched_but_unchanged_converted_cache_is_kept(fake_gguf, tmp_path):
    from mechfact.llm.models.loading import MANIFEST, check_converted, convert_gguf

    src, calls = fake_gguf
    dest = tmp_path / "models" / "Tiny-fp32"
    convert_gguf(src, dest)
    w = dest / "model.safetensors"
    os.utime(w, ns=(w.stat().st_atime_ns, w.stat().st_mtime_ns + 10**9))
    assert check_converted(dest) is None
    assert json.loads((dest / MANIFEST).read_text())["files"]["model.safetensors"]["mtime_ns"] == w.stat().st_mtime_ns
    convert_gguf(src, dest)
    assert len(calls) == 1


def test_a_complete_cache_of_an_older_mechfact_is_adopted(fake_gguf, shared, tmp_path):
    from mechfact.llm.models.loading import MANIFEST, check_converted, convert_gguf

    src, calls = fake_gguf
    dest = tmp_path / "models" / "Tiny-fp32"
    shutil.copytree(shared["model"], dest)  # complete, no manifest
    assert check_converted(dest) is None and (dest / MANIFEST).is_file()
    convert_gguf(src, dest)
    assert not calls


def test_model_dir_rebuilds_a_damaged_conversion(fake_gguf, tmp_path, monkeypatch):
    import hashlib

    from mechfact.llm.models import registry

    src, calls = fake_gguf
    monkeypatch.setenv("MECHFACT_CACHE", str(tmp_path / "cache"))
    m = registry.PackagedModel("tiny-1m", "Tiny-1M", (("d", "1", str(src)),),
                               hashlib.sha256(src.read_bytes()).hexdigest(), "none")
    monkeypatch.setattr(registry, "_part_files", lambda _m: [src])
    dest = registry.model_dir(m)
    assert dest == tmp_path / "cache" / "models" / "Tiny-1M-fp32" and len(calls) == 1
    assert registry.model_dir(m) == dest and len(calls) == 1  # reused
    (dest / "model.safetensors").write_bytes(b"")
    assert registry.model_dir(m) == dest and len(calls) == 2  # rebuilt
    assert (dest / "source.json").is_file()
    from mechfact.llm.models.loading import check_converted

    assert check_converted(dest) is None


# ---- loaders ------------------------------------------------------------------------------------------------

def test_check_safetensors_accepts_a_whole_file_and_refuses_one_byte_less(shared, tmp_path):
    from mechfact.llm.models.loading import check_safetensors
    from mechfact.runs import CorruptFile

    f = Path(shared["model"]) / "model.safetensors"
    check_safetensors(f)
    bad = tmp_path / "m.safetensors"
    bad.write_bytes(f.read_bytes()[:-1])
    with pytest.raises(CorruptFile, match=r"m\.safetensors: truncated"):
        check_safetensors(bad)


@pytest.mark.parametrize("text,needle", [("", "empty"), ("{", "not valid JSON"), ("[]", "expected an object"),
                                         ('{"n_entities": 4}', "is missing"),
                                         ('{"n_entities": 2, "n_relations": 1, "seed": 0, "perms": [[0.5, 1]]}',
                                          "holds torch.float32 values")])
def test_world_json_problems_name_the_file(tmp_path, text, needle):
    from mechfact.facts import FactWorld
    from mechfact.runs import CorruptFile

    f = tmp_path / "world.json"
    f.write_text(text)
    with pytest.raises(CorruptFile, match=needle) as e:
        FactWorld.load_json(f)
    assert str(e.value).startswith(f"{f}: ") and "rerun" in str(e.value)


def test_world_and_queries_round_trip_still(tmp_path):
    from mechfact.facts import FactWorld
    from mechfact.facts.world import Queries

    w = FactWorld(6, 2, seed=3)
    w.save_json(tmp_path / "w.json")
    assert FactWorld.load_json(tmp_path / "w.json") == w
    q = w.single_hop().subset(torch.tensor([], dtype=torch.long))
    q.save_json(tmp_path / "q.json")
    assert Queries.load_json(tmp_path / "q.json") == q


def test_fact_run_loading_names_the_file_through_the_api(tmp_path):
    from mechfact.facts import FactWorld, build_single_hop
    from mechfact.facts.runio import load_fact_run, save_fact_run
    from mechfact.runs import CorruptFile

    world = FactWorld(8, 2, seed=0)
    run = save_fact_run(tmp_path / "run", build_single_hop(world, 8), world)
    model, w = load_fact_run(run)
    assert w == world
    (run / "model" / "config.json").write_text("{}")
    with pytest.raises(CorruptFile, match=r"model/config\.json: not a valid fact-model config .*rerun the"):
        load_fact_run(run)


def test_a_failed_load_is_traced_to_the_damaged_file(shared, tmp_path):
    """What a hub snapshot (checked only when its loading fails) gets: the damaged file, named."""
    from mechfact.llm.models.loading import _diagnose

    folder = tmp_path / "snapshot"
    shutil.copytree(shared["model"], folder)
    w = folder / "model.safetensors"
    w.write_bytes(w.read_bytes()[:1000])
    err = _diagnose(folder, RuntimeError("boom"), "delete it from the cache", "--model org/name")
    assert str(err).startswith(f"{w}: truncated") and str(err).endswith("; delete it from the cache")
    shutil.copyfile(Path(shared["model"]) / "model.safetensors", w)
    err = _diagnose(folder, RuntimeError("boom"), "fix it", "--model org/name")
    assert str(err) == "--model org/name: could not be loaded (RuntimeError: boom); fix it"

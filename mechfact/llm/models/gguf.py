"""GGUF files: dequantised into a plain (unquantised) Hugging Face model, and converted once into a cached
fp32 folder (:func:`convert_gguf`) that later loads reuse (:func:`check_converted`).

A converted folder is complete when MANIFEST (written last, atomically, before the folder is renamed into
place) lists every file of the conversion with its size, mtime and SHA-256. A load checks the sizes, and
rehashes a file whose mtime changed; a folder that fails is discarded and converted again.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

import torch

from ...runs import CorruptFile, write_json_atomic
from .checks import _line, _system_error, check_gguf, check_hf_folder

logger = logging.getLogger("mechfact.llm.models.loading")  # the name its messages have always had (--quiet, log filters)

def _load_gguf_hf(path: Path, dtype: torch.dtype = torch.float32):
    """(model, tokenizer) from a GGUF file, dequantised into a plain (unquantised) HF model.

    A file that is not GGUF, truncated or damaged is one :class:`CorruptFile` naming it."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    check_gguf(path)
    try:
        tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        q = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
        cfg = copy.deepcopy(q.config)
        if hasattr(cfg, "quantization_config"):
            del cfg.quantization_config  # a "gguf-quantised" model refuses save_pretrained
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
        model.load_state_dict(q.state_dict(), strict=True)
    except Exception as exc:  # noqa: BLE001 - the GGUF reader raises anything on a damaged file
        if _system_error(exc):
            raise
        raise CorruptFile(f"{path}: cannot be read as a GGUF model ({type(exc).__name__}: {_line(exc)}); the file "
                          "is truncated, damaged or of an unsupported architecture: download it again") from None
    return model.to(dtype).eval(), tok


MANIFEST = "mechfact_manifest.json"



def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def _write_manifest(folder: Path, source: str) -> None:
    files = {}
    for f in sorted(folder.iterdir()):
        if f.is_file() and f.name not in (MANIFEST, "source.json") and not f.name.startswith("."):
            st = f.stat()
            files[f.name] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": _file_sha256(f)}
    write_json_atomic(folder / MANIFEST, {"format": 1, "source": source, "files": files})


def check_converted(folder: Path) -> str | None:
    """``None`` when the converted folder is complete and unchanged, else what is wrong with it.

    A folder converted by an older mechfact (no manifest) is checked like a model folder and, if it passes,
    given a manifest."""
    if not folder.is_dir():
        return "missing"
    man = folder / MANIFEST
    if not man.is_file():
        if not (folder / "config.json").is_file():
            return "incomplete (no config.json, no manifest)"
        try:
            check_hf_folder(folder)
        except CorruptFile as exc:
            return _line(exc)
        _remember(folder, "adopted")
        return None
    try:
        data = json.loads(man.read_text(encoding="utf-8"))
        files = data["files"]
        entries = [(name, int(v["size"]), int(v["mtime_ns"]), str(v["sha256"])) for name, v in files.items()]
    except (UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as exc:
        return f"{man} unreadable ({_line(exc, 80)})"
    if "config.json" not in files:
        return f"{man} lists no config.json"
    touched = False
    for name, size, mtime, sha in entries:
        f = folder / name
        if not f.is_file():
            return f"{name} is missing"
        st = f.stat()
        if st.st_size != size:
            return f"{name} has {st.st_size} bytes, {size} were written"
        if st.st_mtime_ns != mtime:
            if _file_sha256(f) != sha:
                return f"{name} changed since it was written (SHA-256 differs)"
            touched = True
    if touched:  # copied or touched, same content: remember the new mtimes
        _remember(folder, str(data.get("source", "")))
    return None


def _remember(folder: Path, source: str) -> None:
    """(Re)write the manifest of a folder that passed its checks; a read-only cache just checks again next time."""
    try:
        _write_manifest(folder, source)
    except OSError as exc:
        logger.debug("manifest of %s not written (%s)", folder, exc)


def _discard(folder: Path) -> None:
    """Move a damaged converted folder out of the way (one rename), then delete it."""
    aside = folder.parent / f".{folder.name}.damaged-{os.getpid()}"
    try:
        os.replace(folder, aside)
    except FileNotFoundError:  # another process moved it first
        return
    shutil.rmtree(aside, ignore_errors=True)


def convert_gguf(path: Path, dest: Path) -> Path:
    """Dequantise ``path`` once into an fp32 HF folder ``dest`` (temp dir + manifest, then one rename).

    An existing ``dest`` is reused when :func:`check_converted` passes; a damaged one is rebuilt (warning)."""
    problem = check_converted(dest)
    if problem is None:
        return dest
    if dest.exists():
        logger.warning("converted model cache %s is damaged (%s); converting %s again", dest, problem, path.name)
        _discard(dest)
    logger.info("converting %s to a plain fp32 checkpoint in %s (once, ~20 s)", path.name, dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}."))
    try:
        model, tok = _load_gguf_hf(path)
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        _write_manifest(tmp, path.name)  # last: a folder without it is incomplete
        try:
            os.replace(tmp, dest)
        except OSError:  # another process finished first
            if check_converted(dest) is not None:
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return dest

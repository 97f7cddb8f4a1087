"""Run directories: config.json first, then result.json, meta.json and figures; the cache folder.

Every file is written atomically (temp file + ``os.replace``) so an
interrupted run never leaves a half-written JSON behind. ``result.json`` holds
only deterministic numbers; timings and versions go to ``meta.json``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

logger = logging.getLogger(__name__)


def _jsonable(obj: Any) -> Any:
    if is_dataclass(obj):
        return _jsonable(asdict(obj))
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if hasattr(obj, "item") and callable(obj.item) and getattr(obj, "ndim", 1) == 0:
        return obj.item()
    if isinstance(obj, float) and (obj != obj):  # NaN -> null keeps JSON strict
        return None
    if isinstance(obj, Path):
        return str(obj)
    return obj


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_FILE_MODE = 0o666 & ~_umask()


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; on success it replaces ``path`` in one rename.

    For writers that want a file name (``safetensors.save_file``, ``torch.save``, ...)::

        with atomic_path(out / "model.safetensors") as tmp:
            save_file(state, str(tmp))
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, _FILE_MODE)  # mkstemp makes 0600; results are meant to be shared
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_json_atomic(path: str | os.PathLike, data: Any) -> None:
    """Write JSON to ``path`` atomically (never a partial file)."""
    with atomic_path(path) as tmp, open(tmp, "w") as f:
        json.dump(_jsonable(data), f, indent=2, sort_keys=False, allow_nan=False)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())


def read_json(path: str | os.PathLike) -> Any:
    with open(path) as f:
        return json.load(f)


def cache_dir() -> Path:
    """Root of mechfact's caches (converted models, hidden states): ``$MECHFACT_CACHE`` or ``~/.cache/mechfact``."""
    return Path(os.environ.get("MECHFACT_CACHE") or Path.home() / ".cache" / "mechfact")


def git_sha() -> str | None:
    """The git SHA of the mechfact source tree, if it is a checkout."""
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def versions() -> dict[str, str]:
    """Versions of the packages that shape numerical results."""
    from importlib import metadata

    out = {"python": sys.version.split()[0], "platform": platform.platform()}
    for pkg in ("mechfact", "torch", "numpy", "scipy", "scikit-learn", "transformers", "transformer-lens"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            pass
    return out


def check_writable(out: str | os.PathLike) -> Path:
    """Create ``out`` if needed and make sure it is a writable directory."""
    path = Path(out)
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".mechfact_write_probe"
        probe.write_text("ok")
        probe.unlink()
    except OSError as exc:
        raise ValueError(f"--out {out}: not a writable directory ({exc.strerror or exc})") from None
    return path


def _same_config(old: Any, new: Any) -> bool:
    """Equal, except that keys the old config lacks (options added to mechfact since) are ignored."""
    if isinstance(old, dict) and isinstance(new, dict):
        return set(old) <= set(new) and all(_same_config(old[k], new[k]) for k in old)
    return old == new


class RunDir:
    """A run directory with the standard files and ONE config.json layout.

    ``config.json`` is ``{"kind", "config", "seed", **identity}`` (``identity``:
    what else defines the result, e.g. the pretrained model's ``model_id``); it is
    written on creation, or checked against the existing one when resuming.
    ``finish`` writes ``result.json``, draws the figure from it and writes
    ``meta.json``.
    """

    def __init__(self, out: str | os.PathLike, config: Any, *, kind: str, seed: int, device: str,
                 **identity: Any):
        self.path = check_writable(out)
        self.kind = kind
        self.seed = seed
        self.device = device
        self.t0 = time.time()
        cfg_file = self.path / "config.json"
        self.config = _jsonable({"kind": kind, "config": config, "seed": seed, **identity})
        if cfg_file.exists():
            old = read_json(cfg_file)
            if not _same_config(old, self.config):
                keys = sorted(k for k in set(old) | set(self.config) if old.get(k) != self.config.get(k))
                if keys == ["config"] and isinstance(old.get("config"), dict):
                    new = self.config["config"]
                    keys = [f"config.{k}" for k in sorted(set(old["config"]) | set(new))
                            if old["config"].get(k) != new.get(k)]
                raise ValueError(f"--out {self.path}: holds a run with a different config; use another --out or "
                                 f"delete it (differs in: {', '.join(keys)})")
        else:
            write_json_atomic(cfg_file, self.config)

    def file(self, name: str) -> Path:
        return self.path / name

    def read_result(self, empty: Any) -> Any:
        """The partial ``result.json`` of an interrupted run, or ``empty`` for a fresh one."""
        f = self.path / "result.json"
        return read_json(f) if f.exists() else empty

    def write_result(self, result: Any) -> None:
        write_json_atomic(self.path / "result.json", result)

    def write_meta(self, **extra: Any) -> None:
        meta = {
            "kind": self.kind,
            "seed": self.seed,
            "device": self.device,
            "git_sha": git_sha(),
            "versions": versions(),
            "wall_time_s": round(time.time() - self.t0, 3),
            "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            **extra,
        }
        write_json_atomic(self.path / "meta.json", meta)

    def finish(self, result: Any, plot: Callable[[Any, Path], Any] | None = None, fig: str | None = None,
               **meta: Any) -> Any:
        """Write result.json, draw ``fig`` from it with ``plot(result, path)``, then meta.json.

        A figure that fails to draw is logged, never allowed to lose the result.
        """
        self.write_result(result)
        if plot is not None and fig is not None:
            try:
                plot(result, self.file(fig))
            except Exception as exc:  # noqa: BLE001 - a figure must never lose a result
                logger.warning("figure %s failed: %s", fig, exc)
        self.write_meta(**meta)
        return result

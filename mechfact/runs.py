"""Run directories: config.json first, then result.json, meta.json and figures; the cache folder.

Every file is written atomically (temp file + ``os.replace``) so an
interrupted run never leaves a half-written JSON behind. ``result.json`` holds
only deterministic numbers; timings and versions go to ``meta.json``.

A run directory belongs to one process at a time: ``RunDir`` takes an
exclusive lock on ``<out>/.lock`` (released when the process ends, however it
ends) and checks the existing ``config.json`` under it. ``config.json`` is
written with the first file of the run, so input refused before any work
leaves nothing behind. ``result.json`` carries the SHA-256 of the config it
belongs to (``config_sha256``); a resume checks it and the file's shape.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
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


class CorruptFile(ValueError):
    """A file mechfact reads is not what it should be (the message names it and what to do)."""


def read_json(path: str | os.PathLike) -> Any:
    """Parsed JSON of ``path``; unreadable or malformed JSON raises :class:`CorruptFile` naming the file."""
    try:
        with open(path) as f:
            return json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CorruptFile(f"{path}: not valid JSON ({exc}); delete the file to recompute it") from None


def config_sha256(config: Any) -> str:
    """SHA-256 of a config's canonical JSON (sorted keys)."""
    return hashlib.sha256(json.dumps(_jsonable(config), sort_keys=True).encode()).hexdigest()


def check_shape(value: Any, template: Any, where: str) -> None:
    """``value`` has the JSON shape of ``template``: the same container types, and every key of a template dict;
    a template list with one element is the template of every item. Raises :class:`CorruptFile` naming ``where``
    and the first mismatch."""
    def kind(v: Any) -> str:
        return "object" if isinstance(v, dict) else "list" if isinstance(v, list) else type(v).__name__

    def walk(v: Any, t: Any, at: str) -> None:
        if isinstance(t, dict):
            if not isinstance(v, dict):
                raise CorruptFile(f"{where}: {at.rstrip('.') or 'the top level'} is a JSON {kind(v)}, expected an "
                                  "object; delete the file to recompute it")
            for k, sub in t.items():
                if k not in v:
                    raise CorruptFile(f"{where}: key {at + k!r} is missing; delete the file to recompute it")
                walk(v[k], sub, f"{at}{k}.")
        elif isinstance(t, list):
            if not isinstance(v, list):
                raise CorruptFile(f"{where}: {at.rstrip('.') or 'the top level'} is a JSON {kind(v)}, expected a "
                                  "list; delete the file to recompute it")
            if t:
                for i, item in enumerate(v):
                    walk(item, t[0], f"{at.rstrip('.')}[{i}].")

    walk(value, template, "")


def cache_dir() -> Path:
    """Root of mechfact's caches (converted models, hidden states): ``$MECHFACT_CACHE`` or ``~/.cache/mechfact``.

    A root that exists but is not a folder raises ValueError naming it (and how to point it elsewhere).
    """
    env = os.environ.get("MECHFACT_CACHE")
    path = Path(env or Path.home() / ".cache" / "mechfact")
    if path.exists() and not path.is_dir():
        src = "$MECHFACT_CACHE" if env else "the cache folder"
        raise ValueError(f"{src} {path}: not a folder; point $MECHFACT_CACHE at a writable folder")
    return path


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
    if not str(out).strip():
        raise ValueError(f"--out {str(out)!r}: give a folder name")
    path = Path(out)
    try:
        path.mkdir(parents=True, exist_ok=True)
        # a probe file of this process's own: two runs starting on one fresh --out must not unlink each other's
        fd, probe = tempfile.mkstemp(prefix=".mechfact_write_probe.", dir=path)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise ValueError(f"--out {out}: not a writable directory ({exc.strerror or exc})") from None
    return path


_HELD: dict[str, int] = {}  # run directories this process holds: resolved path -> lock file descriptor


def _lock(path: Path) -> None:
    """Hold ``path/.lock`` exclusively for this process (re-entrant within it). A run directory held by another
    process raises ValueError naming the holder."""
    import fcntl

    key = str(path.resolve())
    if key in _HELD:
        return
    fd = os.open(path / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        holder = ""
        try:
            holder = os.pread(fd, 4096, 0).decode(errors="replace").strip()
        except OSError:
            pass
        os.close(fd)
        if exc.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
            raise ValueError(f"--out {path}: in use by another mechfact process ({holder or 'holder unknown'}); wait "
                             "for it to finish or use another --out") from None
        raise
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"pid {os.getpid()} on {platform.node()}, since {time.strftime('%Y-%m-%d %H:%M:%S')}".encode(), 0)
    _HELD[key] = fd


def release(path: str | os.PathLike) -> None:
    """Give up this process's hold on a run directory (done by :meth:`RunDir.finish`; process exit does it too)."""
    fd = _HELD.pop(str(Path(path).resolve()), None)
    if fd is not None:
        os.close(fd)  # closing the descriptor drops the flock


def _same_config(old: Any, new: Any) -> bool:
    """Equal, except that keys the old config lacks (options added to mechfact since) are ignored."""
    if isinstance(old, dict) and isinstance(new, dict):
        return set(old) <= set(new) and all(_same_config(old[k], new[k]) for k in old)
    return old == new


ELAPSED = ".elapsed.json"  # the run's wall time so far, rewritten with every result.json


def _prior_wall_time(path: Path) -> float:
    """Wall seconds spent on the run in ``path`` by earlier processes: the larger of the progress file's and a
    finished run's meta.json figure (0 for a fresh folder, or an unreadable file)."""
    best = 0.0
    for name in (ELAPSED, "meta.json"):
        try:
            best = max(best, float(read_json(path / name).get("wall_time_s", 0.0)))
        except (FileNotFoundError, CorruptFile, AttributeError, TypeError, ValueError):
            continue
    return best


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
        self._prior_s = 0.0
        self.path = check_writable(out)
        self.kind = kind
        self.seed = seed
        self.device = device
        self.t0 = time.time()
        self.config = _jsonable({"kind": kind, "config": config, "seed": seed, **identity})
        _lock(self.path)
        try:
            cfg_file = self.path / "config.json"
            self._committed = cfg_file.exists()
            if self._committed:
                old = read_json(cfg_file)
                if not isinstance(old, dict) or not {"kind", "config", "seed"} <= set(old):
                    what = f"a JSON {type(old).__name__}" if not isinstance(old, dict) else "no kind, config or seed"
                    raise CorruptFile(f"{cfg_file}: not a mechfact run config ({what}); delete --out {self.path} or use "
                                      "another")
                if not _same_config(old, self.config):
                    keys = sorted(k for k in set(old) | set(self.config) if old.get(k) != self.config.get(k))
                    if keys == ["config"] and isinstance(old.get("config"), dict):
                        new = self.config["config"]
                        keys = [f"config.{k}" for k in sorted(set(old["config"]) | set(new))
                                if old["config"].get(k) != new.get(k)]
                    raise ValueError(f"--out {self.path}: holds a run with a different config; use another --out or "
                                     f"delete it (differs in: {', '.join(keys)})")
                self.config = old  # options added to mechfact since keep the run's own config and hash
            self._prior_s = _prior_wall_time(self.path)
        except BaseException:
            release(self.path)  # refused: the folder is free again
            raise
        self.sha256 = config_sha256(self.config)

    def _commit(self) -> None:
        """Write config.json before the run's first file (once)."""
        if not self._committed:
            write_json_atomic(self.path / "config.json", self.config)
            self._committed = True

    def file(self, name: str) -> Path:
        """The path of a file of the run, to be written (config.json is written first)."""
        self._commit()
        return self.path / name

    def read_result(self, empty: Any, shape: Any = None) -> Any:
        """The partial ``result.json`` of an interrupted run, or ``empty`` for a fresh one.

        The file must have the shape of ``shape`` (default ``empty``; see :func:`check_shape`: e.g.
        ``{"points": [{"d": 0, "p": 0}]}`` requires those keys in every point; a ``config`` copy is not checked key
        by key, so a run started before an option was added resumes) and the config hash of this run; otherwise
        :class:`CorruptFile`.
        """
        f = self.path / "result.json"
        if not f.exists():
            return empty
        result = read_json(f)
        template = empty if shape is None else shape
        if isinstance(template, dict) and isinstance(template.get("config"), dict):
            template = {**template, "config": {}}  # a copy of the config: a run from before an option was added
        check_shape(result, template, str(f))
        if isinstance(result, dict) and result.get("config_sha256", self.sha256) != self.sha256:
            raise CorruptFile(f"{f}: written for another config than {self.path / 'config.json'}; delete "
                              f"--out {self.path} to start over")
        return result

    def write_result(self, result: Any) -> None:
        if isinstance(result, dict):  # always the last key: the file does not depend on when it was first written
            result.pop("config_sha256", None)
            result["config_sha256"] = self.sha256
        write_json_atomic(self.file("result.json"), result)
        write_json_atomic(self.path / ELAPSED, {"wall_time_s": self.wall_time_s()})

    def wall_time_s(self) -> float:
        """Seconds this run has taken: every earlier process that wrote to the folder (an interrupted run resumed,
        a finished run re-run) plus this one."""
        return round(self._prior_s + time.time() - self.t0, 3)

    def write_meta(self, **extra: Any) -> None:
        meta = {
            "kind": self.kind,
            "seed": self.seed,
            "device": self.device,
            "git_sha": git_sha(),
            "versions": versions(),
            "wall_time_s": self.wall_time_s(),  # all processes; this one's alone below
            "wall_time_this_process_s": round(time.time() - self.t0, 3),
            "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            **extra,
        }
        write_json_atomic(self.file("meta.json"), meta)

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
        release(self.path)
        return result

"""The fault cases of the reliability suite (issue: nothing a user does corrupts a run or ends in a traceback).

A :class:`Case` is one thing a user can do wrong (or the system can do to a run), through the CLI. Each case
module (``faults_*.py``) exports ``CASES``; ``tests/test_reliability.py`` runs them all in CI (in-process, through
``mechfact.cli.main``) and ``python -m probes.reliability`` runs them as real processes and writes the table of
``docs/reliability.md``.

Placeholders in ``argv``: ``{out}`` the case's run directory, ``{tmp}`` a scratch folder of the case,
``{model}`` a tiny random Llama folder, ``{relations}`` a tiny relation file (both made by :func:`assets`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Case:
    name: str  # what the user does, in words
    argv: list[str]  # mechfact command-line arguments (placeholders above)
    exit: int  # expected exit status: 0 done, 2 bad input / bad file, 1 the system refused
    needle: str | None = None  # a piece of the one stderr line (exit != 0)
    setup: Callable[[dict], None] | None = None  # prepares files before the command; gets the placeholder dict
    check: Callable[[dict], None] | None = None  # after the command: asserts that finished data is intact
    env: dict[str, str] = field(default_factory=dict)  # extra environment variables
    inject: Callable | None = None  # inject(monkeypatch, paths): a fault inside the process (disk full, ...)
    group: str = ""  # heading in docs/reliability.md

    def fill(self, paths: dict) -> list[str]:
        return [a.format(**paths) for a in self.argv]


def assets(root: Path) -> dict:
    """The tiny model and relation file the LLM cases use (built once per session under ``root``)."""
    from llm_tiny import build_model, write_relations

    model = root / "llama"
    if not (model / "config.json").exists():
        build_model("llama", model)
    rel_dir = write_relations(root / "relations")
    return {"model": str(model), "relations": str(rel_dir / "tiny_colour.json"), "relations_dir": str(rel_dir)}


def paths_for(case_dir: Path, shared: dict) -> dict:
    case_dir.mkdir(parents=True, exist_ok=True)
    (case_dir / "tmp").mkdir(exist_ok=True)
    return {"out": str(case_dir / "out"), "tmp": str(case_dir / "tmp"), **shared}


def write(path: str | Path, text: str) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(text)


def read(path: str | Path):
    return json.loads(Path(path).read_text())


def run_in_process(case: Case, paths: dict, monkeypatch, capsys) -> tuple[int, list[str]]:
    """Run one case through ``mechfact.cli.main`` in this process: (exit status, non-empty stderr lines).

    Environment variables and injected faults are undone by ``monkeypatch``; the case's check runs after the
    faults are undone (so it may rerun the command cleanly).
    """
    from mechfact.cli import main

    for k, v in case.env.items():
        monkeypatch.setenv(k, v.format(**paths))
    if case.setup:
        case.setup(paths)
    capsys.readouterr()
    with monkeypatch.context() as mp:
        if case.inject:
            case.inject(mp, paths)
        rc = main(case.fill(paths))
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    return rc, err


def assert_clean_exit(case: Case, rc: int, err: list[str]) -> None:
    """The exit status is the case's; a refusal is one line with the case's needle; never a traceback."""
    text = "\n".join(err)
    assert "Traceback" not in text, text
    assert rc == case.exit, f"exit {rc}, expected {case.exit}: {text}"
    if case.exit != 0:
        errors = [line for line in err if line.startswith("mechfact")]
        assert len(errors) == 1, text
        if case.needle:
            assert case.needle in errors[0], errors[0]

"""The package's layers, read from the source with ``ast`` (every import, also inside functions).

* no cycle between the packages ``mechfact.probes``, ``mechfact.llm``, ``mechfact.facts``, ``mechfact.memory``,
  ``mechfact.commands`` and ``mechfact.cli``;
* no cycle between modules;
* ``mechfact.probes`` works on any model: it imports nothing from the model packages or the command line.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "mechfact"
PACKAGES = ("mechfact.probes", "mechfact.llm", "mechfact.facts", "mechfact.memory", "mechfact.commands",
            "mechfact.cli")
PROBES_MAY_NOT = ("mechfact.llm", "mechfact.facts", "mechfact.memory", "mechfact.commands", "mechfact.cli",
                  "mechfact.quickstart")


def _modules(roots=(ROOT,)) -> dict[str, Path]:
    out = {}
    for path in sorted(p for root in roots for p in root.rglob("*.py")):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


MODULES = _modules()
# the whole repository: the library, the studies, the examples, the benchmarks and the tests
REPO_ROOTS = tuple(ROOT.parent / d for d in ("mechfact", "probes", "synthetic", "examples", "benchmarks", "tests"))
REPO_MODULES = _modules(REPO_ROOTS)


def _resolve(name: str, modules=MODULES) -> str | None:
    """The module ``name`` is, or the package whose attribute it is (``mechfact.llm.models.loading.load_model``)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _imports(module: str, path: Path, modules=MODULES) -> set[str]:
    """The modules of ``modules`` (default: mechfact's) that ``module`` imports anywhere in its source."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                stem = ".".join(base + ([node.module] if node.module else []))
            else:
                stem = node.module or ""
            names = [stem] + [f"{stem}.{a.name}" for a in node.names]  # `from . import x`: x may be a module
            names = [n for n in names[1:] if n in modules] or [stem]
        else:
            continue
        tops = {m.split(".")[0] for m in modules}
        for n in names:
            if n.split(".")[0] in tops:
                target = _resolve(n, modules)
                if target and target != module:
                    out.add(target)
    return out


GRAPH = {m: _imports(m, p) for m, p in MODULES.items()}


def _package(module: str) -> str | None:
    for p in PACKAGES:
        if module == p or module.startswith(p + "."):
            return p
    return None


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _edges(graph, a: str, b: str, of=lambda m: m) -> list[str]:
    return sorted(f"{m} -> {t}" for m, ts in graph.items() for t in ts if of(m) == a and of(t) == b)


def test_the_graph_sees_the_package():
    assert "mechfact.probes.queries" in MODULES and "mechfact.cli" in MODULES
    assert "mechfact.probes.queries" in GRAPH["mechfact.probes.readout"]  # a function-level import


def test_no_package_cycle():
    pg: dict[str, set[str]] = {p: set() for p in PACKAGES}
    for m, ts in GRAPH.items():
        a = _package(m)
        for t in ts:
            b = _package(t)
            if a and b and a != b:
                pg[a].add(b)
    cycles = _cycles(pg)
    detail = [e for c in cycles for a in c for b in c if b in pg[a] for e in _edges(GRAPH, a, b, _package)]
    assert not cycles, f"package cycles {cycles}: {detail}"


def test_no_module_cycle():
    cycles = _cycles(GRAPH)
    assert not cycles, f"module cycles: {cycles}"


def test_no_module_cycle_in_the_repository():
    """The studies, examples, benchmarks and tests too (a page's module and the study it reads, for one)."""
    graph = {m: _imports(m, p, REPO_MODULES) for m, p in REPO_MODULES.items()}
    assert "probes.families" in graph["probes.results_llm"] and "synthetic.pool_runs" in graph["synthetic.results_pool"]
    cycles = _cycles(graph)
    assert not cycles, f"module cycles: {cycles}"


@pytest.mark.parametrize("forbidden", PROBES_MAY_NOT)
def test_probes_import_only_the_base(forbidden):
    bad = sorted(f"{m} -> {t}" for m, ts in GRAPH.items() if m.startswith("mechfact.probes")
                 for t in ts if t == forbidden or t.startswith(forbidden + "."))
    assert not bad, f"mechfact.probes reaches up: {bad}"


def test_every_result_class_is_a_result_with_records_to_dict_and_summary():
    """One shape for every probe's and trainer's result: each class named *Result in the library (and the two
    result classes named otherwise) inherits mechfact.results.Result and has records, to_dict and summary."""
    import dataclasses
    import importlib
    import inspect
    import pkgutil

    import mechfact
    from mechfact.results import Result

    found = {}
    for mod in pkgutil.walk_packages(mechfact.__path__, "mechfact."):
        if ".quickstart" in mod.name or mod.name.endswith("__main__"):
            continue
        m = importlib.import_module(mod.name)
        for name, cls in inspect.getmembers(m, inspect.isclass):
            if cls.__module__ == m.__name__ and (name.endswith("Result") and name not in ("Result", "MappingResult")
                                                 or name in ("Agreement", "RelationSelectivity")):
                found[f"{m.__name__}.{name}"] = cls
    assert len(found) >= 19, sorted(found)
    for where, cls in found.items():
        assert issubclass(cls, Result), f"{where} does not inherit mechfact.results.Result"
        assert dataclasses.is_dataclass(cls), where
        fields = {f.name for f in dataclasses.fields(cls)}
        assert "records" in fields or hasattr(cls, "records"), f"{where} has no records"
        assert callable(cls.to_dict) and callable(cls.summary), where


def test_no_file_over_600_lines():
    """A module that outgrows 600 lines holds two things: split it along its seam."""
    long = sorted(f"{p.relative_to(ROOT.parent)}: {n}" for p in REPO_MODULES.values()
                  if (n := len(p.read_text().splitlines())) > 600)
    assert not long, f"over 600 lines: {long}"

"""``mechfact quickstart``: small versions of every capability and one HTML report that opens with the claims.

Parts: the linear associative memory (paper A), one-layer transformers on synthetic facts (paper B), the probes
on them in two training regimes and two kinds of world, and the default pretrained model's relational readout,
LRE and superposition test (other installed model families side by side with ``families``). Each part writes
ordinary run directories (or JSON files) under ``out``; the report embeds their figures and numbers and opens
with one table: every claim, the paper's number, the number measured in this run, a verdict.

The package, one job per module:

* :mod:`.sizes` -- every size, for ``fast`` (smoke-sized), the default and ``full``;
* :mod:`.part_memory`, :mod:`.part_facts`, :mod:`.part_probes`, :mod:`.part_llm` -- run one part each;
* :mod:`.claims`, :mod:`.claims_llm` -- the claim and verdict rules, pure functions of the parts' numbers;
* :mod:`.layout`, :mod:`.layout_llm`, :mod:`.cells` -- the report's prose, tables and number formatting.

With two or more torch threads (and the CPU) the pretrained-model part runs in a second process beside the
others, each with half the threads: the parts share no state and every run is seeded, so the numbers are those
of the same parts run one after the other with those thread counts.
"""

from __future__ import annotations

import dataclasses
import logging
import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor
from contextlib import nullcontext
from pathlib import Path

import torch

from ..report import render
from ..runs import versions, write_json_atomic
# the names the single-module quickstart had (tests and scripts import them from here)
from .cells import alpha_text as _alpha_text, as_int as _int, f2, medians as _medians  # noqa: F401
from .cells import r2_cell as _r2, rel as _rel, with_ci as _with_ci  # noqa: F401
from .claims import (ALPHA_HEBB, ALPHA_OPT, DECODABLE, KS_5PCT, LEARNED, LRE_FAITHFULNESS, REFERENCES,  # noqa: F401
                     SUPERPOSITION_BAR, ZERO_SHOT_BAR, aggregate as _aggregate, claim_capacity, claim_dstar,
                     claim_frozen, claim_hebb, claim_op_dp, claim_scores, claim_spectrum, probe_claims,
                     selective as _selective, verdict_readout, verdict_selector, verdict_superposition,
                     verdict_zero_shot)
from .claims_llm import claim_llm_readout, claim_llm_superposition, claim_lre, decodable as _decodable  # noqa: F401
from .layout import GROUPS, Part
from .layout_llm import lre_rows as _lre_rows, readout_rows as _readout_rows  # noqa: F401
from .layout_llm import superposition_rows as _superposition_rows  # noqa: F401
from .part_facts import facts_part
from .part_llm import _families, _installed_families, _llm_runs, llm_part  # noqa: F401
from .part_memory import memory_part
from .part_probes import _per_relation_readout, probe_model, probe_part  # noqa: F401
from .sizes import POOL, Sizes, probe_models, sizes_for  # noqa: F401

logger = logging.getLogger(__name__)

__all__ = ["run_quickstart", "quickstart", "Part", "Sizes", "sizes_for", "memory_part", "facts_part", "probe_part",
           "llm_part", "probe_model", "claim_capacity", "claim_hebb", "claim_scores", "claim_spectrum", "claim_op_dp",
           "claim_dstar", "claim_frozen", "verdict_superposition", "verdict_readout", "verdict_selector",
           "verdict_zero_shot", "probe_claims", "claim_lre", "claim_llm_readout", "claim_llm_superposition"]


def _probe_models(fast: bool = False, full: bool = False) -> list[dict]:
    """The probe section's models (:func:`.sizes.probe_models`), under the name the module had."""
    return probe_models(sizes_for(fast, full))


PARTS = (("memory", memory_part), ("facts", facts_part), ("probes", probe_part), ("llm", llm_part))


def _blas_threads(n: int):
    """numpy/scipy/sklearn BLAS threads limited to torch's: on 2 loaded cores, idle BLAS threads spinning beside
    torch made sklearn's fits 10-40x slower (the LLM superposition test: 111 s -> 2.5 s per layer)."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # pragma: no cover - sklearn depends on threadpoolctl
        return nullcontext()
    return threadpool_limits(limits=max(1, int(n)))


def _timed(name: str, fn, out: Path, timing: dict, **kw) -> Part:
    t = time.time()
    part = fn(out, **kw)
    timing[name] = round(time.time() - t, 1)
    for c in part.claims:
        c.group = c.group or GROUPS[name]
    return part


def _llm_child(out: Path, threads: int, level: int, max_memory_gb: float | None, kw: dict) -> tuple[Part, float]:
    """The pretrained-model part in a second process (spawned: a fresh torch, ``threads`` threads), set up as the
    command line sets up its own process."""
    from ..device import flush_denormals
    from ..limits import set_max_memory

    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    torch.set_num_threads(threads)
    set_max_memory(max_memory_gb)
    flush_denormals()
    timing: dict = {}
    with _blas_threads(threads):
        part = _timed("llm", llm_part, out, timing, **kw)
    return part, timing["llm"]


def run_quickstart(out: str | Path, *, device: torch.device, seed: int = 0, fast: bool = False, full: bool = False,
                   families: bool | list[str] = False, parallel: bool | None = None) -> Path:
    """Run every part into ``out`` and write ``out/report.html``.

    ``fast``: smoke-sized (the tests); ``full``: also what is slow and secondary (:mod:`.sizes`). ``families``:
    False (default) = the embedded default model only; True = also every other installed packaged model
    (``mechfact llm models``); or a list of short names. Each family adds its readout and superposition test
    beside the default model's (minutes per family on a CPU). ``parallel``: the pretrained-model part in a second
    process (default: when torch has two or more threads and the device is the CPU).
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    sizes = sizes_for(fast, full)
    threads = torch.get_num_threads()
    if parallel is None:
        parallel = threads >= 2 and torch.device(device).type == "cpu"
    t0 = time.time()
    timing: dict = {}
    parts: dict[str, Part] = {}
    common = {"device": device, "seed": seed, "sizes": sizes}
    child = None
    if parallel:
        pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
        from .. import limits

        gb = None if limits._LIMIT is None else limits._LIMIT / 1e9
        child = pool.submit(_llm_child, out, max(1, threads // 2), logging.getLogger("mechfact").getEffectiveLevel(),
                            gb, {**common, "families": families})
        torch.set_num_threads(max(1, threads - threads // 2))
    try:
        with _blas_threads(torch.get_num_threads()):
            for name, fn in PARTS:
                if name == "llm" and child is not None:
                    continue
                kw = {"families": families} if name == "llm" else {}
                parts[name] = _timed(name, fn, out, timing, **common, **kw)
        if child is not None:
            parts["llm"], timing["llm"] = child.result()
    except BaseException:  # an error or Ctrl-C here: stop the second process instead of waiting minutes for it
        procs = (getattr(pool, "_processes", None) or {}) if child is not None else {}
        for proc in list(procs.values()):
            proc.terminate()
        raise
    finally:
        if child is not None:
            pool.shutdown(cancel_futures=True)
            torch.set_num_threads(threads)
    sections = [s for name, _ in PARTS for s in parts[name].sections]
    claims = [c for name, _ in PARTS for c in parts[name].claims]
    from .layout import REFERENCES_NOTE, intro

    meta = {"versions": versions(), "device": str(device), "seed": seed, "fast": fast, "full": full,
            "sizes": sizes.mode, "torch_threads": threads, "llm_part_in_second_process": bool(parallel),
            "part_wall_time_s": timing, "wall_time_s": round(time.time() - t0, 1)}
    write_json_atomic(out / "quickstart_meta.json", meta)
    write_json_atomic(out / "claims.json", [dataclasses.asdict(c) for c in claims])
    text = intro(fast=fast, full=full, seed=seed, device=device, wall_time_s=meta["wall_time_s"])
    path = render("mechfact quickstart report", sections, meta, out / "report.html", claims=claims, intro=text,
                  references=REFERENCES, references_note=REFERENCES_NOTE)
    logger.info("quickstart finished in %.0f s (parts: %s)", time.time() - t0, timing)
    return path


quickstart = run_quickstart  # the public entry point under its command's name

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TQDM_DISABLE", "1")


@pytest.fixture
def lre_data():
    """The LRE authors' data folder (github evandez/relations, ``data/``: ``factual/`` and ``linguistic/``) named by
    the environment variable ``MECHFACT_LRE_DATA``; a test that needs it skips, saying so, where it is not set or
    not such a folder."""
    from pathlib import Path

    got = os.environ.get("MECHFACT_LRE_DATA")
    if not got or not (Path(got) / "factual").is_dir() or not (Path(got) / "linguistic").is_dir():
        pytest.skip("needs the LRE authors' data (github evandez/relations, data/): set MECHFACT_LRE_DATA to it"
                    + (f" (MECHFACT_LRE_DATA={got} has no factual/ and linguistic/)" if got else ""))
    return Path(got)


@pytest.fixture(autouse=True)
def _seed_everything():
    from mechfact.seeding import seed_everything

    seed_everything(1234)
    yield


@pytest.fixture
def one_thread():
    """Tiny tensors run fastest on one thread (and do not fight other processes)."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="session")
def fast_report(tmp_path_factory):
    """``mechfact quickstart --fast`` once per test session: (out folder, printed stdout).

    Shared by tests/test_quickstart.py and tests/test_report_browser.py (the browser renders the same report), so
    the quickstart runs once however many tests read it. One torch thread, as the quickstart's time is measured
    (2 CPU cores, other work beside it); the caller's thread count is restored."""
    import contextlib
    import io

    import torch

    from mechfact.cli import main
    from mechfact.seeding import seed_everything

    seed_everything(1234)  # as the autouse fixture would for a test that ran the quickstart itself
    out = tmp_path_factory.mktemp("quickstart") / "qs"
    buf = io.StringIO()
    threads = torch.get_num_threads()
    try:
        with contextlib.redirect_stdout(buf):
            rc = main(["quickstart", "--fast", "--out", str(out), "--quiet", "--threads", "1"])
    finally:
        torch.set_num_threads(threads)
    assert rc == 0
    return out, buf.getvalue()


@pytest.fixture(scope="module")
def construction():
    """The explicit construction on FactWorld(64, 3): the known mechanism the causal tests check against (attributes
    in the subject embedding, attention carrying them to the last position, the MLP there selecting)."""
    from mechfact.facts.construct import construct
    from mechfact.facts.world import FactWorld

    world = FactWorld(64, 3, seed=0)
    return construct(world)[0], world


class StopTraining(Exception):
    """Raised by :func:`train_spy`'s hook: a run killed mid-training."""


@pytest.fixture
def train_spy(monkeypatch):
    """``spy(module, every)`` replaces ``module.train_resumable`` by one that checkpoints every ``every`` steps,
    records in ``spy.starts`` the step each training starts from (0: no checkpoint), and raises
    :class:`StopTraining` after the checkpoint of step ``spy.stop_at`` (None: never)."""
    import torch

    def spy(module, every: int):
        real = module.train_resumable

        def hook(state):
            if state["step"] == spy.stop_at:
                raise StopTraining

        def patched(model, world, cfg, path, **k):
            spy.starts.append(torch.load(path, weights_only=True)["step"] if path.exists() else 0)
            return real(model, world, cfg, path, **k, checkpoint_every=every, after_checkpoint=hook)

        monkeypatch.setattr(module, "train_resumable", patched)

    spy.starts, spy.stop_at, spy.Stop = [], None, StopTraining
    return spy


@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
    """{family: LanguageModel} plus the relation folder; built once per session."""
    import torch

    from llm_tiny import FAMILIES, build_model, write_relations
    from mechfact.llm.models.loading import load_model

    root = tmp_path_factory.mktemp("tiny_llms")
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    models = {f: load_model(str(build_model(f, root / f))) for f in FAMILIES}
    torch.set_num_threads(n)
    return {"models": models, "relations": write_relations(root / "relations"), "root": root}

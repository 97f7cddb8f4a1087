import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TQDM_DISABLE", "1")


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

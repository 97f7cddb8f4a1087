import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TQDM_DISABLE", "1")


@pytest.fixture(autouse=True)
def _seed_everything():
    from mechfact.seeding import seed_everything

    seed_everything(1234)
    yield

from __future__ import annotations

import os

import pytest
import torch

# Never let `spot.provider = auto` find a cloud and poll its metadata server from a test (or from
# the training processes tests start): only servers the tests start on loopback are reached.
os.environ["THRIFTY_SPOT_PROVIDER"] = "none"


@pytest.fixture(autouse=True)
def _small_thread_count():
    # Tests share a 2-core machine; more threads only add contention.
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)

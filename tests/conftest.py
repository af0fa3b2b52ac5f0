from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _small_thread_count():
    # Tests share a 2-core machine; more threads only add contention.
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)

from __future__ import annotations

import gc
import os
import signal

import pytest
import torch

# Fixtures for the tests that need a real PostgreSQL server: `postgres_url`, `postgres_db`.
pytest_plugins = ["postgres_server"]

# Never let `spot.provider = auto` find a cloud and poll its metadata server from a test (or from
# the training processes tests start): only servers the tests start on loopback are reached.
os.environ["THRIFTY_SPOT_PROVIDER"] = "none"
# A pinned peak: no fit() pays the CPU matmul benchmark, and MFU does not depend on how busy the
# machine was while it ran. Tests of the measurement itself unset it.
os.environ["THRIFTY_PEAK_TFLOPS"] = "1"
# A pinned CPU: `precision.mode = "auto"` picks bf16 only on CPUs with AMX or AVX512-BF16, so
# without this the suite would train in another precision on such a machine. Set it yourself to
# run the suite as on one: THRIFTY_CPU_FLAGS="amx_bf16 avx512_bf16" make test.
os.environ.setdefault("THRIFTY_CPU_FLAGS", "")

# One CPU thread in every process a test starts, as in the tests' own process (below): the suite
# runs two tests at once on a 2-core machine, and a training process with a thread per core then
# only fights its neighbour for the cores (about 10% of the suite's time). Tests of the thread
# defaults unset it; `--nprocs` and `thrifty sweep` keep what is set, as they do for you.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

# Run in the background of a script (`cmd &`, nohup), this process starts with SIGINT ignored and
# so would every process a test starts: the Ctrl-C tests would see nothing arrive. A handler set
# here is what an interactive run has, and children again start with Python's default handler.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(autouse=True)
def _small_thread_count():
    # Tests share a 2-core machine; more threads only add contention.
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


# The files whose tests start training processes, longest first (their tests' seconds in one
# run of the suite). They run first, each file's tests together (its module fixtures are set up
# once): with `-n 2 --dist worksteal` the other worker runs the short tests meanwhile and then
# takes from the end of this one's queue, so the suite does not end on a long test with the
# other worker idle.
LONGEST_FIRST = (
    "tests/integrations/test_spot_in_frameworks.py",
    "tests/distributed/test_distributed.py",
    "tests/test_sweep_trust_outage.py",
    "tests/test_sweep.py",
    "tests/test_sweep_trust_failures.py",
    "tests/fleet/test_restarts.py",
    "tests/test_tune_stop.py",
    "tests/distributed/test_your_data_ddp.py",
    "tests/test_stop_setup.py",
    "tests/distributed/test_step_timeout.py",
    "tests/test_group_sigterm.py",
    "tests/test_chaos.py",
    "tests/test_isoflop.py",
    "tests/test_run_dir_finished.py",
    "tests/test_gpt2_benchmark.py",
    "tests/test_resume.py",
    "tests/test_your_data.py",
    "tests/test_lock_relaunch.py",
    "tests/test_tune.py",
    "tests/test_scale.py",
    "tests/checkpoint/test_signals.py",
    "tests/test_stream_state_rejected.py",
)


def pytest_collection_modifyitems(config, items):
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))  # stable


def pytest_collection_finish(session):
    # torch, thrifty and every test module live as long as this process: frozen, no later
    # collection walks them again (14% less CPU over the in-process trainer and config tests).
    gc.freeze()

"""A model and data for the stop-signal tests, which `thrifty train` builds in a child process
(PYTHONPATH=tests), and the harness that signals the child at a chosen moment.

Each moment is a file in `marks`: the first time the child gets there it creates the file and
holds (waits) there, so the test knows where the child is when it sends the signal; the next
run of the same command finds the file and goes straight on. That is how the same command
is run again after the stop.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from torch import nn

from helpers import TokenDataset, tiny_gpt

TESTS = Path(__file__).parent
TIMEOUT = 180  # seconds a child may take before the test fails instead of hanging
HOLD_SECONDS = 120  # the longest a child holds at a mark


def first_time(marks: str, where: str) -> bool:
    """True once per `where`: the file `marks/where` did not exist, and now does."""
    try:
        os.close(os.open(Path(marks) / where, os.O_CREAT | os.O_EXCL))
    except FileExistsError:
        return False
    return True


def wait_until(ready, timeout: float = 120.0) -> None:
    """Wait for `ready()`, up to `timeout` seconds (then go on: the test says what it missed)."""
    deadline = time.monotonic() + timeout
    while not ready() and time.monotonic() < deadline:
        time.sleep(0.02)


def hold(marks: str, where: str, until_stop: bool = True) -> None:
    """The first time: mark `where` and wait there, until thrifty heard a stop signal
    (`until_stop`) or for good (until a signal's exception ends the wait)."""
    if not first_time(marks, where):
        return
    from thrifty.records.stop_signals import active_stop_signals

    deadline = time.monotonic() + HOLD_SECONDS
    while time.monotonic() < deadline:
        if until_stop and active_stop_signals().requested:
            return
        time.sleep(0.02)


class Written(logging.Handler):
    """The steps of the "checkpoint step N written" lines: logged once the manager counts the
    save as written (after its manifest is on disk), which is what a stop's message reads."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.steps: set[int] = set()

    def emit(self, record: logging.LogRecord) -> None:
        if str(record.msg).startswith("checkpoint step %d written"):
            self.steps.add(record.args[0])


class Probe(nn.Module):
    """A tiny GPT that holds where `hold` says ("load": loading a checkpoint; "save": the first
    save after it sent itself `send`), and sends `send` to its own process on its
    `send_at`-th training forward (the first run only)."""

    def __init__(self, marks: str, hold: str, send: str, send_at: int, published: int) -> None:
        super().__init__()
        self.inner = tiny_gpt(n_layer=1)
        self.marks, self.hold, self.send, self.send_at = marks, hold, send, send_at
        self.published = published
        self.written = Written()  # the saves the run's manager says it wrote, by step
        logging.getLogger("thrifty").addHandler(self.written)
        self.calls = 0
        self.sent = False

    def forward(self, **batch):
        if self.training:
            self.calls += 1
            if self.calls == self.send_at and first_time(self.marks, "sent"):
                self.sent = True
                if self.published:  # its checkpoint is on disk first, however busy the machine
                    wait_until(lambda: self.published in self.written.steps)
                os.kill(os.getpid(), signal.Signals[self.send])
        return self.inner(**batch)

    def load_state_dict(self, *args, **kwargs):
        if self.hold == "load":
            hold(self.marks, "load")
        return super().load_state_dict(*args, **kwargs)

    def state_dict(self, *args, **kwargs):
        if self.hold == "save" and self.sent:
            hold(self.marks, "save", until_stop=False)  # Ctrl-C is the watcher's: no flag here
        return super().state_dict(*args, **kwargs)


def probe_model(
    marks: str, hold_at: str = "", send: str = "SIGTERM", send_at: int = 0, published: int = 0
) -> Probe:
    """`[task] model`: holds while it is built when `hold_at` is "model" (a rank of its own
    under --nprocs: "model-0", "model-1", ...)."""
    if hold_at == "model":
        hold(marks, f"model-{os.environ.get('RANK', '0')}")
    torch.manual_seed(0)
    return Probe(marks, hold_at, send, send_at, published)


class HeldData(TokenDataset):
    """TokenDataset whose first fetch in a DataLoader worker marks "workers" and holds: the
    loader's workers are being measured (data.num_workers = "auto")."""

    def __init__(self, marks: str, hold_at: str) -> None:
        super().__init__(n=32)
        self.marks, self.hold_at = marks, hold_at

    def __getitem__(self, i: int):
        worker = torch.utils.data.get_worker_info() is not None
        if self.hold_at == "workers" and worker and first_time(self.marks, "workers"):
            time.sleep(HOLD_SECONDS)
        return super().__getitem__(i)


def probe_data(marks: str, hold_at: str = "") -> HeldData:
    """`[task] train_data`."""
    return HeldData(marks, hold_at)


class HeldValidation(TokenDataset):
    """A validation set whose first fetch marks "eval" and holds (the initial evaluation)."""

    def __init__(self, marks: str, hold_at: str) -> None:
        super().__init__(n=8, seed=1)
        self.marks, self.hold_at = marks, hold_at

    def __getitem__(self, i: int):
        if self.hold_at == "eval":
            hold(self.marks, "eval")
        return super().__getitem__(i)


def probe_validation(marks: str, hold_at: str = "") -> HeldValidation:
    """`[task] val_data` (with hold "eval" only)."""
    return HeldValidation(marks, hold_at)


JOB = """
[run]
max_steps = {steps}
log_every = 1
progress = "off"
[batch]
micro = 4
[data]
num_workers = {workers}
[schedule]
decay = "constant"
[checkpoint]
every = {every}
[spot]
provider = "none"
[measure]
breakdown = false
[log]
report = false
[task]
model = "stop_probe:probe_model"
train_data = "stop_probe:probe_data"
{validation}model_args = {{ marks = "{marks}", hold_at = "{hold}", send = "{send}", send_at = {send_at}, published = {published} }}
data_args = {{ marks = "{marks}", hold_at = "{hold}" }}
"""


def job(
    tmp_path: Path,
    hold: str = "",
    *,
    steps: int = 4,
    workers: int | str = 0,
    every: int | str = "off",
    send: str = "SIGTERM",
    send_at: int = 0,
    published: int = 0,
) -> tuple[list[str], Path]:
    """The `thrifty train` command of a probe job, and its marks folder. With `published`,
    the probe sends its signal only once that step's checkpoint is on disk."""
    marks = tmp_path / "marks"
    marks.mkdir(exist_ok=True)
    config = tmp_path / "job.toml"
    config.write_text(
        JOB.format(
            steps=steps,
            workers=workers if isinstance(workers, int) else f'"{workers}"',
            every=every if isinstance(every, int) else f'"{every}"',
            marks=marks,
            hold=hold,
            send=send,
            send_at=send_at,
            published=published,
            validation='val_data = "stop_probe:probe_validation"\n' if hold == "eval" else "",
        )
    )
    out = str(tmp_path / "run")
    return [sys.executable, "-m", "thrifty", "train", str(config), "--out", out], marks


def env() -> dict[str, str]:
    return {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
    }


def run(command: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(command, capture_output=True, text=True, env=env(), timeout=TIMEOUT)


def start(command: list[str], err: Path) -> subprocess.Popen:
    """The command in a process group of its own, its stderr into `err` (read while it runs)."""
    return subprocess.Popen(
        command,
        stdout=subprocess.DEVNULL,
        stderr=err.open("w"),
        env=env(),
        start_new_session=True,
    )


def wait_for(proc: subprocess.Popen, ready, what: str) -> None:
    deadline = time.monotonic() + TIMEOUT
    while not ready():
        assert proc.poll() is None, f"exited {proc.returncode} before {what}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def finish(proc: subprocess.Popen) -> int:
    try:
        return proc.wait(timeout=TIMEOUT)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def signal_at(
    command: list[str], mark: Path, signum: int = signal.SIGTERM, group: bool = False
) -> tuple[int, str]:
    """Run `command`, send `signum` once `mark` exists (to its whole process group with
    `group`, as Slurm and Kubernetes do); its exit code and stderr."""
    err = mark.parent.parent / f"stderr-{mark.name}.txt"
    proc = start(command, err)
    try:
        wait_for(proc, mark.exists, f"{mark.name}")
        (os.killpg if group else os.kill)(proc.pid, signum)
    finally:
        code = finish(proc)
    return code, err.read_text()


def lines_about(stderr: str, word: str) -> list[str]:
    return [line for line in stderr.splitlines() if word in line]


@pytest.fixture
def sigterm_not_for_thrifty():
    """For tests that run `thrifty train` in their own process: a SIGTERM that reaches the
    test's handler went past thrifty's (without it, it would end the test session)."""

    def caught(signum, frame):
        raise AssertionError("the SIGTERM went past thrifty, to the process's own handler")

    previous = signal.signal(signal.SIGTERM, caught)
    yield
    signal.signal(signal.SIGTERM, previous)

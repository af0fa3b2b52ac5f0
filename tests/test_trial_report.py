"""A trial's one protocol with its search (`thrifty tune`, `thrifty sweep`): the trial's
`TrialReport` callback writes JSON lines, the search's `TrialPipe` serves them. Real pipes, and
for the answered evaluations a real child process on the other end."""

from __future__ import annotations

import json
import os
import select
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from thrifty.callbacks import StepEnd
from thrifty.callbacks.trial_pipe import Evaluation, TrialPipe
from thrifty.callbacks.trial_report import TrialReport
from thrifty.children import Child
from thrifty.errors import ThriftyError
from thrifty.records.stop import StopReason
from thrifty.search.engine import Engine

# A trial's side, as the Trainer drives its callbacks: ready, fit start, steps, evaluations
# (the first at step 0). It prints what each evaluation decided.
TRIAL = """
import sys
from types import SimpleNamespace
from thrifty.callbacks import StepEnd
from thrifty.callbacks.trial_report import TrialReport

report = TrialReport.from_argument(sys.argv[1])
report.ready()
budget = SimpleNamespace(end_step=lambda state: 40)
report.on_fit_start(SimpleNamespace(dist=SimpleNamespace(world_size=1), budget=budget, state=None))
print("step 0:", report.on_evaluation_end(0, 3.0))
for step in range(1, 31):
    report.on_step_end(StepEnd(step, {}))
    if step % 10 == 0:
        print(f"step {step}:", report.on_evaluation_end(step, 3.0 - step / 10), flush=True)
"""


def run_trial(tmp_path: Path, pipe: TrialPipe, judge=None) -> tuple[int | None, list[str]]:
    """The trial above, served by `pipe` to its end: its exit code and the lines it printed."""
    log = tmp_path / "trial.log"
    child = Child(
        [sys.executable, "-c", TRIAL, pipe.argument()],
        dict(os.environ),
        log,
        "the trial",
        pass_fds=pipe.child_fds,
    )
    pipe.started()
    try:
        code = pipe.serve(child, lambda: False, judge)
    finally:
        pipe.close()
    return code, log.read_text().splitlines()


def fake_run(world_size: int = 1) -> SimpleNamespace:
    budget = SimpleNamespace(end_step=lambda state: 40)
    return SimpleNamespace(dist=SimpleNamespace(world_size=world_size), budget=budget, state=None)


def lines_in(fd: int) -> list[dict]:
    os.set_blocking(fd, False)
    data = b""
    try:
        while chunk := os.read(fd, 1 << 16):
            data += chunk
    except BlockingIOError:
        pass
    return [json.loads(line) for line in data.splitlines()]


def test_the_search_hears_ready_and_every_step_and_answers_nothing_it_was_not_asked(tmp_path):
    pipe = TrialPipe()  # a tune's: no answers, so no evaluation is reported
    code, printed = run_trial(tmp_path, pipe)
    assert code == 0, printed
    assert pipe.ready is not None
    assert (pipe.steps, pipe.step) == (30, 30)
    assert printed == ["step 0: None", "step 10: None", "step 20: None", "step 30: None"]


def test_a_prune_and_a_pause_answered_through_the_pipe_stop_the_trial_as_pruned_and_preempted(
    tmp_path,
):
    heard: list[Evaluation] = []
    answers = {10: "prune", 20: "pause", 30: "go"}

    def judge(evaluation: Evaluation) -> str:
        heard.append(evaluation)
        return answers[evaluation.step]

    pipe = TrialPipe(answers=True)
    code, printed = run_trial(tmp_path, pipe, judge)
    assert code == 0, printed
    # Step 0 is never asked; each later evaluation carries its loss and the budget's end.
    assert heard == [Evaluation(10, 2.0, 40), Evaluation(20, 1.0, 40), Evaluation(30, 0.0, 40)]
    assert printed == [
        "step 0: None",
        "pruned by the sweep at step 10",  # its log says why it stops
        f"step 10: {StopReason.PRUNED}",
        "paused by the sweep at step 20: its bracket has not caught up",
        f"step 20: {StopReason.PREEMPTED}",
        "step 30: None",
    ]
    assert (pipe.steps, pipe.step) == (30, 30)


def test_a_full_pipe_drops_progress_lines_and_never_blocks_the_run():
    read, write = os.pipe()
    report = TrialReport(write)
    steps = 100_000  # a pipe holds a few thousand lines: most find it full

    def train() -> None:
        for step in range(1, steps + 1):
            report.on_step_end(StepEnd(step, {}))

    trainer = threading.Thread(target=train, daemon=True)
    trainer.start()
    trainer.join(120)  # a blocked write would never return: the thread would still be alive
    assert not trainer.is_alive()
    lines = lines_in(read)  # whole lines only: a line is written whole or dropped
    assert 0 < len(lines) < steps  # the first steps, in order, then none: the pipe was full
    assert lines == [{"step": step} for step in range(1, len(lines) + 1)]
    os.close(read)
    os.close(write)


def test_an_evaluation_waits_for_room_in_a_full_pipe_and_then_for_its_answer():
    read, write = os.pipe()
    answer_read, answer_write = os.pipe()
    report = TrialReport(write, answer_read)
    report.on_fit_start(fake_run())
    while True:  # fill the pipe with progress, as a trial whose search is slow to read
        try:
            os.write(write, b'{"step": 1}\n')
        except BlockingIOError:
            break
    decided: list[StopReason | None] = []
    trial = threading.Thread(target=lambda: decided.append(report.on_evaluation_end(10, 1.5)))
    trial.start()
    pipe_lines = []
    while not pipe_lines or "value" not in pipe_lines[-1]:  # the search reads on
        select.select([read], [], [], 1.0)
        pipe_lines += lines_in(read)
    assert pipe_lines[-1] == {"step": 10, "value": 1.5, "end": 40}
    os.write(answer_write, b"prune\n")
    trial.join(120)
    assert decided == [StopReason.PRUNED]
    for fd in (read, write, answer_read, answer_write):
        os.close(fd)


@pytest.mark.parametrize("closed", ["reports", "answers"])
def test_a_search_that_is_gone_means_go(closed):
    read, write = os.pipe()
    answer_read, answer_write = os.pipe()
    report = TrialReport(write, answer_read)
    report.on_fit_start(fake_run())
    os.close(read if closed == "reports" else answer_write)  # the search's end
    assert report.on_evaluation_end(10, 1.0) is None
    assert report.gone
    assert report.on_evaluation_end(20, 1.0) is None  # not asked again
    report.on_step_end(StepEnd(21, {}))  # progress to a gone search: dropped, no error
    for fd in (write, answer_read, answer_write if closed == "reports" else read):
        os.close(fd)


def test_a_run_of_several_processes_is_not_asked():
    read, write = os.pipe()
    answer_read, answer_write = os.pipe()
    report = TrialReport(write, answer_read)
    report.on_fit_start(fake_run(world_size=2))
    assert report.on_evaluation_end(10, 1.0) is None  # no answer was written: it did not wait
    assert lines_in(read) == []
    for fd in (read, write, answer_read, answer_write):
        os.close(fd)


def test_the_trials_pipes_on_its_command_line_are_checked():
    read, write = os.pipe()
    assert TrialReport.from_argument(str(write)).answers is None
    with pytest.raises(ThriftyError, match=r"the trial's pipes are 'x,1': give REPORTS or "):
        TrialReport.from_argument("x,1")
    os.close(read)
    os.close(write)


CONFIG = """
[run]
max_steps = 40
device = "cpu"
seed = 3
[precision]
mode = "fp32"
[batch]
micro = 16
effective = 16
[eval]
every = 10
[checkpoint]
every = 10
[data]
num_workers = 0
[task]
model = "dist_task:model"
train_data = "dist_task:train_data"
val_data = "dist_task:val_data"
loss_fn = "dist_task:cross_entropy"
"""


@pytest.mark.parametrize(
    "answers, code, steps",
    [({10: "go", 20: "prune"}, 0, 20), ({10: "pause"}, 75, 10)],
    ids=["prune", "pause"],
)
def test_a_real_trial_reports_through_its_entry_point_and_stops_as_its_search_answers(
    tmp_path, answers, code, steps
):
    from thrifty.checkpointing.store.manifest import MANIFEST

    heard: list[Evaluation] = []

    def judge(evaluation: Evaluation) -> str:
        heard.append(evaluation)
        return answers[evaluation.step]

    out = tmp_path / "run"
    tests = str(Path(__file__).resolve().parent)
    path = os.pathsep.join(p for p in (tests, os.environ.get("PYTHONPATH", "")) if p)
    engine = Engine(
        tmp_path / "workers", {**os.environ, "PYTHONPATH": path, "CUDA_VISIBLE_DEVICES": ""}
    )
    try:
        child = engine.start(["--out", str(out)], CONFIG.encode(), tmp_path / "train.log", "trial")
        pipe = child.pipe
        assert pipe.serve(child, lambda: False, judge) == code, child.log.read_text()
        child.wait()
    finally:
        engine.close()
    assert [(e.step, e.end) for e in heard] == [(step, 40) for step in sorted(answers)]
    assert pipe.ready is not None and (pipe.steps, pipe.step) == (steps, steps)
    if code == 0:
        summary = json.loads((out / "summary.json").read_text())
        assert (summary["stop_reason"], summary["steps"]) == ("pruned", steps)
    else:  # paused: saved at that step and left as after a preemption, to be resumed
        assert (out / "checkpoints" / f"step-{steps:08d}" / MANIFEST).is_file()
        assert f"preempted at step {steps}; checkpoint saved" in child.log.read_text()

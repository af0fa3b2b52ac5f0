"""Exact resume: a run interrupted and resumed ends with the same bits as one that never was."""

from __future__ import annotations

import http.server
import logging
import os
import signal
import socket
import threading

import pytest
import torch
from torch import nn

from helpers import TokenDataset, tiny_gpt
from thrifty import Trainer
from thrifty.config import TrainConfig
from thrifty.errors import ConfigError, ThriftyError
from thrifty.rundir.files import read_metrics


class SigtermAt(nn.Module):
    """The model, plus a SIGTERM to this process on its `at`-th forward (mid-window when
    accumulating): what a spot reclaim looks like from inside the training loop."""

    def __init__(self, inner: nn.Module, at: int | None) -> None:
        super().__init__()
        self.inner = inner
        self.at = at
        self.calls = 0

    def forward(self, **batch):
        if self.training:
            self.calls += 1
            if self.calls == self.at:
                os.kill(os.getpid(), signal.SIGTERM)
        return self.inner(**batch)


def config(
    out, *, workers=0, accumulate=1, steps=12, every="off", checkpoint=None, **extra
) -> TrainConfig:
    return TrainConfig.from_dict(
        {
            "run": {
                "max_steps": steps,
                "device": "cpu",
                "out": str(out),
                "progress": "off",
                "deterministic": True,
                "log_every": 1,
            },
            "batch": {"micro": 4, "effective": 4 * accumulate},
            "data": {"num_workers": workers},
            "optimizer": {"lr": 3e-3},
            "schedule": {"warmup_steps": 3, "decay": "cosine"},
            "eval": {"every": 5},
            "checkpoint": {"every": every, **(checkpoint or {})},
            "spot": {"provider": "none"},
            **extra,
        }
    )


def train(out, at=None, **kw):
    torch.manual_seed(0)
    model = SigtermAt(tiny_gpt(dropout=0.1), at)
    data = TokenDataset(n=40)  # 10 micro-batches per epoch
    result = Trainer(model, data, config(out, **kw), val_data=TokenDataset(n=8, seed=1)).fit()
    return model, result


def assert_same_weights(model: nn.Module, reference: nn.Module) -> None:
    """Every tensor of the two state dicts equal, bit for bit."""
    pairs = zip(reference.state_dict().items(), model.state_dict().values(), strict=True)
    for (name, a), b in pairs:
        assert torch.equal(a, b), name


def losses(out) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_metrics(out / "metrics.jsonl") if "loss" in r}


@pytest.mark.parametrize(
    ("at", "workers", "accumulate"),
    [(7, 0, 1), (10, 0, 1), (9, 2, 1), (7, 0, 2)],
    ids=["mid-epoch", "epoch-boundary", "with-workers", "mid-accumulation"],
)
def test_interrupted_and_resumed_run_matches_the_uninterrupted_one_bit_for_bit(
    tmp_path, at, workers, accumulate
):
    reference, _ = train(tmp_path / "ref", workers=workers, accumulate=accumulate)
    _, first = train(tmp_path / "cut", at=at, workers=workers, accumulate=accumulate)
    assert first.stop_reason == "preempted"
    assert first.steps < 12
    resumed, second = train(tmp_path / "cut", workers=workers, accumulate=accumulate)
    assert second.steps == 12 and second.stop_reason == "max_steps"
    assert_same_weights(resumed, reference)
    assert losses(tmp_path / "cut") == losses(tmp_path / "ref")  # the whole trajectory


def test_periodic_checkpoints_keep_the_last_two(tmp_path):
    train(tmp_path / "run", every=3)
    steps = sorted(
        int(p.name.split("-")[1])
        for p in (tmp_path / "run" / "checkpoints").iterdir()
        if p.name.startswith("step-")
    )
    assert steps == [9, 12]  # 3, 6 purged after newer ones were published; 12 is the final one


def test_a_model_of_another_shape_is_refused_with_what_differs(tmp_path):
    train(tmp_path / "run", at=5)
    shallower = SigtermAt(tiny_gpt(n_layer=2), None)
    with pytest.raises(
        ThriftyError,
        match=r"another model: parameter inner\.blocks\.2\.\S+ is only in the checkpoint",
    ):
        Trainer(shallower, TokenDataset(n=40), config(tmp_path / "run")).fit()


def test_another_effective_batch_is_refused(tmp_path):
    train(tmp_path / "run", at=5)
    with pytest.raises(ThriftyError, match="effective batch of 4, this run has 8"):
        Trainer(
            SigtermAt(tiny_gpt(), None), TokenDataset(n=40), config(tmp_path / "run", accumulate=2)
        ).fit()


def test_resume_never_refuses_to_start_over_a_run_with_checkpoints(tmp_path):
    train(tmp_path / "run", at=5)
    cfg = config(tmp_path / "run", checkpoint={"resume": "never"})
    with pytest.raises(ThriftyError, match="holds checkpoints and checkpoint.resume = never"):
        Trainer(SigtermAt(tiny_gpt(), None), TokenDataset(n=40), cfg).fit()


def test_resume_from_an_explicit_checkpoint(tmp_path):
    train(tmp_path / "a", every=4)  # checkpoints at 4, 8 (purged later), 12
    ckpt = sorted((tmp_path / "a" / "checkpoints").glob("step-*"))[0]
    cfg = config(tmp_path / "b", checkpoint={"resume": str(ckpt)}, steps=14)
    result = Trainer(SigtermAt(tiny_gpt(dropout=0.1), None), TokenDataset(n=40), cfg).fit()
    assert result.steps == 14
    first = read_metrics(tmp_path / "b" / "metrics.jsonl")[0]
    assert first == {"step": int(ckpt.name.split("-")[1]), "event": "resumed"}


def test_a_warm_started_run_preempted_resumes_its_own_save_not_the_one_it_started_from(tmp_path):
    # A spot relaunch repeats the command, checkpoint.resume and all: it once went back to the
    # checkpoint the run started from at every preemption, throwing away what it had trained.
    train(tmp_path / "a", every=4)  # checkpoints at 8 and 12 kept
    start = tmp_path / "a" / "checkpoints" / "step-00000008"
    settings = {"checkpoint": {"resume": str(start)}, "steps": 14}
    reference, _ = train(tmp_path / "ref", **settings)
    train(tmp_path / "b", at=3, **settings)  # SIGTERM on its 3rd forward: saves and stops
    saved = max(int(p.name.split("-")[1]) for p in (tmp_path / "b" / "checkpoints").glob("step-*"))
    assert saved > 8
    model, result = train(tmp_path / "b", **settings)
    assert result.steps == 14
    resumed = [r for r in read_metrics(tmp_path / "b" / "metrics.jsonl") if "event" in r]
    assert [r["step"] for r in resumed if r["event"] == "resumed"] == [8, saved]
    assert losses(tmp_path / "b") == losses(tmp_path / "ref")
    assert_same_weights(model, reference)


def test_a_finished_run_extended_then_preempted_keeps_its_schedules_horizon_on_resume(tmp_path):
    # The extension keeps the cosine's horizon of 12 steps; its checkpoints' config says 16,
    # and a resume from one once rebuilt the schedule on 16: the learning rate jumped.
    def lrs(out):
        return [r["lr"] for r in read_metrics(out / "metrics.jsonl") if "loss" in r]

    for name in ("whole", "stopped"):
        train(tmp_path / name, every=4)
    reference, _ = train(tmp_path / "whole", steps=16)
    train(tmp_path / "stopped", at=2, steps=16)  # SIGTERM on its 2nd forward: 13 is saved
    model, result = train(tmp_path / "stopped", steps=16)
    assert result.steps == 16
    assert lrs(tmp_path / "stopped") == lrs(tmp_path / "whole")
    assert losses(tmp_path / "stopped") == losses(tmp_path / "whole")
    assert_same_weights(model, reference)


class _Preempted(http.server.BaseHTTPRequestHandler):
    requests = 0

    def do_GET(self):  # noqa: N802 (http.server's name)
        type(self).requests += 1
        ok = self.headers.get("Metadata-Flavor") == "Google"
        body = b"TRUE" if ok and type(self).requests >= 3 else b"FALSE"
        self.send_response(200 if ok else 403)
        self.send_header("Metadata-Flavor", "Google")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_a_gcp_preemption_notice_triggers_the_emergency_checkpoint(tmp_path):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Preempted)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        cfg = config(
            tmp_path / "run",
            steps=5000,
            spot={"provider": "gcp", "metadata_url": url, "poll_seconds": 0.05},
        )
        result = Trainer(SigtermAt(tiny_gpt(), None), TokenDataset(n=40), cfg).fit()
    finally:
        server.shutdown()
        server.server_close()
    assert result.stop_reason == "preempted" and result.steps < 5000
    assert _Preempted.requests >= 3
    assert any((tmp_path / "run" / "checkpoints").glob(f"step-*{result.steps}/manifest.json"))


def test_resume_on_a_new_machine_pulls_the_checkpoint_from_s3(tmp_path, monkeypatch):
    """A run on S3 (moto on loopback) is preempted; a 'new machine' — another run directory
    with an empty disk — resumes from the bucket and ends bit-identical to an uninterrupted run."""
    moto_server = pytest.importorskip("moto.server")
    boto3 = pytest.importorskip("boto3")
    pytest.importorskip("s3fs")
    for key in list(os.environ):
        if key.startswith("AWS_"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        endpoint = f"http://127.0.0.1:{port}"
        boto3.client(
            "s3",
            endpoint_url=endpoint,
            aws_access_key_id="k",
            aws_secret_access_key="s",
            region_name="us-east-1",
        ).create_bucket(Bucket="ckpt")
        s3 = {
            "location": "s3://ckpt/run",
            "storage_options": {
                "key": "k",
                "secret": "very-secret",
                "client_kwargs": {"endpoint_url": endpoint},
            },
        }
        reference, _ = train(tmp_path / "ref")
        _, first = train(tmp_path / "machine-a", at=6, checkpoint=s3)
        assert first.stop_reason == "preempted"
        resumed, second = train(tmp_path / "machine-b", checkpoint=s3)
    finally:
        server.stop()
    assert second.steps == 12
    assert_same_weights(resumed, reference)
    assert read_metrics(tmp_path / "machine-b" / "metrics.jsonl")[0] == {
        "step": first.steps,
        "event": "resumed",
    }
    assert "very-secret" not in (tmp_path / "machine-a" / "config.toml").read_text()


def test_an_attempt_killed_before_its_first_checkpoint_starts_over_with_a_warning(tmp_path, caplog):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 1, "loss": 5.5}\n{"step": 2, "loss": 5.4}\n')
    result = Trainer(SigtermAt(tiny_gpt(), None), TokenDataset(n=40), config(run, steps=3)).fit()
    assert result.steps == 3
    assert "ended before its first save" in caplog.text
    assert [r["step"] for r in read_metrics(run / "metrics.jsonl") if "loss" in r] == [1, 2, 3]


def tiny_job(tmp_path, max_steps: int = 400):
    """A TOML job training a tiny demo GPT, for the command-line tests."""
    config = tmp_path / "job.toml"
    config.write_text(
        f'[run]\nmax_steps = {max_steps}\nlog_every = 1\nprogress = "off"\n'
        '[batch]\nmicro = 4\n[data]\nnum_workers = 0\n[schedule]\ndecay = "constant"\n'
        '[checkpoint]\nevery = "off"\n[spot]\nprovider = "none"\n'
        '[task]\nmodel = "thrifty.demo:build_model"\ntrain_data = "thrifty.demo:train_dataset"\n'
        "model_args = { n_layer = 2, n_head = 2, n_embd = 32, block_size = 32 }\n"
        "data_args = { block_size = 32, max_bytes = 100000 }\n"
    )
    return config


def test_resume_option_on_the_command_line(tmp_path, capsys):
    from thrifty.cli import main

    config = tiny_job(tmp_path, max_steps=3)
    out = str(tmp_path / "run")
    assert main(["train", str(config), "--out", out]) == 0
    (tmp_path / "run" / "summary.json").unlink()  # as if it had been stopped
    capsys.readouterr()
    assert main(["train", str(config), "--out", out, "--resume", "never"]) == 2
    assert "holds checkpoints and checkpoint.resume = never" in capsys.readouterr().err
    bad = tmp_path / "nowhere" / "step-00000009"
    assert main(["train", str(config), "--out", out, "--resume", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("thrifty: error: ") and "nowhere" in err
    assert len(err.strip().splitlines()) == 1


def test_sigterm_to_thrifty_train_saves_and_exits_75_then_the_same_command_resumes(
    tmp_path, capsys, caplog
):
    import subprocess
    import sys
    import time

    config = tiny_job(tmp_path)
    command = [
        sys.executable,
        "-m",
        "thrifty",
        "train",
        str(config),
        "--out",
        str(tmp_path / "run"),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True
    )
    try:
        metrics = tmp_path / "run" / "metrics.jsonl"
        deadline = time.monotonic() + 90
        while not (metrics.exists() and metrics.read_text().count('"loss"') >= 3):
            assert proc.poll() is None and time.monotonic() < deadline, (
                proc.stderr.read() if proc.poll() else "timeout"
            )
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 75, err
    assert "received SIGTERM: saving an emergency checkpoint" in err
    assert "preempted at step" in out
    saved = [p.parent.name for p in (tmp_path / "run" / "checkpoints").glob("step-*/manifest.json")]
    assert len(saved) == 1
    step = int(saved[0].split("-")[1])
    # The same command resumes (run in this process: what the stop left is what it meets).
    from thrifty.cli import main

    capsys.readouterr()
    caplog.set_level(logging.INFO)  # the log capture takes thrifty's lines
    code = main([*command[3:], "--steps", str(step + 2)])
    again = capsys.readouterr().err + caplog.text
    assert code == 0, again
    assert f"resumed from step {step}" in again


def test_auto_interval_is_dalys_for_the_measured_stall():
    from thrifty.checkpointing.saving.saves import auto_interval
    from thrifty.plan.spot import daly_interval

    tau, text = auto_interval(stall_seconds=2.0, save_seconds=5.0, interruption_rate=0.5)
    assert tau == pytest.approx(daly_interval(2.0, 7200.0))  # MTBI of 0.5/h = 2 h
    assert "Daly" in text and "expected overhead" in text
    # Never shorter than one full save: at most one save in flight.
    tau, _ = auto_interval(stall_seconds=0.001, save_seconds=600.0, interruption_rate=10.0)
    assert tau == 600.0


def test_auto_interval_is_capped_so_a_death_without_notice_loses_at_most_max_interval():
    from thrifty.checkpointing.saving.saves import auto_interval
    from thrifty.config import CheckpointConfig
    from thrifty.plan.spot import daly_interval

    # A 2 s stall at the default 5-10% advisor bucket: Daly's optimum is hours.
    daly, _ = auto_interval(stall_seconds=2.0, save_seconds=5.0, interruption_rate="5-10%")
    assert daly > 3 * 3600
    cap = CheckpointConfig().max_interval_seconds
    assert cap == 1800.0
    tau, text = auto_interval(2.0, 5.0, "5-10%", max_seconds=cap)
    assert tau == 1800.0
    assert text.startswith(
        f"checkpoint every 30.0 min (checkpoint.max_interval; Daly's optimum {daly / 3600:.1f} h;"
    )
    # Under the cap, Daly's interval as before; never shorter than one full save.
    tau, text = auto_interval(2.0, 5.0, 0.5, max_seconds=cap)
    assert tau == pytest.approx(daly_interval(2.0, 7200.0)) and "(Daly;" in text
    assert auto_interval(0.001, 2400.0, "5-10%", max_seconds=cap)[0] == 2400.0
    with pytest.raises(ConfigError, match="checkpoint.max_interval = 'soon' is invalid"):
        CheckpointConfig(max_interval="soon")


def test_a_job_on_several_instances_is_interrupted_whenever_any_one_is(monkeypatch):
    from thrifty.checkpointing.saving.saves import auto_interval
    from thrifty.plan.spot import daly_interval

    # 4 nodes of 8 under torchrun: 4 x 0.5/h = 2/h for the job, an MTBI of 30 min.
    monkeypatch.setenv("WORLD_SIZE", "32")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    tau, text = auto_interval(stall_seconds=2.0, save_seconds=5.0, interruption_rate=0.5)
    assert tau == pytest.approx(daly_interval(2.0, 1800.0))
    assert "0.5 interruptions/h per instance x 4 instances" in text


def test_thrifty_spot_provider_pins_what_auto_means(monkeypatch):
    from thrifty.checkpointing.saving.preemption import make_poller

    monkeypatch.setenv("THRIFTY_SPOT_PROVIDER", "gcp")
    assert make_poller("auto", "http://127.0.0.1:9").name == "gcp"
    monkeypatch.setenv("THRIFTY_SPOT_PROVIDER", "none")
    assert make_poller("auto") is None
    monkeypatch.setenv("THRIFTY_SPOT_PROVIDER", "oracle")
    with pytest.raises(ConfigError, match="THRIFTY_SPOT_PROVIDER must be one of"):
        make_poller("auto")

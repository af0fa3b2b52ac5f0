"""Start-up lines a newcomer reads as trouble: said once, only where they apply. The data
probe's line once per process (each loader used to probe and say it again), no MFU against a
peak that rounds to or is zero, and no AWS spot-advisor figures on a run not priced for spot."""

from __future__ import annotations

import logging

from helpers import TokenDataset, tiny_gpt
from thrifty import Trainer
from thrifty.checkpointing.saving.saves import auto_interval
from thrifty.config import TrainConfig
from thrifty.measure.peak import Peak


class OnceProbed(TokenDataset):
    """A dataset type no other test trains on: its probe line is this test's alone."""


def fit(tmp_path, name: str, val_data=None, train_data=None, **sections) -> object:
    base = {
        "run": {"max_steps": 4, "device": "cpu", "out": str(tmp_path / name), "progress": "off"},
        "batch": {"micro": 4},
        "data": {"num_workers": 0},
        "log": {"report": False},
    }
    for section, values in sections.items():
        base[section] = {**base.get(section, {}), **values}
    config = TrainConfig.from_dict(base)
    data = train_data or TokenDataset(n=32)
    with Trainer(tiny_gpt(n_layer=1), data, config, val_data=val_data) as trainer:
        return trainer.fit()


def said(caplog, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if text in r.getMessage()]


def test_the_data_probe_line_is_said_once_per_process(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="thrifty")
    # The workers' measurement, the training and each evaluation wrap the data anew; a second
    # run in the same process finds the same answer.
    for name in ("first", "second"):
        fit(
            tmp_path,
            name,
            train_data=OnceProbed(n=32),
            val_data=OnceProbed(n=8, seed=1),
            data={"num_workers": "auto"},
            eval={"every": 1},
        )
    lines = sorted(said(caplog, "OnceProbed draws from no global random generator"))
    assert lines == [
        "data: OnceProbed draws from no global random generator (32 samples probed): its "
        "batches are fetched unseeded",
        "data: OnceProbed draws from no global random generator (8 samples probed): its "
        "batches are fetched unseeded",
    ], lines


def test_a_peak_below_a_teraflop_is_shown_in_gigaflops(tmp_path, caplog, monkeypatch):
    monkeypatch.setenv("THRIFTY_PEAK_TFLOPS", "0.04")
    caplog.set_level(logging.INFO, logger="thrifty")
    result = fit(tmp_path, "slow")
    assert said(caplog, "MFU against") == [
        "MFU against 40 GFLOP/s (given: 0.04 TFLOP/s (THRIFTY_PEAK_TFLOPS))"
    ]
    assert not said(caplog, "0.0 TFLOP/s")
    assert result.mfu is not None


def test_a_zero_peak_says_once_why_mfu_is_not_shown(tmp_path, caplog, monkeypatch):
    import thrifty.measure.peak as peak

    zero = Peak(0.0, "measured: best bf16 matmul (256x256) of 0 timed", measured=True)
    monkeypatch.setattr(peak, "peak_flops", lambda *a, **k: zero)
    caplog.set_level(logging.INFO, logger="thrifty")
    result = fit(tmp_path, "zero")
    assert not said(caplog, "MFU against")
    assert said(caplog, "MFU is not shown") == [
        "MFU is not shown: the peak found for this device is 0 FLOP/s (measured: best bf16 "
        "matmul (256x256) of 0 timed), nothing to measure against; give the dense peak for the "
        "dtype trained in (measure.peak_tflops, or --peak-tflops on the command line)"
    ]
    assert result.mfu is None


def test_no_spot_advisor_figures_on_a_run_not_priced_for_spot(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="thrifty")
    fit(tmp_path, "on-demand", checkpoint={"every": "auto"})
    (line,) = said(caplog, "checkpoint every")
    assert "advisor" not in line and "AWS" not in line, line
    assert "an assumed 1.07e-04 interruptions/h (checkpoint.interruption_rate)" in line, line
    caplog.clear()
    fit(
        tmp_path,
        "spot",
        checkpoint={"every": "auto"},
        cost={"usd_per_gpu_hour": 1.0, "pricing": "spot"},
    )
    (line,) = said(caplog, "checkpoint every")
    assert "AWS advisor bucket 5-10% ≈ 1.07e-04/h" in line, line


def test_the_interval_line_names_the_advisor_only_for_spot():
    _, spot = auto_interval(2.0, 5.0, "5-10%", instances=1)
    _, on_demand = auto_interval(2.0, 5.0, "5-10%", instances=1, spot=False)
    assert "AWS advisor bucket 5-10%" in spot
    assert "advisor" not in on_demand and "an assumed 1.07e-04 interruptions/h" in on_demand

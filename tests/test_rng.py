"""RNG state in checkpoints: a resume continues the same random stream, also on a machine with
another number of GPUs (CUDA is faked on CPU: generators are tensors per device index)."""

from __future__ import annotations

import io
import logging
import random

import numpy as np
import pytest
import torch

from thrifty.checkpointing.saving.rng import rng_state, set_rng_state


class FakeCuda:
    """`devices` visible GPUs, each with a generator state; `current` is the training device."""

    def __init__(self, devices: int, current: int = 0) -> None:
        self.states = {i: torch.tensor([i], dtype=torch.uint8) for i in range(devices)}
        self.current = current

    def install(self, monkeypatch: pytest.MonkeyPatch) -> FakeCuda:
        cuda = torch.cuda
        monkeypatch.setattr(cuda, "is_available", lambda: bool(self.states))
        monkeypatch.setattr(cuda, "device_count", lambda: len(self.states))
        monkeypatch.setattr(cuda, "current_device", lambda: self.current)
        monkeypatch.setattr(
            cuda, "get_rng_state_all", lambda: [self.states[i] for i in sorted(self.states)]
        )
        monkeypatch.setattr(cuda, "set_rng_state_all", self._set_all)
        monkeypatch.setattr(cuda, "set_rng_state", self._set)
        return self

    def _set(self, state: torch.Tensor, device: int = 0) -> None:
        if device not in self.states:
            raise RuntimeError(f"invalid device ordinal {device}")
        self.states[device] = state.clone()

    def _set_all(self, states: list[torch.Tensor]) -> None:
        if len(states) != len(self.states):
            raise ValueError("this fake has another number of devices")
        for i, state in enumerate(states):
            self._set(state, i)


def saved_on(devices: int, current: int, monkeypatch: pytest.MonkeyPatch) -> dict:
    """A state captured by a process training on cuda:`current` of `devices` visible GPUs,
    whose generators have moved on (device i's state is [100 + i])."""
    fake = FakeCuda(devices, current).install(monkeypatch)
    fake.states = {i: torch.tensor([100 + i], dtype=torch.uint8) for i in range(devices)}
    return rng_state()


def draws() -> tuple[float, float, torch.Tensor]:
    return random.random(), float(np.random.rand()), torch.rand(3)


def test_the_cpu_generators_continue_the_same_stream_after_a_weights_only_round_trip():
    torch.manual_seed(0)
    random.seed(0)
    np.random.seed(0)
    buffer = io.BytesIO()
    torch.save(rng_state(), buffer)
    expected = draws()
    draws()  # move every generator on
    buffer.seek(0)
    assert set_rng_state(torch.load(buffer, weights_only=True)) is None
    again = draws()
    assert again[:2] == expected[:2]
    assert torch.equal(again[2], expected[2])


def test_the_same_number_of_gpus_restores_every_device_as_it_was(monkeypatch, caplog):
    state = saved_on(4, 2, monkeypatch)
    fake = FakeCuda(4, 2).install(monkeypatch)
    with caplog.at_level(logging.WARNING, logger="thrifty"):
        assert set_rng_state(state) is None
    assert [int(fake.states[i]) for i in range(4)] == [100, 101, 102, 103]
    assert not caplog.records


def test_eight_gpus_saved_one_visible_restores_the_training_devices_generator(monkeypatch, caplog):
    state = saved_on(8, 3, monkeypatch)  # rank 3 of a job that saw all 8 GPUs
    fake = FakeCuda(1, 0).install(monkeypatch)  # one GPU per task after the resume
    with caplog.at_level(logging.WARNING, logger="thrifty"):
        assert set_rng_state(state) is None  # bit-exact: cuda:3's stream goes on, on cuda:0
    assert int(fake.states[0]) == 103
    assert not caplog.records


def test_one_gpu_per_task_saved_then_eight_visible_puts_the_stream_on_the_training_device(
    monkeypatch,
):
    state = saved_on(1, 0, monkeypatch)
    fake = FakeCuda(8, 5).install(monkeypatch)  # local rank 5 now trains on cuda:5
    assert set_rng_state(state) is None
    assert int(fake.states[5]) == 100


def test_an_older_checkpoint_without_the_training_device_restores_what_both_have_and_says_so(
    monkeypatch, caplog
):
    state = saved_on(8, 0, monkeypatch)
    del state["cuda_device"]  # written before the training device was recorded
    fake = FakeCuda(2).install(monkeypatch)
    with caplog.at_level(logging.WARNING, logger="thrifty"):
        note = set_rng_state(state)
    assert note == (
        "RNG: the checkpoint holds 8 CUDA generator state(s), 2 restored (2 CUDA device(s) are "
        "visible here); training goes on, but the run is no longer bit-exact"
    )
    assert [int(fake.states[i]) for i in range(2)] == [100, 101]
    assert [r.getMessage() for r in caplog.records] == [note]  # said once


def test_gpu_states_resumed_on_a_machine_without_cuda_say_nothing_was_restored(monkeypatch):
    state = saved_on(2, 1, monkeypatch)
    FakeCuda(0).install(monkeypatch)
    note = set_rng_state(state)
    assert note is not None
    assert "holds 2 CUDA generator state(s), 0 restored (no CUDA device is visible" in note
    assert note.endswith("no longer bit-exact")

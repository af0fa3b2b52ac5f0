"""A FLOP count whose step fails (out of memory before its backward) must not keep the
step's activations alive: on a GPU they were the whole memory the training then lacked."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

from thrifty.measure.flops import count_flops


class FailsAfterForward(torch.nn.Module):
    """Saves an output for backward (exp keeps its result), then fails as an OOM would."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(256, 256))
        self.made: list[weakref.ref[torch.Tensor]] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = (x @ self.weight).exp()
        self.made.append(weakref.ref(out))
        raise torch.OutOfMemoryError("out of memory (simulated after the forward)")


def test_failed_count_frees_the_activations_it_saved() -> None:
    model = FailsAfterForward()
    with pytest.raises(torch.OutOfMemoryError):
        count_flops(lambda: model(torch.randn(64, 256)).sum().backward())
    gc.collect()
    assert model.made and model.made[0]() is None, "the failed step's activation is still alive"


def test_count_still_measures_saved_bytes_after_release() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU())
    count = count_flops(lambda: model(torch.randn(8, 64)).sum().backward())
    assert count.flops > 0
    assert count.activation_bytes >= 8 * 64 * 4  # the GELU's input, at least


class Regression(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x).pow(2).mean()


def test_a_micro_batch_too_large_to_count_is_counted_on_one_sample(monkeypatch) -> None:
    """The training halves a micro-batch that does not fit; its FLOP count (and so the MFU)
    must not be lost to the same error: one sample, scaled, gives the same figure."""
    from thrifty.data.geometry import BatchGeometry
    from thrifty.levers.precision import resolve_precision
    from thrifty.measure import instruments

    model = Regression()
    data = [{"x": torch.randn(16)} for _ in range(8)]
    geometry = BatchGeometry(micro=8, accumulation=1, effective=8)
    cpu = torch.device("cpu")
    args = (model, data, geometry, cpu, resolve_precision("fp32", cpu), None, None)
    exact = instruments.count_step_flops(*args, breakdown=True)
    real = instruments.measure_flops
    sizes: list[int] = []

    def fits_one(model: torch.nn.Module, batch: dict, call, device, blocks) -> object:  # type: ignore[no-untyped-def]
        sizes.append(len(batch["x"]))
        if len(batch["x"]) > 1:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return real(model, batch, call, device=device, blocks=blocks)

    monkeypatch.setattr(instruments, "measure_flops", fits_one)
    scaled = instruments.count_step_flops(*args, breakdown=True)
    assert sizes == [2, 1]  # the count's two samples do not fit either
    assert scaled is not None and scaled.flops == exact.flops > 0

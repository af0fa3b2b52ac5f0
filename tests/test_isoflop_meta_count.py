"""`thrifty plan isoflop` counts each size's parameters without allocating the model: a size
whose weights would need hundreds of GB is counted all the same, and every size counts what
building it for real counts."""

from __future__ import annotations

from pathlib import Path

import tomli_w

from test_isoflop import CONFIG, KEY
from thrifty.demo import build_model
from thrifty.search.sweep.isoflop import layout

# n_embd 100,000 in one layer: about 1.2e11 parameters, 480 GB of float32 weights.
HUGE = 100_000


def built(n_embd: int) -> int:
    """The demo GPT's parameters, built for real (a small size)."""
    model = build_model(**{**CONFIG["task"]["model_args"], "n_embd": n_embd})
    return sum(p.numel() for p in model.parameters())


def demo_params(n_embd: int) -> int:
    """The demo GPT's parameter count at any width, exactly: a quadratic in n_embd, so three
    real builds of small widths (8, 16, 24) determine it."""
    y0, y1, y2 = built(8), built(16), built(24)
    k = (n_embd - 8) // 8  # widths in steps of 8 from 8
    second = y2 - 2 * y1 + y0
    return y0 + k * (y1 - y0) + k * (k - 1) // 2 * second


def test_a_size_too_large_to_allocate_is_counted_on_the_meta_device() -> None:
    from thrifty.search.sweep.isoflop import count_params

    small = {**CONFIG["task"]["model_args"], "n_embd": 40}
    assert count_params(build_model, small) == built(40) == demo_params(40)
    huge = {**CONFIG["task"]["model_args"], "n_embd": HUGE}
    # over 1e11 parameters, 400 GB or more as float32: a real build would be out of memory
    assert count_params(build_model, huge) == demo_params(HUGE) > 1e11


def test_the_grid_lays_out_a_size_that_would_not_fit_in_memory(tmp_path: Path) -> None:
    path = tmp_path / "job.toml"
    path.write_text(tomli_w.dumps(CONFIG))
    runs = layout(path, KEY, [8, 16, HUGE], [1e20])
    assert [r.params for r in runs] == [built(8), built(16), demo_params(HUGE)]

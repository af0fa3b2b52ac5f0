"""The report of a real short run, opened in a real browser (headless Chromium): it loads with
no error and no request beyond the file, every section is there, and each chart drew its data.

Drives the system's Chromium through Playwright (no browser download); skipped only where no
Chromium is installed (`make test` installs Debian's where apt-get can)."""

from __future__ import annotations

import io
import shutil
import time

import numpy as np
import pytest

from helpers import TokenDataset, tiny_gpt
from thrifty import Trainer
from thrifty.callbacks import Callback, StepEnd
from thrifty.config import TrainConfig
from thrifty.reporting import write_run_report
from thrifty.reporting.page import RUN_SECTIONS

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def short_run(out) -> None:
    """8 steps of a tiny GPT on the CPU: evaluations, saves, a price, system sampling."""
    config = TrainConfig.from_dict(
        {
            "run": {
                "max_steps": 8,
                "device": "cpu",
                "out": str(out),
                "progress": "off",
                "log_every": 2,
            },
            "batch": {"micro": 4, "effective": 8},
            "data": {"num_workers": 0},
            "eval": {"every": 4},
            "checkpoint": {"every": 4},
            "cost": {"usd_per_gpu_hour": 2.0, "pricing": "spot", "on_demand_usd_per_gpu_hour": 6.0},
            "measure": {"sample_seconds": 0.05},
        }
    )
    data = TokenDataset(n=64)
    Trainer(tiny_gpt(n_layer=2), data, config, val_data=data, callbacks=[Yield()]).fit()


class Yield(Callback):
    """Sleeps a moment at each step's end: the system sampler's thread gets the core even on a
    machine whose cores other tests hold (a run this short could otherwise end unsampled)."""

    def on_step_end(self, step_info: StepEnd) -> None:
        time.sleep(0.06)


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium installed (apt-get install chromium)")
def test_the_report_of_a_real_run_renders_every_section_and_chart_in_chromium(tmp_path):
    from PIL import Image
    from playwright.sync_api import sync_playwright

    short_run(tmp_path / "run")
    report = write_run_report(tmp_path / "run")
    assert report is not None
    errors, requests = [], []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 900})
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on("request", lambda r: requests.append(r.url))
            page.goto(report.as_uri())
            shot = Image.open(io.BytesIO(page.screenshot(full_page=True))).convert("RGB")
            sections = page.eval_on_selector_all("section", "s => s.map(e => e.dataset.section)")
            charts = page.eval_on_selector_all(
                "figure.chart",
                "fs => fs.map(f => [f.id, f.querySelectorAll('polyline, polygon').length,"
                " f.querySelectorAll('circle').length])",
            )
            points = page.eval_on_selector(
                "#chart-loss polyline", "e => e.getAttribute('points').trim().split(/\\s+/).length"
            )
            boxes = {f: page.locator(f"#{f} svg").bounding_box() for f, _, _ in charts}
        finally:
            browser.close()
    assert errors == []
    assert requests == [report.as_uri()]  # nothing fetched beyond the file itself
    assert sections == list(RUN_SECTIONS)
    ids = [f for f, _, _ in charts]
    for expected in ("loss", "throughput", "mfu", "breakdown", "cost", "system-cpu_percent"):
        assert f"chart-{expected}" in ids
    assert points == 8  # a point for each step's training loss
    for figure, drawn, dots in charts:
        assert drawn > 0, figure
        # A line is hundreds of pixels; a lone sample (the sampler thread starved on a busy
        # machine) is one dot of a few dozen.
        assert _coloured_pixels(shot, boxes[figure]) > (200 if dots != 1 else 12), figure


def _coloured_pixels(shot, box) -> int:
    """Pixels in `box` that are neither background nor the greys of the grid and text."""
    crop = shot.crop((box["x"], box["y"], box["x"] + box["width"], box["y"] + box["height"]))
    pixels = np.asarray(crop, dtype=np.int16)
    return int(((pixels.max(axis=2) - pixels.min(axis=2)) > 40).sum())

"""Run directories with known records, and reading back what a chart drew."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

SVG = "{http://www.w3.org/2000/svg}"


def step(n: int, *, loss: float = 2.0, seconds: float = 0.1, tokens: int = 1000, **extra: Any):
    """Step `n`'s record as the Trainer writes it: `tokens` per step, so far `n * tokens`."""
    return {
        "step": n,
        "loss": loss,
        "grad_norm": 1.0,
        "lr": 1e-3,
        "samples": 8 * n,
        "tokens": tokens * n,
        "step_seconds": seconds,
        **extra,
    }


def write_run(
    path: Path,
    records: list[dict[str, Any]],
    *,
    summary: dict[str, Any] | None = None,
    diagnosis: dict[str, Any] | None = None,
    saves: tuple[int, ...] = (),
    tail: str = "",
) -> Path:
    """A run directory holding `records` in metrics.jsonl (then `tail`, a line cut short),
    the JSON files given, and a checkpoint folder with a manifest for each step in `saves`."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.toml").write_text(
        '[run]\nname = "known"\n\n[batch]\nmicro = 4\neffective = 8\n'
    )
    lines = "".join(json.dumps(r) + "\n" for r in records)
    (path / "metrics.jsonl").write_text(lines + tail)
    for name, data in (("summary.json", summary), ("diagnosis.json", diagnosis)):
        if data is not None:
            (path / name).write_text(json.dumps(data))
    for s in saves:
        folder = path / "checkpoints" / f"step-{s:08d}"
        folder.mkdir(parents=True)
        (folder / "manifest.json").write_text(
            json.dumps({"format": "thrifty-checkpoint", "step": s})
        )
    return path


def flat(points) -> list[float]:
    """(x, y) pairs as one list, for pytest.approx."""
    return [v for point in points for v in point]


def drawn(svg: str) -> dict[str, list[tuple[float, float]]]:
    """Each polyline of a chart's SVG, its pixels mapped back to data values through the
    mapping the <svg> carries (data-plot, data-x-domain, data-y-domain)."""
    root = ET.fromstring(svg)
    to_data = data_mapping(root)
    lines = {}
    for group in root.iter(f"{SVG}g"):
        line = group.find(f"{SVG}polyline")
        if group.get("class") == "series" and line is not None:
            pixels = [tuple(map(float, p.split(","))) for p in line.get("points", "").split()]
            lines[group.get("data-series")] = [to_data(px, py) for px, py in pixels]
    return lines


def data_mapping(root: ET.Element):
    left, top, width, height = map(float, root.get("data-plot").split())
    x0, x1 = map(float, root.get("data-x-domain").split())
    y0, y1 = map(float, root.get("data-y-domain").split())

    def to_data(px: float, py: float) -> tuple[float, float]:
        return (
            x0 + (px - left) / width * (x1 - x0),
            y0 + (top + height - py) / height * (y1 - y0),
        )

    return to_data


def mark_steps(svg: str, kind: str) -> list[float]:
    """The steps the marks of `kind` stand at, read back from their pixels."""
    root = ET.fromstring(svg)
    to_data = data_mapping(root)
    steps = []
    for element in root.iter():
        if f"mark-{kind}" not in (element.get("class") or "").split():
            continue
        line = element.find(f"{SVG}line")
        if line is not None:
            px = float(line.get("x1"))
        else:  # a save's triangle: its tip is the step
            px = float(element.get("points").split()[0].split(",")[0])
        steps.append(round(to_data(px, 0.0)[0], 6))
    return steps

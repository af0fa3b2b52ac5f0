"""The progress bar: step, loss, tokens/s and time left (rich)."""

from __future__ import annotations

import sys
from typing import Any


class ProgressBar:
    """A rich progress bar, or nothing when disabled (not a terminal, or run.progress = off)."""

    def __init__(
        self, total_steps: int | None, mode: str = "auto", description: str = "train"
    ) -> None:
        self.enabled = mode == "on" or (mode == "auto" and sys.stderr.isatty())
        self._progress: Any = None
        if not self.enabled:
            return
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self._progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("loss {task.fields[loss]}"),
            TextColumn("{task.fields[rate]}"),
            TimeElapsedColumn(),
            TextColumn("left"),
            TimeRemainingColumn(),
            console=Console(stderr=True),
            transient=False,
        )
        self._task = self._progress.add_task(description, total=total_steps, loss="-", rate="")
        self._progress.start()

    def update(
        self,
        step: int,
        loss: float,
        tokens_per_second: float,
        samples_per_second: float,
        dollars: str = "",
    ) -> None:
        if self._progress is None:
            return
        rate = (
            f"{tokens_per_second:,.0f} tok/s"
            if tokens_per_second
            else f"{samples_per_second:,.1f} samples/s"
        )
        if dollars:
            rate = f"{rate}  {dollars}"
        self._progress.update(self._task, completed=step, loss=f"{loss:.4f}", rate=rate)

    def step(self, step: int) -> None:
        """Move the bar to `step` between flushes: its count moves every step, its loss and rate
        at each flush (reading them would sync). Nothing when the bar is off."""
        if self._progress is not None:
            self._progress.update(self._task, completed=step)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

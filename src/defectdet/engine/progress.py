"""Rich progress bar for training: loss terms, images/s, ETA. Silent when disabled or not a TTY."""

from __future__ import annotations

import sys
import time

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn


class TrainProgress:
    """Use as a context manager; `start(description, total)`, `update(losses, images)` per step."""

    def __init__(self, enabled: bool = True, time_budget_seconds: float | None = None):
        self.enabled = enabled and sys.stderr.isatty()
        self.time_budget_seconds = time_budget_seconds
        self._progress: Progress | None = None
        self._task = None
        self._images = 0
        self._started = 0.0

    def __enter__(self) -> TrainProgress:
        if self.enabled:
            self._progress = Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[speed]}"),
                TimeRemainingColumn(),
                TextColumn("{task.fields[losses]}"),
                console=Console(stderr=True),
                transient=False,
            )
            self._progress.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.__exit__(None, None, None)
            self._progress = None

    def start(self, description: str, total: int | None) -> None:
        self._images = 0
        self._started = time.perf_counter()
        if self._progress is not None:
            if self._task is not None:
                self._progress.remove_task(self._task)
            self._task = self._progress.add_task(description, total=total, speed="", losses="")

    def update(self, losses: dict[str, float], images: int, advance: int = 1) -> None:
        self._images += images
        if self._progress is None or self._task is None:
            return
        elapsed = max(1e-9, time.perf_counter() - self._started)
        text = " ".join(f"{name}={value:.3f}" for name, value in losses.items())
        self._progress.update(
            self._task, advance=advance, speed=f"{self._images / elapsed:.1f} img/s", losses=text
        )

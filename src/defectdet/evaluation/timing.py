"""Per-stage wall-clock timer for evaluation and benchmark loops."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

DEFAULT_STAGES = ("decode", "preprocess", "model", "postprocess")


class StageTimer:
    """Accumulate wall time per named stage and count images.

    >>> timer = StageTimer()
    >>> with timer.stage("model"):
    ...     pass
    >>> timer.add_images(1)

    `synchronize` (for example `torch.cuda.synchronize`) is called before each clock read so
    asynchronous device work is charged to the stage that launched it.
    """

    def __init__(self, synchronize: Callable[[], None] | None = None) -> None:
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self.images = 0
        self._synchronize = synchronize

    def _now(self) -> float:
        if self._synchronize is not None:
            self._synchronize()
        return time.perf_counter()

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        start = self._now()
        try:
            yield
        finally:
            self.add(name, self._now() - start)

    def add(self, name: str, seconds: float) -> None:
        self.seconds[name] = self.seconds.get(name, 0.0) + float(seconds)
        self.calls[name] = self.calls.get(name, 0) + 1

    def add_images(self, count: int) -> None:
        self.images += int(count)

    def reset(self) -> None:
        self.seconds.clear()
        self.calls.clear()
        self.images = 0

    def summary(self) -> dict:
        """`{'images', 'total_seconds', 'images_per_second', 'ms_per_image': {stage: ms}, 'total_ms_per_image'}`.

        Stages are listed decode, preprocess, model, postprocess first, then any others in first-use order.
        images/s is images divided by the summed stage time (time spent outside stages is not counted).
        """
        ordered = [name for name in DEFAULT_STAGES if name in self.seconds]
        ordered += [name for name in self.seconds if name not in ordered]
        total = sum(self.seconds.values())
        images = self.images
        per_image = {name: (1000.0 * self.seconds[name] / images if images else None) for name in ordered}
        return {
            "images": images,
            "total_seconds": total,
            "images_per_second": (images / total if images and total > 0 else None),
            "ms_per_image": per_image,
            "total_ms_per_image": (1000.0 * total / images if images else None),
        }

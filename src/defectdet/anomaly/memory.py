"""The memory bank: greedy coreset subsampling of good patch vectors, and the operating threshold.

Greedy coreset (k-center, as PatchCore): start from a random vector, then repeatedly add the vector farthest
from everything chosen so far. The chosen few thousand cover the good patches the way all of them do (every
good patch lies close to one of them), while a random subsample keeps the common patches and loses the rare
ones, which then read as anomalies. Distances are measured on a random projection (`PROJECTED_DIMENSIONS`),
as PatchCore does, to make each step cheaper.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from defectdet.anomaly.graph import MIN_DISTANCE

PROJECTED_DIMENSIONS = 64
PACE_STEPS = 32  # steps timed before the candidates are cut to the time left


def _project(vectors: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    projected = vectors.float()
    if projected.shape[1] > PROJECTED_DIMENSIONS:
        projection = torch.randn(projected.shape[1], PROJECTED_DIMENSIONS, generator=generator)
        projected = projected @ (projection / math.sqrt(PROJECTED_DIMENSIONS))
    return projected


def _paced(
    pool: tuple[torch.Tensor, ...],
    steps_left: int,
    step_s: float,
    deadline: float,
    generator: torch.Generator,
) -> tuple[torch.Tensor, ...]:
    """The candidate arrays `pool` (rows aligned) cut to a random share that leaves time for `steps_left` more
    steps before `deadline`, a step taking `step_s` on all of them now (a step's time grows with the rows)."""
    rows = pool[0].shape[0]
    left = deadline - time.monotonic()
    if left <= 0 or steps_left * step_s <= left:
        return pool
    keep = min(rows, max(2 * steps_left, int(rows * left / (steps_left * step_s))))
    kept = torch.randperm(rows, generator=generator)[:keep]
    return tuple(array[kept] for array in pool)


def greedy_coreset(
    vectors: torch.Tensor,
    size: int,
    seed: int = 0,
    deadline: float | None = None,
    advance: Callable[[int], None] | None = None,
) -> torch.Tensor:
    """Indices of at most `size` rows of ``(M, D)`` `vectors` chosen by greedy k-center selection. `deadline`
    (a `time.monotonic` value): after `PACE_STEPS` steps the candidates not yet chosen are cut to a random share
    that leaves time for all `size` steps, and the selection stops when it passes anyway (at least `PACE_STEPS`
    rows are chosen). `advance(n)`: called as rows are chosen, for a progress bar."""
    size = min(size, vectors.shape[0])
    generator = torch.Generator().manual_seed(seed)
    projected = _project(vectors, generator)
    rows = torch.arange(vectors.shape[0])  # the candidates' row numbers in `vectors`
    norms = (projected * projected).sum(1)
    nearest = torch.full((vectors.shape[0],), float("inf"))
    chosen = [int(torch.randint(vectors.shape[0], (1,), generator=generator))]
    centre, started = projected[chosen[0]], time.monotonic()
    with torch.inference_mode():
        while True:
            distance = norms - 2.0 * (projected @ centre) + (centre * centre).sum()
            torch.minimum(nearest, distance, out=nearest)
            if len(chosen) == size:
                break
            best = int(nearest.argmax())
            chosen.append(int(rows[best]))
            centre = projected[best].clone()
            if len(chosen) % PACE_STEPS == 0:
                if advance is not None:
                    advance(PACE_STEPS)
                if deadline is not None and time.monotonic() > deadline:
                    break
                if deadline is not None and len(chosen) == PACE_STEPS:
                    step_s = (time.monotonic() - started) / PACE_STEPS
                    pool = (projected, rows, norms, nearest)
                    projected, rows, norms, nearest = _paced(
                        pool, size - PACE_STEPS, step_s, deadline, generator
                    )
    return torch.tensor(chosen, dtype=torch.long)


@dataclass(frozen=True)
class Calibration:
    """The operating point chosen on held-out good images. The score of a distance d is
    ``sigmoid(gain x (log d - log shift))``: 0.5 at the operating distance `shift` (the bundle's threshold), and
    on a log scale above it, so that large distances still rank below larger ones instead of all reading 1.0.
    `false_calls`: the held-out images flagged at `shift`."""

    shift: float
    gain: float
    false_calls: int
    images: int
    target_rate: float

    @property
    def false_call_rate(self) -> float:
        return self.false_calls / self.images if self.images else float("nan")


def calibrate(image_scores: np.ndarray, target_rate: float) -> Calibration:
    """The operating distance for held-out good images whose image scores (largest cell distance) are
    `image_scores`: at most ``floor(target_rate x n)`` of them reach it, halfway to the next one up (just
    above the largest when none may). The gain makes the median good image score 0.25."""
    ordered = np.sort(np.asarray(image_scores, np.float64))
    count = len(ordered)
    if count == 0:
        raise ValueError("calibrate: no held-out good image")
    allowed = min(int(math.floor(target_rate * count)), count - 1)
    below = ordered[count - 1 - allowed]
    if allowed:
        shift = 0.5 * (below + ordered[count - allowed])
    else:
        shift = below + 1e-3 * (ordered[-1] - ordered[0]) + 1e-6 * max(abs(below), 1.0)
    shift = max(shift, MIN_DISTANCE)
    median = max(float(np.median(ordered)), MIN_DISTANCE)
    ratio = math.log(shift / median)
    gain = math.log(3.0) / ratio if ratio > 1e-3 else math.log(3.0) / 1e-3
    false_calls = int((ordered >= shift).sum())
    return Calibration(float(shift), float(gain), false_calls, count, float(target_rate))

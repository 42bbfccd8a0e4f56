"""How long one training step of a preset takes here: the measurement `train` weighs a time budget with.

A few steps (forward, backward, AdamW) on random data of the run's shape, on the run's device and threads, so
the preset choice follows the machine the user has, not a table measured elsewhere.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

WARMUP_STEPS = 1
TIMED_STEPS = 2


@dataclass(frozen=True)
class StepShape:
    """What a training step holds: the model's layout and the batch."""

    preset: str
    channels: int  # of one plane
    template: bool
    companions: int
    size: int  # the square crop or letterbox trained on
    batch: int
    frozen_stem: bool = False


def measure_step_seconds(shape: StepShape, device: str | torch.device = "cpu") -> float:
    """Median seconds of `TIMED_STEPS` training steps after `WARMUP_STEPS`, random weights and images."""
    import torch

    from defectdet.model import build_model

    planes = 1 + int(shape.template) + shape.companions
    companions = [f"companion{index}" for index in range(shape.companions)]
    overrides = {"frozen_stem": True} if shape.frozen_stem else {}
    generator = torch.Generator().manual_seed(0)
    model = build_model(shape.preset, 2, shape.channels * planes, shape.template, companions, **overrides)
    model.to(device, memory_format=torch.channels_last).train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    images = torch.rand(shape.batch, shape.channels * planes, shape.size, shape.size, generator=generator)
    images = images.to(device, memory_format=torch.channels_last)
    box = [0.0, shape.size * 0.2, shape.size * 0.2, shape.size * 0.4, shape.size * 0.35]
    targets = [torch.tensor([box], device=device) for _ in range(shape.batch)]
    timings = []
    for step in range(WARMUP_STEPS + TIMED_STEPS):
        started = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        model(images, targets)["loss"].backward()
        optimizer.step()
        if torch.device(device).type == "cuda":
            torch.cuda.synchronize()
        if step >= WARMUP_STEPS:
            timings.append(time.perf_counter() - started)
    return statistics.median(timings)


def step_seconds_here(shape: StepShape, device: str | torch.device = "cpu") -> float:
    """`measure_step_seconds`, measured once per shape, device and thread count in this process: a second run
    of the same shape (a script or notebook training several models) does not time it again."""
    import torch

    return _cached_step_seconds(shape, str(device), torch.get_num_threads())


@lru_cache(maxsize=32)
def _cached_step_seconds(shape: StepShape, device: str, threads: int) -> float:
    return measure_step_seconds(shape, device)

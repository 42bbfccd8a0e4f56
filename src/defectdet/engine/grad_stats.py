"""Gradient statistics: total norm every step (for explosion / vanishing warnings), per-layer norms
every K steps to the log and `grad_stats.csv`."""

from __future__ import annotations

import csv
import logging
import math
import statistics
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

logger = logging.getLogger(__name__)

CSV_COLUMNS = ["step", "total_norm", "max_layer", "max_norm", "min_layer", "min_norm", "layers"]


@dataclass(frozen=True)
class GradStats:
    step: int
    total_norm: float
    max_layer: str
    max_norm: float
    min_layer: str
    min_norm: float
    layers: int


def layer_gradient_norms(model: nn.Module) -> dict[str, float]:
    """L2 norm of each parameter's gradient, keyed by parameter name (parameters without grad skipped)."""
    named = [(name, p.grad) for name, p in model.named_parameters() if p.grad is not None]
    if not named:
        return {}
    norms = torch._foreach_norm([grad.detach().float() for _, grad in named])
    values = torch.stack(norms).tolist()
    return {name: value for (name, _), value in zip(named, values, strict=True)}


def gradient_stats(model: nn.Module, step: int, total_norm: float | None = None) -> GradStats | None:
    norms = layer_gradient_norms(model)
    if not norms:
        return None
    if total_norm is None:
        total_norm = math.sqrt(sum(v * v for v in norms.values()))
    max_layer = max(norms, key=norms.__getitem__)
    min_layer = min(norms, key=norms.__getitem__)
    return GradStats(
        step, float(total_norm), max_layer, norms[max_layer], min_layer, norms[min_layer], len(norms)
    )


class GradStatsMonitor:
    """`observe(step, total_norm)` each step; `record(step, model, total_norm)` every `every` steps."""

    def __init__(
        self,
        every: int = 100,
        csv_path: str | Path | None = None,
        explosion_factor: float = 10.0,
        vanishing_threshold: float = 1e-8,
        window: int = 50,
        min_history: int = 5,
        log: logging.Logger | None = None,
    ):
        self.every = every
        self.csv_path = Path(csv_path) if csv_path is not None else None
        self.explosion_factor = explosion_factor
        self.vanishing_threshold = vanishing_threshold
        self.history: deque[float] = deque(maxlen=window)
        self.min_history = min_history
        self.log = log or logger
        self.explosions = 0
        self.vanishings = 0

    def due(self, step: int) -> bool:
        return step % self.every == 0

    def observe(self, step: int, total_norm: float) -> None:
        """Warn when the total norm exceeds `explosion_factor` x the running median, or is below 1e-8."""
        if not math.isfinite(total_norm):
            return
        if len(self.history) >= self.min_history:
            median = statistics.median(self.history)
            if median > 0 and total_norm > self.explosion_factor * median:
                self.explosions += 1
                self.log.warning(
                    "gradient explosion at step %d: total norm %.4g is %.1fx the running median %.4g",
                    step,
                    total_norm,
                    total_norm / median,
                    median,
                )
        if total_norm < self.vanishing_threshold:
            self.vanishings += 1
            self.log.warning(
                "vanishing gradients at step %d: total norm %.3g < %.0e",
                step,
                total_norm,
                self.vanishing_threshold,
            )
        self.history.append(total_norm)

    def record(self, step: int, model: nn.Module, total_norm: float | None = None) -> GradStats | None:
        stats = gradient_stats(model, step, total_norm)
        if stats is None:
            return None
        self.log.debug(
            "grad step %d: total %.4g, max %.4g (%s), min %.3g (%s)",
            step,
            stats.total_norm,
            stats.max_norm,
            stats.max_layer,
            stats.min_norm,
            stats.min_layer,
        )
        if self.csv_path is not None:
            new_file = not self.csv_path.exists()
            self.csv_path.parent.mkdir(parents=True, exist_ok=True)
            with self.csv_path.open("a", newline="", encoding="utf-8") as handle:
                writer = csv.writer(handle)
                if new_file:
                    writer.writerow(CSV_COLUMNS)
                writer.writerow(
                    [
                        stats.step,
                        f"{stats.total_norm:.6g}",
                        stats.max_layer,
                        f"{stats.max_norm:.6g}",
                        stats.min_layer,
                        f"{stats.min_norm:.6g}",
                        stats.layers,
                    ]
                )
        return stats

"""`fit_good_only`: defect-free images -> one standard bundle that boxes what does not look like them.

Steps (each timed; with a time budget each gets a share of it):
1. hold out a share of the good images (seeded) to choose the threshold on;
2. ImageNet patch features of every image, letterboxed as the runtime does (`anomaly.graph.PatchFeatures`);
3. a memory bank of a few thousand of the fit images' patch vectors by greedy coreset (`anomaly.memory`);
4. each held-out image's score (its largest cell distance to the bank) -> the operating distance at the target
   false-call rate and a logistic calibration through it (`anomaly.memory.calibrate`);
5. the bundle (`anomaly.bundle`): per cell a box and the calibrated score of class "anomaly", the fragment merge
   on for that class so neighbouring cells above the threshold come out as one region box.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from defectdet.anomaly.graph import AnomalyGraph, PatchFeatures, nearest_distance
from defectdet.anomaly.inputs import (
    choose_channels,
    choose_input_size,
    good_images,
    model_spec,
    prepared_image,
    split_holdout,
)
from defectdet.anomaly.memory import Calibration, calibrate, greedy_coreset
from defectdet.errors import ConfigError, DatasetError, DefectDetError
from defectdet.runtime.bundle import BundleMetadata
from defectdet.runtime.spec import ModelSpec

logger = logging.getLogger(__name__)

# shares of a time budget: held-out features until 20 %, fit features until 65 %, the coreset until 85 %
HELDOUT_SHARE, FEATURES_SHARE, CORESET_SHARE = 0.20, 0.65, 0.85
MIN_FIT_IMAGES = 2


@dataclass
class FitSettings:
    """`minutes`: a time budget (None: every image, the full coreset); `input_size`: None picks it from the
    images; `false_call_rate`: the share of good images the threshold may flag; `holdout`: the share of the
    good images held out to choose it; `memory`: the coreset size; `candidates`: at most this many patch
    vectors are kept for the coreset to choose from (spread evenly over the fit images)."""

    minutes: float | None = None
    input_size: int | None = None
    false_call_rate: float = 0.01
    holdout: float = 0.2
    memory: int = 3000
    candidates: int = 150_000
    seed: int = 0
    progress: bool = True

    def check(self) -> None:
        if self.minutes is not None and not self.minutes > 0:
            raise ConfigError(f"--time: minutes above 0, got {self.minutes}")
        if not 0.0 <= self.false_call_rate < 1.0:
            raise ConfigError(f"--false-call-rate: within [0, 1), got {self.false_call_rate}")
        if not 0.0 < self.holdout < 1.0:
            raise ConfigError(f"holdout: a share within (0, 1), got {self.holdout}")
        if self.memory < 16:
            raise ConfigError(f"memory: at least 16 vectors, got {self.memory}")


@dataclass
class FitResult:
    """What `fit_good_only` wrote and measured."""

    bundle: Path
    metadata: BundleMetadata
    calibration: Calibration
    fit_images: int
    heldout_images: int
    memory_vectors: int
    parity_max_abs_diff: float
    timings: dict[str, float] = field(default_factory=dict)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


@dataclass
class _Extracted:
    """Per image: its patch vectors (kept cells only for fit images), pooled features and drift statistics."""

    patches: list[torch.Tensor] = field(default_factory=list)
    pooled: list[np.ndarray] = field(default_factory=list)
    stats: list[dict[str, float]] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)


class _Clock:
    """Deadlines of the steps under a time budget (None everywhere without one)."""

    def __init__(self, minutes: float | None) -> None:
        self.started = time.monotonic()
        self.budget = None if minutes is None else minutes * 60.0

    def deadline(self, share: float) -> float | None:
        return None if self.budget is None else self.started + share * self.budget

    def elapsed(self) -> float:
        return time.monotonic() - self.started


def build_features(channels: int) -> PatchFeatures:
    """EfficientNet-Lite0 with its ImageNet weights for `channels` input channels, BatchNorm folded, eval."""
    from defectdet.export.exporter import fold_batchnorm
    from defectdet.model.detector import build_model
    from defectdet.model.imagenet import transfer_imagenet_weights

    detector = build_model("lite0", 1, channels, False)
    transfer_imagenet_weights(detector)
    fold_batchnorm(detector)
    return PatchFeatures(detector.fusion, detector.backbone).eval()


def _extract(
    features: PatchFeatures,
    paths: Sequence[Path],
    spec: ModelSpec,
    deadline: float | None,
    keep: int | None,
    progress: Any,
    label: str,
) -> _Extracted:
    """Features of `paths` in order until `deadline` (at least `MIN_FIT_IMAGES` images); `keep`: at most that
    many randomly chosen cells per image (None: all). An unreadable image is skipped and listed."""
    from defectdet.runtime.monitor import image_statistics

    found = _Extracted()
    generator = torch.Generator().manual_seed(len(paths))
    task = progress.add_task(label, total=len(paths))
    for path in paths:
        if deadline is not None and len(found.patches) >= MIN_FIT_IMAGES and time.monotonic() > deadline:
            break
        progress.advance(task)
        try:
            prepared = prepared_image(path, spec)
        except DefectDetError as error:
            logger.warning("skipping %s: %s", path, error)
            found.skipped.append((str(path), str(error)))
            continue
        with torch.inference_mode():
            patches, pooled = features(torch.from_numpy(prepared.tensor[None]))
        patches = patches[0]
        if keep is not None and patches.shape[0] > keep:
            patches = patches[torch.randperm(patches.shape[0], generator=generator)[:keep]]
        found.patches.append(patches.contiguous())
        found.pooled.append(pooled[0].numpy())
        found.stats.append(image_statistics(prepared.content))
    progress.update(task, total=len(found.patches) + len(found.skipped), completed=len(found.patches))
    return found


def _memory_bank(
    fit: _Extracted, settings: FitSettings, deadline: float | None, progress: Any
) -> torch.Tensor:
    """The coreset of the fit images' kept patch vectors."""
    pool = torch.cat(fit.patches)
    if pool.shape[0] > settings.candidates:
        generator = torch.Generator().manual_seed(settings.seed)
        pool = pool[torch.randperm(pool.shape[0], generator=generator)[: settings.candidates]]
    size = min(settings.memory, pool.shape[0])
    task = progress.add_task("memory bank", total=size)
    chosen = greedy_coreset(
        pool, size, settings.seed, deadline, advance=lambda count: progress.advance(task, count)
    )
    progress.update(task, total=len(chosen), completed=len(chosen))
    return pool[chosen].contiguous()


def heldout_scores(held: _Extracted, memory: torch.Tensor) -> np.ndarray:
    """Each held-out image's score: its largest cell distance to the memory bank."""
    norms = (memory * memory).sum(1)
    with torch.inference_mode():
        return np.array(
            [float(nearest_distance(patches[None], memory, norms).max()) for patches in held.patches]
        )


def _progress(enabled: bool) -> Any:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        disable=not enabled,
    )


def fit_good_only(
    images: str | Path | Sequence[str | Path],
    out: str | Path,
    settings: FitSettings | None = None,
) -> FitResult:
    """Fit a good-parts-only model on the defect-free images of a folder (or a list of files) and write its
    bundle at `out`; `predict`, `serve` and `Predictor` run it like any bundle (one class, "anomaly")."""
    from defectdet.anomaly.bundle import write_bundle

    settings = settings or FitSettings()
    settings.check()
    out = Path(out)
    if out.suffix.lower() != ".onnx":
        raise ConfigError(f"--out {out}: the bundle file name must end in .onnx")
    clock = _Clock(settings.minutes)
    paths = good_images(images)
    channels, channel_note = choose_channels(paths)
    spec = model_spec(choose_input_size(paths, settings.input_size), channels)
    fit_paths, held_paths = split_holdout(paths, settings.holdout, settings.seed)
    features = build_features(channels)
    timings: dict[str, float] = {}
    with _progress(settings.progress) as progress:
        held = _extract(
            features, held_paths, spec, clock.deadline(HELDOUT_SHARE), None, progress, "held-out images"
        )
        keep = max(256, math.ceil(settings.candidates / max(1, _expected_images(clock, held, fit_paths))))
        fit = _extract(
            features, fit_paths, spec, clock.deadline(FEATURES_SHARE), keep, progress, "fit images"
        )
        timings["features_s"] = clock.elapsed()
        if len(fit.patches) < MIN_FIT_IMAGES or len(held.patches) < 2:
            raise DatasetError(
                f"only {len(fit.patches)} fit and {len(held.patches)} held-out image(s) could be read"
            )
        memory = _memory_bank(fit, settings, clock.deadline(CORESET_SHARE), progress)
        timings["memory_bank_s"] = clock.elapsed() - timings["features_s"]
    calibration = calibrate(heldout_scores(held, memory), settings.false_call_rate)
    graph = AnomalyGraph(features, memory, calibration.shift, calibration.gain, spec.input_size).eval()
    result = write_bundle(graph, out, spec, calibration, settings, held, fit)
    timings["total_s"] = clock.elapsed()
    result.timings = timings
    result.skipped = held.skipped + fit.skipped
    result.notes.append(channel_note)
    return result


def _expected_images(clock: _Clock, held: _Extracted, fit_paths: Sequence[Path]) -> int:
    """How many fit images the feature step will reach: all of them, or what the budget allows at the held-out
    images' pace."""
    if clock.budget is None or not held.patches:
        return len(fit_paths)
    pace = clock.elapsed() / len(held.patches)
    left = (FEATURES_SHARE * clock.budget) - clock.elapsed()
    return max(1, min(len(fit_paths), int(left / max(pace, 1e-3))))

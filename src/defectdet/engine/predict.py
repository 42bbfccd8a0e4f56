"""The batched prediction path: training-time evaluation (`engine.loop.evaluate`) and `defectdet val` (checkpoint
or bundle) both call `predict_records`.

Everything around the forward pass is `runtime.pipeline`, the functions the torch-free `Predictor` runs too:
`load_planes` (decode the image, its template and companion captures with one intensity mapping) -> `prepare`
(the template and companion rules, registration, letterbox, native-resolution tiles of a large image, the input
arrays) -> model, here batched over images -> `finish`
(score floor + class-aware NMS per pass, boxes mapped back to original pixels, tile detections merged in).
Ground truth is the sample's label-file boxes in original pixels (no letterbox round trip).
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

import cv2
import numpy as np
import torch

from defectdet.data.sample import Sample
from defectdet.engine.validate_settings import DEFAULT_EVAL_BATCH
from defectdet.errors import ImageReadError, InputError
from defectdet.evaluation.types import ImageRecord
from defectdet.postprocess import PostprocessSettings
from defectdet.runtime import pipeline
from defectdet.runtime.pipeline import Prepared
from defectdet.runtime.spec import ModelSpec

logger = logging.getLogger(__name__)

T = TypeVar("T")


def _batches(items: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def predict_records(
    model: Callable[[torch.Tensor], Any],
    samples: Sequence[Sample],
    spec: ModelSpec,
    *,
    batch_size: int = DEFAULT_EVAL_BATCH,
    device: torch.device | str = "cpu",
    autocast: Callable[[], contextlib.AbstractContextManager] | None = None,
    timer: Any = None,
    progress: bool = False,
) -> tuple[list[ImageRecord], list[str]]:
    """Predict every sample; returns (ImageRecords in original pixels, paths skipped as unreadable).

    `model`: a `Detector` in eval mode or any callable `(B, C, S, S) float tensor in [0, 1] -> (B, A, 4 + K)`
    (tensor or array), e.g. `engine.bundle_model.BundleModel`. `spec` says how the model takes its input and
    what post-processing it gets (`ModelSpec.from_checkpoint` / `from_bundle`, or built by the caller). With
    `spec.registration`, each record's `registration` holds the measured motion (`Registration.to_dict()`); the
    timer gets a 'register' stage. With `spec.tiles`, images much larger than the input size also run as
    native-resolution tiles whose small detections join the whole-image ones (`data.tiling`).
    """
    from rich.progress import Progress

    from defectdet.evaluation.timing import StageTimer

    settings = spec.postprocess
    timer = timer or StageTimer()
    batches = _Batches(model, settings, batch_size, torch.device(device), autocast, timer)
    skipped: list[str] = []
    with Progress(disable=not progress, transient=True) as bar, torch.inference_mode():
        task = bar.add_task("evaluating", total=len(samples))
        for sample in samples:
            bar.advance(task)
            prepared = _prepare(sample, spec, timer)
            if prepared is None:
                skipped.append(str(sample.image_path))
            else:
                batches.add(sample, prepared)
        batches.flush()
    return batches.records, skipped


def _prepare(sample: Sample, spec: ModelSpec, timer: Any) -> Prepared | None:
    """Decode and prepare one sample (`runtime.pipeline`); None, with a warning, for an unreadable file or
    planes the pipeline refuses (a template of another size, a missing companion capture), as
    `Predictor.predict` would refuse them."""
    try:
        with timer.stage("decode"):
            template_path = sample.template_path if spec.template else None
            if spec.template and template_path is None:
                raise InputError(f"{sample.image_path}: this model needs a template and the sample has none")
            companions = pipeline.sample_companions(sample, spec.companions)
            planes = pipeline.load_planes(
                sample.image_path, template_path, spec.channels, companions=companions
            )
        return pipeline.prepare(planes.image, planes.template, spec, timer, companions=planes.companions)
    except (ImageReadError, InputError, cv2.error, OSError) as error:
        logger.warning("skipping %s: %s", sample.image_path, error)
        return None


class _Batches:
    """Prepared images waiting for the model, run `batch_size` inputs at a time (an image's whole letterbox,
    then its tiles); memory stays within a batch plus one image's tiles."""

    def __init__(
        self,
        model: Callable[[torch.Tensor], Any],
        settings: PostprocessSettings,
        batch_size: int,
        device: torch.device,
        autocast: Callable[[], contextlib.AbstractContextManager] | None,
        timer: Any,
    ) -> None:
        self.model, self.settings, self.batch_size = model, settings, batch_size
        self.device, self.autocast, self.timer = device, autocast, timer
        self.is_module = isinstance(model, torch.nn.Module)
        self.records: list[ImageRecord] = []
        self.pending: list[tuple[Sample, Prepared]] = []
        self.inputs: list[np.ndarray] = []  # (C, S, S) each

    def add(self, sample: Sample, prepared: Prepared) -> None:
        self.pending.append((sample, prepared))
        self.inputs.extend(prepared.inputs)
        if len(self.inputs) >= self.batch_size:
            self.flush()

    def flush(self) -> None:
        """Run the model on the pending inputs and turn them into records (`pipeline.finish` per image)."""
        if not self.pending:
            return
        with self.timer.stage("model"):
            predictions = np.concatenate(
                [
                    _run_model(
                        self.model,
                        torch.from_numpy(np.stack(part)),
                        self.is_module,
                        self.device,
                        self.autocast,
                    )
                    for part in _batches(self.inputs, self.batch_size)
                ]
            )  # (inputs, A, 4 + K)
        with self.timer.stage("postprocess"):
            position = 0
            for sample, prepared in self.pending:
                rows = predictions[position : position + prepared.passes]  # the whole image, then its tiles
                position += prepared.passes
                self.records.append(_record(sample, prepared, pipeline.finish(rows, prepared, self.settings)))
        self.timer.add_images(len(self.pending))
        self.pending.clear()
        self.inputs.clear()


def _record(sample: Sample, prepared: Prepared, found: pipeline.Found) -> ImageRecord:
    return ImageRecord(
        image_id=sample.image_id,
        width=prepared.transform.original_width,
        height=prepared.transform.original_height,
        gt_boxes=sample.boxes,
        gt_classes=sample.classes,
        det_boxes=found.boxes,
        det_scores=found.scores,
        det_classes=found.classes,
        image_path=str(sample.image_path),
        registration=prepared.registration,
    )


def _run_model(
    model: Callable[[torch.Tensor], Any],
    batch: torch.Tensor,
    is_module: bool,
    device: torch.device,
    autocast: Callable[[], contextlib.AbstractContextManager] | None,
) -> np.ndarray:
    """One forward pass: ``(B, C, S, S)`` -> ``(B, A, 4 + K)`` float array."""
    if is_module:  # channels_last input as in training (engine.loop): the convolutions then run in NHWC,
        # which oneDNN's depthwise kernels prefer on CPU (the speed-up is not benchmarked in bench/results)
        batch = batch.to(device, memory_format=torch.channels_last)
    with autocast() if autocast is not None else contextlib.nullcontext():
        output = model(batch)
    return output.float().cpu().numpy() if isinstance(output, torch.Tensor) else np.asarray(output)


def registration_summary(records: Sequence[ImageRecord]) -> dict[str, Any] | None:
    """Measured pair motion over the records that were registered (None when none was)."""
    found = [record.registration for record in records if record.registration is not None]
    if not found:
        return None
    shifts = np.array([math.hypot(item["dx"], item["dy"]) for item in found])
    angles = np.abs(np.array([item["angle_deg"] for item in found]))
    times = np.array([item["ms"] for item in found])
    return {
        "pairs": len(found),
        "applied": int(sum(bool(item["applied"]) for item in found)),
        "shift_px": {
            "p50": float(np.median(shifts)),
            "p95": float(np.percentile(shifts, 95)),
            "max": float(shifts.max()),
        },
        "abs_angle_deg": {"p50": float(np.median(angles)), "max": float(angles.max())},
        "ms": {"p50": float(np.median(times)), "p95": float(np.percentile(times, 95))},
    }

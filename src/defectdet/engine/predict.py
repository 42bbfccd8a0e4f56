"""The one prediction path: training-time evaluation (`engine.loop.evaluate`) and `defectdet val` (checkpoint
or bundle) both call `predict_records`.

Per sample: decode the tested image (and its template with one intensity mapping, `read_pair`) -> register
the template to the tested image (`data.registration`, on by default with templates) -> letterbox (with
`tiles`, also native-resolution tiles of a large image, `data.tiling`) -> model -> score floor + class-aware
NMS (`defectdet.postprocess.PostprocessSettings`) -> boxes mapped back to original pixels, tile detections merged
in. Ground truth is the sample's label-file boxes in original pixels (no letterbox round trip).
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

from defectdet.data.dataset import to_input_tensor
from defectdet.data.imageio import read_image, read_pair
from defectdet.data.letterbox import LetterboxTransform, letterbox_image
from defectdet.data.registration import register_pair
from defectdet.data.sample import Sample
from defectdet.data.tiling import TilePlan, combine_passes, plan_tiles, tile_canvases
from defectdet.errors import ImageReadError
from defectdet.evaluation.types import ImageRecord
from defectdet.postprocess import PostprocessSettings, postprocess

logger = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_EVAL_BATCH = 8  # images per forward pass in evaluation (the trainer and `val` share it)


def _batches(items: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def _read(sample: Sample, channels: int, use_template: bool) -> tuple[np.ndarray, np.ndarray | None]:
    if not use_template:
        return read_image(sample.image_path, channels=channels), None
    assert sample.template_path is not None
    image, template = read_pair(sample.image_path, sample.template_path, channels=channels)
    if template.shape[:2] != image.shape[:2]:
        template = cv2.resize(template, (image.shape[1], image.shape[0]), interpolation=cv2.INTER_LINEAR)
    return image, template


def predict_records(
    model: Callable[[torch.Tensor], Any],
    samples: Sequence[Sample],
    *,
    imgsz: int,
    channels: int,
    use_template: bool,
    register_pairs: bool = True,
    postprocess_settings: PostprocessSettings | None = None,
    batch_size: int = DEFAULT_EVAL_BATCH,
    device: torch.device | str = "cpu",
    autocast: Callable[[], contextlib.AbstractContextManager] | None = None,
    timer: Any = None,
    progress: bool = False,
    tiles: bool = False,
) -> tuple[list[ImageRecord], list[str]]:
    """Predict every sample; returns (ImageRecords in original pixels, paths skipped as unreadable).

    `model`: a `Detector` in eval mode or any callable `(B, C, S, S) float tensor in [0, 1] -> (B, A, 4 + K)`
    (tensor or array), e.g. `engine.bundle_model.BundleModel`. With `use_template and register_pairs`, each
    record's `registration` holds the measured motion (`Registration.to_dict()`); the timer gets a
    'register' stage. With `tiles`, images much larger than `imgsz` also run as native-resolution tiles whose
    small detections join the whole-image ones (`data.tiling`).
    """
    from rich.progress import Progress

    from defectdet.evaluation.timing import StageTimer

    settings = postprocess_settings or PostprocessSettings()
    timer = timer or StageTimer()
    device = torch.device(device)
    is_module = isinstance(model, torch.nn.Module)
    records: list[ImageRecord] = []
    skipped: list[str] = []
    pending: list[tuple[Sample, LetterboxTransform, dict | None, TilePlan | None]] = []
    tensors: list[torch.Tensor] = []

    def flush() -> None:
        """Run the model on the pending inputs and turn them into records (inputs are each pending image's
        whole letterbox, then its tiles)."""
        with timer.stage("model"):
            predictions = np.concatenate(
                [
                    _run_model(model, torch.stack(part), is_module, device, autocast)
                    for part in _batches(tensors, batch_size)
                ]
            )  # (inputs, A, 4 + K)
        with timer.stage("postprocess"):
            detections = postprocess(
                predictions, settings.score_threshold, settings.iou_threshold, settings.max_detections
            )
            position = 0
            for sample, transform, registration, plan in pending:
                count = len(plan) if plan is not None else 0
                boxes, scores, classes = combine_passes(
                    detections[position : position + 1 + count],
                    transform,
                    plan,
                    settings.iou_threshold,
                    settings.max_detections,
                )
                position += 1 + count
                records.append(
                    ImageRecord(
                        image_id=sample.image_id,
                        width=transform.original_width,
                        height=transform.original_height,
                        gt_boxes=sample.boxes,
                        gt_classes=sample.classes,
                        det_boxes=boxes,
                        det_scores=scores,
                        det_classes=classes,
                        image_path=str(sample.image_path),
                        registration=registration,
                    )
                )
        timer.add_images(len(pending))
        pending.clear()
        tensors.clear()

    with Progress(disable=not progress, transient=True) as bar, torch.inference_mode():
        task = bar.add_task("evaluating", total=len(samples))
        for sample in samples:
            bar.advance(task)
            try:
                with timer.stage("decode"):
                    image, template = _read(sample, channels, use_template)
            except (ImageReadError, cv2.error, OSError) as error:
                logger.warning("skipping %s: %s", sample.image_path, error)
                skipped.append(str(sample.image_path))
                continue
            registration = None
            if template is not None and register_pairs:
                with timer.stage("register"):
                    template, found = register_pair(image, template)
                registration = found.to_dict()
            with timer.stage("preprocess"):
                canvas, transform = letterbox_image(image, imgsz)
                template_canvas = None if template is None else letterbox_image(template, imgsz)[0]
                tensors.append(to_input_tensor(canvas, template_canvas))
                plan = plan_tiles(image.shape[1], image.shape[0], imgsz) if tiles else None
                if plan is not None:
                    tensors.extend(
                        to_input_tensor(*pair) for pair in tile_canvases(image, template, plan, imgsz)
                    )
            pending.append((sample, transform, registration, plan))
            if len(tensors) >= batch_size:  # memory stays within a batch plus one image's tiles
                flush()
        if pending:
            flush()
    return records, skipped


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

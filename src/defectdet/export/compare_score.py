"""`defectdet compare`'s measurements: both models run interleaved (`run_interleaved`), each scored at its own threshold
(`score_model`), and the images where they disagree (`disagreement`). The promotion rule (`decide`, `RULE`) is
`runtime.compare_rule`, which the service's promotion gate applies again to the recorded figures."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from defectdet.data.sample import Sample
from defectdet.evaluation.coco import coco_metrics
from defectdet.evaluation.operating_point import (
    box_iou,
    image_verdicts,
    match_detections,
    pooled_at_threshold,
)
from defectdet.evaluation.types import ImageRecord
from defectdet.export.compare_inputs import ROLES
from defectdet.runtime.compare_rule import (  # noqa: F401 - the rule's names, as compare imports them
    EXIT_KEEP,
    EXIT_PROMOTE,
    KEEP,
    PROMOTE,
    RULE,
    Tolerances,
    decide,
)
from defectdet.runtime.pipeline import sample_companions
from defectdet.runtime.predictor import PredictionResult, Predictor

IOU = 0.5  # a box "agrees" with the other model's box, or finds a defect, at IoU >= 0.5


# ------------------------------------------------------------------------------------------- running
def run_interleaved(
    predictors: dict[str, Predictor], samples: Sequence[Sample], progress: bool = False
) -> tuple[dict[str, list[PredictionResult]], dict[str, list[float]]]:
    """Every sample through both predictors, in one process: per image OLD then NEW, then NEW then OLD on the
    next one (so neither always meets a warm cache), after one untimed warm-up call each. Each call is
    `Predictor.predict` on the file paths: decode, registration, letterbox, model, NMS, boxes to original pixels,
    at the bundle's own threshold, with every detection down to its score floor kept for mAP."""
    from rich.progress import Progress

    results: dict[str, list[PredictionResult]] = {role: [] for role in ROLES}
    latency: dict[str, list[float]] = {role: [] for role in ROLES}

    def call(role: str, sample: Sample) -> PredictionResult:
        predictor = predictors[role]
        template = sample.template_path if predictor.metadata.template else None
        companions = sample_companions(sample, predictor.metadata.companions)
        return predictor.predict(sample.image_path, template, companions=companions, score_floor=0.0)

    if samples:
        for role in ROLES:
            call(role, samples[0])
    with Progress(disable=not progress, transient=True) as bar:
        task = bar.add_task("comparing", total=len(samples))
        for index, sample in enumerate(samples):
            for role in ROLES if index % 2 == 0 else ROLES[::-1]:
                started = time.perf_counter()
                result = call(role, sample)
                latency[role].append((time.perf_counter() - started) * 1e3)
                results[role].append(result)
            bar.advance(task)
    return results, latency


def to_record(sample: Sample, result: PredictionResult, class_ids: dict[str, int]) -> ImageRecord:
    """A prediction as an `ImageRecord` in the comparison's class space (`class_ids`: name -> id)."""
    width, height = result.image_size
    detections = result.detections
    return ImageRecord(
        image_id=sample.image_id,
        width=width,
        height=height,
        gt_boxes=sample.boxes,
        gt_classes=sample.classes,
        det_boxes=np.array([d.box for d in detections], np.float32).reshape(-1, 4),
        det_scores=np.array([d.score for d in detections], np.float32),
        det_classes=np.array([class_ids[d.class_name] for d in detections], np.int64),
        image_path=str(sample.image_path),
    )


# ------------------------------------------------------------------------------------------- scoring
def _rate(count: int, total: int) -> float | None:
    return count / total if total else None


def score_model(
    split_records: Sequence[ImageRecord],
    board_records: Sequence[ImageRecord],
    class_names: Sequence[str],
    threshold: float,
    latency_ms: Sequence[float],
) -> dict[str, Any]:
    """mAP (on the split), escapes and false calls at `threshold`, per-class AP50 and latency percentiles."""
    coco = coco_metrics(split_records, class_names)
    verdicts = image_verdicts(split_records, threshold)
    at = pooled_at_threshold(match_detections(split_records, len(class_names), IOU), threshold)
    defects = at["true_positives"] + at["false_negatives"]
    boards_flagged = sum(record.max_score >= threshold for record in board_records)
    clean_images = verdicts["clean_images"] + len(board_records)
    false_calls = verdicts["false_calls"] + boards_flagged
    labelled = {name for record in split_records for name in (class_names[c] for c in record.gt_classes)}
    return {
        "mAP50": coco["mAP50"],
        "mAP50_95": coco["mAP50_95"],
        "escapes": {
            "defective_images": verdicts["defective_images"],
            "escaped_images": verdicts["escapes"],
            "escape_rate": verdicts["escape_rate"],
            "defects": defects,
            "missed_defects": at["false_negatives"],
            "missed_defect_rate": _rate(at["false_negatives"], defects),
        },
        "false_calls": {
            "split_clean_images": verdicts["clean_images"],
            "split_false_calls": verdicts["false_calls"],
            "clean_boards": len(board_records),
            "clean_board_false_calls": boards_flagged,
            "clean_images": clean_images,
            "false_calls": false_calls,
            "false_call_rate": _rate(false_calls, clean_images),
        },
        "class_AP50": {name: coco["class_AP50"].get(name) for name in class_names if name in labelled},
        "latency_ms": {
            "images": len(latency_ms),
            "p50": round(float(np.percentile(latency_ms, 50)), 3) if len(latency_ms) else None,
            "p95": round(float(np.percentile(latency_ms, 95)), 3) if len(latency_ms) else None,
        },
    }


def disagreement(
    old: ImageRecord, new: ImageRecord, thresholds: tuple[float, float], class_names
) -> str | None:
    """Why the two models' calls on one image differ at their thresholds, or None when they agree: one flags it
    and the other does not, or their boxes differ (paired class-agnostically, highest IoU first, IoU >= 0.5;
    an unpaired box, or a pair of different classes)."""
    old_kept, new_kept = old.det_scores >= thresholds[0], new.det_scores >= thresholds[1]
    if old_kept.any() != new_kept.any():
        return "OLD flags it, NEW calls it clean" if old_kept.any() else "NEW flags it, OLD calls it clean"
    if not old_kept.any():
        return None
    old_boxes, new_boxes = old.det_boxes[old_kept], new.det_boxes[new_kept]
    old_classes, new_classes = old.det_classes[old_kept], new.det_classes[new_kept]
    ious = box_iou(old_boxes, new_boxes)
    old_used, new_used = np.zeros(len(old_boxes), bool), np.zeros(len(new_boxes), bool)
    changed = []
    rows, cols = np.nonzero(ious >= IOU)
    for pair in np.argsort(-ious[rows, cols], kind="stable"):
        row, col = rows[pair], cols[pair]
        if old_used[row] or new_used[col]:
            continue
        old_used[row] = new_used[col] = True
        if old_classes[row] != new_classes[col]:
            changed.append(f"{class_names[old_classes[row]]} -> {class_names[new_classes[col]]}")
    parts = []
    if (~old_used).any():
        parts.append(f"{int((~old_used).sum())} box(es) only OLD finds")
    if (~new_used).any():
        parts.append(f"{int((~new_used).sum())} box(es) only NEW finds")
    if changed:
        parts.append(f"{len(changed)} box(es) of another class ({', '.join(changed)})")
    return "both flag it; " + "; ".join(parts) if parts else None

"""`defectdet compare`'s measurements and verdict: both models run interleaved (`run_interleaved`), each scored at its
own threshold (`score_model`), the images where they disagree (`disagreement`), and the promotion rule (`decide`,
`RULE`)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from defectdet.data.sample import Sample
from defectdet.errors import InputError
from defectdet.evaluation.coco import coco_metrics
from defectdet.evaluation.operating_point import (
    box_iou,
    image_verdicts,
    match_detections,
    pooled_at_threshold,
)
from defectdet.evaluation.types import ImageRecord
from defectdet.export.compare_inputs import ROLES
from defectdet.runtime.pipeline import sample_companions
from defectdet.runtime.predictor import PredictionResult, Predictor

PROMOTE, KEEP = "promote", "keep OLD"
EXIT_PROMOTE, EXIT_KEEP = 0, 1
IOU = 0.5  # a box "agrees" with the other model's box, or finds a defect, at IoU >= 0.5
EPSILON = 1e-9  # equal is not worse: float noise never decides a verdict
RULE = (
    "promote NEW only if, each model at its own stored threshold: NEW's escape rate (defective images judged "
    "clean) <= OLD's + tol_escape, NEW's missed-defect rate <= OLD's + tol_escape, NEW's mAP@0.5 >= OLD's - tol_map, "
    "and NEW's false-call rate (defect-free images and clean boards flagged) <= OLD's + tol_false_call; a criterion "
    "that cannot be measured (no defect-free image: pass --clean DIR or --clean-auto) keeps OLD. Equal is not worse."
)


@dataclass(frozen=True)
class Tolerances:
    """How much worse than OLD NEW may be, in absolute rate (escape, false call) or mAP points (map50)."""

    escape: float = 0.005
    map50: float = 0.01
    false_call: float = 0.01

    def __post_init__(self) -> None:
        for name in ("escape", "map50", "false_call"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise InputError(f"tolerance {name} must be within [0, 1], got {value}")


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


# ------------------------------------------------------------------------------------------- verdict
def decide(old: dict[str, Any], new: dict[str, Any], tolerances: Tolerances) -> dict[str, Any]:
    """The promotion rule (`RULE`) applied to two `score_model` results."""
    checks = [
        _check("escape rate", old["escapes"]["escape_rate"], new["escapes"]["escape_rate"], tolerances.escape,
               lower_is_better=True, missing="the split has no defective image"),
        _check("missed-defect rate", old["escapes"]["missed_defect_rate"], new["escapes"]["missed_defect_rate"],
               tolerances.escape, lower_is_better=True, missing="the split has no labelled defect"),
        _check("mAP@0.5", old["mAP50"], new["mAP50"], tolerances.map50, lower_is_better=False,
               missing="the split has no labelled defect"),
        _check("false-call rate", old["false_calls"]["false_call_rate"], new["false_calls"]["false_call_rate"],
               tolerances.false_call, lower_is_better=True,
               missing="no defect-free image in the split and no clean board: pass --clean DIR or --clean-auto"),
    ]  # fmt: skip
    failed = [check for check in checks if not check["passed"]]
    decision = PROMOTE if not failed else KEEP
    return {
        "decision": decision,
        "exit_code": EXIT_PROMOTE if decision == PROMOTE else EXIT_KEEP,
        "rule": RULE,
        "tolerances": {
            "escape": tolerances.escape,
            "map50": tolerances.map50,
            "false_call": tolerances.false_call,
        },
        "checks": checks,
        "reasons": [check["reason"] for check in (failed or checks)],
    }


def _check(
    name: str, old: float | None, new: float | None, tolerance: float, *, lower_is_better: bool, missing: str
) -> dict[str, Any]:
    if old is None or new is None:
        return {"name": name, "old": old, "new": new, "limit": None, "passed": False,
                "reason": f"{name} not measured: {missing}"}  # fmt: skip
    limit = old + tolerance if lower_is_better else old - tolerance
    passed = new <= limit + EPSILON if lower_is_better else new >= limit - EPSILON
    relation = ("<=" if lower_is_better else ">=") if passed else (">" if lower_is_better else "<")
    word = "within" if passed else "worse than"
    reason = (
        f"{name}: NEW {new:.4f} {relation} {limit:.4f} (OLD {old:.4f} {'+' if lower_is_better else '-'} "
        f"tolerance {tolerance:g}): {word} the limit"
    )
    return {"name": name, "old": old, "new": new, "limit": limit, "passed": passed, "reason": reason}

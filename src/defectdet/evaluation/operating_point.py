"""Box matching, precision/recall curves, confusion matrix and deployment operating points.

Matching rule (shared with the DeepPCB protocol): per image, detections in descending score order
each take the highest-IoU *unmatched* ground truth of the same class, if that IoU passes the threshold
(`>=` COCO-style, or `>` with `strict=True` as DeepPCB states it). Because the matching is greedy by
score, the matches of the detections above any confidence threshold do not depend on the ones below
it, so one matching pass gives exact curves for every threshold.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from defectdet.evaluation.types import ImageRecord

THRESHOLD_GRID = np.linspace(0.0, 1.0, 201)  # confidence thresholds sampled for plots


def box_iou(boxes_a: np.ndarray, boxes_b: np.ndarray) -> np.ndarray:
    """IoU matrix (A, B) of xyxy boxes (A, 4) and (B, 4)."""
    boxes_a = np.asarray(boxes_a, dtype=np.float64).reshape(-1, 4)
    boxes_b = np.asarray(boxes_b, dtype=np.float64).reshape(-1, 4)
    area_a = np.clip(boxes_a[:, 2] - boxes_a[:, 0], 0, None) * np.clip(boxes_a[:, 3] - boxes_a[:, 1], 0, None)
    area_b = np.clip(boxes_b[:, 2] - boxes_b[:, 0], 0, None) * np.clip(boxes_b[:, 3] - boxes_b[:, 1], 0, None)
    top_left = np.maximum(boxes_a[:, None, :2], boxes_b[None, :, :2])  # (A, B, 2)
    bottom_right = np.minimum(boxes_a[:, None, 2:], boxes_b[None, :, 2:])  # (A, B, 2)
    size = np.clip(bottom_right - top_left, 0, None)
    intersection = size[..., 0] * size[..., 1]
    union = area_a[:, None] + area_b[None, :] - intersection
    return np.where(union > 0, intersection / np.maximum(union, 1e-12), 0.0)


@dataclass(frozen=True)
class MatchResult:
    """Every detection of a record list, flattened, with its match outcome."""

    scores: np.ndarray  # (D,) float64
    classes: np.ndarray  # (D,) int64
    true_positive: np.ndarray  # (D,) bool
    image_index: np.ndarray  # (D,) int64, index into the record list
    gt_counts: np.ndarray  # (K,) int64 ground-truth boxes per class


def match_detections(
    records: Sequence[ImageRecord], num_classes: int, match_iou: float = 0.5, strict: bool = False
) -> MatchResult:
    """Greedy same-class matching of detections to ground truth (see module docstring)."""
    scores, classes, positives, image_index = [], [], [], []
    gt_counts = np.zeros(num_classes, dtype=np.int64)
    for index, record in enumerate(records):
        for class_id in record.gt_classes:
            if 0 <= class_id < num_classes:
                gt_counts[class_id] += 1
        count = len(record.det_scores)
        if count == 0:
            continue
        order = np.argsort(-record.det_scores, kind="stable")
        ious = box_iou(record.det_boxes[order], record.gt_boxes)  # (M, N)
        same_class = record.det_classes[order][:, None] == record.gt_classes[None, :]
        ious = np.where(same_class, ious, -1.0)
        taken = np.zeros(len(record.gt_boxes), dtype=bool)
        hits = np.zeros(count, dtype=bool)
        for row in range(count):
            if len(taken) == 0:
                break
            candidate = np.where(taken, -1.0, ious[row])
            best = int(np.argmax(candidate))
            value = candidate[best]
            passed = value > match_iou if strict else value >= match_iou
            if passed:
                taken[best] = True
                hits[row] = True
        scores.append(record.det_scores[order].astype(np.float64))
        classes.append(record.det_classes[order])
        positives.append(hits)
        image_index.append(np.full(count, index, dtype=np.int64))
    if scores:
        return MatchResult(
            np.concatenate(scores),
            np.concatenate(classes),
            np.concatenate(positives),
            np.concatenate(image_index),
            gt_counts,
        )
    empty = np.zeros(0)
    return MatchResult(empty, empty.astype(np.int64), empty.astype(bool), empty.astype(np.int64), gt_counts)


def average_precision(recall: np.ndarray, precision: np.ndarray) -> float:
    """Area under the PR curve with all-point interpolation (VOC 2010+): precision is replaced by
    its running maximum from the right and integrated over every recall step."""
    padded_recall = np.concatenate([[0.0], recall, [1.0]])
    padded_precision = np.concatenate([[0.0], precision, [0.0]])
    envelope = np.maximum.accumulate(padded_precision[::-1])[::-1]
    steps = np.nonzero(padded_recall[1:] != padded_recall[:-1])[0]
    return float(np.sum((padded_recall[steps + 1] - padded_recall[steps]) * envelope[steps + 1]))


@dataclass(frozen=True)
class ClassCurve:
    """Raw PR points of one class, in descending score order; `ap` is None when it has no ground truth."""

    recall: np.ndarray
    precision: np.ndarray
    scores: np.ndarray
    ap: float | None
    num_gt: int
    num_detections: int


def class_pr_curves(match: MatchResult, num_classes: int) -> list[ClassCurve]:
    """Per-class precision/recall points and all-point-interpolated AP from a `MatchResult`."""
    curves = []
    for class_id in range(num_classes):
        selected = match.classes == class_id
        order = np.argsort(-match.scores[selected], kind="stable")
        hits = match.true_positive[selected][order]
        num_gt = int(match.gt_counts[class_id])
        true_cumulative = np.cumsum(hits)
        false_cumulative = np.cumsum(~hits)
        recall = true_cumulative / max(num_gt, 1)
        precision = true_cumulative / np.maximum(true_cumulative + false_cumulative, 1)
        ap = average_precision(recall, precision) if num_gt > 0 else None
        curves.append(ClassCurve(recall, precision, match.scores[selected][order], ap, num_gt, len(hits)))
    return curves


@dataclass(frozen=True)
class CutPoints:
    """Micro (all classes pooled) P/R/F1 at every distinct score used as a `>=` threshold, highest first."""

    thresholds: np.ndarray
    true_positives: np.ndarray
    detections: np.ndarray
    precision: np.ndarray
    recall: np.ndarray
    f1: np.ndarray

    @property
    def best_f1_threshold(self) -> float | None:
        """The threshold with the best pooled F1 (the highest one on ties); None without detections."""
        return float(self.thresholds[int(np.argmax(self.f1))]) if len(self.thresholds) else None


def pooled_cut_points(match: MatchResult) -> CutPoints:
    order = np.argsort(-match.scores, kind="stable")
    scores = match.scores[order]
    true_cumulative = np.cumsum(match.true_positive[order])
    total_gt = int(match.gt_counts.sum())
    if len(scores) == 0:
        empty = np.zeros(0)
        return CutPoints(empty, empty, empty, empty, empty, empty)
    # the last index of each group of tied scores: a threshold keeps the whole group
    last_of_group = np.nonzero(np.append(scores[1:] != scores[:-1], True))[0]
    true_positives = true_cumulative[last_of_group].astype(np.float64)
    detections = (last_of_group + 1).astype(np.float64)
    precision = true_positives / detections
    recall = true_positives / total_gt if total_gt else np.zeros_like(true_positives)
    f1 = _f_score(precision, recall)
    return CutPoints(scores[last_of_group], true_positives, detections, precision, recall, f1)


def _f_score(precision: np.ndarray, recall: np.ndarray) -> np.ndarray:
    total = precision + recall
    return np.where(total > 0, 2 * precision * recall / np.where(total > 0, total, 1), 0.0)


def pooled_at_threshold(match: MatchResult, threshold: float) -> dict:
    """Micro precision/recall/F1 and counts for detections with score >= threshold."""
    kept = match.scores >= threshold
    true_positives = int(match.true_positive[kept].sum())
    detections = int(kept.sum())
    total_gt = int(match.gt_counts.sum())
    precision = true_positives / detections if detections else None
    recall = true_positives / total_gt if total_gt else None
    if precision is None or recall is None or precision + recall == 0:
        f1 = 0.0 if total_gt else None
    else:
        f1 = 2 * precision * recall / (precision + recall)
    return {
        "threshold": float(threshold),
        "precision": precision,
        "recall": recall,
        "f1": f1,
        "true_positives": true_positives,
        "false_positives": detections - true_positives,
        "false_negatives": total_gt - true_positives,
    }


def image_verdicts(records: Sequence[ImageRecord], threshold: float) -> dict:
    """Image-level calls: an image is called defective when any detection has score >= threshold.

    escape rate = defective images called clean / defective images;
    false-call rate = clean images called defective / clean images (None without clean images).
    """
    defective = np.array([not record.is_clean for record in records], dtype=bool)
    called = np.array([record.max_score >= threshold for record in records], dtype=bool)
    num_defective, num_clean = int(defective.sum()), int((~defective).sum())
    escapes = int((defective & ~called).sum())
    false_calls = int((~defective & called).sum())
    return {
        "defective_images": num_defective,
        "clean_images": num_clean,
        "escapes": escapes,
        "false_calls": false_calls,
        "escape_rate": escapes / num_defective if num_defective else None,
        "false_call_rate": false_calls / num_clean if num_clean else None,
    }


def confusion_matrix(
    records: Sequence[ImageRecord], num_classes: int, threshold: float, match_iou: float = 0.5
) -> np.ndarray:
    """(K+1, K+1) counts, rows = true class, columns = predicted class, index K = background.

    Detections with score >= threshold are paired with ground truth class-agnostically (highest IoU
    first, one-to-one, IoU >= threshold), so a right box with the wrong class lands off the diagonal;
    unpaired ground truth is a miss (column background), unpaired detections are false alarms (row
    background). The background/background cell is always 0.
    """
    matrix = np.zeros((num_classes + 1, num_classes + 1), dtype=np.int64)
    background = num_classes
    for record in records:
        kept = record.det_scores >= threshold
        det_boxes, det_classes = record.det_boxes[kept], record.det_classes[kept]
        ious = box_iou(record.gt_boxes, det_boxes)  # (N, M)
        gt_used = np.zeros(len(record.gt_boxes), dtype=bool)
        det_used = np.zeros(len(det_boxes), dtype=bool)
        if ious.size:
            rows, cols = np.nonzero(ious >= match_iou)
            for pair in np.argsort(-ious[rows, cols], kind="stable"):
                gt_index, det_index = rows[pair], cols[pair]
                if gt_used[gt_index] or det_used[det_index]:
                    continue
                gt_used[gt_index] = det_used[det_index] = True
                matrix[record.gt_classes[gt_index], det_classes[det_index]] += 1
        for class_id in record.gt_classes[~gt_used]:
            matrix[class_id, background] += 1
        for class_id in det_classes[~det_used]:
            matrix[background, class_id] += 1
    return matrix


@dataclass
class OperatingPointResult:
    """`summary` is JSON-ready; `curves` holds arrays over `THRESHOLD_GRID` for plots."""

    summary: dict
    curves: dict[str, np.ndarray] = field(default_factory=dict)
    class_curves: list[ClassCurve] = field(default_factory=list)


def operating_points(
    records: Sequence[ImageRecord],
    class_names: Sequence[str],
    match_iou: float = 0.5,
    target_recall: float = 0.99,
    threshold: float | None = None,
) -> OperatingPointResult:
    """Choose deployment thresholds and report box- and image-level rates at them.

    - `best_f1`: the threshold maximizing pooled F1 (the highest one on ties);
    - `target_recall`: the highest threshold (fewest false alarms) whose box recall >= `target_recall`,
      or `reachable: False` when no threshold gets there;
    - `chosen`: `threshold` when given, else the best-F1 threshold; the one the plots mark.
    """
    num_classes = len(class_names)
    match = match_detections(records, num_classes, match_iou)
    cuts = pooled_cut_points(match)
    summary: dict = {"iou_threshold": match_iou, "target_recall": target_recall}

    best_threshold = cuts.best_f1_threshold if len(cuts.thresholds) else 0.5
    summary["best_f1"] = {
        **pooled_at_threshold(match, best_threshold),
        **image_verdicts(records, best_threshold),
    }
    if not len(cuts.thresholds):
        summary["best_f1"]["note"] = "no detections"

    summary["target_recall_point"] = _target_recall_point(records, match, cuts, match_iou, target_recall)

    chosen = best_threshold if threshold is None else float(threshold)
    summary["chosen"] = {
        "source": "best_f1" if threshold is None else "given",
        **pooled_at_threshold(match, chosen),
        **image_verdicts(records, chosen),
    }

    class_curves = class_pr_curves(match, num_classes)
    summary["per_class"] = _per_class(match, class_names, class_curves, chosen)
    return OperatingPointResult(summary, _grid_curves(records, match), class_curves)


def _target_recall_point(
    records: Sequence[ImageRecord],
    match: MatchResult,
    cuts: CutPoints,
    match_iou: float,
    target_recall: float,
) -> dict:
    """The rates at the highest threshold whose box recall reaches `target_recall`, or why none does."""
    reaching = np.nonzero(cuts.recall >= target_recall)[0] if match.gt_counts.sum() else np.zeros(0, int)
    if len(reaching):
        at_recall = float(cuts.thresholds[reaching[0]])
        return {
            "reachable": True,
            **pooled_at_threshold(match, at_recall),
            **image_verdicts(records, at_recall),
        }
    best_recall = float(cuts.recall.max()) if len(cuts.recall) else 0.0
    return {
        "reachable": False,
        "threshold": None,
        "max_recall": best_recall,
        "note": f"not reachable: the highest recall at IoU {match_iou} is {best_recall:.4f} < {target_recall}",
    }


def _per_class(
    match: MatchResult, class_names: Sequence[str], class_curves: list[ClassCurve], chosen: float
) -> list[dict]:
    """Per class: ground truths, detections, AP, and precision and recall at the `chosen` threshold."""
    per_class = []
    for class_id, name in enumerate(class_names):
        selected = match.classes == class_id
        kept = selected & (match.scores >= chosen)
        hits = int(match.true_positive[kept].sum())
        num_gt = int(match.gt_counts[class_id])
        per_class.append(
            {
                "class": name,
                "gt": num_gt,
                "detections": int(selected.sum()),
                "ap": class_curves[class_id].ap,
                "precision": hits / int(kept.sum()) if kept.any() else None,
                "recall": hits / num_gt if num_gt else None,
            }
        )
    return per_class


def _grid_curves(records: Sequence[ImageRecord], match: MatchResult) -> dict[str, np.ndarray]:
    """P/R/F1 and image-level rates sampled on THRESHOLD_GRID (NaN where undefined)."""
    ascending_order = np.argsort(match.scores, kind="stable")
    ascending = match.scores[ascending_order]
    true_from_top = np.cumsum(match.true_positive[ascending_order][::-1])  # TP among the k highest
    kept = len(ascending) - np.searchsorted(ascending, THRESHOLD_GRID, side="left")  # (T,) detections >= t
    true_positives = np.where(kept > 0, true_from_top[np.maximum(kept - 1, 0)] if len(ascending) else 0, 0)
    total_gt = match.gt_counts.sum()
    with np.errstate(invalid="ignore", divide="ignore"):
        precision = np.where(kept > 0, true_positives / np.maximum(kept, 1), np.nan)
        recall = true_positives / total_gt if total_gt else np.full(len(THRESHOLD_GRID), np.nan)
    f1 = np.where(
        np.isnan(precision) | np.isnan(recall),
        np.nan,
        _f_score(np.nan_to_num(precision), np.nan_to_num(recall)),
    )

    max_scores = np.array([record.max_score for record in records])
    defective = np.array([not record.is_clean for record in records], dtype=bool)
    called = max_scores[None, :] >= THRESHOLD_GRID[:, None]  # (T, images)
    escape = (
        (defective & ~called).sum(1) / defective.sum()
        if defective.any()
        else np.full(len(THRESHOLD_GRID), np.nan)
    )
    false_call = (
        (~defective & called).sum(1) / (~defective).sum()
        if (~defective).any()
        else np.full(len(THRESHOLD_GRID), np.nan)
    )
    return {
        "thresholds": THRESHOLD_GRID.copy(),
        "precision": precision,
        "recall": recall,
        "f1": f1,
        "escape_rate": escape.astype(np.float64),
        "false_call_rate": false_call.astype(np.float64),
    }

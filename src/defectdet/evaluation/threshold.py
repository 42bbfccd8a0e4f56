"""The operating threshold, chosen on one set of boards and reported on another.

A board is called defective when any detection scores >= the threshold. Choosing the threshold on the
very boards it is reported on flatters both rates; `threshold_for_escape` picks it on calibration boards
(another split, other board groups, or the bundle's stored value), and the report says where it came from.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from defectdet.defaults import DEFAULT_TARGET_ESCAPE
from defectdet.evaluation.operating_point import match_detections, pooled_cut_points
from defectdet.evaluation.types import ImageRecord


@dataclass(frozen=True)
class ThresholdChoice:
    """An operating threshold and where it came from.

    `rule`: 'escape' (the highest threshold whose board-level escape rate on the calibration boards is
    <= `target_escape`), 'f1' (the best pooled box F1 on the calibration boards), 'given' (a value passed
    in) or 'bundle' (the bundle's `thresholds.threshold`).
    `source` names the calibration data, e.g. "split 'test' of data/deeppcb". `calibration_escape_rate`
    and `defective_boards` describe the calibration boards (None for a given value). `reachable` is False
    when more than the allowed boards had no detection at all: no threshold reaches the target then.
    """

    threshold: float
    rule: str
    source: str
    target_escape: float | None = None
    defective_boards: int | None = None
    calibration_escape_rate: float | None = None
    reachable: bool = True

    def to_dict(self) -> dict:
        return asdict(self)


def threshold_for_escape(
    records: Sequence[ImageRecord],
    target_escape: float = DEFAULT_TARGET_ESCAPE,
    source: str = "calibration records",
) -> ThresholdChoice:
    """The highest threshold at which at most `target_escape` of the defective boards in `records` (those
    with ground truth) have no detection scoring >= it. Clean boards in `records` are ignored."""
    if not 0 <= target_escape < 1:
        raise ValueError(f"target_escape must lie in [0, 1), got {target_escape}")
    scores = np.sort([record.max_score for record in records if not record.is_clean])  # ascending
    if len(scores) == 0:
        raise ValueError(f"{source}: no defective board to choose a threshold on")
    allowed = int(math.floor(target_escape * len(scores) + 1e-9))  # boards that may escape
    threshold = float(scores[allowed])
    reachable = math.isfinite(threshold)
    if not reachable:  # over `allowed` boards had no detection: take the lowest score there is
        finite = scores[np.isfinite(scores)]
        threshold = float(finite[0]) if len(finite) else 0.0
    escape_rate = float(np.mean(scores < threshold))
    return ThresholdChoice(
        threshold, "escape", source, target_escape, int(len(scores)), escape_rate, reachable
    )


def threshold_for_f1(
    records: Sequence[ImageRecord],
    num_classes: int,
    match_iou: float = 0.5,
    source: str = "calibration records",
) -> ThresholdChoice:
    """The threshold with the best pooled box F1 (same class, IoU >= `match_iou`) on `records`: the
    rule for protocols that score boxes (DeepPCB's F) rather than boards."""
    defective = [record for record in records if not record.is_clean]
    if not defective:
        raise ValueError(f"{source}: no defective board to choose a threshold on")
    threshold = pooled_cut_points(match_detections(records, num_classes, match_iou)).best_f1_threshold
    if threshold is None:
        raise ValueError(f"{source}: the model made no detection there")
    escape_rate = float(np.mean([record.max_score < threshold for record in defective]))
    return ThresholdChoice(threshold, "f1", source, None, len(defective), escape_rate, True)


def board_rates(records: Sequence[ImageRecord], threshold: float) -> dict:
    """Board-level counts and rates at `threshold`: escapes among defective boards, false calls among
    clean ones (a rate is None when there is no board of that kind)."""
    defective = [record for record in records if not record.is_clean]
    clean = [record for record in records if record.is_clean]
    escapes = sum(record.max_score < threshold for record in defective)
    false_calls = sum(record.max_score >= threshold for record in clean)
    return {
        "threshold": float(threshold),
        "defective_boards": len(defective),
        "escapes": int(escapes),
        "escape_rate": escapes / len(defective) if defective else None,
        "clean_boards": len(clean),
        "false_calls": int(false_calls),
        "false_call_rate": false_calls / len(clean) if clean else None,
    }

"""Operating threshold from calibration boards: the escape target holds there, and rates are counted right."""

from __future__ import annotations

import numpy as np
import pytest

from defectdet.evaluation.threshold import board_rates, threshold_for_escape, threshold_for_f1
from defectdet.evaluation.types import ImageRecord


def board(index: int, score: float | None, defective: bool = True) -> ImageRecord:
    gt = np.array([[0, 0, 5, 5]], np.float32) if defective else np.zeros((0, 4), np.float32)
    scores = [] if score is None else [score]
    return ImageRecord(
        f"b{index}",
        10,
        10,
        gt,
        np.zeros(len(gt), np.int64),
        np.array([[0, 0, 5, 5]] * len(scores), np.float32),
        np.array(scores, np.float32),
        np.zeros(len(scores), np.int64),
    )


def test_highest_threshold_meeting_the_escape_target() -> None:
    scores = np.linspace(0.3, 0.99, 200)
    records = [board(i, float(s)) for i, s in enumerate(scores)] + [board(999, 0.95, defective=False)]
    choice = threshold_for_escape(records, 0.01, source="split 'a'")
    assert choice.threshold == pytest.approx(scores[2])  # 2 of 200 boards may escape
    assert choice.calibration_escape_rate == pytest.approx(0.01) and choice.defective_boards == 200
    assert choice.reachable and choice.rule == "escape" and choice.source == "split 'a'"
    strict = threshold_for_escape(records, 0.0)
    assert strict.threshold == pytest.approx(scores[0]) and strict.calibration_escape_rate == 0.0


def test_unreachable_when_boards_have_no_detection() -> None:
    records = [board(0, None), board(1, None), board(2, 0.8), board(3, 0.6)]
    choice = threshold_for_escape(records, 0.01)
    assert not choice.reachable and choice.threshold == pytest.approx(0.6)
    with pytest.raises(ValueError, match="no defective board"):
        threshold_for_escape([board(0, 0.5, defective=False)])


def test_board_rates() -> None:
    records = [board(0, 0.9), board(1, 0.2), board(2, None), board(3, 0.7, False), board(4, 0.1, False)]
    rates = board_rates(records, 0.5)
    assert rates["escapes"] == 2 and rates["defective_boards"] == 3
    assert rates["false_calls"] == 1 and rates["clean_boards"] == 2
    assert rates["escape_rate"] == pytest.approx(2 / 3) and rates["false_call_rate"] == pytest.approx(0.5)


def test_f1_threshold_keeps_the_true_boxes_and_drops_the_false_ones() -> None:
    # every board: its true box scores 0.6-0.9; a false box elsewhere scores 0.2-0.5
    records = []
    true_scores, false_scores = np.linspace(0.6, 0.9, 20), np.linspace(0.2, 0.5, 20)
    for index, (true_score, false_score) in enumerate(zip(true_scores, false_scores, strict=True)):
        record = board(index, float(true_score))
        record.det_boxes = np.array([[0, 0, 5, 5], [6, 6, 9, 9]], np.float32)
        record.det_scores = np.array([true_score, false_score], np.float32)
        record.det_classes = np.zeros(2, np.int64)
        records.append(record)
    choice = threshold_for_f1(records, num_classes=1, source="split 'train'")
    assert choice.rule == "f1" and choice.source == "split 'train'"
    assert choice.threshold == pytest.approx(0.6)  # the lowest true score: recall 1, precision 1
    assert choice.calibration_escape_rate == 0.0 and choice.defective_boards == 20
    with pytest.raises(ValueError, match="no detection"):
        threshold_for_f1([board(0, None)], num_classes=1)

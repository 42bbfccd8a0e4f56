"""Hand-worked cases for COCO metrics, the DeepPCB protocol and the operating point."""

from __future__ import annotations

import numpy as np
import pytest

from defectdet.evaluation.coco import coco_metrics
from defectdet.evaluation.deeppcb import deeppcb_metrics
from defectdet.evaluation.operating_point import (
    box_iou,
    confusion_matrix,
    image_verdicts,
    operating_points,
)
from defectdet.evaluation.types import ImageRecord

NAMES = ["open", "short"]
BOX_A = [100.0, 100.0, 140.0, 140.0]  # 40x40 (COCO 'medium')
BOX_B = [300.0, 200.0, 330.0, 260.0]  # 30x60


def record(image_id, gt_boxes=(), gt_classes=(), det_boxes=(), det_scores=(), det_classes=()):
    return ImageRecord(
        image_id,
        640,
        640,
        np.array(gt_boxes, float).reshape(-1, 4),
        gt_classes,
        np.array(det_boxes, float).reshape(-1, 4),
        det_scores,
        det_classes,
    )


def shifted(box, dx):
    return [box[0] + dx, box[1], box[2] + dx, box[3]]


def test_perfect_detections_score_one():
    records = [
        record("a", [BOX_A, BOX_B], [0, 1], [BOX_A, BOX_B], [0.9, 0.8], [0, 1]),
        record("b", [BOX_B], [0], [BOX_B], [0.7], [0]),
    ]
    coco = coco_metrics(records, NAMES)
    assert coco["mAP50"] == pytest.approx(1.0)
    assert coco["mAP50_95"] == pytest.approx(1.0)
    assert coco["class_AP50"] == {"open": pytest.approx(1.0), "short": pytest.approx(1.0)}
    deeppcb = deeppcb_metrics(records, NAMES, threshold=0.5)
    assert deeppcb["mAP"] == pytest.approx(1.0)
    assert deeppcb["at_threshold"]["f_score"] == pytest.approx(1.0)
    assert deeppcb["best"]["f_score"] == pytest.approx(1.0)


def test_iou_between_033_and_05_counts_for_deeppcb_only():
    # a 40-px box shifted by 18 px: IoU = 22/58 = 0.379 -> correct at DeepPCB's 0.33, a miss at 0.5
    moved = shifted(BOX_A, 18)
    assert box_iou([BOX_A], [moved])[0, 0] == pytest.approx(22 / 58)
    records = [record("a", [BOX_A], [0], [moved], [0.9], [0])]
    assert deeppcb_metrics(records, NAMES)["mAP"] == pytest.approx(1.0)
    assert coco_metrics(records, NAMES)["mAP50"] == pytest.approx(0.0)
    summary = operating_points(records, NAMES).summary
    assert summary["chosen"]["recall"] == 0.0 and summary["chosen"]["false_positives"] == 1
    # shifted by 24 px: IoU = 16/64 = 0.25 -> a miss for DeepPCB too
    far = [record("a", [BOX_A], [0], [shifted(BOX_A, 24)], [0.9], [0])]
    result = deeppcb_metrics(far, NAMES)
    assert result["mAP"] == pytest.approx(0.0)
    assert result["best"]["f_score"] == 0.0


def test_deeppcb_threshold_is_strict_and_coco_style_is_inclusive():
    half = [100.0, 100.0, 140.0, 120.0]  # IoU exactly 0.5 with BOX_A
    assert box_iou([BOX_A], [half])[0, 0] == pytest.approx(0.5)
    records = [record("a", [BOX_A], [0], [half], [0.9], [0])]
    assert deeppcb_metrics(records, NAMES, match_iou=0.5)["mAP"] == 0.0  # IoU > 0.5 required
    assert operating_points(records, NAMES, match_iou=0.5).summary["chosen"]["recall"] == 1.0  # >= 0.5
    assert coco_metrics(records, NAMES)["mAP50"] == pytest.approx(1.0)  # pycocotools also uses >=


def test_wrong_class_is_not_a_match():
    records = [record("a", [BOX_A], [0], [BOX_A], [0.9], [1])]
    assert deeppcb_metrics(records, NAMES)["mAP"] == 0.0
    assert coco_metrics(records, NAMES)["class_AP50"] == {"open": 0.0, "short": None}


def test_duplicate_detection_is_false_positive_but_ap_stays_one():
    duplicate = [BOX_A[0] + 1, BOX_A[1], BOX_A[2] + 1, BOX_A[3]]
    records = [record("a", [BOX_A], [0], [BOX_A, duplicate], [0.9, 0.6], [0, 0])]
    coco = coco_metrics(records, NAMES)
    assert coco["mAP50"] == pytest.approx(
        1.0
    )  # pycocotools: the lower-ranked duplicate comes after recall 1.0
    deeppcb = deeppcb_metrics(records, NAMES, threshold=0.5)
    assert deeppcb["mAP"] == pytest.approx(1.0)
    assert deeppcb["at_threshold"]["precision"] == pytest.approx(0.5)
    assert deeppcb["at_threshold"]["false_positives"] == 1
    assert deeppcb["at_threshold"]["f_score"] == pytest.approx(2 * 0.5 * 1 / 1.5)
    assert deeppcb["best"]["threshold"] == pytest.approx(0.9)
    assert deeppcb["best"]["f_score"] == pytest.approx(1.0)


def test_duplicate_ranked_above_the_true_box_lowers_ap():
    # the higher-scored detection misses (IoU 0.25), the lower one hits: precision at recall 1 is 0.5
    records = [record("a", [BOX_A], [0], [shifted(BOX_A, 24), BOX_A], [0.9, 0.6], [0, 0])]
    assert deeppcb_metrics(records, NAMES)["mAP"] == pytest.approx(0.5)
    assert coco_metrics(records, NAMES)["mAP50"] == pytest.approx(0.5)


def test_false_detection_on_clean_image_lowers_precision_and_raises_false_calls():
    base = [record("a", [BOX_A], [0], [BOX_A], [0.9], [0]), record("clean", [], [], [], [], [])]
    before = operating_points(base, NAMES, threshold=0.5).summary["chosen"]
    assert before["precision"] == 1.0 and before["false_call_rate"] == 0.0 and before["clean_images"] == 1
    noisy = [base[0], record("clean", [], [], [BOX_B], [0.7], [1])]
    after = operating_points(noisy, NAMES, threshold=0.5).summary["chosen"]
    assert after["precision"] == pytest.approx(0.5)
    assert after["false_call_rate"] == pytest.approx(1.0)
    assert after["escape_rate"] == 0.0
    # above the false alarm's score the clean image is clean again
    assert image_verdicts(noisy, 0.8)["false_call_rate"] == 0.0
    # without clean images the false-call rate is undefined, not 0
    assert image_verdicts(base[:1], 0.5)["false_call_rate"] is None


def test_escape_rate_counts_defective_images_without_detections():
    records = [
        record("a", [BOX_A], [0], [BOX_A], [0.9], [0]),
        record("b", [BOX_B], [1], [], [], []),
        record("c", [BOX_B], [1], [BOX_B], [0.3], [1]),
    ]
    verdict = image_verdicts(records, 0.5)
    assert verdict["escapes"] == 2 and verdict["escape_rate"] == pytest.approx(2 / 3)
    assert verdict["false_call_rate"] is None


def test_target_recall_point_and_not_reachable():
    records = [
        record("a", [BOX_A, BOX_B], [0, 1], [BOX_A, BOX_B, shifted(BOX_A, 200)], [0.9, 0.4, 0.8], [0, 1, 0])
    ]
    summary = operating_points(records, NAMES, target_recall=0.99).summary
    point = summary["target_recall_point"]
    assert point["reachable"] is True
    assert point["threshold"] == pytest.approx(0.4)  # the highest threshold reaching recall 1.0
    assert point["recall"] == 1.0 and point["false_positives"] == 1
    # best F1: at 0.9 F1 = 2*1*0.5/1.5 = 0.667; at 0.4 F1 = 2*(2/3)*1/(5/3) = 0.8
    assert summary["best_f1"]["threshold"] == pytest.approx(0.4)
    assert summary["best_f1"]["f1"] == pytest.approx(0.8)

    missing_one = [record("a", [BOX_A, BOX_B], [0, 1], [BOX_A], [0.9], [0])]
    point = operating_points(missing_one, NAMES, target_recall=0.99).summary["target_recall_point"]
    assert point["reachable"] is False and point["threshold"] is None
    assert point["max_recall"] == pytest.approx(0.5)
    assert "not reachable" in point["note"]


def test_no_detections_and_class_without_ground_truth():
    records = [record("a", [BOX_A], [0]), record("b")]
    coco = coco_metrics(records, NAMES)
    assert coco["mAP50"] == 0.0 and coco["class_AP50"]["short"] is None
    deeppcb = deeppcb_metrics(records, NAMES)
    assert deeppcb["mAP"] == 0.0 and deeppcb["class_ap"]["short"] is None
    summary = operating_points(records, NAMES).summary
    assert summary["chosen"]["escape_rate"] == 1.0 and summary["target_recall_point"]["reachable"] is False
    # no ground truth at all: every COCO number is undefined
    assert (
        coco_metrics([record("b", det_boxes=[BOX_A], det_scores=[0.5], det_classes=[0])], NAMES)["mAP50"]
        is None
    )


def test_confusion_matrix_cells():
    records = [
        record("a", [BOX_A, BOX_B], [0, 1], [BOX_A, BOX_B], [0.9, 0.9], [0, 0]),  # right, wrong class
        record(
            "b", [BOX_A], [1], [shifted(BOX_A, 300), BOX_A], [0.9, 0.2], [1, 1]
        ),  # false alarm; hit below thr
    ]
    matrix = confusion_matrix(records, 2, threshold=0.5)
    # rows: true open, short, background; columns: predicted open, short, background
    expected = np.array(
        [
            [1, 0, 0],  # open found as open
            [1, 0, 1],  # short found as open (image a); short missed, its hit scored below the threshold (b)
            [0, 1, 0],  # the false alarm predicted as short (b)
        ]
    )
    np.testing.assert_array_equal(matrix, expected)


def test_deeppcb_ap_at_05_agrees_with_pycocotools_ap50():
    """Our all-point AP vs pycocotools' 101-point AP on a random case: the matching is identical (IoU>=,
    greedy by score, best unmatched gt), only the interpolation differs, by at most ~1/101 per class."""
    rng = np.random.default_rng(7)
    records = []
    for index in range(40):
        count = int(rng.integers(1, 6))
        corners = rng.uniform(0, 560, (count, 2))
        gt = np.concatenate([corners, corners + rng.uniform(15, 80, (count, 2))], axis=1)
        classes = rng.integers(0, 2, count)
        keep = rng.random(count) < 0.85
        jitter = rng.normal(0, 6, (count, 4))
        det_boxes = (gt + jitter)[keep]
        det_classes = np.where(rng.random(count) < 0.9, classes, 1 - classes)[keep]
        noise = int(rng.integers(0, 3))
        noise_corners = rng.uniform(0, 560, (noise, 2))
        det_boxes = np.concatenate([det_boxes, np.concatenate([noise_corners, noise_corners + 30], axis=1)])
        det_classes = np.concatenate([det_classes, rng.integers(0, 2, noise)])
        scores = rng.uniform(0.05, 1.0, len(det_boxes))
        records.append(ImageRecord(str(index), 640, 640, gt, classes, det_boxes, scores, det_classes))
    ours = deeppcb_metrics(records, NAMES, match_iou=0.5)
    theirs = coco_metrics(records, NAMES)
    assert 0.3 < ours["mAP"] < 0.99  # a non-trivial case
    for name in NAMES:
        assert ours["class_ap"][name] == pytest.approx(theirs["class_AP50"][name], abs=0.012)
    assert ours["mAP"] == pytest.approx(theirs["mAP50"], abs=0.012)


def test_image_record_rejects_mismatched_lengths():
    with pytest.raises(ValueError, match="image x"):
        ImageRecord("x", 10, 10, np.zeros((2, 4)), [0], np.zeros((0, 4)), [], [])
    with pytest.raises(ValueError, match="det boxes"):
        ImageRecord("x", 10, 10, det_boxes=np.zeros((1, 4)), det_scores=[0.5, 0.6], det_classes=[0])
    assert ImageRecord("x", 10, 10).is_clean

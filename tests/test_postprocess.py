"""Score filtering and class-aware NMS (NumPy + OpenCV)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from defectdet.postprocess import Detections, postprocess


def _predictions(rows: list[tuple[list[float], list[float]]]) -> np.ndarray:
    """rows of (xyxy, class scores) -> (1, A, 4 + K)."""
    return np.array([[box + scores for box, scores in rows]], dtype=np.float32)


def test_class_aware_nms_keeps_other_classes_and_suppresses_duplicates() -> None:
    predictions = _predictions(
        [
            ([0, 0, 10, 10], [0.9, 0.0]),
            ([1, 0, 11, 10], [0.8, 0.0]),  # same-class duplicate (IoU 0.82)
            ([0, 0, 10, 10.5], [0.0, 0.7]),  # same place, other class: kept
            ([30, 30, 40, 40], [0.6, 0.0]),  # same class, elsewhere: kept
        ]
    )
    (detections,) = postprocess(predictions, score_floor=0.05, nms_iou=0.6)
    assert detections.classes.tolist() == [0, 1, 0]
    np.testing.assert_allclose(detections.scores, [0.9, 0.7, 0.6])
    np.testing.assert_allclose(detections.boxes[0], [0, 0, 10, 10])
    assert detections.boxes.dtype == np.float32 and detections.classes.dtype == np.int64
    (agnostic,) = postprocess(predictions, nms_iou=0.6, class_agnostic=True)
    assert agnostic.classes.tolist() == [0, 0]


def test_score_threshold_and_max_detections() -> None:
    rows = [([i * 20.0, 0, i * 20.0 + 10, 10], [0.1 + 0.05 * i]) for i in range(10)]
    predictions = _predictions(rows)
    (detections,) = postprocess(predictions, score_floor=0.3)
    assert len(detections) == 5 and detections.scores.min() > 0.3
    assert np.all(np.diff(detections.scores) <= 0)
    (capped,) = postprocess(predictions, score_floor=0.0, max_detections=3)
    np.testing.assert_allclose(capped.scores, [0.55, 0.5, 0.45], rtol=1e-6)
    (limited,) = postprocess(predictions, score_floor=0.0, pre_nms_top_k=2)
    assert len(limited) == 2 and limited.scores.min() == pytest.approx(0.5)


def test_empty_inputs() -> None:
    assert postprocess(np.zeros((0, 5, 7), np.float32)) == []
    results = postprocess(np.zeros((2, 0, 7), np.float32))
    assert len(results) == 2 and all(len(item) == 0 for item in results)
    (low,) = postprocess(_predictions([([0, 0, 5, 5], [0.01, 0.02])]), score_floor=0.05)
    assert isinstance(low, Detections) and low.boxes.shape == (0, 4)
    with pytest.raises(ValueError):
        postprocess(np.zeros((4, 4), np.float32))


def test_postprocess_does_not_import_torch() -> None:
    code = "import sys, defectdet.postprocess; print('torch' in sys.modules)"
    output = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert output.stdout.strip() == "False"


def test_degenerate_boxes_never_come_out_of_postprocess() -> None:
    predictions = _predictions(
        [
            ([5, 5, 5, 9], [0.9]),  # zero width
            ([5, 9, 9, 5], [0.8]),  # upside down
            ([0, 0, float("nan"), 4], [0.7]),
            ([1, 1, 4, 4], [0.6]),
        ]
    )
    (detections,) = postprocess(predictions, score_floor=0.05)
    assert detections.boxes.tolist() == [[1, 1, 4, 4]]


def test_the_pipeline_drops_boxes_under_a_pixel_of_the_image() -> None:
    """A 100x50 image letterboxed to 64: a proposal in the bottom padding clips to zero height, one 0.3 input
    pixels wide is 0.47 image pixels; neither is a detection (the review refuses such boxes)."""
    from defectdet.data.letterbox import letterbox_image
    from defectdet.postprocess import PostprocessSettings
    from defectdet.runtime.pipeline import Prepared, finish

    canvas, transform = letterbox_image(np.zeros((50, 100), np.uint8), 64)
    prepared = Prepared(np.zeros((1, 64, 64), np.float32), transform, canvas)
    predictions = _predictions(
        [
            ([10, 50, 30, 60], [0.9]),  # below the content (rows 16-48): y1 = y2 = 50 once clipped
            ([40, 20, 40.3, 30], [0.8]),
            ([10, 20, 30, 40], [0.7]),
        ]
    )
    boxes, scores, _ = finish(predictions, prepared, PostprocessSettings(score_floor=0.05))
    assert scores.tolist() == [pytest.approx(0.7)] and boxes.shape == (1, 4)
    assert boxes[0, 2] - boxes[0, 0] >= 1 and boxes[0, 3] - boxes[0, 1] >= 1

"""bench/template_oracle.py: which detections the template oracle drops."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np

from bench import template_oracle
from defectdet.evaluation.types import ImageRecord


def _pair(folder: Path) -> tuple[Path, Path]:
    """A board with a drill hole in both images, a pin-hole only in the tested one, and a 1-px scan shift."""
    template = np.full((120, 160), 255, np.uint8)
    cv2.rectangle(template, (20, 20), (140, 100), 0, -1)  # copper
    cv2.circle(template, (40, 60), 4, 255, -1)  # a drill hole of the design
    tested = np.roll(template, 1, axis=1)  # the scan moved by one pixel: edges differ, nothing changed
    cv2.circle(tested, (110, 60), 4, 255, -1)  # a pin-hole
    cv2.imwrite(str(folder / "tested.png"), tested)
    cv2.imwrite(str(folder / "template.png"), template)
    return folder / "tested.png", folder / "template.png"


def test_only_detections_on_a_change_survive_and_edge_jitter_is_no_change(tmp_path: Path) -> None:
    mask = template_oracle.change_mask(*_pair(tmp_path))
    on_drill_hole, on_pin_hole, on_copper_edge = [33, 53, 47, 67], [103, 53, 117, 67], [15, 40, 25, 80]
    record = ImageRecord(
        image_id="board",
        width=160,
        height=120,
        gt_boxes=np.array([on_pin_hole], np.float32),
        gt_classes=np.array([5]),
        det_boxes=np.array([on_drill_hole, on_pin_hole, on_copper_edge], np.float32),
        det_scores=np.array([0.9, 0.8, 0.7], np.float32),
        det_classes=np.array([5, 5, 3]),
    )
    kept = template_oracle.keep_changed(record, mask, min_changed=6)
    assert kept.det_boxes.tolist() == [on_pin_hole]
    assert kept.det_scores.tolist() == [np.float32(0.8)]
    assert kept.gt_boxes.tolist() == record.gt_boxes.tolist()

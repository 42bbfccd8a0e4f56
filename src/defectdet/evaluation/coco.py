"""COCO box metrics through pycocotools' COCOeval, built in memory from `ImageRecord`s."""

from __future__ import annotations

import contextlib
import io
from collections.abc import Sequence

import numpy as np

from defectdet.evaluation.types import ImageRecord


def _xywh(boxes: np.ndarray) -> np.ndarray:
    boxes = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    return np.stack([boxes[:, 0], boxes[:, 1], boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]], axis=1)


def build_coco_objects(records: Sequence[ImageRecord], class_names: Sequence[str]):
    """(ground-truth COCO, detection COCO) objects. Image ids are 1-based positions in `records`,
    category ids are class id + 1, annotation ids start at 1 (pycocotools treats id 0 as 'unmatched')."""
    from pycocotools.coco import COCO

    images = [
        {"id": index + 1, "width": record.width, "height": record.height, "file_name": record.image_id}
        for index, record in enumerate(records)
    ]
    categories = [{"id": class_id + 1, "name": name} for class_id, name in enumerate(class_names)]
    ground_truth, detections = [], []
    for index, record in enumerate(records):
        for box, class_id in zip(_xywh(record.gt_boxes), record.gt_classes, strict=True):
            ground_truth.append(
                {
                    "id": len(ground_truth) + 1,
                    "image_id": index + 1,
                    "category_id": int(class_id) + 1,
                    "bbox": [float(value) for value in box],
                    "area": float(box[2] * box[3]),
                    "iscrowd": 0,
                }
            )
        for box, score, class_id in zip(
            _xywh(record.det_boxes), record.det_scores, record.det_classes, strict=True
        ):
            detections.append(
                {
                    "id": len(detections) + 1,
                    "image_id": index + 1,
                    "category_id": int(class_id) + 1,
                    "bbox": [float(value) for value in box],
                    "area": float(box[2] * box[3]),
                    "iscrowd": 0,
                    "score": float(score),
                }
            )
    with contextlib.redirect_stdout(io.StringIO()):
        coco_gt = COCO()
        coco_gt.dataset = {"images": images, "categories": categories, "annotations": ground_truth}
        coco_gt.createIndex()
        coco_dt = COCO()
        coco_dt.dataset = {"images": images, "categories": categories, "annotations": detections}
        coco_dt.createIndex()
    return coco_gt, coco_dt


def _stat(value: float) -> float | None:
    return None if value < 0 else float(value)


def _class_mean(block: np.ndarray) -> float | None:
    valid = block[block > -1]
    return float(valid.mean()) if valid.size else None


def coco_metrics(records: Sequence[ImageRecord], class_names: Sequence[str]) -> dict:
    """mAP50, mAP50_95, mAP75, AP by object size, AR@100 and per-class AP50/AP50_95.

    Values pycocotools marks undefined (-1: no ground truth in that class or size range) become None.
    Standard COCO settings: IoU 0.50:0.95 step 0.05, 101-point interpolation, at most 100 detections
    per image (more are dropped, lowest score first).
    """
    from pycocotools.cocoeval import COCOeval

    empty = {
        "mAP50": None,
        "mAP50_95": None,
        "mAP75": None,
        "AP_small": None,
        "AP_medium": None,
        "AP_large": None,
        "AR100": None,
        "class_AP50": {name: None for name in class_names},
        "class_AP50_95": {name: None for name in class_names},
    }
    if not records:
        return empty
    coco_gt, coco_dt = build_coco_objects(records, class_names)
    if not coco_gt.dataset["annotations"]:
        return empty  # nothing to recall: every COCO number is undefined
    evaluator = COCOeval(coco_gt, coco_dt, iouType="bbox")
    with contextlib.redirect_stdout(io.StringIO()):
        evaluator.evaluate()
        evaluator.accumulate()
        evaluator.summarize()
    stats = evaluator.stats
    precision = evaluator.eval["precision"]  # (T iou, R recall points, K classes, A areas, M maxDets)
    all_area, max_dets_100 = 0, len(evaluator.params.maxDets) - 1
    class_ap50, class_ap50_95 = {}, {}
    for position, category_id in enumerate(evaluator.params.catIds):
        name = class_names[category_id - 1]
        class_ap50[name] = _class_mean(precision[0, :, position, all_area, max_dets_100])
        class_ap50_95[name] = _class_mean(precision[:, :, position, all_area, max_dets_100])
    return {
        "mAP50_95": _stat(stats[0]),
        "mAP50": _stat(stats[1]),
        "mAP75": _stat(stats[2]),
        "AP_small": _stat(stats[3]),
        "AP_medium": _stat(stats[4]),
        "AP_large": _stat(stats[5]),
        "AR100": _stat(stats[8]),
        "class_AP50": class_ap50,
        "class_AP50_95": class_ap50_95,
    }

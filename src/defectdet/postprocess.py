"""Score filtering + class-aware NMS on decoded predictions (NumPy + OpenCV only, no torch).

Imports nothing from defectdet but its defaults (`defectdet.defaults`): data.tiling, model, engine, runtime and export
all use it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import cv2
import numpy as np

# The post-processing defaults (TrainConfig, training-time evaluation, `val`, the bundle): `defectdet.defaults`
from defectdet.defaults import DEFAULT_MAX_DETECTIONS, DEFAULT_NMS_IOU, DEFAULT_SCORE_FLOOR

# A box thinner or lower than one pixel of the original image is no detection (nobody can see, draw or label it).
MIN_BOX_PIXELS = 1.0
# Boxes are reported with this many decimals: the size check measures the box as it is reported.
BOX_DECIMALS = 2


# Fragment merge: a detection joins a higher-scoring one of its class when at least this share of the smaller of
# the two lies inside the other ...
FRAGMENT_OVERLAP = 0.5
# ... and it scores at least this share of that one's score (low-scoring pieces of a long defect join too).
FRAGMENT_SCORE_RATIO = 0.3


@dataclass(frozen=True)
class PostprocessSettings:
    """Score floor, class-aware NMS IoU and detection cap applied to raw predictions; `merge_classes`: the class
    ids whose overlapping fragments are reported as one box (`merge_fragments`)."""

    score_floor: float = DEFAULT_SCORE_FLOOR
    nms_iou: float = DEFAULT_NMS_IOU
    max_detections: int = DEFAULT_MAX_DETECTIONS
    merge_classes: tuple[int, ...] = ()

    @classmethod
    def from_config(cls, config: Mapping[str, Any] | None) -> PostprocessSettings:
        """From a TrainConfig dict (`score_floor`, `nms_iou`, `max_detections`), defaults for missing keys. A
        run saved before the renaming uses retired names: read it through `defectdet.compat` first."""
        config = config or {}
        return cls(
            float(config.get("score_floor", DEFAULT_SCORE_FLOOR)),
            float(config.get("nms_iou", DEFAULT_NMS_IOU)),
            int(config.get("max_detections", DEFAULT_MAX_DETECTIONS)),
        )


@dataclass
class Detections:
    """Detections of one image: ``boxes`` (K, 4) float32 xyxy, ``scores`` (K,) float32,
    ``classes`` (K,) int64; sorted by descending score."""

    boxes: np.ndarray
    scores: np.ndarray
    classes: np.ndarray

    @classmethod
    def empty(cls) -> Detections:
        return cls(np.zeros((0, 4), np.float32), np.zeros((0,), np.float32), np.zeros((0,), np.int64))

    def __len__(self) -> int:
        return int(self.scores.shape[0])


def postprocess(
    predictions: np.ndarray,
    score_floor: float = DEFAULT_SCORE_FLOOR,
    nms_iou: float = DEFAULT_NMS_IOU,
    max_detections: int = DEFAULT_MAX_DETECTIONS,
    class_agnostic: bool = False,
    pre_nms_top_k: int = 1000,
) -> list[Detections]:
    """``predictions`` (B, A, 4 + K): xyxy boxes then per-class scores -> one Detections per image.

    Each anchor yields its best class (one box per location). Candidates above
    ``score_floor`` are cut to the ``pre_nms_top_k`` best before NMS.
    """
    predictions = np.asarray(predictions)
    if predictions.ndim != 3 or predictions.shape[2] < 5:
        raise ValueError(f"predictions must be (B, A, 4 + K), got {predictions.shape}")
    results = []
    for image_predictions in predictions:
        results.append(
            _postprocess_one(
                image_predictions,
                score_floor,
                nms_iou,
                max_detections,
                class_agnostic,
                pre_nms_top_k,
            )
        )
    return results


def _postprocess_one(
    predictions: np.ndarray,  # (A, 4 + K)
    score_floor: float,
    nms_iou: float,
    max_detections: int,
    class_agnostic: bool,
    pre_nms_top_k: int,
) -> Detections:
    class_scores = predictions[:, 4:]
    classes = class_scores.argmax(1)  # (A,)
    scores = class_scores[np.arange(class_scores.shape[0]), classes]  # (A,)
    corners = predictions[:, :4]
    proper = np.isfinite(corners).all(1) & (corners[:, 2] > corners[:, 0]) & (corners[:, 3] > corners[:, 1])
    keep = np.flatnonzero((scores > score_floor) & proper)
    if keep.size == 0 or max_detections <= 0:
        return Detections.empty()
    if keep.size > pre_nms_top_k:
        keep = keep[np.argpartition(-scores[keep], pre_nms_top_k - 1)[:pre_nms_top_k]]
    boxes = predictions[keep, :4].astype(np.float32)
    scores, classes = scores[keep].astype(np.float32), classes[keep].astype(np.int64)
    xywh = np.concatenate([boxes[:, :2], boxes[:, 2:] - boxes[:, :2]], 1)
    if class_agnostic:
        indices = cv2.dnn.NMSBoxes(xywh.tolist(), scores.tolist(), score_floor, nms_iou)
    else:
        indices = cv2.dnn.NMSBoxesBatched(
            xywh.tolist(), scores.tolist(), classes.tolist(), score_floor, nms_iou
        )
    indices = np.asarray(indices, dtype=np.int64).reshape(-1)
    indices = indices[np.argsort(-scores[indices], kind="stable")][:max_detections]
    return Detections(boxes=boxes[indices], scores=scores[indices], classes=classes[indices])


def visible_boxes(boxes: np.ndarray, min_size: float = MIN_BOX_PIXELS) -> np.ndarray:
    """Mask of the (K, 4) xyxy boxes at least `min_size` wide and high once rounded to `BOX_DECIMALS` as they
    are reported (a box clipped to the image edge can collapse to zero height)."""
    rounded = np.round(np.asarray(boxes, np.float64).reshape(-1, 4), BOX_DECIMALS)
    return (rounded[:, 2] - rounded[:, 0] >= min_size) & (rounded[:, 3] - rounded[:, 1] >= min_size)


def merge_fragments(
    boxes: np.ndarray, scores: np.ndarray, classes: np.ndarray, merge_classes: tuple[int, ...]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Detections of `merge_classes` that are pieces of one larger defect, reported as one box.

    A long scratch or a large contusion is often answered with several overlapping boxes, each covering a
    stretch of it, that NMS keeps because their IoU with each other is low. In descending score order, a
    detection whose class is in `merge_classes` joins the first kept box of its class that holds at least
    `FRAGMENT_OVERLAP` of the smaller of the two and scores at least `FRAGMENT_SCORE_RATIO` of its score: that
    box grows to cover both and keeps its score. Other classes pass unchanged; the order stays by score.
    """
    boxes = np.asarray(boxes, np.float32).reshape(-1, 4)
    if not merge_classes or len(boxes) == 0:
        return boxes, scores, classes
    order = np.argsort(-np.asarray(scores), kind="stable")
    kept: list[int] = []  # indices into the output arrays, in score order
    out_boxes = boxes[order].copy()
    out_scores, out_classes = np.asarray(scores)[order], np.asarray(classes)[order]
    mergeable = np.isin(out_classes, np.asarray(merge_classes, dtype=np.int64))
    for index in range(len(out_boxes)):
        if mergeable[index] and kept:
            candidates = np.asarray(kept)
            candidates = candidates[
                (out_classes[candidates] == out_classes[index])
                & (out_scores[index] >= FRAGMENT_SCORE_RATIO * out_scores[candidates])
            ]
            if len(candidates):
                box, others = out_boxes[index], out_boxes[candidates]
                width = np.minimum(others[:, 2], box[2]) - np.maximum(others[:, 0], box[0])
                height = np.minimum(others[:, 3], box[3]) - np.maximum(others[:, 1], box[1])
                inside = np.clip(width, 0, None) * np.clip(height, 0, None)
                areas = (others[:, 2] - others[:, 0]) * (others[:, 3] - others[:, 1])
                smaller = np.minimum(areas, (box[2] - box[0]) * (box[3] - box[1]))
                joined = np.flatnonzero(inside >= FRAGMENT_OVERLAP * np.maximum(smaller, 1e-6))
                if len(joined):
                    target = candidates[joined[0]]
                    out_boxes[target, :2] = np.minimum(out_boxes[target, :2], box[:2])
                    out_boxes[target, 2:] = np.maximum(out_boxes[target, 2:], box[2:])
                    continue
        kept.append(index)
    return out_boxes[kept], out_scores[kept], out_classes[kept]

"""The per-image record every evaluation function consumes: ground truth and detections, plain NumPy."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


def _empty_boxes() -> np.ndarray:
    return np.zeros((0, 4), dtype=np.float32)


def _empty_vector(dtype: type) -> np.ndarray:
    return np.zeros((0,), dtype=dtype)


@dataclass
class ImageRecord:
    """Ground truth and detections of one image, xyxy in original-image pixels, 0-based class ids.

    `image_path` is keyword-friendly and optional (only the prediction grid reads it); so is `registration`.
    """

    image_id: str
    width: int
    height: int
    gt_boxes: np.ndarray = field(default_factory=_empty_boxes)  # (N, 4) float32 xyxy
    gt_classes: np.ndarray = field(default_factory=lambda: _empty_vector(np.int64))  # (N,)
    det_boxes: np.ndarray = field(default_factory=_empty_boxes)  # (M, 4) float32 xyxy
    det_scores: np.ndarray = field(default_factory=lambda: _empty_vector(np.float32))  # (M,)
    det_classes: np.ndarray = field(default_factory=lambda: _empty_vector(np.int64))  # (M,)
    image_path: str | None = None
    registration: dict | None = None  # measured pair motion (data.registration.Registration.to_dict())

    def __post_init__(self) -> None:
        self.image_id = str(self.image_id)
        self.width = int(self.width)
        self.height = int(self.height)
        self.gt_boxes = np.asarray(self.gt_boxes, dtype=np.float32).reshape(-1, 4)
        self.gt_classes = np.asarray(self.gt_classes, dtype=np.int64).reshape(-1)
        self.det_boxes = np.asarray(self.det_boxes, dtype=np.float32).reshape(-1, 4)
        self.det_scores = np.asarray(self.det_scores, dtype=np.float32).reshape(-1)
        self.det_classes = np.asarray(self.det_classes, dtype=np.int64).reshape(-1)
        if len(self.gt_boxes) != len(self.gt_classes):
            raise ValueError(
                f"image {self.image_id}: {len(self.gt_boxes)} gt boxes but {len(self.gt_classes)} gt classes"
            )
        if not len(self.det_boxes) == len(self.det_scores) == len(self.det_classes):
            raise ValueError(
                f"image {self.image_id}: {len(self.det_boxes)} det boxes, {len(self.det_scores)} scores, "
                f"{len(self.det_classes)} classes (must be equal)"
            )
        if self.image_path is not None:
            self.image_path = str(self.image_path)

    @property
    def is_clean(self) -> bool:
        """True when the image has no ground-truth defect (a good board)."""
        return len(self.gt_boxes) == 0

    @property
    def max_score(self) -> float:
        """Highest detection score, -inf when there is none (the image-level defect score)."""
        return float(self.det_scores.max()) if len(self.det_scores) else float("-inf")

"""Letterbox: resize keeping aspect ratio, pad to a square, and map boxes both ways.

The image is resized to whole pixels (`resized_width` x `resized_height`), so each axis has its own
exact scale (`resized / original`); boxes use those same per-axis scales, forward and back, so a
box lands exactly where its pixels went. NumPy + OpenCV only: the deployment runtime imports this
module without torch.
"""

from __future__ import annotations

from dataclasses import dataclass

import cv2
import numpy as np

# the square input side when neither the settings nor the data choose one: DeepPCB's native size, where 320
# crops reached 0.96+ mAP@0.5; a run saved without an input size was trained at it
DEFAULT_INPUT_SIZE = 640
DEFAULT_PAD_VALUE = 114  # the canvas fill around a letterboxed image


@dataclass(frozen=True)
class LetterboxTransform:
    """Maps original pixels to letterboxed pixels: x' = x * scale_x + pad_x, y' = y * scale_y + pad_y.

    The content occupies `[pad_x, pad_x + resized_width) x [pad_y, pad_y + resized_height)` of the
    `size` x `size` canvas.
    """

    scale_x: float
    scale_y: float
    pad_x: float
    pad_y: float
    original_width: int
    original_height: int
    size: int

    @property
    def resized_width(self) -> int:
        return round(self.original_width * self.scale_x)

    @property
    def resized_height(self) -> int:
        return round(self.original_height * self.scale_y)

    @property
    def scale(self) -> float:
        """The aspect-preserving factor `min(size / width, size / height)` the sizes were rounded from;
        map coordinates with `scale_x` / `scale_y`, which are exact."""
        return min(self.size / self.original_width, self.size / self.original_height)


def compute_letterbox(width: int, height: int, size: int) -> LetterboxTransform:
    """The transform that fits a `width` x `height` image into `size` x `size`, centred.

    Each side is rounded to whole pixels, never below 1: an extreme aspect ratio (say 20000 x 3 into
    640) keeps a 1-pixel-high strip instead of a zero-height resize.
    """
    if width <= 0 or height <= 0 or size <= 0:
        raise ValueError(f"letterbox needs positive sizes, got {width}x{height} -> {size}")
    scale = min(size / width, size / height)
    new_w = min(size, max(1, round(width * scale)))
    new_h = min(size, max(1, round(height * scale)))
    pad_x = (size - new_w) // 2
    pad_y = (size - new_h) // 2
    return LetterboxTransform(new_w / width, new_h / height, float(pad_x), float(pad_y), width, height, size)


def letterbox_image(
    image: np.ndarray, size: int, pad_value: int = DEFAULT_PAD_VALUE
) -> tuple[np.ndarray, LetterboxTransform]:
    """Resize `image` (HxW or HxWxC, any dtype) into a `size` x `size` canvas; returns it and the transform."""
    height, width = image.shape[:2]
    transform = compute_letterbox(width, height, size)
    new_w, new_h = transform.resized_width, transform.resized_height
    if (new_w, new_h) != (width, height):
        shrinking = new_w < width or new_h < height
        interpolation = cv2.INTER_AREA if shrinking else cv2.INTER_LINEAR
        resized = cv2.resize(image, (new_w, new_h), interpolation=interpolation)
        image = resized.reshape((new_h, new_w) + image.shape[2:])  # cv2 drops a trailing channel of 1
    canvas_shape = (size, size) + image.shape[2:]
    canvas = np.full(canvas_shape, pad_value, dtype=image.dtype)
    x0, y0 = int(transform.pad_x), int(transform.pad_y)
    canvas[y0 : y0 + new_h, x0 : x0 + new_w] = image
    return canvas, transform


def _scale_and_offset(transform: LetterboxTransform) -> tuple[np.ndarray, np.ndarray]:
    scale = np.array([transform.scale_x, transform.scale_y] * 2, dtype=np.float64)
    offset = np.array([transform.pad_x, transform.pad_y] * 2, dtype=np.float64)
    return scale, offset


def boxes_to_letterbox(boxes: np.ndarray, transform: LetterboxTransform) -> np.ndarray:
    """Map xyxy boxes from original pixels to letterboxed pixels (float32)."""
    boxes = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    scale, offset = _scale_and_offset(transform)
    return (boxes * scale + offset).astype(np.float32)


def boxes_from_letterbox(boxes: np.ndarray, transform: LetterboxTransform, clip: bool = True) -> np.ndarray:
    """Map xyxy boxes from letterboxed pixels back to original pixels (the inverse of `boxes_to_letterbox`)."""
    boxes = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    scale, offset = _scale_and_offset(transform)
    original = ((boxes - offset) / scale).astype(np.float32)
    if clip:
        original[:, [0, 2]] = original[:, [0, 2]].clip(0, transform.original_width)
        original[:, [1, 3]] = original[:, [1, 3]].clip(0, transform.original_height)
    return original

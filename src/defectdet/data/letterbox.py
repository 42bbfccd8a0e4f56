"""Letterbox: resize keeping aspect ratio, pad to a square, and map boxes both ways.

NumPy + OpenCV only: the deployment runtime imports this module without torch.
"""

from __future__ import annotations

from dataclasses import dataclass

import cv2
import numpy as np


@dataclass(frozen=True)
class LetterboxTransform:
    """Maps original pixels to letterboxed pixels: x' = x * scale + pad_x (same for y)."""

    scale: float
    pad_x: float
    pad_y: float
    original_width: int
    original_height: int
    size: int


def compute_letterbox(width: int, height: int, size: int) -> LetterboxTransform:
    """The transform that fits a `width` x `height` image into `size` x `size`, centred."""
    if width <= 0 or height <= 0 or size <= 0:
        raise ValueError(f"letterbox needs positive sizes, got {width}x{height} -> {size}")
    scale = min(size / width, size / height)
    new_w, new_h = round(width * scale), round(height * scale)
    pad_x = (size - new_w) // 2
    pad_y = (size - new_h) // 2
    return LetterboxTransform(float(scale), float(pad_x), float(pad_y), width, height, size)


def letterbox_image(
    image: np.ndarray, size: int, pad_value: int = 114
) -> tuple[np.ndarray, LetterboxTransform]:
    """Resize `image` (HxW or HxWxC, any dtype) into a `size` x `size` canvas; returns it and the transform."""
    height, width = image.shape[:2]
    transform = compute_letterbox(width, height, size)
    new_w, new_h = round(width * transform.scale), round(height * transform.scale)
    if (new_w, new_h) != (width, height):
        interpolation = cv2.INTER_AREA if transform.scale < 1 else cv2.INTER_LINEAR
        image = cv2.resize(image, (new_w, new_h), interpolation=interpolation)
    canvas_shape = (size, size) + image.shape[2:]
    canvas = np.full(canvas_shape, pad_value, dtype=image.dtype)
    x0, y0 = int(transform.pad_x), int(transform.pad_y)
    canvas[y0 : y0 + new_h, x0 : x0 + new_w] = image
    return canvas, transform


def boxes_to_letterbox(boxes: np.ndarray, transform: LetterboxTransform) -> np.ndarray:
    """Map xyxy boxes from original pixels to letterboxed pixels."""
    boxes = np.asarray(boxes, dtype=np.float32).reshape(-1, 4)
    offset = np.array([transform.pad_x, transform.pad_y] * 2, dtype=np.float32)
    return boxes * np.float32(transform.scale) + offset


def boxes_from_letterbox(boxes: np.ndarray, transform: LetterboxTransform, clip: bool = True) -> np.ndarray:
    """Map xyxy boxes from letterboxed pixels back to original pixels (exact inverse of `boxes_to_letterbox`)."""
    boxes = np.asarray(boxes, dtype=np.float32).reshape(-1, 4)
    offset = np.array([transform.pad_x, transform.pad_y] * 2, dtype=np.float32)
    original = (boxes - offset) / np.float32(transform.scale)
    if clip:
        original[:, [0, 2]] = original[:, [0, 2]].clip(0, transform.original_width)
        original[:, [1, 3]] = original[:, [1, 3]].clip(0, transform.original_height)
    return original

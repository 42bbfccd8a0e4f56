"""Mosaic: one training item cut from four augmented images tiled 2 x 2.

On a small dataset every image is seen many times in a training budget and the model learns each one's
surroundings along with its defects. A mosaic item shows parts of four images side by side, each at its own
scale (nothing is shrunk: a faint 10 px spot stays 10 px), so each step sees more defects against more
backgrounds. The four images sit at the corners of a 2S x 2S canvas and the item is the S x S window at a
random origin in its middle half, so every image fills at least a quarter of each side. Every plane of an image
(tested image, template, companions) is cut with the same window, so the planes stay aligned.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from defectdet.trainingdata.augment import clip_boxes_to_window


@dataclass
class Planes:
    """One augmented image of side S with its aligned planes and labels (xyxy boxes in its pixels)."""

    image: np.ndarray
    template: np.ndarray | None
    companions: list[np.ndarray]
    boxes: np.ndarray
    classes: np.ndarray

    def all_planes(self) -> list[np.ndarray | None]:
        return [self.image, self.template, *self.companions]


def mosaic_origin(size: int, rng: np.random.Generator) -> tuple[int, int]:
    """Top-left of the S x S window on the 2S x 2S canvas: uniform in the middle half of each axis."""
    low, high = size // 4, size - size // 4
    return int(rng.integers(low, high + 1)), int(rng.integers(low, high + 1))


def tile_window(parts: Sequence[Planes], size: int, origin: tuple[int, int], min_visibility: float) -> Planes:
    """The S x S window at `origin` of the 2S x 2S canvas holding `parts` (four, each S x S) at its corners
    (top-left, top-right, bottom-left, bottom-right). A box cut by its image's edge in the window stays when at
    least `min_visibility` of it shows, as with crops."""
    if len(parts) != 4:
        raise ValueError(f"a mosaic tiles 4 images, got {len(parts)}")
    first = parts[0]
    shapes = {plane.shape[:2] for part in parts for plane in part.all_planes() if plane is not None}
    if shapes != {(size, size)}:
        raise ValueError(f"every mosaic plane must be {size}x{size}, got {sorted(shapes)}")
    window_x, window_y = origin
    outputs = [None if plane is None else np.empty_like(plane) for plane in first.all_planes()]
    boxes, classes = [], []
    for position, part in enumerate(parts):
        corner_x, corner_y = (position % 2) * size, (position // 2) * size
        # the part's rectangle inside the window, in canvas pixels
        x0, x1 = max(corner_x, window_x), min(corner_x + size, window_x + size)
        y0, y1 = max(corner_y, window_y), min(corner_y + size, window_y + size)
        source = (slice(y0 - corner_y, y1 - corner_y), slice(x0 - corner_x, x1 - corner_x))
        target = (slice(y0 - window_y, y1 - window_y), slice(x0 - window_x, x1 - window_x))
        for output, plane in zip(outputs, part.all_planes(), strict=True):
            if output is not None and plane is not None:
                output[target] = plane[source]
        shift = np.array([corner_x, corner_y, corner_x, corner_y], dtype=np.float32)
        visible = (x0, y0, x1, y1)
        part_boxes, part_classes = clip_boxes_to_window(
            part.boxes + shift, part.classes, visible, min_visibility
        )
        offset = np.array([x0 - window_x, y0 - window_y] * 2, dtype=np.float32)
        boxes.append(part_boxes + offset)
        classes.append(part_classes)
    image, template, *companions = outputs
    assert image is not None
    return Planes(image, template, list(companions), np.concatenate(boxes), np.concatenate(classes))

"""Draw a batch of model inputs with their boxes, to see what the network is actually fed."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import cv2
import numpy as np
import torch

PALETTE = [
    (230, 25, 75),
    (60, 180, 75),
    (0, 130, 200),
    (245, 130, 48),
    (145, 30, 180),
    (70, 240, 240),
    (240, 50, 230),
    (210, 245, 60),
    (250, 190, 190),
    (0, 128, 128),
]


def _plane_to_rgb(plane: np.ndarray) -> np.ndarray:
    """(C, H, W) float in [0, 1] with C = 1 or 3 -> (H, W, 3) uint8 RGB."""
    image = (np.clip(plane, 0, 1) * 255).astype(np.uint8).transpose(1, 2, 0)
    return np.repeat(image, 3, axis=2) if image.shape[2] == 1 else np.ascontiguousarray(image)


def draw_boxes(
    image: np.ndarray, boxes: np.ndarray, classes: np.ndarray, class_names: Sequence[str]
) -> np.ndarray:
    """Draw xyxy boxes with class names onto an RGB uint8 image (a copy)."""
    canvas = image.copy()
    for (x1, y1, x2, y2), class_id in zip(boxes.round().astype(int), classes.astype(int), strict=True):
        color = PALETTE[class_id % len(PALETTE)]
        cv2.rectangle(canvas, (x1, y1), (x2, y2), color, 1)
        name = class_names[class_id] if class_id < len(class_names) else str(class_id)
        cv2.putText(canvas, name, (x1, max(8, y1 - 2)), cv2.FONT_HERSHEY_SIMPLEX, 0.32, color, 1, cv2.LINE_AA)
    return canvas


def save_batch_grid(
    images: torch.Tensor,
    targets: Sequence[torch.Tensor],
    class_names: Sequence[str],
    path: str | Path,
    template: bool,
    max_images: int = 8,
) -> Path:
    """Write a PNG grid of a collated batch: each tile is the tested image (boxes drawn) beside its template."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    array = images[:max_images].detach().cpu().float().numpy()  # (B, C, S, S)
    channels = array.shape[1] // (2 if template else 1)
    tiles = []
    for plane, target in zip(array, targets, strict=False):
        target = target.detach().cpu().numpy().reshape(-1, 5)
        tested = draw_boxes(_plane_to_rgb(plane[:channels]), target[:, 1:], target[:, 0], class_names)
        parts = [tested]
        if template:
            parts += [np.full((tested.shape[0], 4, 3), 255, np.uint8), _plane_to_rgb(plane[channels:])]
        tiles.append(np.concatenate(parts, axis=1))
    if not tiles:
        raise ValueError("save_batch_grid: the batch is empty")
    columns = 2
    blank = np.full_like(tiles[0], 255)
    while len(tiles) % columns:
        tiles.append(blank)
    rows = [np.concatenate(tiles[i : i + columns], axis=1) for i in range(0, len(tiles), columns)]
    grid = np.concatenate(rows, axis=0)
    cv2.imwrite(str(path), cv2.cvtColor(grid, cv2.COLOR_RGB2BGR))
    return path

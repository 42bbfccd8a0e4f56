"""Tiled inference for defects too small to survive the whole-image letterbox.

A 2,000 px image letterboxed to 352 px shrinks 6x: an 8 px pin-hole becomes about one pixel. With tiles the
model also sees the image at (up to) its own resolution, in overlapping `size` x `size` windows, and each
window's small detections join the whole-image pass's:

- `plan_tiles` decides whether an image needs tiles (its long side > `TILE_TRIGGER` x the letterbox) and
  where they go: a grid of at most `MAX_TILES_PER_SIDE` per axis at scale `min(1, ...)`, overlapping by at
  least `TILE_OVERLAP`, so a small defect lies whole inside some tile.
- `merge_tile_detections` keeps a tile detection only when it is too small for the whole-image pass (under
  `KEEP_BELOW_PX` at the whole-image scale) and does not touch an edge its tile shares with a neighbour
  (a cut defect; the overlap shows it whole in another tile); then class-aware NMS over the union.

The whole-image pass stays the source of large defects, so a defect spanning tiles is never split. Training is
unchanged (whole letterboxed images): a model trained so already scores its small defects better on tiles
(bench/results/tiles.json). NumPy and OpenCV only: the torch-free runtime and the torch evaluation path share
these functions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import cv2
import numpy as np

from defectdet.data.letterbox import DEFAULT_PAD_VALUE, LetterboxTransform, boxes_from_letterbox
from defectdet.postprocess import Detections

TILE_TRIGGER = 1.5  # tile when the long side is over this many letterbox sizes
TILE_OVERLAP = 0.25  # least overlap between neighbouring tiles, as a share of the tile
MAX_TILES_PER_SIDE = 4  # bounds the cost: at most 16 tiles + the whole image per call
KEEP_BELOW_PX = 8.0  # a tile detection whose long side at the whole-image scale is under one stride-8 cell
EDGE_MARGIN_PX = 2.0  # a box this close to a shared tile edge counts as cut


@dataclass(frozen=True)
class Tile:
    """A window of the image resized by `scale`: `[x0, x0 + width) x [y0, y0 + height)` in resized pixels
    (at most the letterbox size each way), and which of its edges border another tile."""

    x0: int
    y0: int
    width: int
    height: int
    scale: float
    inner_edges: tuple[bool, bool, bool, bool]  # left, top, right, bottom shared with a neighbour


@dataclass(frozen=True)
class TilePlan:
    """The tiles of one image; empty when the whole-image pass suffices."""

    scale: float  # original -> tiled pixels
    resized_width: int
    resized_height: int
    tiles: tuple[Tile, ...]
    whole_scale: float  # original -> whole-image letterbox pixels

    def __len__(self) -> int:
        return len(self.tiles)


def _starts(length: int, size: int, max_tiles: int, overlap: float) -> list[int]:
    """Tile origins along one axis: evenly spread, first at 0, last ending at `length`."""
    if length <= size:
        return [0]
    count = min(max_tiles, max(2, math.ceil((length - size) / (size * (1 - overlap))) + 1))
    return [round(index * (length - size) / (count - 1)) for index in range(count)]


def plan_tiles(
    width: int,
    height: int,
    size: int,
    trigger: float = TILE_TRIGGER,
    overlap: float = TILE_OVERLAP,
    max_tiles_per_side: int = MAX_TILES_PER_SIDE,
) -> TilePlan:
    """Where the tiles of a `width` x `height` image go for a `size` letterbox (none when not needed).

    The tile scale is 1 (native pixels) unless `max_tiles_per_side` tiles of `size`, overlapping by
    `overlap`, cannot cover the long side; then the image is first shrunk just enough that they can.
    """
    long_side = max(width, height)
    whole_scale = size / long_side
    if long_side <= trigger * size:
        return TilePlan(whole_scale, round(width * whole_scale), round(height * whole_scale), (), whole_scale)
    reach = size + (max_tiles_per_side - 1) * size * (1 - overlap)
    scale = min(1.0, reach / long_side)
    resized_width, resized_height = max(1, round(width * scale)), max(1, round(height * scale))
    xs = _starts(resized_width, size, max_tiles_per_side, overlap)
    ys = _starts(resized_height, size, max_tiles_per_side, overlap)
    tiles = []
    for row, y0 in enumerate(ys):
        for column, x0 in enumerate(xs):
            tiles.append(
                Tile(
                    x0=x0,
                    y0=y0,
                    width=min(size, resized_width - x0),
                    height=min(size, resized_height - y0),
                    scale=scale,
                    inner_edges=(column > 0, row > 0, column < len(xs) - 1, row < len(ys) - 1),
                )
            )
    return TilePlan(scale, resized_width, resized_height, tuple(tiles), whole_scale)


def resize_for_tiles(image: np.ndarray, plan: TilePlan) -> np.ndarray:
    """The image at the plan's tile scale (a view of it at scale 1)."""
    height, width = image.shape[:2]
    if (plan.resized_width, plan.resized_height) == (width, height):
        return image
    resized = cv2.resize(image, (plan.resized_width, plan.resized_height), interpolation=cv2.INTER_AREA)
    return resized.reshape((plan.resized_height, plan.resized_width) + image.shape[2:])


def tile_canvas(resized: np.ndarray, tile: Tile, size: int, pad_value: int = DEFAULT_PAD_VALUE) -> np.ndarray:
    """The tile's pixels from the image `resize_for_tiles` returned, at the top-left of a `size` x `size`
    canvas padded with `pad_value` (never resized: a tile keeps its scale, and tile pixels are canvas pixels)."""
    canvas = np.full((size, size) + resized.shape[2:], pad_value, dtype=resized.dtype)
    canvas[: tile.height, : tile.width] = resized[
        tile.y0 : tile.y0 + tile.height, tile.x0 : tile.x0 + tile.width
    ]
    return canvas


def tile_canvases(
    image: np.ndarray,
    template: np.ndarray | None,
    plan: TilePlan,
    size: int,
    pad_value: int = DEFAULT_PAD_VALUE,
) -> list[tuple[np.ndarray, np.ndarray | None]]:
    """(image canvas, template canvas or None) per tile of `plan`; the template is cut exactly as the image."""
    if not plan.tiles:
        return []
    resized = resize_for_tiles(image, plan)
    resized_template = None if template is None else resize_for_tiles(template, plan)
    return [
        (
            tile_canvas(resized, tile, size, pad_value),
            None if resized_template is None else tile_canvas(resized_template, tile, size, pad_value),
        )
        for tile in plan.tiles
    ]


def keep_tile_boxes(boxes: np.ndarray, tile: Tile, whole_scale: float) -> np.ndarray:
    """Mask of a tile's detections (xyxy in tile pixels) that the merge keeps: small at the whole-image
    scale and not cut by an edge shared with another tile."""
    boxes = np.asarray(boxes, np.float64).reshape(-1, 4)
    long_side = np.maximum(boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]) / tile.scale
    keep = long_side * whole_scale < KEEP_BELOW_PX
    left, top, right, bottom = tile.inner_edges
    if left:
        keep &= boxes[:, 0] > EDGE_MARGIN_PX
    if top:
        keep &= boxes[:, 1] > EDGE_MARGIN_PX
    if right:
        keep &= boxes[:, 2] < tile.width - EDGE_MARGIN_PX
    if bottom:
        keep &= boxes[:, 3] < tile.height - EDGE_MARGIN_PX
    return keep


def tile_boxes_to_original(boxes: np.ndarray, tile: Tile) -> np.ndarray:
    """xyxy in tile pixels -> original image pixels (float32), first clipped to the tile (a box reaching into
    the canvas padding of an edge tile ends at the image border)."""
    boxes = np.asarray(boxes, np.float64).reshape(-1, 4).copy()
    boxes[:, [0, 2]] = boxes[:, [0, 2]].clip(0, tile.width)
    boxes[:, [1, 3]] = boxes[:, [1, 3]].clip(0, tile.height)
    offset = np.array([tile.x0, tile.y0, tile.x0, tile.y0], np.float64)
    return ((boxes + offset) / tile.scale).astype(np.float32)


def merge_tile_detections(
    whole: tuple[np.ndarray, np.ndarray, np.ndarray],
    tiles: list[tuple[Tile, np.ndarray, np.ndarray, np.ndarray]],
    whole_scale: float,
    nms_iou: float,
    max_detections: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(boxes xyxy, scores, classes) in original pixels from the whole-image pass (already in original
    pixels) and each tile's (tile, boxes in tile pixels, scores, classes); class-aware NMS over the union,
    best `max_detections` kept, sorted by score."""
    boxes, scores, classes = [np.asarray(whole[0], np.float32).reshape(-1, 4)], [whole[1]], [whole[2]]
    for tile, tile_boxes, tile_scores, tile_classes in tiles:
        keep = keep_tile_boxes(tile_boxes, tile, whole_scale)
        boxes.append(tile_boxes_to_original(np.asarray(tile_boxes).reshape(-1, 4)[keep], tile))
        scores.append(np.asarray(tile_scores)[keep])
        classes.append(np.asarray(tile_classes)[keep])
    all_boxes = np.concatenate(boxes).astype(np.float32)
    all_scores = np.concatenate(scores).astype(np.float32)
    all_classes = np.concatenate(classes).astype(np.int64)
    if len(all_boxes) == 0:
        return all_boxes, all_scores, all_classes
    xywh = np.concatenate([all_boxes[:, :2], all_boxes[:, 2:] - all_boxes[:, :2]], 1)
    kept = cv2.dnn.NMSBoxesBatched(
        xywh.tolist(), all_scores.tolist(), all_classes.tolist(), 0.0, float(nms_iou)
    )
    kept = np.asarray(kept, np.int64).reshape(-1)
    kept = kept[np.argsort(-all_scores[kept], kind="stable")][:max_detections]
    return all_boxes[kept], all_scores[kept], all_classes[kept]


def combine_passes(
    found: list[Detections],
    transform: LetterboxTransform,
    plan: TilePlan | None,
    nms_iou: float,
    max_detections: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One image's answer in original pixels from its post-processed passes: `found[0]` the whole letterbox
    (mapped back through `transform`), then one per tile of `plan` (merged by `merge_tile_detections`)."""
    whole = found[0]
    boxes = boxes_from_letterbox(whole.boxes, transform)
    if plan is None or not plan.tiles:
        return boxes, whole.scores, whole.classes
    tiles = [(tile, f.boxes, f.scores, f.classes) for tile, f in zip(plan.tiles, found[1:], strict=True)]
    return merge_tile_detections(
        (boxes, whole.scores, whole.classes), tiles, plan.whole_scale, nms_iou, max_detections
    )

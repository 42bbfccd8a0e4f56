"""The anomaly map of a good-parts-only bundle (`defectdet fit`): each cell's calibrated score, as an overlay.

The bundle's predictions are one row per stride-8 cell of the letterboxed input, in row-major order, with the
cell's score last (0.5 at the bundle's threshold). `anomaly_scores` lays them out as a grid in the original
image's pixels; `anomaly_overlay_png` colours it for the review page (transparent where the image looks like the
good parts, yellow to red towards and above the threshold). Torch-free.
"""

from __future__ import annotations

import math
from typing import Any

import cv2
import numpy as np

from defectdet.runtime.bundle import BundleMetadata

STRIDE = 8  # the bundle's cell side in input pixels
# the input pixel cell 0 answers for in bundles that do not record it (`cell_centre_px`): their boxes sat at the
# middle of each cell
UNRECORDED_CELL_CENTRE_PX = (STRIDE - 1) / 2
MAX_OVERLAY_SIDE = 1024  # the overlay is stretched over the image by the page: no need for more pixels
SHOWN_FROM = 0.25  # the median good image's score: fully transparent at or below it
OPAQUE_AT = 0.5  # the bundle's threshold: full colour from it up
MAX_ALPHA = 0.6


def is_good_only(metadata: BundleMetadata) -> bool:
    """Whether the bundle is a good-parts-only model (fitted on defect-free images, boxes of class "anomaly")."""
    return metadata.metrics.get("good_only") is True or metadata.train_config.get("model") == "good_only"


def anomaly_scores(predictor: Any, image: Any) -> np.ndarray:
    """``(H, W)`` float32 score of every pixel of `image` (a path, bytes or array) under a good-parts-only
    `predictor` (`runtime.Predictor`): its cell's score, bilinear between cell centres. ValueError for a bundle
    that is not good-parts-only."""
    if not is_good_only(predictor.metadata):
        raise ValueError("the model is not a good-parts-only model: it has no anomaly map")
    loaded = predictor.load(image)
    prepared = predictor.prepare(loaded, None)
    raw, _ = predictor.run(prepared.tensor[None])  # the whole letterbox only, never its tiles
    size = prepared.transform.size
    side = size // STRIDE
    if raw.shape[1] != side * side:
        raise ValueError(f"the model answers {raw.shape[1]} cells, expected {side} x {side}")
    grid = raw[0, :, 4].reshape(side, side).astype(np.float32)
    # cell c's value at input pixel STRIDE x c + centre, the one its features answer for; linear in between
    centre = float(predictor.metadata.train_config.get("cell_centre_px", UNRECORDED_CELL_CENTRE_PX))
    place = np.float32([[STRIDE, 0, centre], [0, STRIDE, centre]])
    full = cv2.warpAffine(grid, place, (size, size), flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE)
    transform = prepared.transform
    x0, y0 = int(math.floor(transform.pad_x)), int(math.floor(transform.pad_y))
    content = full[y0 : y0 + transform.resized_height, x0 : x0 + transform.resized_width]
    height, width = loaded.shape[:2]
    return cv2.resize(content, (width, height), interpolation=cv2.INTER_LINEAR)


def anomaly_overlay_png(scores: np.ndarray) -> bytes:
    """`scores` as an RGBA PNG (at most `MAX_OVERLAY_SIDE` pixels on its long side): alpha rises from 0 at the
    median good score to `MAX_ALPHA` at the threshold; the colour goes from yellow to red over the same range."""
    height, width = scores.shape
    scale = min(1.0, MAX_OVERLAY_SIDE / max(height, width))
    if scale < 1.0:
        size = (max(1, round(width * scale)), max(1, round(height * scale)))
        scores = cv2.resize(scores, size, interpolation=cv2.INTER_AREA)
    level = np.clip((scores - SHOWN_FROM) / (OPAQUE_AT - SHOWN_FROM), 0.0, 1.0)
    bgra = np.zeros((*scores.shape, 4), np.uint8)
    bgra[..., 1] = np.round(255 * (1.0 - level)).astype(np.uint8)  # green fades: yellow -> red
    bgra[..., 2] = 255
    bgra[..., 3] = np.round(255 * MAX_ALPHA * level).astype(np.uint8)
    ok, encoded = cv2.imencode(".png", bgra)
    if not ok:
        raise ValueError("the anomaly map could not be encoded as PNG")
    return encoded.tobytes()

"""The repeat check: drop a detection whose surroundings repeat unchanged elsewhere in the same image.

A model without a golden template must tell a defect from the part's own features by look alone, and the
features it gets wrong are the ones a new design brings: a drill hole drawn on purpose looks like a pin-hole.
But a design repeats its features (every pad of a footprint has the same hole, a die array repeats its cells)
and a defect is where the part differs from its own repeats. So for each detection this module cuts its
surroundings (the box grown by half its longer side), finds the best copy of that patch elsewhere in the image
(normalised cross-correlation, copies overlapping the patch itself excluded) and, when the copy matches well,
compares the two inside the box, each pixel against the copy's pixels within one pixel (sub-pixel offsets along
edges are no change, a 1-2 px short is): a detection whose box shows no change from its copy sits on repeated
design and is dropped. A copy of the design beside a true defect shows the defect as a change, so the defect stays;
where nothing repeats (a scratch on a textured sheet) no copy matches and every detection stays.

Measured on DeepPCB's held-out groups (new board designs, no template): `bench/repeat_check.py`,
`bench/results/repeat_check_*.json`. Torch-free (OpenCV + NumPy), run by `runtime.pipeline.finish` when the
model's `ModelSpec.repeat_check` is on.
"""

from __future__ import annotations

from dataclasses import dataclass

import cv2
import numpy as np

GROW = 0.5  # the patch is the box grown on each side by this share of its longer side ...
MIN_GROW_PIXELS = 8  # ... and by at least this many pixels, so a tiny box brings its neighbourhood
MIN_MATCH = 0.7  # normalised cross-correlation of the patch with its best copy for the copy to count
DIFF_SIGMA = 1.0  # a pixel changed: no copy pixel within 1 px comes within this many stds (each standardised)
MIN_CHANGED_PIXELS = 6  # changed pixels inside the box, grown by 2 px, that keep it
SEARCH_RADIUS = 640  # copies are sought this close to the patch (bounds the cost on large images)
COARSE_PATCH_SIDE = 12  # a larger patch is first sought on the image shrunk to about this side ...
MAX_SHRINK = 4  # ... by at most this factor
CANDIDATES = 3  # the best coarse copies refined at full resolution
CHECK_FLOOR = 0.02  # detections scoring lower are kept unchecked (they barely move AP and would cost time)


@dataclass(frozen=True)
class RepeatEvidence:
    """What the check saw for one box: the best copy's correlation and the changed pixels inside the box."""

    match: float
    changed_pixels: int

    @property
    def repeated(self) -> bool:
        """The box shows the same as a well-matching copy elsewhere: repeated design, not a defect."""
        return self.match >= MIN_MATCH and self.changed_pixels < MIN_CHANGED_PIXELS


def as_gray(image: np.ndarray) -> np.ndarray:
    """uint8 HxW gray or HxWx3 RGB (the pipeline's layouts) -> HxW float32."""
    if image.ndim == 3:
        image = cv2.cvtColor(image, cv2.COLOR_RGB2GRAY)
    return image.astype(np.float32)


def _bounds(box: np.ndarray, width: int, height: int) -> tuple[int, int, int, int]:
    """The box grown by `GROW` of its longer side (at least `MIN_GROW_PIXELS`), clipped: x0, y0, x1, y1."""
    x0, y0, x1, y1 = (float(value) for value in box[:4])
    grow = max(MIN_GROW_PIXELS, GROW * max(x1 - x0, y1 - y0))
    return (
        int(max(0, np.floor(x0 - grow))),
        int(max(0, np.floor(y0 - grow))),
        int(min(width, np.ceil(x1 + grow))),
        int(min(height, np.ceil(y1 + grow))),
    )


def _standardised(patch: np.ndarray) -> np.ndarray:
    return (patch - patch.mean()) / (patch.std() + 1e-6)


def _changed(patch: np.ndarray, gray: np.ndarray, row: int, col: int) -> np.ndarray:
    """(h, w) bool: pixels of `patch` that no pixel of its copy at (`row`, `col`) in `gray`, shifted by up to one
    pixel, comes within `DIFF_SIGMA` of (both standardised by their own mean and spread). The one-pixel slack absorbs
    the copy's sub-pixel offset along edges without an opening, which would also erase a 1-2 px short or bite."""
    patch_h, patch_w = patch.shape
    copy = gray[row : row + patch_h, col : col + patch_w]
    mean, spread = float(copy.mean()), float(copy.std()) + 1e-6
    top, left = max(0, row - 1), max(0, col - 1)
    around = (gray[top : row + patch_h + 1, left : col + patch_w + 1] - mean) / spread
    target = _standardised(patch)
    nearest = np.full(patch.shape, np.inf, np.float32)
    for dy in (-1, 0, 1):
        for dx in (-1, 0, 1):
            y0, x0 = row + dy - top, col + dx - left
            if y0 < 0 or x0 < 0 or y0 + patch_h > around.shape[0] or x0 + patch_w > around.shape[1]:
                continue
            nearest = np.minimum(nearest, np.abs(target - around[y0 : y0 + patch_h, x0 : x0 + patch_w]))
    return nearest > DIFF_SIGMA


def _coarse(gray: np.ndarray, factor: int, cache: dict[int, np.ndarray]) -> np.ndarray:
    """`gray` shrunk `factor` times (area averaging), made once per image and factor."""
    if factor not in cache:
        height, width = gray.shape
        size = (max(1, width // factor), max(1, height // factor))
        cache[factor] = cv2.resize(gray, size, interpolation=cv2.INTER_AREA)
    return cache[factor]


def _exclude_overlap(
    scores: np.ndarray, top: int, left: int, origin: tuple[int, int], size: tuple[int, int]
) -> None:
    """Set to -1 the copies (top-left offsets into `scores`, whose [0, 0] is image pixel (`top`, `left`)) that
    overlap the patch at `origin` (y, x) of `size` (h, w): the patch itself, shifted, is not a repeat."""
    (oy, ox), (patch_h, patch_w) = origin, size
    rows = slice(max(0, oy - patch_h + 1 - top), max(0, oy + patch_h - top))
    cols = slice(max(0, ox - patch_w + 1 - left), max(0, ox + patch_w - left))
    scores[rows, cols] = -1.0


def _candidate_windows(
    gray: np.ndarray, origin: tuple[int, int], size: tuple[int, int], cache: dict[int, np.ndarray]
) -> list[tuple[int, int, int, int]]:
    """Where to look for the best copy at full resolution (y0, x0, y1, x1): the whole search window for a small
    patch; for a larger one, the neighbourhoods of the best `CANDIDATES` copies found on a shrunk image (a
    full-resolution correlation over the window costs many times the shrunk one)."""
    height, width = gray.shape
    (py0, px0), (patch_h, patch_w) = origin, size
    sy0, sx0 = max(0, py0 - SEARCH_RADIUS), max(0, px0 - SEARCH_RADIUS)
    sy1, sx1 = min(height, py0 + patch_h + SEARCH_RADIUS), min(width, px0 + patch_w + SEARCH_RADIUS)
    factor = int(np.clip(min(patch_h, patch_w) // COARSE_PATCH_SIDE, 1, MAX_SHRINK))
    if factor == 1:
        return [(sy0, sx0, sy1, sx1)]
    small = _coarse(gray, factor, cache)
    cy0, cx0, cy1, cx1 = sy0 // factor, sx0 // factor, sy1 // factor, sx1 // factor
    small_patch = small[py0 // factor : (py0 + patch_h) // factor, px0 // factor : (px0 + patch_w) // factor]
    window = small[cy0:cy1, cx0:cx1]
    small_h, small_w = small_patch.shape
    if small_h < 2 or small_w < 2 or window.shape[0] < small_h or window.shape[1] < small_w:
        return [(sy0, sx0, sy1, sx1)]
    scores = np.nan_to_num(cv2.matchTemplate(window, small_patch, cv2.TM_CCOEFF_NORMED), nan=-1.0)
    grown = (small_h + 1, small_w + 1)  # one coarse pixel more: rounding must not let the patch find itself
    _exclude_overlap(scores, cy0, cx0, (py0 // factor, px0 // factor), grown)
    windows = []
    for _ in range(CANDIDATES):
        row, col = np.unravel_index(int(np.argmax(scores)), scores.shape)
        if scores[row, col] <= -1.0:
            break
        scores[max(0, row - 1) : row + 2, max(0, col - 1) : col + 2] = -1.0
        y, x = (cy0 + int(row)) * factor, (cx0 + int(col)) * factor
        windows.append(
            (
                max(0, y - factor),
                max(0, x - factor),
                min(height, y + factor + patch_h),
                min(width, x + factor + patch_w),
            )
        )
    return windows


def _best_copy(
    gray: np.ndarray, origin: tuple[int, int], size: tuple[int, int], cache: dict[int, np.ndarray]
) -> tuple[float, int, int]:
    """(correlation, y, x) of the best copy of the patch at `origin` of `size` that does not overlap it."""
    (py0, px0), (patch_h, patch_w) = origin, size
    patch = gray[py0 : py0 + patch_h, px0 : px0 + patch_w]
    best = (-1.0, 0, 0)
    for wy0, wx0, wy1, wx1 in _candidate_windows(gray, origin, size, cache):
        if wy1 - wy0 < patch_h or wx1 - wx0 < patch_w:
            continue
        scores = np.nan_to_num(
            cv2.matchTemplate(gray[wy0:wy1, wx0:wx1], patch, cv2.TM_CCOEFF_NORMED), nan=-1.0
        )
        _exclude_overlap(scores, wy0, wx0, origin, size)
        row, col = np.unravel_index(int(np.argmax(scores)), scores.shape)
        if scores[row, col] > best[0]:
            best = (float(scores[row, col]), wy0 + int(row), wx0 + int(col))
    return best


def repeat_evidence(
    gray: np.ndarray, box: np.ndarray, cache: dict[int, np.ndarray] | None = None
) -> RepeatEvidence:
    """Correlation of the box's surroundings with their best copy elsewhere in `gray` (HxW float32) and the
    changed pixels between the two inside the box. A flat patch or one with no room for a copy: match 0.
    `cache`: shrunk copies of `gray`, shared by the boxes of one image."""
    height, width = gray.shape
    px0, py0, px1, py1 = _bounds(box, width, height)
    patch = gray[py0:py1, px0:px1]
    patch_h, patch_w = patch.shape
    if patch_h < 3 or patch_w < 3 or float(patch.std()) < 1e-3:
        return RepeatEvidence(0.0, -1)
    match, row, col = _best_copy(gray, (py0, px0), (patch_h, patch_w), {} if cache is None else cache)
    if match < MIN_MATCH:
        return RepeatEvidence(match, -1)
    changed = _changed(patch, gray, row, col)
    x0, y0, x1, y1 = (float(value) for value in box[:4])
    bx0, by0 = max(0, int(np.floor(x0)) - px0 - 2), max(0, int(np.floor(y0)) - py0 - 2)
    bx1, by1 = int(np.ceil(x1)) - px0 + 2, int(np.ceil(y1)) - py0 + 2
    return RepeatEvidence(match, int(changed[by0:by1, bx0:bx1].sum()))


def repeated_mask(image: np.ndarray, boxes: np.ndarray, scores: np.ndarray) -> np.ndarray:
    """(K,) bool: True for the detections (xyxy `boxes` in `image`'s pixels) that sit on repeated design.
    Detections under `CHECK_FLOOR` are not checked (False)."""
    repeated = np.zeros(len(boxes), bool)
    checked = np.flatnonzero(np.asarray(scores) >= CHECK_FLOOR)
    if len(checked) == 0:
        return repeated
    gray, cache = as_gray(image), {}
    for index in checked:
        repeated[index] = repeat_evidence(gray, boxes[index], cache).repeated
    return repeated

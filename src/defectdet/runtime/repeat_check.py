"""The repeat check: drop a detection whose surroundings repeat unchanged elsewhere in the same image.

A model without a golden template must tell a defect from the part's own features by look alone, and the
features it gets wrong are the ones a new design brings: a drill hole drawn on purpose looks like a pin-hole.
But a design repeats its features (every pad of a footprint has the same hole, a die array repeats its cells)
and a defect is where the part differs from its own repeats. So for each detection this module cuts its
surroundings (the box grown by half its longer side), finds the best copy of that patch elsewhere in the image
(normalised cross-correlation, copies overlapping the patch itself excluded) and, when the copy matches well,
compares the two inside the box: a detection whose box shows no change from its copy sits on repeated design
and is dropped. A copy of the design beside a true defect shows the defect as a change, so the defect stays;
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
DIFF_SIGMA = 1.0  # a pixel changed: patch and copy (each standardised) differ by more than this many stds
MIN_CHANGED_PIXELS = 6  # changed pixels (after a 3x3 opening) inside the box, grown by 2 px, that keep it
SEARCH_RADIUS = (
    640  # copies are sought within this many pixels of the patch (bounds the cost on large images)
)
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


def repeat_evidence(gray: np.ndarray, box: np.ndarray) -> RepeatEvidence:
    """Correlation of the box's surroundings with their best copy elsewhere in `gray` (HxW float32) and the
    changed pixels between the two inside the box. A flat patch or one with no room for a copy: match 0."""
    height, width = gray.shape
    px0, py0, px1, py1 = _bounds(box, width, height)
    patch = gray[py0:py1, px0:px1]
    patch_h, patch_w = patch.shape
    if patch_h < 3 or patch_w < 3 or float(patch.std()) < 1e-3:
        return RepeatEvidence(0.0, -1)
    sx0, sy0 = max(0, px0 - SEARCH_RADIUS), max(0, py0 - SEARCH_RADIUS)
    sx1, sy1 = min(width, px1 + SEARCH_RADIUS), min(height, py1 + SEARCH_RADIUS)
    window = gray[sy0:sy1, sx0:sx1]
    scores = np.nan_to_num(cv2.matchTemplate(window, patch, cv2.TM_CCOEFF_NORMED), nan=-1.0)
    # copies that overlap the patch itself are the patch, shifted: not a repeat
    ox, oy = px0 - sx0, py0 - sy0
    scores[max(0, oy - patch_h + 1) : oy + patch_h, max(0, ox - patch_w + 1) : ox + patch_w] = -1.0
    row, col = np.unravel_index(int(np.argmax(scores)), scores.shape)
    match = float(scores[row, col])
    if match < MIN_MATCH:
        return RepeatEvidence(match, -1)
    copy = window[row : row + patch_h, col : col + patch_w]
    changed = (np.abs(_standardised(patch) - _standardised(copy)) > DIFF_SIGMA).astype(np.uint8)
    changed = cv2.morphologyEx(changed, cv2.MORPH_OPEN, np.ones((3, 3), np.uint8))
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
    gray = as_gray(image)
    for index in checked:
        repeated[index] = repeat_evidence(gray, boxes[index]).repeated
    return repeated

"""Defects drawn onto a copy of a board layout, each with an exact box.

A defect's box comes from the pixels it actually changed: the board state (substrate /
copper / hole) is compared in the defect's region before and after drawing it. A defect
whose changed pixels come near an earlier defect is undone and re-drawn elsewhere, so
every box stays exact even when defects are close, and boxes never overlap heavily.
"""

from __future__ import annotations

from dataclasses import dataclass

import cv2
import numpy as np

from defectdet.data.synth.layout import BoardLayout, Trace

CLASS_NAMES: tuple[str, ...] = ("open", "short", "mousebite", "spur", "copper", "pin-hole", "missing-hole")
OPEN, SHORT, MOUSEBITE, SPUR, COPPER, PIN_HOLE, MISSING_HOLE = range(7)


@dataclass
class Defect:
    """One drawn defect: class id, tight box of changed pixels and the annotated (padded) box."""

    class_id: int
    changed_box: tuple[int, int, int, int]  # x1, y1, x2, y2 (exclusive) around changed pixels
    box: tuple[float, float, float, float]  # x1, y1, x2, y2 as an annotator would draw it


@dataclass
class _Site:
    """A point on an isolated stretch of trace: centre, unit direction, unit normal, width."""

    centre: np.ndarray
    along: np.ndarray
    normal: np.ndarray
    width: int


class _State:
    """The tested board being damaged: copper and hole masks plus derived lookups."""

    def __init__(self, layout: BoardLayout) -> None:
        self.layout = layout
        self.copper = layout.copper.copy()
        self.holes = layout.holes.copy()
        self.height, self.width = self.copper.shape
        occupied = cv2.bitwise_or(layout.copper, layout.holes)
        # Distance to the nearest copper/hole (free space) and to the nearest non-copper (inside copper).
        self.free_distance = cv2.distanceTransform(cv2.bitwise_not(occupied), cv2.DIST_L2, 3)
        self.copper_distance = cv2.distanceTransform(layout.copper, cv2.DIST_L2, 3)
        lengths = []
        for trace in layout.traces:
            segment_lengths = np.linalg.norm(np.diff(trace.points, axis=0), axis=1)
            lengths.append(segment_lengths)
        self.segment_lengths = lengths

    def copper_at(self, point: np.ndarray) -> bool:
        x, y = int(round(point[0])), int(round(point[1]))
        if not (0 <= x < self.width and 0 <= y < self.height):
            return False
        return bool(self.copper[y, x])

    def inside(self, point: np.ndarray, margin: float) -> bool:
        return margin <= point[0] < self.width - margin and margin <= point[1] < self.height - margin


def _trace_site(state: _State, rng: np.random.Generator, clearance_sides: int = 2) -> _Site | None:
    """A random point on a trace whose `clearance_sides` sides are bare substrate."""
    traces: list[Trace] = state.layout.traces
    if not traces:
        return None
    weights = np.array([lengths.sum() for lengths in state.segment_lengths])
    if weights.sum() <= 0:
        return None
    for _attempt in range(20):
        trace_index = int(rng.choice(len(traces), p=weights / weights.sum()))
        trace = traces[trace_index]
        lengths = state.segment_lengths[trace_index]
        segment = int(rng.choice(len(lengths), p=lengths / lengths.sum()))
        if lengths[segment] < 3 * trace.width:
            continue
        start, end = trace.points[segment], trace.points[segment + 1]
        along = (end - start) / lengths[segment]
        normal = np.array([along[1], -along[0]])
        offset = rng.uniform(1.5 * trace.width, lengths[segment] - 1.5 * trace.width)
        centre = start + along * offset
        if not state.inside(centre, 25):
            continue
        half = trace.width / 2
        side_free = [not state.copper_at(centre + sign * normal * (half + 3)) for sign in (1, -1)]
        continues = all(state.copper_at(centre + sign * along * trace.width) for sign in (1, -1))
        if state.copper_at(centre) and continues and sum(side_free) >= clearance_sides:
            if clearance_sides == 1 and not side_free[0]:
                normal = -normal
            return _Site(centre, along, normal, trace.width)
    return None


def _fill(mask: np.ndarray, points: np.ndarray, value: int) -> None:
    cv2.fillPoly(mask, [np.round(points).astype(np.int32).reshape(-1, 1, 2)], value)


def _open(state: _State, rng: np.random.Generator, zoom: float) -> bool:
    site = _trace_site(state, rng)
    if site is None:
        return False
    gap = rng.uniform(3, 10) * zoom if rng.random() < 0.75 else rng.uniform(10, 30) * zoom
    half_across = site.width / 2 + 2
    jitter = rng.uniform(-0.3, 0.3, size=4) * max(gap, 4)
    corners = [
        (-gap / 2 + jitter[0], -half_across),
        (gap / 2 + jitter[1], -half_across),
        (gap / 2 + jitter[2], half_across),
        (-gap / 2 + jitter[3], half_across),
    ]
    points = np.array([site.centre + site.along * a + site.normal * n for a, n in corners])
    _fill(state.copper, points, 0)
    return True


def _short(state: _State, rng: np.random.Generator, zoom: float) -> bool:
    site = _trace_site(state, rng, clearance_sides=1)
    if site is None:
        return False
    direction = site.normal
    max_reach = site.width / 2 + 45 * zoom
    step = site.width / 2 + 1
    while step < max_reach and state.copper_at(site.centre + direction * step):
        step += 1
    gap_start = step
    while step < max_reach and not state.copper_at(site.centre + direction * step):
        if not state.inside(site.centre + direction * step, 2):
            return False
        step += 1
    if step >= max_reach or step - gap_start < 2:
        return False
    thickness = int(np.clip(rng.uniform(2, 7) * zoom, 2, max(2, site.width)))
    start = site.centre + direction * (gap_start - 2)
    end = site.centre + direction * (step + 2)
    skew = site.along * rng.uniform(-0.4, 0.4) * (step - gap_start)
    cv2.line(
        state.copper,
        tuple(np.round(start).astype(int)),
        tuple(np.round(end + skew).astype(int)),
        255,
        thickness,
    )
    return True


def _mousebite(state: _State, rng: np.random.Generator, zoom: float) -> bool:
    site = _trace_site(state, rng, clearance_sides=1)
    if site is None or site.width < 8:
        return False
    radius_min = max(2.5, 0.3 * site.width)
    radius_max = max(radius_min + 0.5, min(0.45 * site.width, 7 * zoom))
    count = int(rng.integers(1, 4))
    position = 0.0
    for _ in range(count):
        radius = rng.uniform(radius_min, radius_max)
        centre = site.centre + site.along * position + site.normal * (site.width / 2)
        cv2.circle(state.copper, tuple(np.round(centre).astype(int)), int(round(radius)), 0, -1)
        position += radius * rng.uniform(1.2, 2.2) * rng.choice([-1, 1])
    return True


def _spur(state: _State, rng: np.random.Generator, zoom: float) -> bool:
    site = _trace_site(state, rng, clearance_sides=1)
    if site is None:
        return False
    angle = rng.uniform(-0.7, 0.7)
    direction = site.normal * np.cos(angle) + site.along * np.sin(angle)
    length = rng.uniform(6, 20) * zoom
    base = site.centre + site.normal * (site.width / 2 - 1)
    # The spur must end in free space, well short of any other conductor.
    for distance in np.arange(2, length + state.layout.clearance * 0.6, 1.0):
        if state.copper_at(base + direction * distance) or not state.inside(base + direction * distance, 2):
            return False
    half_base = rng.uniform(1.0, 3.0) * zoom + 0.5
    tip_half = rng.uniform(0.5, 1.5)
    points = np.array(
        [
            base - site.along * half_base,
            base + site.along * half_base,
            base + direction * length + site.along * tip_half,
            base + direction * length - site.along * tip_half,
        ]
    )
    _fill(state.copper, points, 255)
    return True


def _random_blob(centre: np.ndarray, radius: float, rng: np.random.Generator) -> np.ndarray:
    count = int(rng.integers(7, 14))
    angles = np.sort(rng.uniform(0, 2 * np.pi, count))
    stretch = rng.uniform(0.5, 1.0)
    rotation = rng.uniform(0, np.pi)
    radii = radius * rng.uniform(0.6, 1.15, count)
    x = radii * np.cos(angles)
    y = radii * np.sin(angles) * stretch
    return centre + np.stack(
        [x * np.cos(rotation) - y * np.sin(rotation), x * np.sin(rotation) + y * np.cos(rotation)], axis=1
    )


def _sample_where(
    distance: np.ndarray, minimum: float, margin: int, rng: np.random.Generator
) -> np.ndarray | None:
    height, width = distance.shape
    candidates = np.flatnonzero(distance[margin : height - margin, margin : width - margin] >= minimum)
    if candidates.size == 0:
        return None
    index = int(candidates[rng.integers(candidates.size)])
    inner_width = width - 2 * margin
    return np.array([index % inner_width + margin, index // inner_width + margin], dtype=np.float64)


def _copper(state: _State, rng: np.random.Generator, zoom: float) -> bool:
    radius = rng.uniform(3, 10) * zoom
    centre = _sample_where(state.free_distance, radius + 4, 20, rng)
    if centre is None:
        return False
    _fill(state.copper, _random_blob(centre, radius, rng), 255)
    return True


def _pin_hole(state: _State, rng: np.random.Generator, zoom: float) -> bool:
    radius = rng.uniform(2.5, 5.5) * zoom
    centre = _sample_where(state.copper_distance, radius + 3, 20, rng)
    if centre is None:
        return False
    if radius < 3:
        cv2.circle(state.copper, tuple(np.round(centre).astype(int)), int(round(radius)), 0, -1)
    else:
        _fill(state.copper, _random_blob(centre, radius, rng), 0)
    return True


def _missing_hole(state: _State, rng: np.random.Generator, zoom: float) -> bool:
    drills = [
        drill
        for drill in state.layout.drills
        if state.inside(np.array(drill.center, float), drill.radius + 4)
    ]
    if not drills:
        return False
    drill = drills[int(rng.integers(len(drills)))]
    cv2.circle(state.holes, drill.center, drill.radius + 1, 0, -1)
    cv2.circle(state.copper, drill.center, drill.radius + 1, 255, -1)
    return True


_DRAWERS = {
    OPEN: _open,
    SHORT: _short,
    MOUSEBITE: _mousebite,
    SPUR: _spur,
    COPPER: _copper,
    PIN_HOLE: _pin_hole,
    MISSING_HOLE: _missing_hole,
}


def _state_difference(
    copper_before: np.ndarray, holes_before: np.ndarray, copper_after: np.ndarray, holes_after: np.ndarray
) -> np.ndarray:
    """(H, W) uint8 mask of pixels whose state (substrate / copper / hole; hole wins) changed."""
    visible_before = cv2.bitwise_and(copper_before, cv2.bitwise_not(holes_before))
    visible_after = cv2.bitwise_and(copper_after, cv2.bitwise_not(holes_after))
    return cv2.bitwise_or(cv2.absdiff(visible_before, visible_after), cv2.absdiff(holes_before, holes_after))


def _boxes_clash(box: tuple, others: list[tuple], margin: int) -> bool:
    x1, y1, x2, y2 = box
    for ox1, oy1, ox2, oy2 in others:
        if x1 - margin < ox2 and ox1 - margin < x2 and y1 - margin < oy2 and oy1 - margin < y2:
            return True
    return False


def _overlap_fraction(box: tuple, other: tuple) -> float:
    width = min(box[2], other[2]) - max(box[0], other[0])
    height = min(box[3], other[3]) - max(box[1], other[1])
    if width <= 0 or height <= 0:
        return 0.0
    smaller = min((box[2] - box[0]) * (box[3] - box[1]), (other[2] - other[0]) * (other[3] - other[1]))
    return width * height / max(smaller, 1e-9)


def _annotate(
    changed: tuple[int, int, int, int], zoom: float, height: int, width: int, rng: np.random.Generator
) -> tuple[float, float, float, float]:
    """Pad the changed-pixel box like a human annotator: a few px margin and a minimum size."""
    x1, y1, x2, y2 = changed
    scale = 0.5 + 0.5 * zoom  # annotators' boxes grow less than the features do
    pad = rng.uniform(3, 7) * scale
    minimum = rng.uniform(24, 34) * scale
    centre_x = (x1 + x2) / 2 + rng.uniform(-2, 2)
    centre_y = (y1 + y2) / 2 + rng.uniform(-2, 2)
    box_w = max(x2 - x1 + 2 * pad, minimum)
    box_h = max(y2 - y1 + 2 * pad, minimum)
    # keep the changed pixels inside despite the centre jitter
    left = min(x1 - 1.0, centre_x - box_w / 2)
    top = min(y1 - 1.0, centre_y - box_h / 2)
    right = max(x2 + 1.0, left + box_w)
    bottom = max(y2 + 1.0, top + box_h)
    return (
        float(max(0.0, round(left))),
        float(max(0.0, round(top))),
        float(min(width, round(right))),
        float(min(height, round(bottom))),
    )


def add_defects(
    layout: BoardLayout, rng: np.random.Generator, count: int | None = None
) -> tuple[np.ndarray, np.ndarray, list[Defect]]:
    """Damage a copy of `layout`; returns (tested copper, tested holes, defects)."""
    state = _State(layout)
    zoom = layout.zoom
    target = int(rng.integers(3, 13)) if count is None else count
    plan = list(rng.permutation(len(CLASS_NAMES)))
    # extra entries stand in for classes that found no place on this board
    plan += list(rng.integers(0, len(CLASS_NAMES), size=max(0, target - len(plan)) + 6))
    defects: list[Defect] = []
    changed_boxes: list[tuple[int, int, int, int]] = []
    for class_id in plan:
        if len(defects) >= target:
            break
        for _attempt in range(8):
            before_copper = state.copper.copy()
            before_holes = state.holes.copy()
            if not _DRAWERS[int(class_id)](state, rng, zoom):
                continue
            difference = _state_difference(before_copper, before_holes, state.copper, state.holes)
            ok = cv2.countNonZero(difference) >= 12
            if ok:
                x, y, box_w, box_h = cv2.boundingRect(difference)
                changed = (x, y, x + box_w, y + box_h)
                ok = max(changed[2] - changed[0], changed[3] - changed[1]) <= 110 * zoom and not _boxes_clash(
                    changed, changed_boxes, margin=4
                )
            if ok:
                box = _annotate(changed, zoom, state.height, state.width, rng)
                ok = all(_overlap_fraction(box, other.box) < 0.3 for other in defects)
            if not ok:
                state.copper, state.holes = before_copper, before_holes
                continue
            changed_boxes.append(changed)
            defects.append(Defect(int(class_id), changed, box))
            break
    return state.copper, state.holes, defects

"""Procedural defect-free PCB layouts: copper pours, pads, vias and octilinear traces.

Everything is drawn into binary masks (uint8 0/255) at the final image resolution. Each new
conductor is only committed when it keeps a clearance to the copper already drawn, so
neighbouring conductors never touch by accident and every later "short" is a real defect.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import cv2
import numpy as np

# Octilinear unit directions, index k means an angle of k * 45 degrees (image y points down).
DIRECTIONS = np.array(
    [(np.cos(k * np.pi / 4), np.sin(k * np.pi / 4)) for k in range(8)], dtype=np.float64
).round(6)


@dataclass
class Trace:
    """A copper trace: polyline of vertices (K, 2) in x, y pixels, drawn with `width`."""

    points: np.ndarray
    width: int


@dataclass
class Drill:
    """A drilled hole of `radius` at `center` inside a pad or via of `pad_radius`."""

    center: tuple[int, int]
    radius: int
    pad_radius: int


@dataclass
class BoardLayout:
    """The defect-free board: masks plus the geometry defects are placed on."""

    height: int
    width: int
    zoom: float
    clearance: int
    copper: np.ndarray  # (H, W) uint8 0/255, all copper
    pads: np.ndarray  # (H, W) uint8 0/255, exposed pad copper (only changes the colour render)
    holes: np.ndarray  # (H, W) uint8 0/255, drill holes (no copper, see-through)
    traces: list[Trace] = field(default_factory=list)
    drills: list[Drill] = field(default_factory=list)


def _ipoints(points: np.ndarray, offset: tuple[int, int] = (0, 0)) -> np.ndarray:
    return np.round(points - np.asarray(offset, dtype=np.float64)).astype(np.int32).reshape(-1, 1, 2)


def _draw(
    canvas: np.ndarray, shape: tuple, grow: int = 0, offset: tuple[int, int] = (0, 0), value: int = 255
) -> None:
    """Draw one primitive. Shapes: ('circle', cx, cy, r), ('rect', cx, cy, half_w, half_h),
    ('line', points (K, 2), width), ('poly', points (K, 2))."""
    kind = shape[0]
    ox, oy = offset
    if kind == "circle":
        _, cx, cy, radius = shape
        cv2.circle(canvas, (int(round(cx - ox)), int(round(cy - oy))), int(radius + grow), value, -1)
    elif kind == "rect":
        _, cx, cy, half_w, half_h = shape
        top_left = (int(round(cx - half_w - grow - ox)), int(round(cy - half_h - grow - oy)))
        bottom_right = (int(round(cx + half_w + grow - ox)), int(round(cy + half_h + grow - oy)))
        cv2.rectangle(canvas, top_left, bottom_right, value, -1)
    elif kind == "line":
        _, points, width = shape
        cv2.polylines(canvas, [_ipoints(points, offset)], False, value, int(width + 2 * grow))
    elif kind == "poly":
        _, points = shape
        cv2.fillPoly(canvas, [_ipoints(points, offset)], value)
        if grow > 0:
            cv2.polylines(canvas, [_ipoints(points, offset)], True, value, int(2 * grow))
    else:  # pragma: no cover - internal misuse
        raise ValueError(f"unknown shape {kind!r}")


def _bounds(shape: tuple) -> tuple[float, float, float, float]:
    kind = shape[0]
    if kind == "circle":
        _, cx, cy, radius = shape
        return cx - radius, cy - radius, cx + radius, cy + radius
    if kind == "rect":
        _, cx, cy, half_w, half_h = shape
        return cx - half_w, cy - half_h, cx + half_w, cy + half_h
    points = shape[1]
    half = shape[2] / 2 if kind == "line" else 0
    return (
        points[:, 0].min() - half,
        points[:, 1].min() - half,
        points[:, 0].max() + half,
        points[:, 1].max() + half,
    )


def fits(copper: np.ndarray, shapes: list[tuple], clearance: int, ignore: list[tuple] = ()) -> bool:
    """True when `shapes`, grown by `clearance`, touch no copper except inside `ignore` shapes."""
    height, width = copper.shape
    boxes = np.array([_bounds(shape) for shape in shapes])
    x0 = int(max(0, np.floor(boxes[:, 0].min()) - clearance - 2))
    y0 = int(max(0, np.floor(boxes[:, 1].min()) - clearance - 2))
    x1 = int(min(width, np.ceil(boxes[:, 2].max()) + clearance + 3))
    y1 = int(min(height, np.ceil(boxes[:, 3].max()) + clearance + 3))
    if x1 <= x0 or y1 <= y0:
        return False
    scratch = np.zeros((y1 - y0, x1 - x0), np.uint8)
    for shape in shapes:
        _draw(scratch, shape, grow=clearance, offset=(x0, y0))
    if ignore:
        for shape in ignore:
            _draw(scratch, shape, offset=(x0, y0), value=0)
    return cv2.countNonZero(cv2.bitwise_and(scratch, copper[y0:y1, x0:x1])) == 0


def offset_polyline(points: np.ndarray, distance: float) -> np.ndarray:
    """Parallel copy of an octilinear polyline `distance` px to its left (mitred corners)."""
    segments = np.diff(points, axis=0)
    lengths = np.linalg.norm(segments, axis=1, keepdims=True)
    units = segments / np.maximum(lengths, 1e-9)
    normals = np.stack([units[:, 1], -units[:, 0]], axis=1)  # (K-1, 2)
    vertex_normals = np.empty_like(points)
    vertex_normals[0] = normals[0]
    vertex_normals[-1] = normals[-1]
    for index in range(1, len(points) - 1):
        mitre = normals[index - 1] + normals[index]
        mitre /= max(np.linalg.norm(mitre), 1e-9)
        vertex_normals[index] = mitre / max(float(mitre @ normals[index]), 0.5)
    return points + distance * vertex_normals


class _Builder:
    """Stateful helper drawing one board; keeps the masks and geometry lists in sync."""

    def __init__(self, rng: np.random.Generator, height: int, width: int) -> None:
        self.rng = rng
        self.height = height
        self.width = width
        self.zoom = float(rng.uniform(1.0, 1.6))
        zoom = self.zoom
        self.clearance = max(3, int(round(rng.uniform(6, 11) * zoom)))
        widths = [rng.uniform(5, 9), rng.uniform(10, 15), rng.uniform(16, 26)]
        self.trace_widths = [max(3, int(round(value * zoom))) for value in widths]
        self.copper = np.zeros((height, width), np.uint8)
        self.pads = np.zeros((height, width), np.uint8)
        self.holes = np.zeros((height, width), np.uint8)
        self.traces: list[Trace] = []
        self.drills: list[Drill] = []
        self.terminals: list[tuple[float, float, float]] = []  # x, y, pad half size

    # -- primitives -------------------------------------------------------------------------
    def commit(self, shapes: list[tuple], pad: bool = False) -> None:
        for shape in shapes:
            _draw(self.copper, shape)
            if pad:
                _draw(self.pads, shape)

    def drill(self, cx: float, cy: float, radius: int, pad_radius: int) -> None:
        cv2.circle(self.holes, (int(round(cx)), int(round(cy))), int(radius), 255, -1)
        self.drills.append(Drill((int(round(cx)), int(round(cy))), int(radius), int(pad_radius)))

    def random_point(self, margin: float = 0.0) -> tuple[float, float]:
        return (
            float(self.rng.uniform(margin, self.width - margin)),
            float(self.rng.uniform(margin, self.height - margin)),
        )

    # -- copper pours -----------------------------------------------------------------------
    def pour(self) -> None:
        rng = self.rng
        width, height = self.width, self.height
        span_w = rng.uniform(0.3, 0.8) * width
        span_h = rng.uniform(0.2, 0.6) * height
        side = rng.integers(4)
        if side in (0, 1):  # hanging off the left or right edge
            x0 = -50.0 if side == 0 else width - span_w
            x1 = x0 + span_w + 50
            y0 = rng.uniform(-0.2, 0.8) * height
            y1 = y0 + span_h
        else:  # hanging off the top or bottom edge
            y0 = -50.0 if side == 2 else height - span_h
            y1 = y0 + span_h + 50
            x0 = rng.uniform(-0.2, 0.8) * width
            x1 = x0 + span_w
        chamfer = rng.uniform(0.05, 0.3) * min(x1 - x0, y1 - y0)
        points = np.array(
            [
                (x0 + chamfer, y0),
                (x1 - chamfer, y0),
                (x1, y0 + chamfer),
                (x1, y1 - chamfer),
                (x1 - chamfer, y1),
                (x0 + chamfer, y1),
                (x0, y1 - chamfer),
                (x0, y0 + chamfer),
            ]
        )
        shape = ("poly", points)
        if not fits(self.copper, [shape], self.clearance):
            return
        self.commit([shape])
        # Vias stitched into the pour, some with an isolating clearance ring.
        for _ in range(int(rng.integers(0, 4))):
            cx, cy = rng.uniform(x0 + chamfer, x1 - chamfer), rng.uniform(y0 + chamfer, y1 - chamfer)
            if not (10 < cx < width - 10 and 10 < cy < height - 10):
                continue
            ring = int(round(rng.uniform(7, 13) * self.zoom))
            if rng.random() < 0.5:
                cv2.circle(self.copper, (int(cx), int(cy)), ring + self.clearance, 0, -1)
                cv2.circle(self.copper, (int(cx), int(cy)), ring, 255, -1)
            self.drill(cx, cy, max(2, int(ring * rng.uniform(0.35, 0.55))), ring)

    # -- pads and vias ----------------------------------------------------------------------
    def component(self) -> None:
        rng = self.rng
        zoom = self.zoom
        kind = rng.choice(
            ["round_row", "smd_pair", "via", "square", "oblong"], p=[0.25, 0.25, 0.25, 0.1, 0.15]
        )
        count = int(rng.integers(1, 5)) if kind == "round_row" else 1
        horizontal = rng.random() < 0.5
        for _attempt in range(6):
            cx, cy = self.random_point(margin=20)
            shapes: list[tuple] = []
            drills: list[tuple[float, float, int, int]] = []
            if kind in ("round_row", "square"):
                radius = int(round(rng.uniform(11, 22) * zoom))
                pitch = 2 * radius + self.clearance + int(rng.integers(2, 10))
                for index in range(count):
                    px = cx + (index * pitch if horizontal else 0)
                    py = cy + (0 if horizontal else index * pitch)
                    if kind == "square" or (index == 0 and count > 1 and rng.random() < 0.5):
                        shapes.append(("rect", px, py, radius, radius))
                    else:
                        shapes.append(("circle", px, py, radius))
                    drills.append((px, py, max(3, int(radius * rng.uniform(0.3, 0.5))), radius))
            elif kind == "via":
                radius = int(round(rng.uniform(6, 11) * zoom))
                shapes.append(("circle", cx, cy, radius))
                drills.append((cx, cy, max(2, int(radius * rng.uniform(0.35, 0.55))), radius))
            elif kind == "smd_pair":
                half_w = rng.uniform(6, 16) * zoom
                half_h = rng.uniform(10, 22) * zoom
                gap = rng.uniform(10, 28) * zoom + self.clearance
                if horizontal:
                    shapes += [
                        ("rect", cx, cy, half_w, half_h),
                        ("rect", cx + 2 * half_w + gap, cy, half_w, half_h),
                    ]
                else:
                    shapes += [
                        ("rect", cx, cy, half_h, half_w),
                        ("rect", cx, cy + 2 * half_w + gap, half_h, half_w),
                    ]
            else:  # oblong pad with a hole at one end
                radius = int(round(rng.uniform(12, 24) * zoom))
                length = rng.uniform(1.0, 2.5) * radius
                end = (cx + length, cy) if horizontal else (cx, cy + length)
                shapes.append(("line", np.array([(cx, cy), end]), 2 * radius))
                drills.append((cx, cy, max(3, int(radius * rng.uniform(0.3, 0.5))), radius))
            if not fits(self.copper, shapes, self.clearance):
                continue
            self.commit(shapes, pad=kind != "via")
            for px, py, hole, pad_radius in drills:
                self.drill(px, py, hole, pad_radius)
            for shape in shapes:
                x0, y0, x1, y1 = _bounds(shape)
                self.terminals.append(((x0 + x1) / 2, (y0 + y1) / 2, min(x1 - x0, y1 - y0) / 2))
            return

    # -- traces -----------------------------------------------------------------------------
    def _walk(
        self, start: np.ndarray, direction: int, max_segments: int, allow_right_angle: bool
    ) -> np.ndarray:
        rng = self.rng
        zoom = self.zoom
        points = [start.astype(np.float64)]
        for _ in range(max_segments):
            length = rng.uniform(30, 220) * zoom
            points.append(points[-1] + DIRECTIONS[direction] * length)
            x, y = points[-1]
            if not (-20 < x < self.width + 20 and -20 < y < self.height + 20):
                break
            turn = rng.choice([-1, 1]) * (2 if allow_right_angle and rng.random() < 0.3 else 1)
            direction = int((direction + turn) % 8)
            if rng.random() < 0.7 and turn in (-1, 1):
                # a short 45 degree chamfer, then back to an axis direction (classic routing look)
                points.append(points[-1] + DIRECTIONS[direction] * rng.uniform(12, 60) * zoom)
                direction = int((direction + turn) % 8)
        return np.array(points)

    def _edge_start(self) -> tuple[np.ndarray, int]:
        side = int(self.rng.integers(4))
        x, y = self.random_point(margin=10)
        if side == 0:
            return np.array([-15.0, y]), 0
        if side == 1:
            return np.array([self.width + 15.0, y]), 4
        if side == 2:
            return np.array([x, -15.0]), 2
        return np.array([x, self.height + 15.0]), 6

    def bus(self) -> None:
        """Several parallel traces following one path (data buses, connector fan-outs)."""
        rng = self.rng
        count = int(rng.integers(1, 6))
        trace_width = int(rng.choice(self.trace_widths[:2] if count > 1 else self.trace_widths))
        pitch = trace_width + self.clearance + int(rng.integers(0, 6))
        for _attempt in range(5):
            start, direction = self._edge_start()
            centre = self._walk(start, direction, int(rng.integers(1, 5)), allow_right_angle=count == 1)
            if len(centre) < 2:
                continue
            lines = [offset_polyline(centre, (index - (count - 1) / 2) * pitch) for index in range(count)]
            shapes = [("line", line, trace_width) for line in lines]
            if fits(self.copper, shapes, self.clearance):
                self.commit(shapes)
                self.traces += [Trace(line, trace_width) for line in lines]
                return

    def connect(self) -> None:
        """Route an octilinear trace between two pads, or from a pad to the image edge."""
        rng = self.rng
        if len(self.terminals) < 1:
            return
        order = rng.permutation(len(self.terminals))
        ax, ay, a_half = self.terminals[order[0]]
        candidates = [self.terminals[index] for index in order[1:4]]
        trace_width = int(min(rng.choice(self.trace_widths), max(3, 1.6 * a_half)))
        a = np.array([ax, ay])
        for bx, by, b_half in candidates:
            b = np.array([bx, by])
            width = int(min(trace_width, max(3, 1.6 * b_half)))
            ignore = [
                ("circle", ax, ay, a_half + width + self.clearance),
                ("circle", bx, by, b_half + width + self.clearance),
            ]
            for route in _octilinear_routes(a, b, rng):
                shape = ("line", route, width)
                if fits(self.copper, [shape], self.clearance, ignore=ignore):
                    self.commit([shape])
                    self.traces.append(Trace(route, width))
                    return
        # fall back: leave the pad in an axis direction towards the edge
        for _attempt in range(3):
            direction = int(rng.integers(4)) * 2
            route = self._walk(a, direction, int(rng.integers(1, 3)), allow_right_angle=False)
            shape = ("line", route, trace_width)
            if len(route) >= 2 and fits(
                self.copper,
                [shape],
                self.clearance,
                ignore=[("circle", ax, ay, a_half + trace_width + self.clearance)],
            ):
                self.commit([shape])
                self.traces.append(Trace(route, trace_width))
                return


def _octilinear_routes(a: np.ndarray, b: np.ndarray, rng: np.random.Generator) -> list[np.ndarray]:
    """Candidate routes from a to b: straight+45 degree and Manhattan L shapes."""
    delta = b - a
    major = 0 if abs(delta[0]) >= abs(delta[1]) else 1
    diagonal = min(abs(delta[0]), abs(delta[1]))
    straight = np.zeros(2)
    straight[major] = np.sign(delta[major]) * (abs(delta[major]) - diagonal)
    split = rng.uniform(0.2, 0.8)
    routes = [
        np.array([a, a + straight, b]),
        np.array([a, b - straight, b]),
        np.array([a, a + straight * split, b - straight * (1 - split), b]),
        np.array([a, (b[0], a[1]), b]),
        np.array([a, (a[0], b[1]), b]),
    ]
    order = rng.permutation(len(routes))
    return [_dedupe(routes[index]) for index in order]


def _dedupe(points: np.ndarray) -> np.ndarray:
    keep = [points[0]]
    for point in points[1:]:
        if np.linalg.norm(point - keep[-1]) > 1e-6:
            keep.append(point)
    if len(keep) == 1:
        keep.append(keep[0])
    return np.array(keep, dtype=np.float64)


def generate_layout(rng: np.random.Generator, height: int, width: int) -> BoardLayout:
    """Draw a random defect-free board of `height` x `width` pixels."""
    builder = _Builder(rng, height, width)
    area_scale = height * width / (640 * 640) / builder.zoom**2
    for _ in range(int(rng.choice([0, 1, 1, 2, 2, 3]))):
        builder.pour()
    for _ in range(int(round(rng.integers(8, 20) * area_scale))):
        builder.component()
    for _ in range(int(round(rng.integers(3, 9) * area_scale))):
        builder.bus()
    for _ in range(int(round(rng.integers(8, 20) * area_scale))):
        builder.connect()
    for _ in range(int(round(rng.integers(2, 8) * area_scale))):
        builder.bus()
    # Holes go through the copper: drilled pixels are never copper.
    builder.copper[builder.holes > 0] = 0
    builder.pads[builder.holes > 0] = 0
    return BoardLayout(
        height,
        width,
        builder.zoom,
        builder.clearance,
        builder.copper,
        builder.pads,
        builder.holes,
        builder.traces,
        builder.drills,
    )

"""Procedural textured surfaces with defects across the size range (`defectdet synth --kind surface`).

Materials: brushed steel, rolled steel (mill scale), ceramic tile (glaze, optional grout grid),
fabric-like weave, cast metal (grain and fine porosity); gray or colour; any size and aspect.
Defects, from a few pixels to most of the image: pin-holes, scratches, large patches (corrosion /
discolouration), elongated branching cracks, low-contrast stains and texture changes. No template.

Every defect is drawn through its own alpha mask, and its box is the bounding box of that mask
(alpha >= `BOX_ALPHA`), so boxes are exact by construction. Everything is vectorised NumPy/OpenCV
on float32 (H, W, C) images, C = 1 (gray) or 3 (RGB).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import cv2
import numpy as np

SURFACE_CLASS_NAMES = ("pin-hole", "scratch", "patch", "crack", "stain", "texture")
MATERIALS = ("brushed", "rolled", "tile", "weave", "cast")
BOX_ALPHA = 0.1  # a pixel belongs to a defect's box where its alpha reaches this
MAX_DEFECTS = 4
CLEAN_PROBABILITY = 0.06  # share of images without any defect


@dataclass
class SynthSurface:
    """One rendered surface; boxes are xyxy pixels of `image`, classes index SURFACE_CLASS_NAMES."""

    image: np.ndarray  # (H, W) uint8 gray or (H, W, 3) uint8 RGB
    boxes: np.ndarray  # (N, 4) float32
    classes: np.ndarray  # (N,) int64
    material: str
    clean: np.ndarray | None = (
        None  # with `clean=True`: the surface without its defects, same light and noise
    )


def _field(rng: np.random.Generator, height: int, width: int, cells_y: int, cells_x: int) -> np.ndarray:
    """Smooth random field of unit-ish amplitude, (H, W) float32 (bicubic from a coarse grid)."""
    grid = rng.standard_normal((max(2, cells_y), max(2, cells_x)), dtype=np.float32)
    return cv2.resize(grid, (width, height), interpolation=cv2.INTER_CUBIC)


def _fine(rng: np.random.Generator, height: int, width: int, sigma: float = 0.0) -> np.ndarray:
    noise = rng.standard_normal((height, width), dtype=np.float32)
    return cv2.GaussianBlur(noise, (0, 0), sigma) * np.float32(1 + sigma) if sigma > 0 else noise


def _texture(material: str, rng: np.random.Generator, height: int, width: int, variant: float) -> np.ndarray:
    """Zero-mean texture of `material`, (H, W) float32 in gray levels; `variant` in [0, 1) picks
    the material's parameters (a different variant is what a texture-change defect looks like)."""
    if material == "brushed":
        horizontal = variant < 0.5
        rows, cols = (height, width) if horizontal else (width, height)
        length = 24 + 200 * (variant % 0.5)  # streak length in pixels
        streaks = _field(rng, rows, cols, rows, max(2, int(cols / length)))
        texture = streaks * 7.0 + _fine(rng, rows, cols) * 2.5
        texture = texture if horizontal else texture.T
        return np.ascontiguousarray(texture) + _field(rng, height, width, 3, 3) * 5.0
    if material == "rolled":
        scale = 6 + 30 * variant
        blotches = _field(rng, height, width, int(height / scale), int(width / scale))
        bands = _field(rng, height, width, max(2, height // 6), 2)
        flecks = (_field(rng, height, width, height // 4, width // 4) > 1.6).astype(np.float32)
        return blotches * 9.0 + bands * 4.0 - flecks * 18.0 + _fine(rng, height, width) * 2.0
    if material == "tile":
        texture = _fine(rng, height, width, 0.8) * (1.5 + 3 * variant)
        speckle = (rng.random((height, width), dtype=np.float32) > 0.997).astype(np.float32)
        texture += cv2.GaussianBlur(speckle, (0, 0), 0.8) * 60.0 * (1 if variant < 0.5 else -1)
        return texture + _field(rng, height, width, 4, 4) * 3.0
    if material == "weave":
        period = 4.0 + 10.0 * variant
        ys, xs = np.mgrid[0:height, 0:width].astype(np.float32)
        warp = _field(rng, height, width, max(2, height // 64), max(2, width // 64)) * 1.5
        phase_x, phase_y = 2 * np.pi * (xs + warp) / period, 2 * np.pi * (ys - warp) / period
        over = ((np.floor((xs + warp) / period) + np.floor((ys - warp) / period)) % 2).astype(np.float32)
        thread = over * np.cos(phase_y) + (1 - over) * np.cos(phase_x)
        return thread * 14.0 + _fine(rng, height, width) * 3.0 + _field(rng, height, width, 3, 3) * 4.0
    if material == "cast":
        grain = _fine(rng, height, width, 1.0 + 2.5 * variant) * 7.0
        pits = (rng.random((height, width), dtype=np.float32) > 0.9985).astype(np.float32)
        pits = cv2.GaussianBlur(pits, (0, 0), 0.7) * -45.0
        return grain + pits + _field(rng, height, width, 6, 6) * 6.0
    raise ValueError(f"unknown material {material!r}")


_TINTS: dict[str, Callable[[np.random.Generator], np.ndarray]] = {
    "brushed": lambda rng: np.array([0.95, 0.98, 1.04]) + rng.uniform(-0.03, 0.03, 3),
    "rolled": lambda rng: np.array([0.92, 0.95, 1.02]) + rng.uniform(-0.05, 0.05, 3),
    "tile": lambda rng: rng.uniform(0.6, 1.25, 3),
    "weave": lambda rng: rng.uniform(0.45, 1.35, 3),
    "cast": lambda rng: np.array([1.06, 1.0, 0.9]) + rng.uniform(-0.05, 0.05, 3),
}
_BASE_LEVEL = {
    "brushed": (120, 190),
    "rolled": (70, 140),
    "tile": (90, 210),
    "weave": (70, 180),
    "cast": (80, 150),
}


def _mask_box(alpha: np.ndarray, x0: int, y0: int) -> tuple[float, float, float, float] | None:
    """xyxy box (pixel edges, image coordinates) of alpha >= BOX_ALPHA in a window at (x0, y0)."""
    ys, xs = np.nonzero(alpha >= BOX_ALPHA)
    if len(xs) == 0:
        return None
    return float(x0 + xs.min()), float(y0 + ys.min()), float(x0 + xs.max() + 1), float(y0 + ys.max() + 1)


def _window(
    cx: float, cy: float, half_w: float, half_h: float, width: int, height: int
) -> tuple[int, int, int, int]:
    x0, y0 = max(0, int(cx - half_w)), max(0, int(cy - half_h))
    x1, y1 = min(width, int(np.ceil(cx + half_w)) + 1), min(height, int(np.ceil(cy + half_h)) + 1)
    return x0, y0, x1, y1


def _blob_polygon(
    rng: np.random.Generator, cx: float, cy: float, rx: float, ry: float, roughness: float
) -> np.ndarray:
    """Closed irregular outline around (cx, cy): an ellipse with smoothly varying radius, (P, 2) int32."""
    count = 48
    angles = np.linspace(0, 2 * np.pi, count, endpoint=False)
    harmonics = sum(
        rng.normal(0, roughness / k) * np.cos(k * angles + rng.uniform(0, 2 * np.pi)) for k in range(2, 6)
    )
    radius = np.clip(1.0 + harmonics, 0.5, 1.4)
    rotation = rng.uniform(0, np.pi)
    ex, ey = rx * radius * np.cos(angles), ry * radius * np.sin(angles)
    xs = cx + ex * np.cos(rotation) - ey * np.sin(rotation)
    ys = cy + ex * np.sin(rotation) + ey * np.cos(rotation)
    return np.round(np.stack([xs, ys], 1) * 4).astype(np.int32)  # 2 fractional bits for cv2 shift=2


def _delta(rng: np.random.Generator, channels: int, magnitude: float, tint: np.ndarray | None) -> np.ndarray:
    """Per-channel intensity change of a defect: `magnitude` gray levels, tinted in colour images."""
    if channels == 1:
        return np.array([magnitude], np.float32)
    hue = tint if tint is not None else np.ones(3)
    return (magnitude * hue).astype(np.float32)


class _Canvas:
    """The image being drawn, float32 (H, W, C), plus what a texture change needs."""

    def __init__(
        self, image: np.ndarray, material: str, variant: float, base: float, tint: np.ndarray | None
    ):
        self.image = image
        self.material = material
        self.variant = variant
        self.base = base
        self.tint = tint

    @property
    def height(self) -> int:
        return self.image.shape[0]

    @property
    def width(self) -> int:
        return self.image.shape[1]

    def blend(self, alpha: np.ndarray, x0: int, y0: int, delta: np.ndarray | float) -> None:
        """image[window] += alpha * delta, where delta is per channel or a (h, w, C) array."""
        h, w = alpha.shape
        self.image[y0 : y0 + h, x0 : x0 + w] += alpha[..., None] * delta


Defect = tuple[tuple[float, float, float, float], int]


def _pin_hole(canvas: _Canvas, rng: np.random.Generator, short: int) -> Defect | None:
    radius = float(np.clip(short * rng.uniform(0.004, 0.016), 1.5, 18.0))
    cx, cy = (
        rng.uniform(radius + 1, canvas.width - radius - 1),
        rng.uniform(radius + 1, canvas.height - radius - 1),
    )
    x0, y0, x1, y1 = _window(cx, cy, radius + 2, radius + 2, canvas.width, canvas.height)
    ys, xs = np.mgrid[y0:y1, x0:x1].astype(np.float32)
    distance = np.sqrt((xs + 0.5 - cx) ** 2 + (ys + 0.5 - cy) ** 2)
    alpha = np.clip(radius + 0.5 - distance, 0, 1)
    depth = -rng.uniform(55, 130) if rng.random() < 0.8 else rng.uniform(50, 100)
    canvas.blend(alpha, x0, y0, _delta(rng, canvas.image.shape[2], depth, None))
    box = _mask_box(alpha, x0, y0)
    return None if box is None else (box, 0)


def _stroke_alpha(
    points: np.ndarray, thickness: int, x0: int, y0: int, shape: tuple[int, int], extra: list[np.ndarray] = ()
) -> np.ndarray:
    mask = np.zeros(shape, np.uint8)
    for line in [points, *extra]:
        shifted = np.round((line - [x0, y0]) * 4).astype(np.int32)
        cv2.polylines(mask, [shifted], False, 255, thickness, cv2.LINE_AA, shift=2)
    return mask.astype(np.float32) / 255.0


def _clip_points(points: np.ndarray, width: int, height: int) -> np.ndarray:
    inside = (
        (points[:, 0] >= 1) & (points[:, 0] < width - 1) & (points[:, 1] >= 1) & (points[:, 1] < height - 1)
    )
    if inside.all():
        return points
    first_out = int(np.argmin(inside)) if inside[0] else 0
    return points[:first_out] if inside[0] else points[:0]


def _scratch(canvas: _Canvas, rng: np.random.Generator, short: int) -> Defect | None:
    length = short * rng.uniform(0.12, 0.7)
    angle = rng.uniform(0, np.pi)
    cx, cy = rng.uniform(0.1, 0.9) * canvas.width, rng.uniform(0.1, 0.9) * canvas.height
    t = np.linspace(-0.5, 0.5, 24)[:, None]
    direction = np.array([np.cos(angle), np.sin(angle)])
    normal = np.array([-direction[1], direction[0]])
    bend = rng.normal(0, 0.06) * length
    points = np.array([cx, cy]) + t * length * direction + (0.25 - t * t) * 4 * bend * normal
    points = _clip_points(points, canvas.width, canvas.height)
    if len(points) < 4:
        return None
    thickness = max(1, int(round(short * rng.uniform(0.001, 0.004))))
    x0, y0 = int(max(0, points[:, 0].min() - thickness - 2)), int(max(0, points[:, 1].min() - thickness - 2))
    x1 = int(min(canvas.width, points[:, 0].max() + thickness + 3))
    y1 = int(min(canvas.height, points[:, 1].max() + thickness + 3))
    alpha = _stroke_alpha(points, thickness, x0, y0, (y1 - y0, x1 - x0))
    sign = 1 if rng.random() < 0.6 else -1
    canvas.blend(alpha, x0, y0, _delta(rng, canvas.image.shape[2], sign * rng.uniform(35, 100), None))
    box = _mask_box(alpha, x0, y0)
    return None if box is None else (box, 1)


def _crack(canvas: _Canvas, rng: np.random.Generator, short: int) -> Defect | None:
    length = short * rng.uniform(0.2, 0.8)
    steps = 40
    heading = rng.uniform(0, 2 * np.pi)
    turns = np.cumsum(rng.normal(0, 0.22, steps))
    step = length / steps
    offsets = np.stack([np.cos(heading + turns), np.sin(heading + turns)], 1) * step
    start = np.array([rng.uniform(0.15, 0.85) * canvas.width, rng.uniform(0.15, 0.85) * canvas.height])
    points = _clip_points(start + np.cumsum(offsets, 0), canvas.width, canvas.height)
    if len(points) < 8:
        return None
    branches = []
    if rng.random() < 0.5:
        origin = points[int(rng.integers(len(points) // 4, 3 * len(points) // 4))]
        branch_heading = heading + turns[len(points) // 2] + rng.choice([-1, 1]) * rng.uniform(0.5, 1.1)
        branch_turns = np.cumsum(rng.normal(0, 0.25, steps // 3))
        branch = origin + np.cumsum(
            np.stack([np.cos(branch_heading + branch_turns), np.sin(branch_heading + branch_turns)], 1)
            * step,
            0,
        )
        branch = _clip_points(branch, canvas.width, canvas.height)
        if len(branch) >= 2:
            branches.append(branch)
    every = np.concatenate([points, *branches])
    thickness = max(1, int(round(short * rng.uniform(0.0015, 0.004))))
    x0, y0 = int(max(0, every[:, 0].min() - thickness - 2)), int(max(0, every[:, 1].min() - thickness - 2))
    x1 = int(min(canvas.width, every[:, 0].max() + thickness + 3))
    y1 = int(min(canvas.height, every[:, 1].max() + thickness + 3))
    alpha = _stroke_alpha(points, thickness, x0, y0, (y1 - y0, x1 - x0), branches)
    canvas.blend(alpha, x0, y0, _delta(rng, canvas.image.shape[2], -rng.uniform(55, 110), None))
    box = _mask_box(alpha, x0, y0)
    return None if box is None else (box, 3)


def _region_alpha(
    canvas: _Canvas, rng: np.random.Generator, rx: float, ry: float, softness: float, roughness: float
) -> tuple[np.ndarray, int, int]:
    """Soft irregular region inside the image: (alpha window, x0, y0)."""
    cx = rng.uniform(min(rx, canvas.width / 2), max(canvas.width - rx, canvas.width / 2))
    cy = rng.uniform(min(ry, canvas.height / 2), max(canvas.height - ry, canvas.height / 2))
    reach = 1.5 * max(rx, ry) + 3 * softness + 2
    x0, y0, x1, y1 = _window(cx, cy, reach, reach, canvas.width, canvas.height)
    mask = np.zeros((y1 - y0, x1 - x0), np.uint8)
    cv2.fillPoly(mask, [_blob_polygon(rng, cx - x0, cy - y0, rx, ry, roughness)], 255, cv2.LINE_AA, shift=2)
    alpha = mask.astype(np.float32) / 255.0
    if softness > 0.5:
        alpha = cv2.GaussianBlur(alpha, (0, 0), softness)
    return alpha, x0, y0


def _patch(canvas: _Canvas, rng: np.random.Generator, short: int) -> Defect | None:
    rx, ry = canvas.width * rng.uniform(0.17, 0.45), canvas.height * rng.uniform(0.17, 0.45)
    alpha, x0, y0 = _region_alpha(canvas, rng, rx, ry, short * rng.uniform(0.004, 0.015), 0.25)
    h, w = alpha.shape
    inner = 0.55 + 0.45 * np.clip(_field(rng, h, w, max(2, h // 24), max(2, w // 24)) * 0.5 + 0.5, 0, 1)
    sign = -1 if rng.random() < 0.7 else 1
    rust = np.array([1.3, 0.95, 0.55]) if rng.random() < 0.6 else None
    delta = _delta(rng, canvas.image.shape[2], sign * rng.uniform(30, 65), rust)
    canvas.blend(alpha * inner, x0, y0, delta)
    box = _mask_box(alpha, x0, y0)
    return None if box is None else (box, 2)


def _stain(canvas: _Canvas, rng: np.random.Generator, short: int) -> Defect | None:
    radius = short * rng.uniform(0.07, 0.28)
    rx, ry = radius * rng.uniform(0.7, 1.3), radius * rng.uniform(0.7, 1.3)
    alpha, x0, y0 = _region_alpha(canvas, rng, rx, ry, radius * rng.uniform(0.04, 0.12), 0.2)
    water = np.array([1.1, 1.0, 0.7])
    sign = -1 if rng.random() < 0.75 else 1
    canvas.blend(alpha, x0, y0, _delta(rng, canvas.image.shape[2], sign * rng.uniform(16, 32), water))
    box = _mask_box(alpha, x0, y0)
    return None if box is None else (box, 4)


def _texture_change(canvas: _Canvas, rng: np.random.Generator, short: int) -> Defect | None:
    radius = short * rng.uniform(0.1, 0.3)
    rx, ry = radius * rng.uniform(0.7, 1.4), radius * rng.uniform(0.7, 1.4)
    alpha, x0, y0 = _region_alpha(canvas, rng, rx, ry, max(1.0, radius * 0.03), 0.3)
    h, w = alpha.shape
    variant = (canvas.variant + rng.uniform(0.3, 0.7)) % 1.0
    current = canvas.image[y0 : y0 + h, x0 : x0 + w]
    smooth = cv2.GaussianBlur(current, (0, 0), max(2.0, radius * 0.15))
    smooth = smooth if smooth.ndim == 3 else smooth[..., None]
    other = _texture(canvas.material, rng, h, w, variant) * np.float32(rng.uniform(1.6, 2.4))
    tint = canvas.tint if canvas.tint is not None else np.ones(1)
    replacement = smooth + other[..., None] * tint.astype(np.float32)
    canvas.blend(alpha, x0, y0, replacement - current)
    box = _mask_box(alpha, x0, y0)
    return None if box is None else (box, 5)


DEFECT_MAKERS = (_pin_hole, _scratch, _patch, _crack, _stain, _texture_change)
# large defects go first so the small ones are drawn on top of them
_DRAW_ORDER = (2, 5, 4, 3, 1, 0)


def _iou(box: tuple[float, ...], others: list[tuple[float, ...]]) -> float:
    best = 0.0
    for other in others:
        w = min(box[2], other[2]) - max(box[0], other[0])
        h = min(box[3], other[3]) - max(box[1], other[1])
        if w > 0 and h > 0:
            inter = w * h
            union = (
                (box[2] - box[0]) * (box[3] - box[1]) + (other[2] - other[0]) * (other[3] - other[1]) - inter
            )
            best = max(best, inter / union)
    return best


def surface_size(rng: np.random.Generator, min_size: int, max_size: int) -> tuple[int, int]:
    """(width, height): long side log-uniform in [min_size, max_size], aspect 1..2.2, either way round."""
    long_side = float(np.exp(rng.uniform(np.log(min_size), np.log(max_size))))
    short_side = max(min_size, long_side / rng.uniform(1.0, 2.2))
    long_side, short_side = int(round(long_side)), int(round(min(short_side, long_side)))
    return (long_side, short_side) if rng.random() < 0.5 else (short_side, long_side)


def generate_surface(
    seed: int,
    index: int,
    min_size: int = 128,
    max_size: int = 2048,
    color: bool = False,
    materials: tuple[str, ...] = MATERIALS,
    clean: bool = False,
) -> SynthSurface:
    """Surface number `index` of the set seeded by `seed` (independent of the other images).

    `materials` restricts the textures drawn (pretraining leaves one out, so that a benchmark can
    measure transfer to a material the weights never saw); all of them give the default set. `clean` also
    renders the surface without its defects through the same camera draws (`SynthSurface.clean`)."""
    unknown = set(materials) - set(MATERIALS)
    if not materials or unknown:
        raise ValueError(
            f"materials: choose from {', '.join(MATERIALS)}; got {', '.join(materials) or 'none'}"
        )
    size_rng, texture_rng, defect_rng, camera_rng = (
        np.random.default_rng(child) for child in np.random.SeedSequence([seed, index, 0x5F]).spawn(4)
    )
    width, height = surface_size(size_rng, min_size, max_size)
    canvas = _bare_surface(texture_rng, materials, (width, height), color)
    before_defects = canvas.image.copy() if clean else None
    boxes, classes = _add_defects(canvas, defect_rng, min(width, height))
    clean_image = None if before_defects is None else _camera(before_defects, copy.deepcopy(camera_rng))
    return SynthSurface(
        image=_camera(canvas.image, camera_rng),
        boxes=np.array(boxes, np.float32).reshape(-1, 4),
        classes=np.array(classes, np.int64),
        material=canvas.material,
        clean=clean_image,
    )


def _bare_surface(
    texture_rng: np.random.Generator, materials: tuple[str, ...], size: tuple[int, int], color: bool
) -> _Canvas:
    """One of `materials`, its texture (tile: sometimes a grout grid) and, in colour, its tint: no defect yet."""
    width, height = size
    material = materials[int(texture_rng.integers(len(materials)))]
    variant = float(texture_rng.uniform(0, 1))
    base = float(texture_rng.uniform(*_BASE_LEVEL[material]))
    luminance = base + _texture(material, texture_rng, height, width, variant)
    if material == "tile" and texture_rng.random() < 0.5:
        luminance -= _grout(texture_rng, width, height)
    tint = np.asarray(_TINTS[material](texture_rng), np.float32) if color else None
    image = (luminance[..., None] * tint) if tint is not None else luminance[..., None]
    return _Canvas(np.ascontiguousarray(image, dtype=np.float32), material, variant, base, tint)


def _grout(texture_rng: np.random.Generator, width: int, height: int) -> np.ndarray:
    """The darkening of a tile's grout grid, (H, W) float32."""
    pitch = int(texture_rng.uniform(0.25, 0.6) * min(width, height))
    grout = np.zeros((height, width), np.float32)
    grout[:, (np.arange(width) % pitch) < 3] = 1
    grout[(np.arange(height) % pitch) < 3, :] = 1
    return cv2.GaussianBlur(grout, (0, 0), 0.8) * float(texture_rng.uniform(30, 60))


def _add_defects(
    canvas: _Canvas, defect_rng: np.random.Generator, short: int
) -> tuple[list[tuple[float, float, float, float]], list[int]]:
    """Draw up to `MAX_DEFECTS` defects onto `canvas` (none with `CLEAN_PROBABILITY`), each tried a few times
    so that defects do not stack on each other; their boxes and classes."""
    boxes: list[tuple[float, float, float, float]] = []
    classes: list[int] = []
    count = 0 if defect_rng.random() < CLEAN_PROBABILITY else int(defect_rng.integers(1, MAX_DEFECTS + 1))
    wanted = sorted(defect_rng.integers(0, len(DEFECT_MAKERS), count).tolist(), key=_DRAW_ORDER.index)
    for class_id in wanted:
        for _ in range(4):
            trial = np.random.default_rng(defect_rng.integers(2**63))
            saved = canvas.image.copy() if boxes else None
            made = DEFECT_MAKERS[class_id](canvas, trial, short)
            if made is None:
                continue
            box, made_class = made
            if _iou(box, boxes) > 0.3:
                canvas.image = saved if saved is not None else canvas.image
                continue
            boxes.append(box)
            classes.append(made_class)
            break
    return boxes, classes


def _camera(image: np.ndarray, camera_rng: np.random.Generator) -> np.ndarray:
    """The camera: illumination gradient, slight blur, sensor noise; (H, W, C) float32 -> uint8 (H, W[, 3])."""
    height, width = image.shape[:2]
    gradient = _field(camera_rng, height, width, 2, 2) * np.float32(camera_rng.uniform(0, 0.08)) + np.float32(
        1
    )
    image = image * gradient[..., None]
    if camera_rng.random() < 0.5:
        image = cv2.GaussianBlur(image, (0, 0), camera_rng.uniform(0.4, 0.9)).reshape(image.shape)
    image += camera_rng.standard_normal(image.shape, dtype=np.float32) * np.float32(camera_rng.uniform(1, 4))
    image = np.clip(image, 0, 255).astype(np.uint8)
    return image[..., 0] if image.shape[2] == 1 else image

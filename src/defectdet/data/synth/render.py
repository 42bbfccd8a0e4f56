"""Imaging: turn a board state (substrate / copper / hole) into a camera-like picture.

The tested image and the template are rendered separately with independent lighting,
exposure, glare, blur and noise, and the template slightly misregistered, as an optical
inspection camera would see the golden board and the board under test. Some boards are
binarized afterwards like DeepPCB (dark copper on a white background).
"""

from __future__ import annotations

from dataclasses import dataclass

import cv2
import numpy as np


@dataclass
class BoardStyle:
    """Per-board look shared by the tested image and its template."""

    binarized: bool
    color: bool
    levels: np.ndarray  # (4, C) float32: substrate, copper, hole, exposed pad
    texture: np.ndarray  # (H, W) float32 fixed-pattern texture of this board (weave, grain)


def _smooth_field(rng: np.random.Generator, height: int, width: int, cells: int) -> np.ndarray:
    """Low-frequency random field in about [-1, 1], (H, W) float32."""
    grid = rng.standard_normal((cells, cells)).astype(np.float32)
    return cv2.resize(grid, (width, height), interpolation=cv2.INTER_LINEAR)


def _noise(rng: np.random.Generator, shape: tuple[int, ...], sigma: float) -> np.ndarray:
    """Zero-mean sensor noise of standard deviation `sigma`, float32.

    The sum of two uniform bytes (a triangular distribution) is close enough to Gaussian
    here and about ten times faster to draw than `standard_normal`.
    """
    count = int(np.prod(shape))
    pairs = np.frombuffer(rng.bytes(2 * count), np.uint8).reshape(2, count).astype(np.float32)
    scale = np.float32(sigma / 104.5)  # std of the sum of two uniform bytes
    return ((pairs[0] + pairs[1] - np.float32(255.0)) * scale).reshape(shape)


def _per_channel(field: np.ndarray, image: np.ndarray) -> np.ndarray:
    """Broadcast an (H, W) field over an (H, W) or (H, W, C) image."""
    return field if image.ndim == 2 else field[..., None]


def make_style(
    rng: np.random.Generator, height: int, width: int, color: bool, binarize_probability: float = 0.5
) -> BoardStyle:
    """Pick the board's material colours and surface texture."""
    if color:
        substrate = np.array([25, 85, 45]) + rng.uniform(-12, 12, 3)
        copper = np.array([70, 160, 80]) + rng.uniform(-20, 20, 3)
        hole = np.array([12, 12, 12]) + rng.uniform(-8, 8, 3)
        pad = np.array([215, 175, 95]) + rng.uniform(-25, 25, 3)
        levels = np.stack([substrate, copper, hole, pad]).astype(np.float32)
        binarized = False
    else:
        substrate = rng.uniform(25, 85)
        copper = rng.uniform(160, 235)
        hole = rng.uniform(0, 25)
        pad = copper + rng.uniform(-10, 15)
        levels = np.array([[substrate], [copper], [hole], [pad]], dtype=np.float32)
        binarized = bool(rng.random() < binarize_probability)
    texture = _smooth_field(rng, height, width, int(rng.integers(8, 30))) * rng.uniform(2, 7) + _noise(
        rng, (height, width), rng.uniform(0.5, 3)
    )
    return BoardStyle(binarized, color, levels, texture.astype(np.float32))


def render_image(
    label: np.ndarray,
    pads: np.ndarray,
    style: BoardStyle,
    rng: np.random.Generator,
    shift: tuple[float, float] = (0.0, 0.0),
    rotation_degrees: float = 0.0,
) -> np.ndarray:
    """Render one picture of a board state.

    label: (H, W) uint8, 0 substrate, 1 copper, 2 hole. pads: (H, W) uint8 exposed-pad mask.
    Returns uint8 (H, W) gray or (H, W, 3) RGB.
    """
    image = _material_image(label, pads, style)
    if shift != (0.0, 0.0) or rotation_degrees:
        image = _moved(image, shift, rotation_degrees)
    image = cv2.GaussianBlur(image, (0, 0), rng.uniform(0.5, 1.2))
    # a binarized board is imaged under controlled light (glare would break the threshold)
    image = _exposed(image, rng, glare_allowed=not style.binarized)
    if style.binarized:
        return _binarized(image, rng)
    return np.clip(image, 0, 255).astype(np.uint8)


def _material_image(label: np.ndarray, pads: np.ndarray, style: BoardStyle) -> np.ndarray:
    """Each material at the board's level, plus its texture: float32 (H, W) or (H, W, 3)."""
    material = label.copy()
    material[(pads > 0) & (label == 1)] = 3
    channels = style.levels.shape[1]
    table = np.zeros((256, 1, channels), np.uint8)
    table[:4, 0, :] = np.clip(np.round(style.levels), 0, 255).astype(np.uint8)
    if channels == 1:
        return cv2.LUT(material, table[:, :, 0]).astype(np.float32) + style.texture  # (H, W)
    image = cv2.LUT(cv2.merge([material] * 3), table).astype(np.float32)  # (H, W, 3)
    image += style.texture[..., None]
    return image


def _moved(image: np.ndarray, shift: tuple[float, float], rotation_degrees: float) -> np.ndarray:
    """The board shifted by `shift` pixels and rotated about the image centre (edges reflected)."""
    height, width = image.shape[:2]
    matrix = cv2.getRotationMatrix2D((width / 2, height / 2), rotation_degrees, 1.0)
    matrix[:, 2] += shift
    return cv2.warpAffine(
        image, matrix, (width, height), flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_REFLECT
    )


def _exposed(image: np.ndarray, rng: np.random.Generator, glare_allowed: bool) -> np.ndarray:
    """Lighting, exposure offset, gamma, (sometimes) specular glare and sensor noise, float32."""
    height, width = image.shape[:2]
    lighting, glare = _lighting(rng, height, width, glare_allowed)
    image = image * _per_channel(lighting, image) + np.float32(rng.uniform(-5, 5))
    gamma = rng.uniform(0.9, 1.1)
    table = np.clip(255.0 * np.power(np.arange(256) / 255.0, gamma), 0, 255).astype(np.uint8)
    image = cv2.LUT(np.clip(image, 0, 255).astype(np.uint8), table).astype(np.float32)
    if glare is not None:
        image += _per_channel(glare, image)
    image += _noise(rng, image.shape, rng.uniform(1, 4))
    return image


def _lighting(
    rng: np.random.Generator, height: int, width: int, glare_allowed: bool
) -> tuple[np.ndarray, np.ndarray | None]:
    """(H, W) float32 gain: a tilted plane, vignetting and a low-frequency unevenness; and the additive
    specular glare, or None (drawn with a chance of one in four when allowed).

    Smooth, so computed on a coarse grid (1/8 resolution) and upsampled."""
    coarse_h, coarse_w = height // 8 + 2, width // 8 + 2
    xs = (np.arange(coarse_w, dtype=np.float32) / (coarse_w - 1) - 0.5)[None, :]  # (1, w)
    ys = (np.arange(coarse_h, dtype=np.float32) / (coarse_h - 1) - 0.5)[:, None]  # (h, 1)
    tilt_x, tilt_y = (float(value) for value in rng.uniform(-0.15, 0.15, 2))
    vignette = float(rng.uniform(0, 0.3))
    gain = float(rng.uniform(0.93, 1.07))
    coarse = (
        1.0
        + tilt_x * xs
        + tilt_y * ys
        - vignette * (xs * xs + ys * ys)
        + _smooth_field(rng, coarse_h, coarse_w, 4) * float(rng.uniform(0, 0.04))
    ) * gain
    glare = None
    if glare_allowed and rng.random() < 0.25:
        cx, cy = (float(value) for value in rng.uniform(-0.5, 0.5, 2))
        spread = float(rng.uniform(0.05, 0.2))
        spot = np.exp(-((xs - cx) ** 2) / (2 * spread**2)) * np.exp(-((ys - cy) ** 2) / (2 * spread**2))
        strength = float(rng.uniform(20, 55))
        glare = cv2.resize(
            (spot * strength).astype(np.float32), (width, height), interpolation=cv2.INTER_LINEAR
        )
    lighting = cv2.resize(coarse.astype(np.float32), (width, height), interpolation=cv2.INTER_LINEAR)
    return lighting, glare


def _binarized(image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """DeepPCB's look: Otsu-thresholded, copper dark, substrate and holes white, JPEG-like softness and
    speckle (holes are darker than the substrate, so the threshold calls them substrate). uint8."""
    gray = np.clip(image, 0, 255).astype(np.uint8)
    _, binary = cv2.threshold(gray, 0, 255, cv2.THRESH_BINARY + cv2.THRESH_OTSU)
    soft = cv2.GaussianBlur(255.0 - binary.astype(np.float32), (0, 0), 0.6)
    soft = soft * rng.uniform(0.93, 1.0) + rng.uniform(0, 6)
    soft += _noise(rng, soft.shape, 2.0)
    return np.clip(soft, 0, 255).astype(np.uint8)

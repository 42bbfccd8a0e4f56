"""A shifted line: the same kind of boards seen through a new lamp, lens or camera (`defectdet synth --shift`).

Only the tested images change; the golden templates stay as they were captured under the old setup, as on a
line where the template was taken once. Boxes do not move (no shift here is geometric), so the labels stay
exact. Each image draws its own variation from `seed` and its position in the sorted file list, so the same
dataset and seed give the same shifted files.

- `lamp`: exposure x0.6, gamma 1.4, contrast x0.75 and a light fall-off to 65 % across the board (its
  direction drawn per image);
- `lens`: softer focus (Gaussian blur, sigma 1.5 px) and vignetting to 70 % in the corners;
- `camera`: gain x1.25, black level +12 and sensor noise (sigma 5 grey levels).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import cv2
import numpy as np

from defectdet.errors import DefectDetError

SHIFTS = ("lamp", "lens", "camera")
SHIFT_RECORD = "shift.json"


def _falloff(height: int, width: int, rng: np.random.Generator) -> np.ndarray:
    angle = rng.uniform(0, 2 * np.pi)
    ys, xs = np.mgrid[0:height, 0:width].astype(np.float32)
    ramp = (np.cos(angle) * xs / width + np.sin(angle) * ys / height) * 1.0
    ramp = (ramp - ramp.min()) / max(1e-6, float(ramp.max() - ramp.min()))
    return 1.0 - 0.35 * ramp


def new_lamp(image: np.ndarray, seed: int) -> np.ndarray:
    """The tested image under the new lamp (see the module docstring)."""
    rng = np.random.default_rng(seed)
    height, width = image.shape[:2]
    falloff = _falloff(height, width, rng)
    values = image.astype(np.float32) / 255.0
    values = np.power(values, 1.4)
    values = (values - values.mean()) * 0.75 + values.mean()
    values = values * 0.6 * (falloff if image.ndim == 2 else falloff[..., None])
    return np.clip(values * 255.0, 0, 255).astype(np.uint8)


def new_lens(image: np.ndarray, seed: int) -> np.ndarray:
    """The tested image through the new lens: softer, darker towards the corners (`seed` unused: no draw)."""
    del seed
    height, width = image.shape[:2]
    soft = cv2.GaussianBlur(image.astype(np.float32), (0, 0), 1.5)
    ys, xs = np.mgrid[0:height, 0:width].astype(np.float32)
    radius = np.hypot((xs - (width - 1) / 2) / (width / 2), (ys - (height - 1) / 2) / (height / 2)) / np.sqrt(
        2
    )
    vignette = 1.0 - 0.3 * radius**2
    soft = soft * (vignette if image.ndim == 2 else vignette[..., None])
    return np.clip(soft + 0.5, 0, 255).astype(np.uint8)


def new_camera(image: np.ndarray, seed: int) -> np.ndarray:
    """The tested image from the new camera: more gain, a raised black level, its own sensor noise."""
    rng = np.random.default_rng(seed)
    values = image.astype(np.float32) * 1.25 + 12.0
    values += rng.normal(0.0, 5.0, image.shape).astype(np.float32)
    return np.clip(values + 0.5, 0, 255).astype(np.uint8)


_SHIFTERS = {"lamp": new_lamp, "lens": new_lens, "camera": new_camera}


def checked_shifts(shifts: Sequence[str]) -> tuple[str, ...]:
    """The shift names, each known and given once (DefectDetError otherwise)."""
    names = tuple(name.strip().lower() for name in shifts if name.strip())
    unknown = [name for name in names if name not in SHIFTS]
    if unknown or len(set(names)) != len(names):
        raise DefectDetError(f"--shift: choose from {', '.join(SHIFTS)}, each once; got {', '.join(shifts)}")
    return names


def shift_image(image: np.ndarray, shifts: Sequence[str], seed: int) -> np.ndarray:
    """`image` (uint8, gray or RGB) with each of `shifts` applied in the order given."""
    for name in checked_shifts(shifts):
        image = _SHIFTERS[name](image, seed)
    return image


def shift_dataset(root: str | Path, shifts: Sequence[str], seed: int = 0) -> int:
    """Apply `shifts` in place to the tested images under `root/images` (templates untouched); record them in
    `root/shift.json`. Returns the number of images changed."""
    root = Path(root)
    names = checked_shifts(shifts)
    if not names:
        return 0
    paths = sorted(path for path in (root / "images").rglob("*") if path.suffix.lower() == ".png")
    if not paths:
        raise DefectDetError(f"{root}/images: no PNG images to shift")
    for number, path in enumerate(paths):
        image = cv2.imread(str(path), cv2.IMREAD_UNCHANGED)
        if image is None:
            raise DefectDetError(f"{path}: cannot be read")
        if not cv2.imwrite(str(path), shift_image(image, names, seed + number)):
            raise DefectDetError(f"{path}: cannot be written")
    record = {"shifts": list(names), "seed": seed, "images": len(paths), "templates": "unchanged"}
    (root / SHIFT_RECORD).write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    return len(paths)

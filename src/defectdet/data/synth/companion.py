"""Aligned companion captures of synthetic images: the part under a second lighting (`synth --companion NAME`).

Each image is rendered twice through the same camera draws, with and without its defects, so their difference
is the defects alone. Under the image's own lighting the defects keep `FAINT` of their contrast (a scratch a few
grey levels deep, as under a lamp that hides it); under a companion's lighting the part looks otherwise (its
texture at about half contrast, another brightness, a light gradient across it, its own sensor noise) and the
defects stand out at `GAIN` times their contrast, with the opposite sign for every other companion. A model that
reads the companion planes finds what the image alone barely shows.
"""

from __future__ import annotations

import numpy as np

from defectdet.data.sample import check_companion_name
from defectdet.errors import DefectDetError

FAINT = 0.35  # share of the defects' contrast left in the image
GAIN = 2.0  # the defects' contrast in a companion, times their full contrast in the image


def checked_companion_names(names: list[str] | tuple[str, ...]) -> list[str]:
    """The companion names, each a valid name given once (comma lists split); DefectDetError otherwise."""
    found: list[str] = []
    for name in (part.strip() for value in names for part in value.split(",")):
        if not name:
            continue
        check_companion_name(name, "--companion")
        if name in found:
            raise DefectDetError(f"--companion: {name} given twice")
        found.append(name)
    return found


def faint_defects(image: np.ndarray, clean: np.ndarray) -> np.ndarray:
    """`image` with its defects (its difference to `clean`) at `FAINT` of their contrast; uint8."""
    defects = image.astype(np.float32) - clean.astype(np.float32)
    return np.clip(np.rint(clean.astype(np.float32) + FAINT * defects), 0, 255).astype(np.uint8)


def companion_capture(
    image: np.ndarray, clean: np.ndarray, rng: np.random.Generator, number: int
) -> np.ndarray:
    """The part under companion lighting `number` (0, 1, ...): `clean` relit, the defects (`image` - `clean`)
    at `GAIN` times their contrast, the opposite sign for odd numbers; uint8, the image's shape."""
    base = clean.astype(np.float32)
    defects = image.astype(np.float32) - base
    height, width = base.shape[:2]
    angle = rng.uniform(0, 2 * np.pi)
    ys, xs = np.mgrid[0:height, 0:width].astype(np.float32) / np.float32(max(height, width))
    ramp = (np.cos(angle) * xs + np.sin(angle) * ys) * np.float32(rng.uniform(15, 30))
    relit = (base - base.mean()) * np.float32(rng.uniform(0.4, 0.6)) + np.float32(rng.uniform(80, 150))
    relit += ramp if base.ndim == 2 else ramp[..., None]
    sign = -1.0 if number % 2 == 0 else 1.0
    relit += np.float32(sign * GAIN) * defects
    relit += rng.standard_normal(base.shape, dtype=np.float32) * np.float32(2.0)
    return np.clip(np.rint(relit), 0, 255).astype(np.uint8)

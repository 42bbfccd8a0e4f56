"""A tiny synthetic dataset whose images each have an aligned second lighting (companion `L2`).

Import it from any test as `from companion_data import make_companion_dataset` (the suite's root conftest puts
`tests/` on the import path). Layout (YOLO)::

    root/data.yaml              names [scratch, spot]; companions: {L2: L2}
    root/images/{train,val}/    <split>_NNN.png, gray 8-bit
    root/labels/{train,val}/    <split>_NNN.txt
    root/L2/                    <split>_NNN.png: the same part under another lighting, pixel-aligned

In the image the defects are faint (a few gray levels against textured noise); under `L2` they stand out with
the opposite sign and several times the contrast, so a model that reads the companion plane can find them more
easily than from the image alone. The last image of each split is defect-free.
"""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np

CLASS_NAMES = ("scratch", "spot")
COMPANION = "L2"
# gray-level change of a defect: (in the image, under L2)
CONTRAST = {0: (7.0, -60.0), 1: (-8.0, 70.0)}


def make_companion_dataset(root: Path, images: int = 12, size: int = 96, seed: int = 0) -> Path:
    """Write the dataset below `root` and return its data.yaml path. A third of the images (at least one)
    form the val split. Deterministic for a given `seed`."""
    root = Path(root)
    rng = np.random.default_rng(seed)
    val_count = max(1, images // 3)
    for index in range(images):
        split = "val" if index >= images - val_count else "train"
        last_of_split = index in (images - val_count - 1, images - 1)
        name = f"{split}_{index:03d}"
        image, companion, rows = _render(rng, size, clean=last_of_split)
        _write(root / "images" / split / f"{name}.png", image)
        _write(root / COMPANION / f"{name}.png", companion)
        label = root / "labels" / split / f"{name}.txt"
        label.parent.mkdir(parents=True, exist_ok=True)
        label.write_text("".join(f"{row}\n" for row in rows))
    yaml_path = root / "data.yaml"
    yaml_path.write_text(
        "path: .\ntrain: images/train\nval: images/val\n"
        f"names: [{', '.join(CLASS_NAMES)}]\ncompanions:\n  {COMPANION}: {COMPANION}\n"
    )
    return yaml_path


def _render(rng: np.random.Generator, size: int, clean: bool) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """One part under two lightings: (image, companion, YOLO label lines)."""
    texture = cv2.GaussianBlur(rng.standard_normal((size, size)).astype(np.float32), (0, 0), 1.5) * 6.0
    ramp = np.linspace(-20.0, 20.0, size, dtype=np.float32)[None, :]
    image = 120.0 + texture + rng.standard_normal((size, size)).astype(np.float32) * 2.0
    companion = 90.0 + 0.5 * texture + ramp + rng.standard_normal((size, size)).astype(np.float32) * 2.0
    rows: list[str] = []
    for _ in range(0 if clean else int(rng.integers(1, 3))):
        class_id = int(rng.integers(len(CLASS_NAMES)))
        mask, box = _defect_mask(rng, size, class_id)
        image += mask * np.float32(CONTRAST[class_id][0])
        companion += mask * np.float32(CONTRAST[class_id][1])
        x1, y1, x2, y2 = box
        rows.append(
            f"{class_id} {(x1 + x2) / 2 / size:.6f} {(y1 + y2) / 2 / size:.6f} "
            f"{(x2 - x1) / size:.6f} {(y2 - y1) / size:.6f}"
        )
    as_uint8 = [np.clip(np.rint(plane), 0, 255).astype(np.uint8) for plane in (image, companion)]
    return as_uint8[0], as_uint8[1], rows


def _defect_mask(rng: np.random.Generator, size: int, class_id: int) -> tuple[np.ndarray, tuple[int, ...]]:
    """A float32 (size, size) mask in [0, 1] of one scratch (a thin line) or spot (a disc), and its xyxy box."""
    mask = np.zeros((size, size), np.float32)
    margin = size // 8
    if class_id == 0:
        x1, y1 = (int(v) for v in rng.integers(margin, size // 2, 2))
        length = int(rng.integers(size // 4, size // 2))
        x2, y2 = min(size - margin, x1 + length), min(size - margin, y1 + int(rng.integers(2, length)))
        cv2.line(mask, (x1, y1), (x2, y2), 1.0, thickness=1, lineType=cv2.LINE_AA)
    else:
        cx, cy = (int(v) for v in rng.integers(margin * 2, size - margin * 2, 2))
        radius = int(rng.integers(3, max(4, size // 12)))
        cv2.circle(mask, (cx, cy), radius, 1.0, thickness=-1, lineType=cv2.LINE_AA)
    ys, xs = np.nonzero(mask > 0.1)
    return mask, (int(xs.min()), int(ys.min()), int(xs.max()) + 1, int(ys.max()) + 1)


def _write(path: Path, image: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if not cv2.imwrite(str(path), image):
        raise OSError(f"{path}: cannot write")

"""Clean boards for the false-call rate: a template turned into a realistic second capture of the same good
board (NumPy + OpenCV only).

Feeding a template as its own tested image gives a template-aware model an exactly zero difference, which
says nothing about a real clean capture. `recapture` adds what a second capture has: a shift and a small
rotation relative to the template (fixture / conveyor), an exposure (gain, black level) and gamma change,
sensor noise, and a JPEG re-encode.

Default ranges (`RecaptureConfig`, in `data.recapture_config`), from DeepPCB's own tested/template pairs measured by
`bench/registration.py` (bench/results/registration.json, "deeppcb_residual", 960 trusted pairs of 1000): the
residual shift has a median of 0.50 px, a 90th percentile of 1.34 px and a 99th of 5.6 px; |rotation| has a
median of 0.05 deg and a 99th percentile of 0.25 deg. So a clean recapture is shifted by 0.25-2 px in a random
direction (the bulk of that distribution; bench/clean_boards.py adds fixed 3 and 6 px cases) and rotated by up to
0.25 deg. Photometric ranges match the training augmentation's (`AugmentConfig`: gamma 0.8-1.25, +-10 %
exposure, noise 1-4 gray levels) and JPEG quality 75-95.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from defectdet.data.recapture_config import RecaptureConfig as RecaptureConfig
from defectdet.data.registration import motion_matrix, warp_to
from defectdet.data.sample import DatasetSplit, Sample, id_path
from defectdet.errors import ConfigError


def recapture(
    image: np.ndarray, config: RecaptureConfig, rng: np.random.Generator
) -> tuple[np.ndarray, dict[str, float]]:
    """A second capture of `image` (uint8 HxW or HxWx3) and the nuisance values drawn for it."""
    height, width = image.shape[:2]
    length = rng.uniform(*config.shift_px)
    direction = rng.uniform(0, 2 * math.pi)
    dx, dy = length * math.cos(direction), length * math.sin(direction)
    angle = rng.uniform(*config.rotation_deg) * (1 if rng.random() < 0.5 else -1)
    gain, offset, gamma = rng.uniform(*config.gain), rng.uniform(*config.offset), rng.uniform(*config.gamma)
    noise = rng.uniform(*config.noise_std)
    quality = (
        int(rng.integers(config.jpeg_quality[0], config.jpeg_quality[1] + 1)) if config.jpeg_quality else None
    )
    params: dict[str, Any] = {
        "dx": dx,
        "dy": dy,
        "angle_deg": angle,
        "gain": gain,
        "offset": offset,
        "gamma": gamma,
        "noise_std": noise,
        "jpeg_quality": quality,
    }
    out = image
    if dx or dy or angle:
        out = warp_to(out, motion_matrix(dx, dy, angle, width, height))
    if gain != 1 or offset != 0 or gamma != 1 or noise > 0:
        values = out.astype(np.float32) * np.float32(1 / 255)
        values = np.power(values, np.float32(gamma)) * np.float32(255 * gain) + np.float32(offset)
        if noise > 0:
            values += rng.standard_normal(values.shape, dtype=np.float32) * np.float32(noise)
        out = np.clip(np.rint(values), 0, 255).astype(np.uint8)
    if quality is not None:
        bgr = cv2.cvtColor(out, cv2.COLOR_RGB2BGR) if out.ndim == 3 else out
        ok, encoded = cv2.imencode(".jpg", bgr, [cv2.IMWRITE_JPEG_QUALITY, quality])
        if not ok:
            raise RuntimeError("JPEG encoding failed")
        decoded = cv2.imdecode(encoded, cv2.IMREAD_COLOR if out.ndim == 3 else cv2.IMREAD_GRAYSCALE)
        out = cv2.cvtColor(decoded, cv2.COLOR_BGR2RGB) if out.ndim == 3 else decoded
    return out, params


def make_clean_boards(
    split: DatasetSplit,
    out_dir: str | Path,
    config: RecaptureConfig,
    *,
    channels: int = 1,
    seed: int = 0,
) -> list[Sample]:
    """Write a recaptured clean board for every template of `split` into `out_dir` (lossless PNG) and return
    them as samples with no defects, each still paired with its original template.

    Board i draws its nuisances from `SeedSequence([seed, i])`, so a board does not depend on the others.
    `out_dir/clean_boards.json` records every draw. Raises ConfigError when the split has no template.
    """
    from defectdet.data.imageio import read_image

    with_template = [sample for sample in split.samples if sample.template_path is not None]
    if not with_template:
        raise ConfigError(
            f"clean boards: the {split.split!r} split of {split.root} has no template images to recapture "
            "(give the split templates, e.g. data.yaml `templates:`)"
        )
    folder = Path(out_dir)
    folder.mkdir(parents=True, exist_ok=True)
    samples: list[Sample] = []
    draws: list[dict[str, Any]] = []
    seen: set[Path] = set()
    for index, sample in enumerate(with_template):
        assert sample.template_path is not None
        if sample.template_path in seen:  # several tested images may share one template
            continue
        seen.add(sample.template_path)
        rng = np.random.default_rng(np.random.SeedSequence([seed, index]))
        template = read_image(sample.template_path, channels=channels)
        image, params = recapture(template, config, rng)
        image_id = f"{sample.image_id}_clean"
        path = folder / id_path(image_id, ".png")
        path.parent.mkdir(parents=True, exist_ok=True)
        bgr = cv2.cvtColor(image, cv2.COLOR_RGB2BGR) if image.ndim == 3 else image
        if not cv2.imwrite(str(path), bgr):
            raise ConfigError(f"{path}: cannot write the clean board (is the folder writable?)")
        samples.append(
            Sample(
                image_path=path,
                boxes=np.zeros((0, 4), np.float32),
                classes=np.zeros((0,), np.int64),
                template_path=sample.template_path,
                source=f"recapture of {sample.template_path}",
                image_id=image_id,
            )
        )
        draws.append({"image_id": image_id, "template": str(sample.template_path), **params})
    document = {"config": config.model_dump(mode="json"), "seed": seed, "boards": draws}
    (folder / "clean_boards.json").write_text(json.dumps(document, indent=1), encoding="utf-8")
    return samples

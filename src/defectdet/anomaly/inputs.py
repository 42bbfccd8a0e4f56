"""The good images a good-parts-only model is fitted on: which files, gray or colour, what input size, and
each image letterboxed exactly as the runtime prepares it (`runtime.pipeline.prepare`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from defectdet.data.imageio import IMAGE_SUFFIXES, read_image, read_image_size
from defectdet.errors import ConfigError, DatasetError
from defectdet.runtime import pipeline
from defectdet.runtime.spec import ModelSpec

MIN_IMAGES = 4  # two to fit on, two to choose the threshold on
DEFAULT_MAX_INPUT = 640
COLOUR_SAMPLES = 16


def good_images(source: str | Path | Sequence[str | Path]) -> list[Path]:
    """The image files of a folder (searched recursively, sorted), or the given list of files."""
    if isinstance(source, (str, Path)):
        folder = Path(source)
        if not folder.is_dir():
            raise DatasetError(f"{folder}: not a folder of good images")
        paths = sorted(
            path for path in folder.rglob("*") if path.is_file() and path.suffix.lower() in IMAGE_SUFFIXES
        )
        where = str(folder)
    else:
        paths, where = [Path(path) for path in source], "the image list"
    if len(paths) < MIN_IMAGES:
        raise DatasetError(
            f"{where}: {len(paths)} image(s); a good-parts-only model needs at least {MIN_IMAGES} defect-free "
            "images (some are held out to choose the threshold)"
        )
    return paths


def choose_channels(paths: Sequence[Path]) -> tuple[int, str]:
    """1 (gray) or 3 (RGB) from a sample of the images, as `train` decides."""
    from defectdet.engine.autoconfig import COLOR_SHARE, COLOR_SPREAD, color_spread

    step = max(1, len(paths) // COLOUR_SAMPLES)
    sample = list(paths[::step])[:COLOUR_SAMPLES]
    coloured = sum(int(color_spread(read_image(path, 3)) > COLOR_SPREAD) for path in sample)
    found = f"{coloured} of {len(sample)} sampled images have colour content"
    return (
        (3, f"{found}: RGB input") if coloured / len(sample) >= COLOR_SHARE else (1, f"{found}: gray input")
    )


def choose_input_size(paths: Sequence[Path], requested: int | None) -> int:
    """`requested` (a multiple of 32), else the first image's long side rounded up to 32, at most 640."""
    if requested is not None:
        if requested < 64 or requested % 32:
            raise ConfigError(f"--input-size: a multiple of 32 from 64 up, got {requested}")
        return int(requested)
    width, height = read_image_size(paths[0])
    return int(min(DEFAULT_MAX_INPUT, max(64, 32 * math.ceil(max(width, height) / 32))))


def model_spec(input_size: int, channels: int) -> ModelSpec:
    """How the bundle takes its input: one plane, no template, the runtime's letterbox."""
    return ModelSpec(input_size=input_size, channels=channels, template=False, class_names=("anomaly",))


def prepared_image(path: Path, spec: ModelSpec) -> pipeline.Prepared:
    """`path` decoded and letterboxed as `Predictor.predict` does (no tiles)."""
    image = pipeline.load_image(path, spec.channels, name=str(path))
    return pipeline.prepare(image, None, spec)


def split_holdout(paths: Sequence[Path], share: float, seed: int) -> tuple[list[Path], list[Path]]:
    """(fit, held out): a seeded shuffle, `share` of the images (at least 2, leaving at least 2) held out."""
    order = np.random.default_rng(seed).permutation(len(paths))
    count = min(max(2, int(round(share * len(paths)))), len(paths) - 2)
    held = [paths[index] for index in order[:count]]
    fit = [paths[index] for index in order[count:]]
    return fit, held

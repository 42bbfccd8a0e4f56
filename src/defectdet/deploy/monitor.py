"""Drift monitor: cheap image statistics, a reference profile stored in the bundle, and EWMA charts.

NumPy + OpenCV only (no torch): it runs beside `Predictor` and inside the service.

* `image_statistics` measures one letterboxed uint8 image (about 0.3-0.5 ms at 640x640 gray).
* `build_reference` turns the statistics (and the bundle's pooled activations) of the validation
  images into a JSON profile; `defectdet export` stores it as `metadata.drift_reference`.
* `DriftMonitor` runs one EWMA chart per statistic, plus one on the activation score, with limits
  derived from a target in-control run length (see `ewma_limit` and docs/deploy.md).
"""

from __future__ import annotations

import logging
from typing import Any, Literal

import cv2
import numpy as np

from defectdet.errors import InputError

logger = logging.getLogger(__name__)

Level = Literal["ok", "warn", "alert"]
LEVELS: tuple[Level, ...] = ("ok", "warn", "alert")
REFERENCE_FORMAT = 1
STATISTICS = ("brightness", "contrast", "sharpness", "saturation", "detail")
FEATURES = "features"
QUANTILES = (0.01, 0.05, 0.25, 0.5, 0.75, 0.95, 0.99)
# Smallest scale a chart uses per statistic (units of the statistic): a reference in which a statistic
# barely varies (identical boards) must not turn a one-grey-level exposure wobble into an alarm.
SCALE_FLOORS = {
    "brightness": 1.0,
    "contrast": 0.5,
    "sharpness": 5.0,
    "saturation": 0.002,
    "detail": 0.05,
    FEATURES: 0.01,
}
RELATIVE_SCALE_FLOOR = 0.01  # and at least 1 % of the reference mean
# Above this share of pixels at 0 or 255 the imagery is binarised by design (DeepPCB scans are ~95 %):
# the share then jumps with any exposure change of one grey level and says nothing about the lens or lamp.
BINARISED_SATURATION = 0.5


def image_statistics(letterboxed_uint8: np.ndarray) -> dict[str, float]:
    """Cheap statistics of one letterboxed uint8 image (HxW gray, HxWx1 or HxWx3 RGB).

    brightness: mean grey level (0-255); contrast: RMS contrast, the grey-level standard deviation;
    sharpness: variance of the 3x3 Laplacian at the letterbox size; detail: mean |Laplacian| (less
    dominated by strong edges, so it also rises with sensor noise); saturation: share of pixels at 0 or 255.
    """
    image = np.asarray(letterboxed_uint8)
    if image.dtype != np.uint8:
        raise InputError(f"image_statistics needs a uint8 image, got dtype {image.dtype}")
    if image.ndim == 3 and image.shape[2] == 1:
        image = image[:, :, 0]
    if image.ndim == 3 and image.shape[2] == 3:
        image = cv2.cvtColor(image, cv2.COLOR_RGB2GRAY)
    if image.ndim != 2 or image.size == 0:
        raise InputError(f"image_statistics needs an HxW or HxWx3 image, got shape {image.shape}")
    if not image.flags.c_contiguous:
        image = np.ascontiguousarray(image)
    mean, std = cv2.meanStdDev(image)
    laplacian = cv2.Laplacian(image, cv2.CV_16S)  # (H, W) int16, 3x3 aperture
    _, laplacian_std = cv2.meanStdDev(laplacian)
    pixels = image.size
    mid_tones = cv2.countNonZero(cv2.inRange(image, 1, 254))
    return {
        "brightness": float(mean[0, 0]),
        "contrast": float(std[0, 0]),
        "sharpness": float(laplacian_std[0, 0]) ** 2,
        "saturation": (pixels - mid_tones) / pixels,
        "detail": float(cv2.norm(laplacian, cv2.NORM_L1)) / pixels,
    }


def _summary(values: np.ndarray) -> dict[str, Any]:
    values = np.asarray(values, dtype=np.float64)
    quantiles = np.quantile(values, QUANTILES)
    return {
        "mean": float(values.mean()),
        "std": float(values.std(ddof=1)) if len(values) > 1 else 0.0,
        "min": float(values.min()),
        "max": float(values.max()),
        "quantiles": {f"{q:g}": float(v) for q, v in zip(QUANTILES, quantiles, strict=True)},
    }


def _feature_channels(mean: np.ndarray, std: np.ndarray) -> np.ndarray:
    """Channels that vary in the reference (dead channels would divide by ~0)."""
    return std > 1e-6 * (1.0 + np.abs(mean))


def feature_score(features: np.ndarray, mean: np.ndarray, std: np.ndarray) -> np.ndarray:
    """Mean absolute z-score over the live channels: (F,) -> scalar, or (N, F) -> (N,)."""
    features = np.asarray(features, dtype=np.float64)
    live = _feature_channels(mean, std)
    if not live.any():
        return np.zeros(features.shape[:-1])
    z = (features[..., live] - mean[live]) / std[live]
    return np.abs(z).mean(axis=-1)


def build_reference(stats: list[dict[str, float]], features: np.ndarray | None = None) -> dict[str, Any]:
    """JSON-ready reference profile from the validation images.

    `stats`: one `image_statistics` dict per image; `features`: (N, F) pooled activations of the same
    images in the same order, or None. Per statistic: mean, std, min, max and quantiles; per feature
    channel: mean and std, plus the summary of the per-image feature score (mean |z| over channels).
    """
    if not stats:
        raise ValueError("build_reference needs the statistics of at least one image")
    names = [name for name in stats[0] if all(name in row for row in stats)]
    table = np.array([[float(row[name]) for name in names] for row in stats], dtype=np.float64)
    if not np.isfinite(table).all():
        raise ValueError("build_reference: non-finite image statistic in the reference images")
    reference: dict[str, Any] = {
        "format_version": REFERENCE_FORMAT,
        "images": len(stats),
        "statistics": {name: _summary(table[:, index]) for index, name in enumerate(names)},
        "features": None,
    }
    if features is not None:
        features = np.asarray(features, dtype=np.float64)
        if features.ndim != 2 or features.shape[0] != len(stats):
            raise ValueError(f"build_reference: features must be ({len(stats)}, F), got {features.shape}")
        if not np.isfinite(features).all():
            raise ValueError("build_reference: non-finite feature value in the reference images")
        mean = features.mean(axis=0)
        std = features.std(axis=0, ddof=1) if len(features) > 1 else np.zeros_like(mean)
        reference["features"] = {
            "channels": int(features.shape[1]),
            "mean": [float(v) for v in mean],
            "std": [float(v) for v in std],
            "score": _summary(feature_score(features, mean, std)),
        }
    return reference

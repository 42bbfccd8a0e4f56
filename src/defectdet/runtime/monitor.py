"""Drift monitor: cheap image statistics, a reference profile stored in the bundle, and EWMA charts.

NumPy + OpenCV only (no torch): it runs beside `Predictor` and inside the service.

* `image_statistics` measures one letterboxed uint8 image (p50 1.31 ms at 640x640 gray on a shared 2-core
  machine: bench/results/drift.json, `image_statistics_ms_640`).
* `build_reference` turns the statistics (and the bundle's pooled activations) of the training images
  (a bounded sample spread over their groups: `reference_groups`, `sample_reference`) into a JSON profile
  with the spread between groups; `defectdet export` stores it as `metadata.drift_reference`.
* `DriftMonitor` runs one EWMA chart per statistic, plus one on the activation score, with limits
  derived from a target in-control run length (see `ewma_limit`), widened by the
  reference's between-group spread (`group_inflation`). Degenerate images (`degenerate_reason`) are
  counted and kept out of the charts.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import os
import re
import statistics
import threading
from collections import Counter, deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import cv2
import numpy as np

from defectdet.errors import InputError

logger = logging.getLogger(__name__)

Level = Literal["ok", "warn", "alert"]
LEVELS: tuple[Level, ...] = ("ok", "warn", "alert")
LOG_SETTLE_IMAGES = 10  # a lower level is logged once it held this many images
REFERENCE_FORMAT = 2  # 2: black/white levels, image geometry, between-group spread, held-out feature score
STATISTICS = (
    "brightness",
    "contrast",
    "sharpness",
    "saturation",
    "detail",
    "acutance",
    "black_level",
    "white_level",
)
GEOMETRY = ("width", "height")  # measured, never charted: they only tell a degenerate image
LEVEL_QUANTILES = (0.01, 0.99)  # black / white level: these grey-level quantiles
MIN_SIDE = 16  # letterboxed content narrower than this (pixels) is a thin strip or a speck: not charted
CONSTANT_CONTRAST = 0.5  # grey-level sd below this: a constant image, not charted
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
    "acutance": 0.005,
    # levels are pinned at 0 / 255 on binarised imagery: a few grey levels of exposure jitter is no drift
    "black_level": 6.0,
    "white_level": 6.0,
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
    dominated by strong edges, so it also rises with sensor noise); saturation: share of pixels at 0 or 255;
    acutance: at half size, the lowest over a 4x4 grid of tiles of mean |Laplacian| / mean morphological
    gradient. Edge density cancels in that ratio, so it measures how steep the edges are where they are
    softest: a smudge over part of the lens lowers it even when the global sharpness barely moves.
    black_level / white_level: the 1st / 99th percentile grey level. Unlike brightness and contrast they
    do not follow how much of the board is copper, so exposure and contrast faults show against a
    reference of many different boards. width / height: the measured size (`GEOMETRY`, not charted).
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
    cumulative = np.cumsum(cv2.calcHist([image], [0], None, [256], [0, 256]).reshape(-1))
    black, white = np.searchsorted(cumulative, [q * pixels for q in LEVEL_QUANTILES])
    return {
        "brightness": float(mean[0, 0]),
        "contrast": float(std[0, 0]),
        "sharpness": float(laplacian_std[0, 0]) ** 2,
        "saturation": (pixels - mid_tones) / pixels,
        "detail": float(cv2.norm(laplacian, cv2.NORM_L1)) / pixels,
        "acutance": _acutance(image),
        "black_level": float(black),
        "white_level": float(white),
        "width": float(image.shape[1]),
        "height": float(image.shape[0]),
    }


def degenerate_reason(image_stats: Mapping[str, float]) -> tuple[str, str] | None:
    """(kind, message) when the image must stay out of the charts (a speck, a thin strip, a constant
    image: they say nothing about the lens or the lamp), else None."""
    width, height = image_stats.get("width"), image_stats.get("height")
    if width is not None and height is not None and min(width, height) < MIN_SIDE:
        return "too small", f"{width:.0f}x{height:.0f} px after letterboxing (a side under {MIN_SIDE} px)"
    contrast = image_stats.get("contrast")
    if contrast is not None and contrast < CONSTANT_CONTRAST:
        return "constant", f"constant image (grey-level sd {contrast:.2f} < {CONSTANT_CONTRAST})"
    return None


_GRADIENT_KERNEL = np.ones((3, 3), np.uint8)
ACUTANCE_TILES = 4


def _tile_sums(image: np.ndarray, tiles: int) -> np.ndarray:
    """(tiles, tiles) sums of a uint8 image over an even grid, from its integral image."""
    integral = cv2.integral(image)  # (H + 1, W + 1)
    rows = np.linspace(0, image.shape[0], tiles + 1).astype(int)
    cols = np.linspace(0, image.shape[1], tiles + 1).astype(int)
    corners = integral[np.ix_(rows, cols)].astype(np.float64)
    return corners[1:, 1:] - corners[:-1, 1:] - corners[1:, :-1] + corners[:-1, :-1]


def _acutance(gray: np.ndarray) -> float:
    height, width = gray.shape
    if min(height, width) >= 2 * ACUTANCE_TILES * 4:
        gray = cv2.resize(gray, (width // 2, height // 2), interpolation=cv2.INTER_AREA)
    laplacian = cv2.convertScaleAbs(cv2.Laplacian(gray, cv2.CV_16S))
    gradient = cv2.morphologyEx(gray, cv2.MORPH_GRADIENT, _GRADIENT_KERNEL)
    tiles = min(ACUTANCE_TILES, gray.shape[0], gray.shape[1])
    edges, steepness = _tile_sums(gradient, tiles), _tile_sums(laplacian, tiles)
    textured = edges > gray.size / tiles**2  # tiles whose mean gradient exceeds one grey level
    if not textured.any():
        total = edges.sum()
        return float(steepness.sum() / total) if total > 0 else 0.0
    return float((steepness[textured] / edges[textured]).min())


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


_TRAILING_NUMBER = re.compile(r"[\W_]*\d+$")


def reference_groups(paths: Sequence[str | Path], chunks: int = 8) -> tuple[list[str], str]:
    """One group label per image, and how they were found: the parent folder (DeepPCB's board groups,
    one folder per batch or board); else the file name without its trailing number (`boardA_012`); else,
    with no such structure, `chunks` runs of consecutive sorted file names (capture order, when names
    follow it; random chunks otherwise). Used where there are 2 .. N/2 groups."""
    paths = [Path(path) for path in paths]
    count = len(paths)
    folders = [str(path.parent) for path in paths]
    if _usable_groups(folders, count):
        common = os.path.commonpath(folders)
        return [os.path.relpath(folder, common) for folder in folders], "parent folder"
    prefixes = [_TRAILING_NUMBER.sub("", path.stem) for path in paths]
    if _usable_groups(prefixes, count):
        return prefixes, "file-name prefix"
    runs = max(1, min(chunks, count // 2))
    order = sorted(range(count), key=lambda index: str(paths[index]))
    labels = [""] * count
    for rank, index in enumerate(order):
        labels[index] = f"chunk{rank * runs // count}"
    return labels, f"{runs} runs of consecutive file names"


def _usable_groups(labels: list[str], count: int) -> bool:
    return 2 <= len(set(labels)) <= count // 2


def sample_reference(groups: Sequence[str], max_images: int, seed: int = 0) -> list[int]:
    """Indices of at most `max_images` images, taken in turn from each group (seeded order inside each),
    so small groups are kept whole and large ones do not crowd them out. Sorted."""
    rng = np.random.default_rng(seed)
    members: dict[str, list[int]] = {}
    for index, group in enumerate(groups):
        members.setdefault(group, []).append(index)
    queues = [list(rng.permutation(indices)) for indices in members.values()]
    chosen: list[int] = []
    while len(chosen) < max_images and any(queues):
        for queue in queues:
            if queue and len(chosen) < max_images:
                chosen.append(int(queue.pop()))
    return sorted(chosen)


SPREAD_CONFIDENCE = 0.8  # the between-group sd a chart allows for: its upper 80 % bound (few groups)


def group_spread(values: np.ndarray, groups: Sequence[str]) -> tuple[float, float, float]:
    """(within, between, between_upper) standard deviations of `values` by group: one-way random-effects
    ANOVA (unbalanced), between = max(0, (MSB - MSW) / n0), and its upper `SPREAD_CONFIDENCE` bound from
    MSB ~ (MSW + n0 between^2) chi2(k - 1) / (k - 1): five groups say little about the sixth."""
    values = np.asarray(values, dtype=np.float64)
    labels = np.asarray(list(groups))
    names = list(dict.fromkeys(labels.tolist()))
    total, kinds = len(values), len(names)
    if kinds < 2 or total < 2:
        return (float(values.std(ddof=1)) if total > 1 else 0.0), 0.0, 0.0
    sizes = np.array([np.sum(labels == name) for name in names], dtype=np.float64)
    means = np.array([values[labels == name].mean() for name in names])
    within_ss = sum(
        float(((values[labels == name] - mean) ** 2).sum()) for name, mean in zip(names, means, strict=True)
    )
    within_ms = within_ss / (total - kinds) if total > kinds else 0.0
    between_ms = float((sizes * (means - values.mean()) ** 2).sum()) / (kinds - 1)
    n0 = (total - float((sizes**2).sum()) / total) / (kinds - 1)
    if n0 <= 0:
        return math.sqrt(within_ms), 0.0, 0.0
    between = max(0.0, (between_ms - within_ms) / n0)
    bound = between_ms * (kinds - 1) / _chi2_quantile(1.0 - SPREAD_CONFIDENCE, kinds - 1)
    return math.sqrt(within_ms), math.sqrt(between), math.sqrt(max(0.0, (bound - within_ms) / n0))


def _chi2_quantile(p: float, dof: int) -> float:
    """Chi-square quantile, Wilson-Hilferty (within 1 % of the exact value from 2 degrees of freedom)."""
    z = _NORMAL.inv_cdf(p)
    return max(dof * (1.0 - 2.0 / (9.0 * dof) + z * math.sqrt(2.0 / (9.0 * dof))) ** 3, 1e-9)


def group_inflation(summary: Mapping[str, Any], lam: float) -> float:
    """How much wider a chart must be for a new group to look in-control (>= 1; 1 without groups).

    A group shifts every image by the same offset b ~ N(0, between^2) (`between_std_upper`, the upper
    bound, when the reference has it), which the EWMA does not average away, while the within-group noise is averaged down by lam / (2 - lam). The limits assume i.i.d.
    noise of the reference sd, so the scale is multiplied by
    sqrt((within^2 + between^2 (2 - lam) / lam) / (within^2 + between^2)): the chart's in-control EWMA
    spread then matches the design, and the run-length target holds per new group, not only per image.
    """
    between = float(summary.get("between_std_upper", summary.get("between_std")) or 0.0)
    within = float(summary.get("within_std") or 0.0)
    if between <= 0.0:
        return 1.0
    total = within**2 + between**2
    return max(1.0, math.sqrt((within**2 + between**2 * (2.0 - lam) / lam) / total))


def build_reference(
    stats: list[dict[str, float]],
    features: np.ndarray | None = None,
    groups: Sequence[str] | None = None,
    group_by: str | None = None,
) -> dict[str, Any]:
    """JSON-ready reference profile from the reference (training) images.

    `stats`: one `image_statistics` dict per image; `features`: (N, F) pooled activations of the same
    images in the same order, or None; `groups`: one label per image (`reference_groups`), or None.
    Degenerate images are dropped (counted in "skipped"). Per statistic: mean, std, min, max and
    quantiles over all images, plus the within- and between-group sd; per feature channel: mean and std;
    the per-image feature score (mean |z| over channels) is summarised held out, each group's images
    against the other groups' channels (with 3+ groups), as the monitor will meet an unseen board.
    """
    if groups is not None and len(groups) != len(stats):
        raise ValueError(f"build_reference: {len(groups)} group labels for {len(stats)} images")
    kept = [index for index, row in enumerate(stats) if degenerate_reason(row) is None]
    if not kept:
        raise ValueError("build_reference needs the statistics of at least one (non-degenerate) image")
    labels = [str(groups[index]) for index in kept] if groups is not None else ["all"] * len(kept)
    rows = [stats[index] for index in kept]
    names = [name for name in rows[0] if name not in GEOMETRY and all(name in row for row in rows)]
    table = np.array([[float(row[name]) for name in names] for row in rows], dtype=np.float64)
    if not np.isfinite(table).all():
        raise ValueError("build_reference: non-finite image statistic in the reference images")
    sizes = Counter(labels)
    reference: dict[str, Any] = {
        "format_version": REFERENCE_FORMAT,
        "images": len(rows),
        "skipped": len(stats) - len(rows),
        "groups": {"count": len(sizes), "by": group_by, "images": dict(sizes)},
        "statistics": {name: _spread_summary(table[:, index], labels) for index, name in enumerate(names)},
        "features": None,
    }
    if features is not None:
        features = np.asarray(features, dtype=np.float64)
        if features.ndim != 2 or features.shape[0] != len(stats):
            raise ValueError(f"build_reference: features must be ({len(stats)}, F), got {features.shape}")
        features = features[kept]
        if not np.isfinite(features).all():
            raise ValueError("build_reference: non-finite feature value in the reference images")
        mean = features.mean(axis=0)
        std = features.std(axis=0, ddof=1) if len(features) > 1 else np.zeros_like(mean)
        reference["features"] = {
            "channels": int(features.shape[1]),
            "mean": [float(v) for v in mean],
            "std": [float(v) for v in std],
            "score": _spread_summary(_held_out_scores(features, labels, mean, std), labels),
            "score_held_out": len(sizes) >= 3,
        }
    return reference


def _spread_summary(values: np.ndarray, labels: list[str]) -> dict[str, Any]:
    summary = _summary(values)
    within, between, upper = group_spread(values, labels)
    return {**summary, "within_std": within, "between_std": between, "between_std_upper": upper}


def _held_out_scores(
    features: np.ndarray, labels: list[str], mean: np.ndarray, std: np.ndarray
) -> np.ndarray:
    """Feature score of each image: against the other groups' channels with 3+ groups, else in-sample."""
    names = list(dict.fromkeys(labels))
    if len(names) < 3:
        return feature_score(features, mean, std)
    array = np.asarray(labels)
    scores = np.empty(len(features))
    for name in names:
        inside = array == name
        others = features[~inside]
        scores[inside] = feature_score(features[inside], others.mean(axis=0), others.std(axis=0, ddof=1))
    return scores


# ----------------------------------------------------------------------------------------------------
# EWMA control limits from a target in-control run length
# ----------------------------------------------------------------------------------------------------

_NORMAL = statistics.NormalDist()
_normal_cdf = np.vectorize(lambda x: 0.5 * math.erfc(-x / math.sqrt(2.0)), otypes=[np.float64])


def ewma_run_length(lam: float, limit: float, two_sided: bool = True, states: int = 81) -> float:
    """In-control average run length of an EWMA chart on N(0, 1) observations (Brook & Evans Markov chain).

    The chart is Z_t = (1 - lam) Z_{t-1} + lam X_t, Z_0 = 0, signalling when Z_t leaves +-`limit`
    (two-sided) or exceeds `limit` (one-sided, with Z reset to 0 whenever it falls below 0, the
    Crowder-Hamilton chart). The band is cut into `states` cells; ARL = (I - P)^-1 1 from the cell of 0.
    """
    lower = -limit if two_sided else 0.0
    edges = np.linspace(lower, limit, states + 1)
    centres = 0.5 * (edges[:-1] + edges[1:])
    shifted = (1.0 - lam) * centres[:, None]  # (states, 1)
    cdf = _normal_cdf((edges[None, :] - shifted) / lam)  # (states, states + 1)
    if not two_sided:
        cdf[:, 0] = 0.0  # everything below 0 is reset to 0: it lands in the first cell
    transition = cdf[:, 1:] - cdf[:, :-1]
    run_lengths = np.linalg.solve(np.eye(states) - transition, np.ones(states))
    start = int(np.searchsorted(edges, 0.0, side="right")) - 1 if two_sided else 0
    return float(run_lengths[min(max(start, 0), states - 1)])


@functools.lru_cache(maxsize=64)
def ewma_limit(lam: float, run_length: float, two_sided: bool = True) -> float:
    """The limit h (in units of the observations' sigma) giving an in-control ARL of `run_length`."""
    if not 0 < lam <= 1:
        raise ValueError(f"EWMA lambda must be in (0, 1], got {lam}")
    if run_length <= 2:
        raise ValueError(f"target run length must exceed 2, got {run_length}")
    low, high = 0.05, 10.0 * math.sqrt(lam / (2.0 - lam))
    target = math.log(run_length)
    for _ in range(40):  # bisection on log ARL, which rises monotonically with h
        middle = 0.5 * (low + high)
        if math.log(ewma_run_length(lam, middle, two_sided)) < target:
            low = middle
        else:
            high = middle
    return 0.5 * (low + high)


# ----------------------------------------------------------------------------------------------------
# The online monitor
# ----------------------------------------------------------------------------------------------------


@dataclass
class ChartState:
    """One chart: the smoothed value in the statistic's units, its bands and its level."""

    name: str
    value: float  # EWMA of the statistic, in its own units
    last: float  # the latest raw observation
    z: float  # EWMA in units of the reference scale (0 = reference centre)
    level: Level
    warn_band: tuple[float, float]
    alert_band: tuple[float, float]

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "value": self.value,
            "last": self.last if math.isfinite(self.last) else None,
            "z": self.z,
            "level": self.level,
            "warn_band": _json_band(self.warn_band),
            "alert_band": _json_band(self.alert_band),
        }


@dataclass
class DriftState:
    """The monitor's verdict after the latest image: the worst chart names the statistic."""

    level: Level
    statistic: str | None
    value: float | None
    band: tuple[float, float] | None
    images: int
    message: str
    charts: dict[str, ChartState] = field(default_factory=dict)
    skipped_images: int = 0  # degenerate images kept out of the charts
    skip_reasons: dict[str, int] = field(default_factory=dict)
    last_skip: str | None = None  # why the latest image was skipped; None when it was charted

    def to_dict(self) -> dict[str, Any]:
        return {
            "level": self.level,
            "statistic": self.statistic,
            "value": self.value,
            "band": _json_band(self.band),
            "images": self.images,
            "message": self.message,
            "charts": {name: chart.to_dict() for name, chart in self.charts.items()},
            "skipped_images": self.skipped_images,
            "skip_reasons": dict(self.skip_reasons),
            "last_skip": self.last_skip,
        }


@dataclass(frozen=True)
class _Standardizer:
    """Maps a statistic to z (reference units) and back: piecewise linear through the reference quantiles
    at their normal scores (a skewed statistic gets a symmetric in-control z), linear beyond them with
    slope 1 / `scale`. With one knot it is the plain (x - mean) / scale."""

    knots_x: tuple[float, ...]
    knots_z: tuple[float, ...]
    scale: float

    def forward(self, x: float) -> float:
        if x <= self.knots_x[0]:
            return self.knots_z[0] + (x - self.knots_x[0]) / self.scale
        if x >= self.knots_x[-1]:
            return self.knots_z[-1] + (x - self.knots_x[-1]) / self.scale
        return float(np.interp(x, self.knots_x, self.knots_z))

    def inverse(self, z: float) -> float:
        if z <= self.knots_z[0]:
            return self.knots_x[0] + (z - self.knots_z[0]) * self.scale
        if z >= self.knots_z[-1]:
            return self.knots_x[-1] + (z - self.knots_z[-1]) * self.scale
        return float(np.interp(z, self.knots_z, self.knots_x))


def _standardizer(summary: Mapping[str, Any], floor: float, transform: str) -> _Standardizer:
    scale = max(float(summary["std"]), floor)
    linear = _Standardizer((float(summary["mean"]),), (0.0,), scale)
    quantiles = summary.get("quantiles") or {}
    if transform == "linear" or len(quantiles) < 3:
        return linear
    levels = sorted((float(key), float(value)) for key, value in quantiles.items())
    xs = np.array([value for _, value in levels])
    zs = np.array([_NORMAL.inv_cdf(p) for p, _ in levels])
    # every segment at least as wide as the floor allows: else (ties, a near-constant statistic) go linear
    if not np.all(np.diff(xs) >= floor * np.diff(zs)):
        return linear
    return _Standardizer(tuple(float(v) for v in xs), tuple(float(v) for v in zs), scale)


@dataclass
class _Chart:
    name: str
    standardizer: _Standardizer
    two_sided: bool
    warn_limit: float  # on the EWMA of z
    alert_limit: float
    inflation: float = 1.0  # scale widening for the between-group spread (`group_inflation`)
    ewma: float = 0.0
    last: float = float("nan")
    level: Level = "ok"

    def band(self, limit: float) -> tuple[float, float]:
        lower = self.standardizer.inverse(-limit) if self.two_sided else -math.inf
        return (lower, self.standardizer.inverse(limit))

    def state(self) -> ChartState:
        return ChartState(
            self.name,
            self.standardizer.inverse(self.ewma),
            self.last,
            self.ewma,
            self.level,
            self.band(self.warn_limit),
            self.band(self.alert_limit),
        )


class DriftMonitor:
    """EWMA charts of the image statistics and of the activation score against the reference profile.

    Each observation becomes z in reference units: with `transform="quantile"` (default) piecewise-linearly
    through the reference quantiles at their normal scores (q05 -> -1.645, median -> 0, ...; a skewed
    statistic such as the activation score gets a near-normal in-control z), beyond the outer quantiles
    linearly with slope 1 / max(std, floor); `"linear"` is plain (x - mean) / max(std, floor). z is clipped
    to +-`clip`, so one odd image moves a chart by at most lam * clip, and smoothed:
    E_t = (1 - lam) E_{t-1} + lam z_t.

    Groups: when the reference records the sd between its groups (boards, batches), the scale of each
    chart is widened by `group_inflation`: a new board shifts the EWMA as a whole, which the i.i.d. limits
    would take for drift. Degenerate images (`degenerate_reason`: a side under 16 px, a constant image) do
    not touch the charts; they are counted (`skipped_images`, `skip_reasons`).

    Limits: a chart is in alert when |E_t| exceeds h_alert, the limit whose in-control average run length
    for N(0, 1) observations (Brook-Evans Markov chain, `ewma_limit`) is `alert_run_length` x the number
    of charts, so that the monitor as a whole raises a false alarm about once per `alert_run_length`
    images (charts taken as independent: a union bound); warn likewise with `warn_run_length`. On
    binarised reference images (median share of pixels at 0 or 255 above 0.5) saturation is not charted,
    nor are brightness and contrast when the reference has the black / white levels: there they measure
    the board's copper share (`skipped` says why). The activation chart is one-sided (only a rise of the mean |z| is drift; E is reset at 0). Clipping lowers
    the in-control variance, so the real run lengths are longer than the targets. A level is left only
    when the chart falls below 0.8 x its limit (hysteresis); each change of the overall state is logged
    once. Thread-safe.
    """

    def __init__(
        self,
        reference: Mapping[str, Any],
        *,
        lam: float = 0.2,
        alert_run_length: float = 100_000,
        warn_run_length: float = 5_000,
        clip: float = 4.0,
        transform: str = "quantile",
        statistics: Sequence[str] | None = None,
        history: int = 300,
    ) -> None:
        if not reference or "statistics" not in reference:
            raise ValueError("DriftMonitor needs a reference profile from build_reference")
        self.reference = dict(reference)
        if transform not in ("quantile", "linear"):
            raise ValueError(f"transform must be 'quantile' or 'linear', got {transform!r}")
        self.lam = lam
        self.clip = clip
        self.transform = transform
        self.skipped: dict[str, str] = {}
        available = reference["statistics"]
        names = self._charted_statistics(available, statistics)
        features = reference.get("features")
        use_features = features is not None and (statistics is None or FEATURES in names)
        names = [name for name in names if name != FEATURES]
        if use_features:
            self._feature_mean = np.asarray(features["mean"], dtype=np.float64)
            self._feature_std = np.asarray(features["std"], dtype=np.float64)
        charts = len(names) + int(use_features)
        if charts == 0:
            raise ValueError("DriftMonitor: nothing to chart")
        self.alert_run_length = alert_run_length
        self.warn_run_length = warn_run_length
        self._charts: dict[str, _Chart] = {}
        for name in names:
            self._charts[name] = self._make_chart(name, available[name], True, charts)
        if use_features:
            self._charts[FEATURES] = self._make_chart(FEATURES, features["score"], False, charts)
        self._images = 0
        self._level: Level = "ok"  # the level last logged
        self._calmer_run = 0  # images in a row below the logged level
        self._skips: Counter[str] = Counter()
        self._last_skip: str | None = None
        self._lock = threading.Lock()
        self._history: deque[dict[str, float]] = deque(maxlen=history)

    def _charted_statistics(
        self, available: Mapping[str, Any], statistics: Sequence[str] | None
    ) -> list[str]:
        """The statistics to chart (FEATURES among them when asked for): `statistics`, or every one of the
        reference's but those binarised reference images make meaningless (recorded in `skipped`)."""
        names = list(statistics) if statistics is not None else list(available)
        unknown = [name for name in names if name not in available and name != FEATURES]
        if unknown:
            raise ValueError(
                f"DriftMonitor: statistics {unknown} are not in the reference ({list(available)})"
            )
        if statistics is None and "saturation" in names:
            self._skip_binarised(available["saturation"], names)
        return names

    def _skip_binarised(self, saturation: Mapping[str, Any], names: list[str]) -> None:
        """On binarised reference images, drop saturation (and brightness and contrast, when the black and
        white levels are charted) from `names`, saying why in `skipped`."""
        median = saturation["quantiles"].get("0.5", saturation["mean"])
        if not median > BINARISED_SATURATION:  # (a NaN median is not binarised either)
            return
        names.remove("saturation")
        self.skipped["saturation"] = (
            f"reference images are binarised ({median:.0%} of pixels at 0 or 255): "
            "the share follows any exposure change and is not charted"
        )
        if all(level in names for level in ("black_level", "white_level")):
            for name in ("brightness", "contrast"):
                if name in names:
                    names.remove(name)
                    self.skipped[name] = (
                        f"reference images are binarised: {name} follows how much of each board is "
                        "copper (its design), not the lamp; black_level / white_level chart exposure "
                        "and contrast instead"
                    )

    def _make_chart(self, name: str, summary: Mapping[str, Any], two_sided: bool, charts: int) -> _Chart:
        floor = max(SCALE_FLOORS.get(name, 0.0), RELATIVE_SCALE_FLOOR * abs(float(summary["mean"])), 1e-12)
        warn = ewma_limit(self.lam, self.warn_run_length * charts, two_sided)
        alert = ewma_limit(self.lam, self.alert_run_length * charts, two_sided)
        standardizer = _standardizer(summary, floor, self.transform)
        inflation = group_inflation(summary, self.lam)
        if inflation > 1.0:
            standardizer = dataclasses.replace(
                standardizer,
                knots_z=tuple(z / inflation for z in standardizer.knots_z),
                scale=standardizer.scale * inflation,
            )
        return _Chart(name, standardizer, two_sided, warn, alert, inflation)

    @property
    def charts(self) -> list[str]:
        return list(self._charts)

    def limits(self) -> dict[str, dict[str, Any]]:
        """Per chart: centre, scale, two-sided flag and the warn / alert limits in units of scale."""
        return {
            name: {
                "centre": chart.standardizer.inverse(0.0),
                "scale": chart.standardizer.scale,
                "two_sided": chart.two_sided,
                "warn_limit": chart.warn_limit,
                "alert_limit": chart.alert_limit,
                "group_inflation": chart.inflation,
            }
            for name, chart in self._charts.items()
        }

    def update(self, image_stats: Mapping[str, float], features: np.ndarray | None = None) -> DriftState:
        """Feed one image's statistics (and pooled activations); returns the state after it. A degenerate
        image (`degenerate_reason`) is counted and leaves the charts as they were."""
        skip = degenerate_reason(image_stats)
        if skip is not None:
            with self._lock:
                self._skips[skip[0]] += 1
                self._last_skip = skip[1]
                return self._state()
        observations = {name: float(image_stats[name]) for name in self._charts if name in image_stats}
        if FEATURES in self._charts and features is not None:
            vector = np.asarray(features, dtype=np.float64).reshape(-1)
            if vector.shape == self._feature_mean.shape and np.isfinite(vector).all():
                observations[FEATURES] = float(feature_score(vector, self._feature_mean, self._feature_std))
        with self._lock:
            self._images += 1
            self._last_skip = None
            for name, value in observations.items():
                if math.isfinite(value):
                    self._observe(self._charts[name], value)
            self._history.append({name: chart.ewma for name, chart in self._charts.items()})
            state = self._state()
            self._maybe_log(state)
        return state

    def _maybe_log(self, state: DriftState) -> None:
        """Log a rise at once, a fall once it held for `LOG_SETTLE_IMAGES` images: an EWMA hovering at a limit
        flips the level image by image, and the log should say so once, not every other image."""
        rank, logged = LEVELS.index(state.level), LEVELS.index(self._level)
        self._calmer_run = self._calmer_run + 1 if rank < logged else 0
        if rank > logged or (rank < logged and self._calmer_run >= LOG_SETTLE_IMAGES):
            self._log_change(self._level, state)
            self._level = state.level
            self._calmer_run = 0

    def _observe(self, chart: _Chart, value: float) -> None:
        z = min(max(chart.standardizer.forward(value), -self.clip), self.clip)
        chart.ewma = (1.0 - self.lam) * chart.ewma + self.lam * z
        if not chart.two_sided:
            chart.ewma = max(chart.ewma, 0.0)
        chart.last = value
        size = abs(chart.ewma)
        if size > chart.alert_limit:
            chart.level = "alert"
        elif size > chart.warn_limit:
            chart.level = "alert" if chart.level == "alert" and size > 0.8 * chart.alert_limit else "warn"
        elif chart.level != "ok" and size > 0.8 * chart.warn_limit:
            chart.level = "warn"
        else:
            chart.level = "ok"

    def _state(self) -> DriftState:
        charts = {name: chart.state() for name, chart in self._charts.items()}
        worst = max(
            self._charts.values(),
            key=lambda chart: (LEVELS.index(chart.level), abs(chart.ewma) / chart.alert_limit),
        )
        level = worst.level
        if self._images == 0:
            message = "no images yet"
        elif level == "ok":
            message = f"ok: all {len(charts)} charts inside their bands over {self._images} images"
        else:
            band = worst.band(worst.alert_limit if level == "alert" else worst.warn_limit)
            where = (
                f"outside [{_fmt(band[0])}, {_fmt(band[1])}]" if worst.two_sided else f"above {_fmt(band[1])}"
            )
            message = (
                f"{level}: {worst.name} {_fmt(worst.standardizer.inverse(worst.ewma))} {where} "
                f"(EWMA, lambda {self.lam:g})"
            )
        if self._skips:
            message += f"; {sum(self._skips.values())} degenerate image(s) not charted"
        band = worst.band(worst.warn_limit if level != "alert" else worst.alert_limit)
        return DriftState(
            level=level,
            statistic=worst.name if self._images else None,
            value=charts[worst.name].value if self._images else None,
            band=band if self._images else None,
            images=self._images,
            message=message,
            charts=charts,
            skipped_images=sum(self._skips.values()),
            skip_reasons=dict(self._skips),
            last_skip=self._last_skip,
        )

    def _log_change(self, previous: Level, state: DriftState) -> None:
        log = logger.warning if LEVELS.index(state.level) > LEVELS.index(previous) else logger.info
        log("drift %s -> %s after %d images: %s", previous, state.level, state.images, state.message)

    def state(self) -> DriftState:
        """The current state without feeding an image."""
        with self._lock:
            return self._state()

    def history(self) -> list[dict[str, float]]:
        """The last `history` EWMA values per chart, in units of the reference scale (oldest first)."""
        with self._lock:
            return list(self._history)

    def reset(self) -> None:
        """Start the charts afresh (after cleaning the lens or changing the lamp)."""
        with self._lock:
            for chart in self._charts.values():
                chart.ewma, chart.last, chart.level = 0.0, float("nan"), "ok"
            self._history.clear()
            if self._level != "ok":
                logger.info("drift %s -> ok: monitor reset", self._level)
            self._level = "ok"
            self._calmer_run = 0
            self._images = 0
            self._skips.clear()
            self._last_skip = None


def _json_band(band: tuple[float, float] | None) -> list[float | None] | None:
    """A band for JSON: an open side (one-sided chart) is null."""
    return None if band is None else [value if math.isfinite(value) else None for value in band]


def _fmt(value: float) -> str:
    if not math.isfinite(value):
        return "-inf" if value < 0 else "inf"
    return f"{value:.4g}"

"""Drift monitor: cheap image statistics, a reference profile stored in the bundle, and EWMA charts.

NumPy + OpenCV only (no torch): it runs beside `Predictor` and inside the service.

* `image_statistics` measures one letterboxed uint8 image (about 0.3-0.5 ms at 640x640 gray).
* `build_reference` turns the statistics (and the bundle's pooled activations) of the validation
  images into a JSON profile; `defectdet export` stores it as `metadata.drift_reference`.
* `DriftMonitor` runs one EWMA chart per statistic, plus one on the activation score, with limits
  derived from a target in-control run length (see `ewma_limit` and docs/deploy.md).
"""

from __future__ import annotations

import functools
import logging
import math
import statistics
import threading
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import cv2
import numpy as np

from defectdet.errors import InputError

logger = logging.getLogger(__name__)

Level = Literal["ok", "warn", "alert"]
LEVELS: tuple[Level, ...] = ("ok", "warn", "alert")
REFERENCE_FORMAT = 1
STATISTICS = ("brightness", "contrast", "sharpness", "saturation", "detail", "acutance")
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
        "acutance": _acutance(image),
    }


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

    def to_dict(self) -> dict[str, Any]:
        return {
            "level": self.level,
            "statistic": self.statistic,
            "value": self.value,
            "band": _json_band(self.band),
            "images": self.images,
            "message": self.message,
            "charts": {name: chart.to_dict() for name, chart in self.charts.items()},
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

    Limits: a chart is in alert when |E_t| exceeds h_alert, the limit whose in-control average run length
    for N(0, 1) observations (Brook-Evans Markov chain, `ewma_limit`) is `alert_run_length` x the number
    of charts, so that the monitor as a whole raises a false alarm about once per `alert_run_length`
    images (charts taken as independent: a union bound); warn likewise with `warn_run_length`. The
    activation chart is one-sided (only a rise of the mean |z| is drift; E is reset at 0). Clipping lowers
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
        names = list(statistics) if statistics is not None else list(available)
        unknown = [name for name in names if name not in available and name != FEATURES]
        if unknown:
            raise ValueError(
                f"DriftMonitor: statistics {unknown} are not in the reference ({list(available)})"
            )
        if statistics is None and "saturation" in names:
            median = available["saturation"]["quantiles"].get("0.5", available["saturation"]["mean"])
            if median > BINARISED_SATURATION:
                names.remove("saturation")
                self.skipped["saturation"] = (
                    f"reference images are binarised ({median:.0%} of pixels at 0 or 255): "
                    "the share follows any exposure change and is not charted"
                )
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
        self._level: Level = "ok"
        self._lock = threading.Lock()
        self._history: deque[dict[str, float]] = deque(maxlen=history)

    def _make_chart(self, name: str, summary: Mapping[str, Any], two_sided: bool, charts: int) -> _Chart:
        floor = max(SCALE_FLOORS.get(name, 0.0), RELATIVE_SCALE_FLOOR * abs(float(summary["mean"])), 1e-12)
        warn = ewma_limit(self.lam, self.warn_run_length * charts, two_sided)
        alert = ewma_limit(self.lam, self.alert_run_length * charts, two_sided)
        return _Chart(name, _standardizer(summary, floor, self.transform), two_sided, warn, alert)

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
            }
            for name, chart in self._charts.items()
        }

    def update(self, image_stats: Mapping[str, float], features: np.ndarray | None = None) -> DriftState:
        """Feed one image's statistics (and pooled activations); returns the state after it."""
        observations = {name: float(image_stats[name]) for name in self._charts if name in image_stats}
        if FEATURES in self._charts and features is not None:
            vector = np.asarray(features, dtype=np.float64).reshape(-1)
            if vector.shape == self._feature_mean.shape and np.isfinite(vector).all():
                observations[FEATURES] = float(feature_score(vector, self._feature_mean, self._feature_std))
        with self._lock:
            self._images += 1
            for name, value in observations.items():
                if math.isfinite(value):
                    self._observe(self._charts[name], value)
            self._history.append({name: chart.ewma for name, chart in self._charts.items()})
            state = self._state()
            if state.level != self._level:
                self._log_change(self._level, state)
                self._level = state.level
        return state

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
        band = worst.band(worst.warn_limit if level != "alert" else worst.alert_limit)
        return DriftState(
            level=level,
            statistic=worst.name if self._images else None,
            value=charts[worst.name].value if self._images else None,
            band=band if self._images else None,
            images=self._images,
            message=message,
            charts=charts,
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
            self._images = 0


def _json_band(band: tuple[float, float] | None) -> list[float | None] | None:
    """A band for JSON: an open side (one-sided chart) is null."""
    return None if band is None else [value if math.isfinite(value) else None for value in band]


def _fmt(value: float) -> str:
    if not math.isfinite(value):
        return "-inf" if value < 0 else "inf"
    return f"{value:.4g}"

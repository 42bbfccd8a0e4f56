"""Drift monitor: image statistics, reference profile, EWMA limits and the alert / no-alert behaviour."""

from __future__ import annotations

import json
import time

import cv2
import numpy as np
import pytest

from defectdet.deploy.monitor import STATISTICS, build_reference, image_statistics
from defectdet.errors import InputError


def _board(rng: np.random.Generator, size: int = 640) -> np.ndarray:
    """A synthetic near-binary 'board': dark background, bright random rectangles, a little noise."""
    image = np.full((size, size), 30, np.uint8)
    for _ in range(40):
        x, y = rng.integers(0, size - 40, 2)
        w, h = rng.integers(10, 120, 2)
        image[y : y + h, x : x + w] = 220
    noise = rng.normal(0, 4, image.shape)
    return np.clip(image + noise, 0, 255).astype(np.uint8)


def test_image_statistics_values() -> None:
    flat = np.full((64, 64), 100, np.uint8)
    stats = image_statistics(flat)
    assert set(stats) == set(STATISTICS)
    assert stats["brightness"] == pytest.approx(100)
    assert stats["contrast"] == pytest.approx(0)
    assert stats["sharpness"] == pytest.approx(0)
    assert stats["saturation"] == 0
    half = np.zeros((64, 64), np.uint8)
    half[:, 32:] = 255
    stats = image_statistics(half)
    assert stats["brightness"] == pytest.approx(127.5)
    assert stats["contrast"] == pytest.approx(127.5)
    assert stats["saturation"] == 1.0
    assert stats["sharpness"] > 0 and stats["detail"] > 0


def test_image_statistics_respond_to_faults() -> None:
    image = _board(np.random.default_rng(0))
    base = image_statistics(image)
    blurred = image_statistics(cv2.GaussianBlur(image, (0, 0), 2))
    assert blurred["sharpness"] < 0.2 * base["sharpness"]
    low = image_statistics(((image.astype(np.float32) - 128) * 0.5 + 128).astype(np.uint8))
    assert low["contrast"] == pytest.approx(0.5 * base["contrast"], rel=0.02)
    dark = image_statistics((image * 0.7).astype(np.uint8))
    assert dark["brightness"] == pytest.approx(0.7 * base["brightness"], rel=0.02)


def test_image_statistics_rgb_and_bad_input() -> None:
    gray = _board(np.random.default_rng(1), 128)
    rgb = np.repeat(gray[:, :, None], 3, axis=2)
    assert image_statistics(rgb)["brightness"] == pytest.approx(image_statistics(gray)["brightness"], abs=0.5)
    assert image_statistics(gray[:, :, None]) == image_statistics(gray)
    assert image_statistics(gray[::2, ::2])["brightness"] > 0  # non-contiguous view
    with pytest.raises(InputError, match="uint8"):
        image_statistics(gray.astype(np.float32))
    with pytest.raises(InputError, match="shape"):
        image_statistics(np.zeros((0, 5), np.uint8))


def test_image_statistics_is_cheap() -> None:
    image = _board(np.random.default_rng(2))
    image_statistics(image)
    timings = []
    for _ in range(30):
        start = time.perf_counter()
        image_statistics(image)
        timings.append(time.perf_counter() - start)
    # ~0.4 ms on an idle core; a generous bound for a shared CI box
    assert sorted(timings)[len(timings) // 2] < 3e-3


def test_build_reference_is_json_and_correct() -> None:
    rng = np.random.default_rng(3)
    stats = [image_statistics(_board(rng, 128)) for _ in range(20)]
    features = rng.normal(2.0, 0.5, (20, 8)).astype(np.float32)
    features[:, 3] = 1.0  # a dead channel
    reference = build_reference(stats, features)
    round_trip = json.loads(json.dumps(reference))
    assert round_trip == reference
    brightness = np.array([row["brightness"] for row in stats])
    assert reference["images"] == 20
    assert reference["statistics"]["brightness"]["mean"] == pytest.approx(brightness.mean())
    assert reference["statistics"]["brightness"]["std"] == pytest.approx(brightness.std(ddof=1))
    assert reference["statistics"]["brightness"]["quantiles"]["0.5"] == pytest.approx(np.median(brightness))
    assert reference["features"]["channels"] == 8
    assert reference["features"]["std"][3] == 0
    assert 0.3 < reference["features"]["score"]["mean"] < 1.5  # mean |z| of normal data is ~0.8
    assert build_reference(stats, None)["features"] is None
    with pytest.raises(ValueError, match="features"):
        build_reference(stats, features[:5])
    with pytest.raises(ValueError, match="at least one"):
        build_reference([], None)

"""Pair registration: recovers known motions, is bounded, and stays torch-free."""

from __future__ import annotations

import subprocess
import sys

import cv2
import numpy as np
import pytest

from defectdet.data.registration import (
    Registration,
    RegistrationSettings,
    motion_matrix,
    register_pair,
    warp_to,
)


def board(size: int = 640, seed: int = 0) -> np.ndarray:
    """A binary PCB-like pattern: traces, pads and holes on a dark substrate."""
    rng = np.random.default_rng(seed)
    image = np.full((size, size), 30, np.uint8)
    for _ in range(60):
        x1, y1 = rng.integers(0, size, 2)
        if rng.random() < 0.5:
            x2, y2 = int(rng.integers(0, size)), int(y1)
        else:
            x2, y2 = int(x1), int(rng.integers(0, size))
        cv2.line(image, (int(x1), int(y1)), (x2, y2), 220, int(rng.integers(3, 9)))
    for _ in range(40):
        centre = tuple(int(v) for v in rng.integers(10, size - 10, 2))
        cv2.circle(image, centre, int(rng.integers(6, 14)), 220, -1)
        cv2.circle(image, centre, 3, 30, -1)
    return image


def test_recovers_shift_and_rotation() -> None:
    template = board()
    tested = warp_to(template, motion_matrix(2.3, -1.7, 0.4, 640, 640))
    noise = np.random.default_rng(1).normal(0, 3, tested.shape)
    tested = np.clip(tested + noise, 0, 255).astype(np.uint8)
    aligned, registration = register_pair(tested, template)
    assert registration.applied
    assert abs(registration.dx - 2.3) < 0.2 and abs(registration.dy + 1.7) < 0.2
    assert abs(registration.angle_deg - 0.4) < 0.1
    assert registration.correlation > 0.9 and registration.ms > 0
    before = np.abs(template.astype(np.int16) - tested).mean()
    after = np.abs(aligned.astype(np.int16) - tested).mean()
    assert after < 0.25 * before


@pytest.mark.parametrize("method", ["gauss_newton", "opencv_ecc"])
def test_translation_only(method: str) -> None:
    template = board(seed=3)
    tested = warp_to(template, motion_matrix(-1.6, 0.7, 0.0, 640, 640))
    _, registration = register_pair(tested, template, RegistrationSettings(rotation=False, method=method))
    assert registration.angle_deg == 0.0
    assert abs(registration.dx + 1.6) < 0.2 and abs(registration.dy - 0.7) < 0.2


def test_identical_pair_is_left_alone() -> None:
    template = board(seed=4)
    aligned, registration = register_pair(template.copy(), template)
    assert aligned is template and not registration.applied
    assert registration.shift < 0.05 and abs(registration.angle_deg) < 0.01


def test_bounded_motion_and_blank_images() -> None:
    template = board(seed=5)
    tested = warp_to(template, motion_matrix(14.0, 0.0, 0.0, 640, 640))
    aligned, registration = register_pair(tested, template, RegistrationSettings(max_shift=8.0))
    assert aligned is template and not registration.applied
    blank = np.zeros((64, 80), np.uint8)
    aligned, registration = register_pair(blank, blank)
    assert aligned is blank and not registration.applied


def test_rgb_non_square_and_errors() -> None:
    template = cv2.cvtColor(board(seed=6)[:480], cv2.COLOR_GRAY2RGB)  # 640x480
    tested = warp_to(template, motion_matrix(1.2, 1.9, -0.3, 640, 480))
    aligned, registration = register_pair(tested, template)
    assert aligned.shape == template.shape
    assert abs(registration.dx - 1.2) < 0.2 and abs(registration.dy - 1.9) < 0.2
    assert abs(registration.angle_deg + 0.3) < 0.1
    assert isinstance(Registration.identity(), Registration)
    with pytest.raises(ValueError, match="template is"):
        register_pair(tested, template[:100])
    with pytest.raises(ValueError, match="method"):
        RegistrationSettings(method="sift")


def test_module_does_not_import_torch() -> None:
    code = "import sys, defectdet.data.registration; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)

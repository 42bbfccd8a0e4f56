"""Companion captures: aligned extra planes of each image, read, augmented and stacked with it."""

from __future__ import annotations

from pathlib import Path

from companion_data import COMPANION, make_companion_dataset


def test_companion_dataset_is_aligned_and_differs(tmp_path: Path) -> None:
    import cv2

    yaml_path = make_companion_dataset(tmp_path)
    image = cv2.imread(str(tmp_path / "images" / "train" / "train_000.png"), cv2.IMREAD_GRAYSCALE)
    companion = cv2.imread(str(tmp_path / COMPANION / "train_000.png"), cv2.IMREAD_GRAYSCALE)
    assert yaml_path.is_file() and image.shape == companion.shape == (96, 96)
    assert abs(float(image.mean()) - float(companion.mean())) > 10

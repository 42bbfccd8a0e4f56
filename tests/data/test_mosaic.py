"""Mosaic items: four images tiled, planes kept aligned, boxes following their pixels."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest

from defectdet.data.formats import load_dataset
from defectdet.trainingdata.augment import AugmentConfig
from defectdet.trainingdata.dataset import DetectionDataset, Draws, ItemLayout
from defectdet.trainingdata.mosaic import Planes, mosaic_origin, tile_window

SIDE = 64
MARK = 250  # the defect's gray level; each image's background is its own level


def _part(level: int, box: tuple[float, float, float, float]) -> Planes:
    image = np.full((SIDE, SIDE), level, np.uint8)
    x0, y0, x1, y1 = (int(v) for v in box)
    image[y0:y1, x0:x1] = MARK
    boxes = np.array([box], np.float32)
    return Planes(image, None, [255 - image], boxes, np.array([level // 10], np.int64))


def test_tile_window_places_each_image_and_its_boxes() -> None:
    parts = [_part(10 * (i + 1), (4, 4, 20, 20)) for i in range(3)] + [_part(40, (20, 20, 36, 36))]
    tiled = tile_window(parts, SIDE, (32, 32), min_visibility=0.4)  # the window spans canvas pixels 32..96
    # the window's corners come from the four images in canvas order
    corners = [tiled.image[1, 1], tiled.image[1, 40], tiled.image[40, 1], tiled.image[40, 40]]
    assert corners == [10, 20, 30, 40]
    np.testing.assert_array_equal(tiled.companions[0], 255 - tiled.image)
    # the first three boxes lie outside the window; the fourth image's box (canvas 84..100) is cut at 96
    assert tiled.classes.tolist() == [4]
    np.testing.assert_array_equal(tiled.boxes, [[52, 52, 64, 64]])
    assert (tiled.image[52:64, 52:64] == MARK).all()


def test_tile_window_drops_a_box_that_barely_shows_and_checks_its_input() -> None:
    parts = [_part(10, (50, 50, 60, 60))] + [_part(20 + 10 * i, (0, 0, 1, 1)) for i in range(3)]
    tiled = tile_window(parts, SIDE, (58, 58), min_visibility=0.4)  # 2 x 2 px of the first 10 x 10 box show
    assert tiled.classes.tolist() == [4]  # only the fourth image's corner box is inside the window
    small = Planes(np.zeros((8, 8), np.uint8), None, [], parts[0].boxes, parts[0].classes)
    with pytest.raises(ValueError, match="every mosaic plane must be 64x64"):
        tile_window([*parts[:3], small], SIDE, (0, 0), 0.4)
    with pytest.raises(ValueError, match="a mosaic tiles 4 images"):
        tile_window(parts[:3], SIDE, (0, 0), 0.4)
    origins = {mosaic_origin(SIDE, np.random.default_rng(seed)) for seed in range(50)}
    assert all(16 <= x <= 48 and 16 <= y <= 48 for x, y in origins) and len(origins) > 10


def _write_dataset(root: Path, images: int = 6) -> Path:
    """Gray images of one background level each with one bright square, and their inverse as companion `L2`."""
    rng = np.random.default_rng(0)
    for folder in ("images/train", "labels/train", "L2"):
        (root / folder).mkdir(parents=True, exist_ok=True)
    for index in range(images):
        image = np.full((SIDE, SIDE), 20 + 30 * index, np.uint8)
        x0, y0 = (int(v) for v in rng.integers(4, SIDE - 20, 2))
        image[y0 : y0 + 14, x0 : x0 + 14] = MARK
        cv2.imwrite(str(root / "images/train" / f"p{index}.png"), image)
        cv2.imwrite(str(root / "L2" / f"p{index}.png"), 255 - image)
        centre_x, centre_y = (x0 + 7) / SIDE, (y0 + 7) / SIDE
        (root / "labels/train" / f"p{index}.txt").write_text(
            f"0 {centre_x} {centre_y} {14 / SIDE} {14 / SIDE}\n"
        )
    (root / "data.yaml").write_text("path: .\ntrain: images/train\nnames: [square]\ncompanions:\n  L2: L2\n")
    return root / "data.yaml"


def test_dataset_mosaic_items_keep_planes_aligned_and_boxes_on_their_defects(tmp_path: Path) -> None:
    split = load_dataset(_write_dataset(tmp_path), "train")
    still = AugmentConfig(  # flips only: nothing moves a plane against another or fills a border
        rotate_degrees=0, scale=(1, 1), translate=0, pair_jitter_prob=0, brightness_contrast_prob=0,
        gamma_prob=0, blur_prob=0, noise_prob=0, glare_prob=0, mosaic_prob=1.0,
    )  # fmt: skip
    dataset = DetectionDataset(
        split, ItemLayout(input_size=SIDE, companions=["L2"]), Draws(augment=still, train=True, seed=3)
    )
    levels_seen = set()
    for index in range(len(dataset)):
        tensor, target, _ = dataset[index]
        image, companion = (tensor.numpy() * 255).round().astype(np.int64)
        np.testing.assert_array_equal(companion, 255 - image)
        levels = set(np.unique(image).tolist()) - {MARK}
        assert len(levels) >= 2  # parts of several images in one item
        levels_seen |= levels
        for _, x0, y0, x1, y1 in target.numpy():
            assert image[int(np.ceil(y0)) : int(y1), int(np.ceil(x0)) : int(x1)].min() == MARK
    assert len(levels_seen) >= 4
    # crops and validation never tile
    plain = DetectionDataset(
        split, ItemLayout(input_size=SIDE, companions=["L2"]), Draws(augment=still, train=True, crop_size=32)
    )
    assert plain.mosaic_prob == 0.0
    assert (
        DetectionDataset(
            split, ItemLayout(input_size=SIDE, companions=["L2"]), Draws(augment=still, train=False)
        ).mosaic_prob
        == 0.0
    )

"""Augmentation keeps boxes on their objects, the template aligned, and border boxes handled by visibility."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from defectdet.trainingdata.augment import AugmentConfig, build_augment, clip_boxes_to_window

GEOMETRY_ONLY = {
    "brightness_contrast_prob": 0.0,
    "gamma_prob": 0.0,
    "blur_prob": 0.0,
    "noise_prob": 0.0,
    "glare_prob": 0.0,
    "pair_jitter_prob": 0.0,  # the shared geometry only: no relative template jitter
}
NO_GEOMETRY = {
    "rotate_degrees": 0.0,
    "scale": (1.0, 1.0),
    "translate": 0.0,
    "horizontal_flip": 0.0,
    "vertical_flip": 0.0,
}


def square_image(
    size: int = 128, box: tuple[int, int, int, int] = (40, 50, 70, 76), rgb: bool = False
) -> np.ndarray:
    image = np.zeros((size, size), dtype=np.uint8)
    x1, y1, x2, y2 = box
    image[y1:y2, x1:x2] = 255
    return np.repeat(image[:, :, None], 3, axis=2) if rgb else image


def bright_bbox(image: np.ndarray, threshold: int = 128) -> np.ndarray | None:
    gray = image if image.ndim == 2 else image.max(axis=2)
    ys, xs = np.nonzero(gray > threshold)
    if len(xs) == 0:
        return None
    return np.array([xs.min(), ys.min(), xs.max() + 1, ys.max() + 1], dtype=np.float32)


def iou(a: np.ndarray, b: np.ndarray) -> float:
    width = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    height = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = width * height
    return inter / ((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter)


@pytest.mark.parametrize("rgb", [False, True])
def test_box_follows_the_square_through_geometry(rgb: bool) -> None:
    box = (40, 50, 70, 76)
    image = square_image(box=box, rgb=rgb)
    config = AugmentConfig(rotate_degrees=10, scale=(0.8, 1.2), translate=0.1, **GEOMETRY_ONLY)
    augmenter = build_augment(config, train=True, seed=3)
    moved = 0
    for _ in range(60):
        out_image, _, boxes, classes = augmenter(
            image, None, np.array([box], dtype=np.float32), np.array([2])
        )
        assert out_image.shape == image.shape and out_image.dtype == np.uint8
        assert boxes.dtype == np.float32 and classes.dtype == np.int64
        assert boxes.shape == (1, 4) and classes.tolist() == [2]  # the square stays well inside the frame
        truth = bright_bbox(out_image)
        assert truth is not None
        returned = boxes[0]
        assert (truth[:2] >= returned[:2] - 2).all() and (truth[2:] <= returned[2:] + 2).all(), (
            truth,
            returned,
        )
        assert iou(truth, returned) > 0.75, (truth, returned)
        moved += not np.allclose(returned, box, atol=1)
    assert moved > 50  # the transform really changed things


def test_template_geometry_is_identical_without_photometric() -> None:
    rng = np.random.default_rng(0)
    image = (rng.random((96, 112)) * 255).astype(np.uint8)
    augmenter = build_augment(AugmentConfig(rotate_degrees=8, translate=0.1, **GEOMETRY_ONLY), seed=1)
    for _ in range(10):
        out_image, out_template, _, _ = augmenter(image, image.copy(), np.zeros((0, 4)), np.zeros(0))
        assert out_template is not None
        assert np.array_equal(out_image, out_template)
        assert not np.array_equal(out_image, image)


@pytest.mark.parametrize("rgb", [False, True])
def test_template_stays_aligned_with_photometric_on(rgb: bool) -> None:
    image = square_image(box=(30, 60, 50, 90), rgb=rgb)
    config = AugmentConfig(
        rotate_degrees=8,
        fill_value=0,
        brightness_contrast_prob=1.0,
        gamma_prob=1.0,
        noise_prob=1.0,
        noise_std=(2, 4),
        glare_prob=0.0,
        pair_jitter_prob=0.0,
    )
    augmenter = build_augment(config, seed=7)
    differed = 0
    for _ in range(20):
        out_image, out_template, _, _ = augmenter(image, image.copy(), np.zeros((0, 4)), np.zeros(0))
        assert out_template is not None and out_template.shape == image.shape
        differed += not np.array_equal(out_image, out_template)  # exposures differ...
        # ...but the square sits at the same place in both
        image_box, template_box = bright_bbox(out_image, 100), bright_bbox(out_template, 100)
        assert image_box is not None and template_box is not None
        assert np.abs(image_box - template_box).max() <= 1
    assert differed == 20


def test_glare_brightens_only_the_tested_image() -> None:
    image = np.full((64, 64), 40, dtype=np.uint8)
    config = AugmentConfig(**NO_GEOMETRY, **{**GEOMETRY_ONLY, "glare_prob": 1.0})
    out_image, out_template, _, _ = build_augment(config, seed=0)(
        image, image.copy(), np.zeros((0, 4)), np.zeros(0)
    )
    assert out_template is not None and np.array_equal(out_template, image)
    assert out_image.max() > 80 and (out_image >= image).all()  # additive, never darkens


def test_border_boxes_clipped_or_dropped_by_visibility() -> None:
    image = np.zeros((100, 100), dtype=np.uint8)
    boxes = np.array([[80, 10, 120, 30], [90, 40, 130, 60], [-5, 70, 15, 90]], dtype=np.float32)
    classes = np.array([0, 1, 2])
    kept, kept_classes = clip_boxes_to_window(boxes, classes, (0, 0, 100, 100), min_visibility=0.4)
    # box 0: 50% visible -> clipped; box 1: 25% -> dropped; box 2: 75% -> clipped
    assert kept_classes.tolist() == [0, 2]
    np.testing.assert_allclose(kept, [[80, 10, 100, 30], [0, 70, 15, 90]])
    # labels that stick out of the image before augmentation are clipped, not judged by visibility
    config = AugmentConfig(**NO_GEOMETRY, **GEOMETRY_ONLY, min_visibility=0.4)
    _, _, out_boxes, out_classes = build_augment(config, seed=0)(image, None, boxes, classes)
    # inputs outside the image are clipped first, then judged against the clipped box: all stay
    assert out_classes.tolist() == [0, 1, 2]
    assert out_boxes.min() >= 0 and out_boxes.max() <= 100


def test_augmenter_drops_boxes_pushed_out_by_translation() -> None:
    image = np.zeros((100, 100), dtype=np.uint8)
    near_edge = np.array([[2, 40, 12, 50], [45, 45, 55, 55]], dtype=np.float32)
    config = AugmentConfig(
        rotate_degrees=0, scale=(1.0, 1.0), translate=0.1, horizontal_flip=0, vertical_flip=0, **GEOMETRY_ONLY
    )
    augmenter = build_augment(config, seed=0)
    seen_drop = False
    for _ in range(40):
        _, _, boxes, classes = augmenter(image, None, near_edge, np.array([0, 1]))
        assert 1 in classes.tolist()  # the centre box can never leave
        assert boxes.min() >= 0 and boxes.max() <= 100
        widths = boxes[:, 2] - boxes[:, 0]
        assert (widths >= 0.4 * 10 - 1e-3).all()  # nothing below min_visibility survives
        seen_drop |= 0 not in classes.tolist()
    assert seen_drop


def test_no_boxes_and_disabled_and_eval_pass_through() -> None:
    image = square_image()
    for augmenter in (
        build_augment(AugmentConfig(enabled=False)),
        build_augment(AugmentConfig(), train=False),
    ):
        out_image, out_template, boxes, classes = augmenter(image, None, [[1, 2, 3, 4]], [5])
        assert out_image is image and out_template is None
        assert boxes.dtype == np.float32 and boxes.shape == (1, 4) and classes.dtype == np.int64
    _, _, boxes, classes = build_augment(AugmentConfig())(image, image, np.zeros((0, 4)), np.zeros(0))
    assert boxes.shape == (0, 4) and classes.shape == (0,)


def test_reseed_repeats_and_seeds_differ() -> None:
    image = (np.random.default_rng(1).random((64, 64)) * 255).astype(np.uint8)
    first = build_augment(AugmentConfig(), seed=5)
    second = build_augment(AugmentConfig(), seed=5)
    other = build_augment(AugmentConfig(), seed=6)
    outputs = [
        [a(image, image, np.zeros((0, 4)), np.zeros(0))[0] for _ in range(5)] for a in (first, second, other)
    ]
    assert all(np.array_equal(x, y) for x, y in zip(outputs[0], outputs[1], strict=True))
    assert not all(np.array_equal(x, y) for x, y in zip(outputs[0], outputs[2], strict=True))
    first.reseed(5)
    assert np.array_equal(first(image, image, np.zeros((0, 4)), np.zeros(0))[0], outputs[0][0])


def test_config_rejects_unknown_keys_and_bad_ranges() -> None:
    with pytest.raises(ValidationError, match="rotate"):
        AugmentConfig(rotate=5)  # type: ignore[call-arg]
    with pytest.raises(ValidationError):
        AugmentConfig(scale=(1.2, 0.9))
    with pytest.raises(ValidationError):
        AugmentConfig(glare_prob=1.5)


@pytest.mark.parametrize("rgb", [False, True])
def test_flips_are_exact_on_pixels_and_boxes(rgb: bool) -> None:
    image = (np.random.default_rng(2).random((40, 56, 3) if rgb else (40, 56)) * 255).astype(np.uint8)
    box = np.array([[3, 5, 20, 11]], dtype=np.float32)
    config = AugmentConfig(**{**NO_GEOMETRY, "horizontal_flip": 1.0, "vertical_flip": 1.0}, **GEOMETRY_ONLY)
    out_image, out_template, boxes, _ = build_augment(config)(image, image.copy(), box, [0])
    flipped = image[::-1, ::-1]
    assert np.array_equal(out_image, flipped) and np.array_equal(out_template, flipped)
    np.testing.assert_allclose(boxes, [[56 - 20, 40 - 11, 56 - 3, 40 - 5]], atol=1e-4)


def test_pair_jitter_moves_only_the_template_within_bounds() -> None:
    from defectdet.data.registration import RegistrationSettings, register_pair

    rng = np.random.default_rng(3)
    image = np.zeros((160, 160), np.uint8)
    for _ in range(25):  # a textured board so the relative motion is measurable
        x, y = rng.integers(5, 140, 2)
        image[y : y + int(rng.integers(4, 15)), x : x + int(rng.integers(4, 15))] = 220
    config = AugmentConfig(
        **NO_GEOMETRY, **{**GEOMETRY_ONLY, "pair_jitter_prob": 1.0}, pair_shift=2.0, pair_rotate_degrees=0.3
    )
    augmenter = build_augment(config, seed=2)
    shifts = []
    for _ in range(8):
        out_image, out_template, _, _ = augmenter(image, image.copy(), np.zeros((0, 4)), np.zeros(0))
        assert np.array_equal(out_image, image)  # the tested image is untouched
        assert out_template is not None and not np.array_equal(out_template, image)
        _, found = register_pair(out_template, image, RegistrationSettings(min_correction=0.0))
        assert abs(found.dx) <= 2.0 + 0.3 and abs(found.dy) <= 2.0 + 0.3 and abs(found.angle_deg) <= 0.4
        shifts.append(found.shift)
    assert max(shifts) > 0.5  # it does move
    still = build_augment(AugmentConfig(**NO_GEOMETRY, **GEOMETRY_ONLY), seed=2)
    out_image, out_template, _, _ = still(image, image.copy(), np.zeros((0, 4)), np.zeros(0))
    assert np.array_equal(out_image, out_template)

"""Letterbox: aspect kept, content centred, per-axis exact scales, and the box mapping inverts exactly."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from defectdet.data.letterbox import (
    boxes_from_letterbox,
    boxes_to_letterbox,
    compute_letterbox,
    letterbox_image,
)

sizes = st.integers(min_value=8, max_value=4096)


@settings(max_examples=300, deadline=None)
@given(width=sizes, height=sizes, size=st.sampled_from([32, 320, 416, 640, 1024]), data=st.data())
def test_box_round_trip_is_exact(width: int, height: int, size: int, data: st.DataObject) -> None:
    transform = compute_letterbox(width, height, size)
    x1 = data.draw(st.floats(0, width - 1))
    y1 = data.draw(st.floats(0, height - 1))
    x2 = data.draw(st.floats(x1, width))
    y2 = data.draw(st.floats(y1, height))
    boxes = np.array([[x1, y1, x2, y2]], dtype=np.float32)
    forward = boxes_to_letterbox(boxes, transform)
    back = boxes_from_letterbox(forward, transform)
    assert np.abs(back - boxes).max() < 0.5
    # forward boxes stay inside the canvas
    assert forward.min() >= -1e-3 and forward.max() <= size + 1e-3


@settings(max_examples=100, deadline=None)
@given(width=sizes, height=sizes, size=st.sampled_from([64, 320, 640]))
def test_scale_keeps_aspect_and_fits(width: int, height: int, size: int) -> None:
    transform = compute_letterbox(width, height, size)
    new_w, new_h = width * transform.scale_x, height * transform.scale_y
    assert (new_w, new_h) == pytest.approx((transform.resized_width, transform.resized_height))
    assert max(transform.resized_width, transform.resized_height) == size
    # each side is its aspect-true length rounded to a whole pixel (at least 1)
    assert abs(transform.resized_width - width * transform.scale) <= 0.5 or transform.resized_width == 1
    assert abs(transform.resized_height - height * transform.scale) <= 0.5 or transform.resized_height == 1
    assert transform.pad_x >= 0 and transform.pad_y >= 0


def test_letterbox_image_places_content_where_boxes_say() -> None:
    image = np.zeros((300, 600), dtype=np.uint8)
    image[100:150, 200:260] = 255  # a bright rectangle: box (200,100)-(260,150)
    canvas, transform = letterbox_image(image, 320)
    assert canvas.shape == (320, 320)
    assert transform.pad_x == 0 and transform.pad_y == 80
    x1, y1, x2, y2 = boxes_to_letterbox(np.array([[200, 100, 260, 150]]), transform)[0]
    ys, xs = np.nonzero(canvas > 200)
    assert abs(xs.min() - x1) <= 1 and abs(xs.max() + 1 - x2) <= 1
    assert abs(ys.min() - y1) <= 1 and abs(ys.max() + 1 - y2) <= 1
    assert (canvas[:80] == 114).all() and (canvas[-80:] == 114).all()


def test_letterbox_color_and_16bit_keep_dtype_and_channels() -> None:
    color = np.random.default_rng(0).integers(0, 255, (248, 373, 3), dtype=np.uint8)
    canvas, _ = letterbox_image(color, 640)
    assert canvas.shape == (640, 640, 3) and canvas.dtype == np.uint8
    deep = np.full((100, 50), 4000, dtype=np.uint16)
    canvas16, _ = letterbox_image(deep, 64)
    assert canvas16.dtype == np.uint16 and canvas16.max() == 4000


def test_inverse_clips_to_original_image() -> None:
    transform = compute_letterbox(200, 100, 100)
    back = boxes_from_letterbox(np.array([[-10, -10, 200, 200]]), transform)
    assert back.min() >= 0 and back[0, 2] <= 200 and back[0, 3] <= 100


# --- letterbox_image itself: pixels land where the box mapping says -----------------------------------

# one axis may be far longer than the other, down to a 1-pixel strip after resizing
image_sides = st.integers(min_value=1, max_value=1200)


@settings(max_examples=150, deadline=None)
@given(width=image_sides, height=image_sides, size=st.integers(16, 256), data=st.data())
def test_drawn_box_lands_where_boxes_to_letterbox_says(
    width: int, height: int, size: int, data: st.DataObject
) -> None:
    transform = compute_letterbox(width, height, size)
    # a box of at least 2 canvas pixels and 2 image pixels on each side: then some resized pixel lies wholly
    # inside it (area averaging) or samples between two of its pixels (bilinear), so the box's extent
    # is set by full-intensity pixels, not by a thin line's attenuated corners
    min_w = min(width, max(2, int(np.ceil(2 / transform.scale_x))))
    min_h = min(height, max(2, int(np.ceil(2 / transform.scale_y))))
    x1 = data.draw(st.integers(0, width - min_w), label="x1")
    y1 = data.draw(st.integers(0, height - min_h), label="y1")
    x2 = data.draw(st.integers(x1 + min_w, width), label="x2")
    y2 = data.draw(st.integers(y1 + min_h, height), label="y2")
    image = np.zeros((height, width), dtype=np.uint8)
    image[y1:y2, x1:x2] = 255

    canvas, returned = letterbox_image(image, size)
    assert returned == transform and canvas.shape == (size, size)
    # the content fills exactly its rectangle; the padding keeps its value
    content = np.zeros((size, size), dtype=bool)
    content[
        int(transform.pad_y) : int(transform.pad_y) + transform.resized_height,
        int(transform.pad_x) : int(transform.pad_x) + transform.resized_width,
    ] = True
    assert (canvas[~content] == 114).all()
    assert transform.resized_width == size or transform.resized_height == size

    bright = canvas > 127  # a resized pixel is bright when the box covers more than half of it
    ys, xs = np.nonzero(bright & content)
    assert len(xs), "the box vanished"
    expected = boxes_to_letterbox(np.array([[x1, y1, x2, y2]]), transform)[0]
    found = np.array([xs.min(), ys.min(), xs.max() + 1, ys.max() + 1], dtype=np.float64)
    # area averaging / bilinear put the half-covered pixel edge within half a pixel of the true edge
    assert np.abs(found - expected).max() <= 0.5 + 1e-3, (found, expected)
    # and back: the found pixels map to the drawn box within half a canvas pixel on each axis
    back = boxes_from_letterbox(found[None], transform)[0]
    tolerance = 0.5 / np.array([transform.scale_x, transform.scale_y] * 2) + 1e-3
    assert (np.abs(back - np.array([x1, y1, x2, y2])) <= tolerance).all()


@pytest.mark.parametrize(("width", "height"), [(20000, 3), (3, 20000), (100000, 1), (1, 1), (640, 1)])
def test_extreme_aspect_ratio_keeps_a_one_pixel_strip(width: int, height: int) -> None:
    image = np.full((height, width), 200, dtype=np.uint8)
    canvas, transform = letterbox_image(image, 64)
    assert canvas.shape == (64, 64)
    assert min(transform.resized_width, transform.resized_height) >= 1
    assert max(transform.resized_width, transform.resized_height) == 64
    assert (canvas == 200).sum() == transform.resized_width * transform.resized_height
    whole = boxes_to_letterbox(np.array([[0, 0, width, height]]), transform)[0]
    np.testing.assert_allclose(
        whole,
        [
            transform.pad_x,
            transform.pad_y,
            transform.pad_x + transform.resized_width,
            transform.pad_y + transform.resized_height,
        ],
        atol=1e-4,
    )


def test_rounded_axis_uses_its_own_scale() -> None:
    # 96x64 into 64: width 64 (scale 2/3), height 42.67 -> 43 px, so the y scale is 43/64, not 2/3
    transform = compute_letterbox(96, 64, 64)
    assert (transform.resized_width, transform.resized_height) == (64, 43)
    assert transform.scale_x == pytest.approx(2 / 3) and transform.scale_y == pytest.approx(43 / 64)
    assert transform.scale == pytest.approx(2 / 3)
    bottom = boxes_to_letterbox(np.array([[0, 0, 96, 64]]), transform)[0]
    assert bottom[3] == pytest.approx(transform.pad_y + 43)


def test_single_channel_trailing_axis_is_kept() -> None:
    canvas, _ = letterbox_image(np.zeros((30, 50, 1), dtype=np.uint8), 40)
    assert canvas.shape == (40, 40, 1)

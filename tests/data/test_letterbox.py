"""Letterbox: aspect kept, content centred, and the box mapping inverts exactly."""

from __future__ import annotations

import numpy as np
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
    new_w, new_h = width * transform.scale, height * transform.scale
    assert max(new_w, new_h) <= size + 1e-6
    assert max(new_w, new_h) >= size - 1
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

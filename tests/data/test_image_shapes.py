"""Images whose memory is out of proportion to their pixel count: extreme aspect ratios refused from the header,
and the Pillow fallback held to the bytes OpenCV would allocate."""

from __future__ import annotations

import cv2
import numpy as np
import pytest
from image_files import png

from defectdet.data import imageio
from defectdet.data.imageio import MAX_ASPECT_RATIO, decode_image
from defectdet.errors import ImageReadError, ImageTooLargeError


def test_a_twenty_million_by_one_png_is_refused_from_its_header() -> None:
    data = png(20_000_000, 1, color=True)
    assert len(data) < 60_000  # a small upload that decodes to 20 million pixels
    with pytest.raises(ImageReadError, match=r"upload\.png: image is 20000000x1 pixels, an aspect ratio of"):
        decode_image(data, "upload.png", 1, max_pixels=25_000_000)
    with pytest.raises(ImageReadError, match=f"at most {MAX_ASPECT_RATIO}:1"):
        decode_image(png(1, 5_000), "tall.png", 3)  # 5000:1


def test_long_strips_up_to_the_ratio_decode() -> None:
    assert decode_image(png(1000 * 2, 2), "strip.png", 1).shape == (2, 2000)
    assert decode_image(png(2, 1000 * 2, color=True), "strip.png", 3).shape == (2000, 2, 3)
    assert decode_image(png(700, 1), "line.png", 1).shape == (1, 700)


def test_the_pillow_fallback_is_held_to_the_bytes_opencv_would_take(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(imageio.cv2, "imdecode", lambda *args: None)  # every decode falls back to Pillow
    # RGB takes 4 bytes a pixel in Pillow: 1000 x 1000 RGB is 4 MB, over 3 x 1,200,000
    with pytest.raises(ImageTooLargeError, match=r"rgb\.png: decoding this 1000x1000 RGB image takes 4 MiB"):
        decode_image(png(1000, 1000, color=True), "rgb.png", 1, max_pixels=1_200_000)
    gray = decode_image(png(1000, 1000), "gray.png", 1, max_pixels=1_200_000)  # 1 byte a pixel
    assert gray.shape == (1000, 1000) and gray.dtype == np.uint8
    small = decode_image(png(500, 500, color=True), "small.png", 3, max_pixels=1_200_000)
    assert small.shape == (500, 500, 3)


def test_opencv_decodes_an_ordinary_image_unchanged() -> None:
    image = np.arange(64 * 48, dtype=np.uint8).reshape(48, 64)
    ok, encoded = cv2.imencode(".png", image)
    assert ok
    assert np.array_equal(decode_image(encoded.tobytes(), "board.png", 1), image)

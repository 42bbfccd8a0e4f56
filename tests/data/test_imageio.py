"""read_image / read_image_size on small synthesized files of every awkward kind."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest
from PIL import Image

from defectdet.data.imageio import decode_pair, read_image, read_image_size, read_pair
from defectdet.errors import ImageReadError


def _write(path: Path, image: np.ndarray) -> Path:
    assert cv2.imwrite(str(path), image)
    return path


def test_8bit_gray_png_roundtrip_and_gray_to_three_channels(tmp_path: Path) -> None:
    gray = np.arange(12 * 20, dtype=np.uint8).reshape(12, 20)
    path = _write(tmp_path / "gray.png", gray)
    assert np.array_equal(read_image(path, channels=1), gray)
    color = read_image(path, channels=3)
    assert color.shape == (12, 20, 3) and color.dtype == np.uint8
    assert np.array_equal(color[:, :, 0], gray) and np.array_equal(color[:, :, 2], gray)


def test_color_png_is_rgb(tmp_path: Path) -> None:
    bgr = np.zeros((6, 8, 3), np.uint8)
    bgr[:, :, 2] = 200  # red in OpenCV's BGR order
    path = _write(tmp_path / "red.png", bgr)
    rgb = read_image(path, channels=3)
    assert rgb[0, 0].tolist() == [200, 0, 0]
    gray = read_image(path, channels=1)
    assert gray.shape == (6, 8) and 50 <= gray[0, 0] <= 70  # 0.299 * 200


def test_16bit_png_scaled_by_its_bit_depth(tmp_path: Path) -> None:
    twelve_bit = np.array([[0, 1024, 2048, 4095]], dtype=np.uint16)  # a 12-bit camera in a 16-bit PNG
    path = _write(tmp_path / "deep.png", twelve_bit)
    out = read_image(path)
    assert out.dtype == np.uint8
    assert out.tolist() == [[0, 64, 128, 255]]  # not >> 8, which would give [0, 4, 8, 15]
    full = _write(tmp_path / "full.png", np.array([[0, 65535]], dtype=np.uint16))
    assert read_image(full, channels=3)[0, 1].tolist() == [255, 255, 255]


def test_twelve_bit_pair_straddling_2048_shares_one_mapping(tmp_path: Path) -> None:
    # same board, same 12-bit camera: the tested frame peaks at 2100 (needs 12 bits), the template at
    # 2000 (fits 11 bits). A region of raw value 1000 must come out equal in both.
    board = np.full((8, 8), 1000, dtype=np.uint16)
    tested, template = board.copy(), board.copy()
    tested[0, 0], template[0, 0] = 2100, 2000
    tested_path = _write(tmp_path / "tested.png", tested)
    template_path = _write(tmp_path / "template.png", template)
    # read one by one, each by its own depth: 1000 -> 62 vs 125, a false global difference
    alone = read_image(tested_path), read_image(template_path)
    assert (int(alone[0][4, 4]), int(alone[1][4, 4])) == (62, 125)

    image, reference = read_pair(tested_path, template_path)
    assert image.dtype == reference.dtype == np.uint8
    assert np.array_equal(image[1:], reference[1:]) and int(image[4, 4]) == round(1000 * 255 / 4095)
    assert (int(image[0, 0]), int(reference[0, 0])) == (round(2100 * 255 / 4095), round(2000 * 255 / 4095))
    # the same from bytes (uploads), and with the camera's depth given explicitly
    from_bytes = decode_pair(tested_path.read_bytes(), template_path.read_bytes(), channels=3)
    assert from_bytes[0].shape == (8, 8, 3) and np.array_equal(from_bytes[0][1:], from_bytes[1][1:])
    explicit = read_pair(tested_path, template_path, bit_depth=16)
    assert int(explicit[0][4, 4]) == int(explicit[1][4, 4]) == round(1000 * 255 / 65535)
    assert int(read_image(template_path, bit_depth=12)[4, 4]) == 62
    with pytest.raises(ValueError, match="bit_depth"):
        read_pair(tested_path, template_path, bit_depth=4)


def test_pair_of_8bit_files_is_unchanged(tmp_path: Path) -> None:
    a = np.arange(64, dtype=np.uint8).reshape(8, 8)
    first, second = _write(tmp_path / "a.png", a), _write(tmp_path / "b.png", a // 2)
    image, template = read_pair(first, second)
    assert np.array_equal(image, a) and np.array_equal(template, a // 2)
    # an 8-bit file next to a deep one: different encodings, each keeps its own mapping
    deep = _write(tmp_path / "deep.png", np.full((8, 8), 4095, dtype=np.uint16))
    image, template = read_pair(deep, first)
    assert int(image.max()) == 255 and np.array_equal(template, a)
    with pytest.raises(ImageReadError, match="missing.png"):
        read_pair(first, tmp_path / "missing.png")


def test_rgba_png_alpha_dropped(tmp_path: Path) -> None:
    rgba = np.zeros((4, 4, 4), np.uint8)
    rgba[..., 1] = 180  # green
    rgba[..., 3] = 0  # fully transparent
    path = _write(tmp_path / "rgba.png", rgba)
    out = read_image(path, channels=3)
    assert out.shape == (4, 4, 3) and out[0, 0].tolist() == [0, 180, 0]


def test_palette_png(tmp_path: Path) -> None:
    palette_image = Image.new("P", (5, 3))
    palette_image.putpalette([0, 0, 0, 10, 20, 250] + [0] * (254 * 3))
    palette_image.putpixel((2, 1), 1)
    path = tmp_path / "palette.png"
    palette_image.save(path)
    out = read_image(path, channels=3)
    assert out.shape == (3, 5, 3)
    assert out[1, 2].tolist() == [10, 20, 250] and out[0, 0].tolist() == [0, 0, 0]


def test_exif_rotated_jpeg(tmp_path: Path) -> None:
    stored = np.zeros((20, 40, 3), np.uint8)  # stored landscape, 40 wide
    stored[:, :10] = 255  # white strip on the left
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 clockwise to display
    path = tmp_path / "phone.jpg"
    Image.fromarray(stored).save(path, "JPEG", exif=exif.tobytes(), quality=95)
    out = read_image(path, channels=3)
    assert out.shape == (40, 20, 3)  # displayed portrait
    assert out[:10].mean() > 200 and out[-10:].mean() < 30  # left strip is now at the top
    assert read_image_size(path) == (20, 40)


def test_read_image_size_from_header(tmp_path: Path) -> None:
    path = _write(tmp_path / "wide.jpg", np.zeros((30, 70), np.uint8))
    assert read_image_size(path) == (70, 30)


def test_non_ascii_path(tmp_path: Path) -> None:
    path = _write(tmp_path / "x.png", np.full((3, 3), 7, np.uint8)).rename(tmp_path / "платa_测试.png")
    assert read_image(path)[0, 0] == 7


def test_zero_byte_file_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "empty.jpg"
    path.write_bytes(b"")
    with pytest.raises(ImageReadError, match=r"empty\.jpg.*empty"):
        read_image(path)
    with pytest.raises(ImageReadError, match=r"empty\.jpg"):
        read_image_size(path)


@pytest.mark.parametrize("suffix", [".jpg", ".png"])
def test_truncated_file_raises(tmp_path: Path, suffix: str) -> None:
    noise = np.random.default_rng(0).integers(0, 255, (64, 64, 3), dtype=np.uint8)
    ok, encoded = cv2.imencode(suffix, noise)
    assert ok
    path = tmp_path / f"cut{suffix}"
    path.write_bytes(encoded.tobytes()[: len(encoded) // 2])
    with pytest.raises(ImageReadError, match=rf"cut\{suffix}"):
        read_image(path)


def test_not_an_image_and_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "notes.png"
    path.write_text("this is not a picture")
    with pytest.raises(ImageReadError, match=r"notes\.png"):
        read_image(path)
    with pytest.raises(ImageReadError, match=r"absent\.png.*not found"):
        read_image(tmp_path / "absent.png")


def test_over_max_pixels_names_the_limit(tmp_path: Path) -> None:
    path = _write(tmp_path / "big.png", np.zeros((100, 100), np.uint8))
    with pytest.raises(ImageReadError, match=r"big\.png.*10,000.*max_pixels"):
        read_image(path, max_pixels=9_999)
    assert read_image(path, max_pixels=10_000).shape == (100, 100)
    jpeg = _write(tmp_path / "big.jpg", np.zeros((100, 100), np.uint8))
    with pytest.raises(ImageReadError, match="max_pixels"):
        read_image(jpeg, max_pixels=5_000)


def test_formats_outside_the_accepted_list_are_refused(tmp_path: Path) -> None:
    # GIF used to go through the Pillow fallback; only the accepted formats are decoded now (issue 23)
    path = tmp_path / "board.gif"
    Image.fromarray(np.full((4, 6), 90, np.uint8)).save(path)
    with pytest.raises(ImageReadError, match=r"board\.gif: not an accepted image format"):
        read_image(path)

"""Issue 23, items 1 and 9: accepted formats, the header's pixel count checked before any decoder runs,
OpenCV's own pixel cap, non-regular files (FIFOs, folders, symlink loops) and truncated JPEGs."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import threading
import zlib
from collections.abc import Callable
from pathlib import Path

import cv2
import numpy as np
import pytest
from PIL import Image

from defectdet.data.formats import list_images
from defectdet.data.imageio import (
    ACCEPTED_FORMATS,
    decode_image,
    read_image,
    read_image_size,
    read_pair,
)
from defectdet.data.sample import Problem
from defectdet.errors import ImageReadError, ImageTooLargeError

# every accepted format, written by OpenCV (WebP lossless so the pixels survive)
FORMAT_SUFFIXES = {
    "PNG": ".png",
    "JPEG": ".jpg",
    "BMP": ".bmp",
    "TIFF": ".tif",
    "WebP": ".webp",
    "PNM": ".pgm",
}


def _board(height: int = 80, width: int = 100) -> np.ndarray:
    rng = np.random.default_rng(3)
    return cv2.GaussianBlur(rng.integers(0, 255, (height, width), dtype=np.uint8), (5, 5), 0)


def _write(path: Path, image: np.ndarray) -> Path:
    params = [cv2.IMWRITE_WEBP_QUALITY, 101] if path.suffix == ".webp" else []
    assert cv2.imwrite(str(path), image, params)
    return path


def _no_decoder(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if OpenCV or Pillow is asked to decode pixels."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a decoder ran on an image that should have been refused from its header")

    monkeypatch.setattr(cv2, "imdecode", refuse)
    monkeypatch.setattr(Image.Image, "load", refuse)


def test_accepted_formats_cover_the_collected_suffixes() -> None:
    assert set(FORMAT_SUFFIXES) == set(ACCEPTED_FORMATS)


def test_radiance_hdr_is_refused_before_decoding(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the probe: a small .hdr file declaring far more pixels than the limit was decoded by OpenCV
    path = tmp_path / "bomb.hdr"
    assert cv2.imwrite(str(path), np.zeros((120, 200, 3), np.float32))
    _no_decoder(monkeypatch)
    with pytest.raises(ImageReadError, match=r"bomb\.hdr.*not an accepted image format.*PNG, JPEG") as caught:
        read_image(path, max_pixels=10_000)
    assert "max_pixels" not in str(caught.value)
    with pytest.raises(ImageReadError, match=r"bomb\.hdr.*PNG, JPEG"):
        decode_image(path.read_bytes(), path, max_pixels=10**9)
    with pytest.raises(ImageReadError, match=r"bomb\.hdr"):
        read_image_size(path)


@pytest.mark.parametrize("kind", ["gif", "text", "dds"])
def test_unknown_formats_name_the_file_and_the_accepted_list(tmp_path: Path, kind: str) -> None:
    path = tmp_path / f"input.{kind}"
    if kind == "gif":
        Image.fromarray(np.full((4, 6), 90, np.uint8)).save(path)
    elif kind == "dds":
        path.write_bytes(b"DDS " + struct.pack("<7I", 124, 0x1007, 64, 64, 0, 0, 0) + bytes(200))
    else:
        path.write_text("this is not a picture")
    expected = ", ".join(ACCEPTED_FORMATS)
    with pytest.raises(ImageReadError, match=rf"input\.{kind}: not an accepted image format") as caught:
        read_image(path)
    assert expected in str(caught.value)


@pytest.mark.parametrize("name", FORMAT_SUFFIXES)
def test_every_accepted_format_checks_its_header_before_decoding(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    path = _write(tmp_path / f"board{FORMAT_SUFFIXES[name]}", _board())
    assert read_image(path, max_pixels=8_000).shape == (80, 100)
    assert read_image(path, channels=3, max_pixels=8_000).shape == (80, 100, 3)
    assert read_image_size(path) == (100, 80)
    _no_decoder(monkeypatch)
    with pytest.raises(ImageTooLargeError, match=rf"board\{path.suffix}.*100x80 = 8,000 pixels.*7,999"):
        read_image(path, max_pixels=7_999)


def _inflate(name: str, data: bytes) -> bytes:
    """The same file with its header declaring 16000 x 16000 pixels."""
    out = bytearray(data)
    if name == "PNG":
        out[16:24] = struct.pack(">II", 16000, 16000)
    elif name == "JPEG":
        sof = max(out.find(b"\xff\xc0"), out.find(b"\xff\xc2"))
        out[sof + 5 : sof + 9] = struct.pack(">HH", 16000, 16000)
    elif name == "BMP":
        out[18:26] = struct.pack("<ii", 16000, -16000)
    elif name == "TIFF":
        order = "<" if out[:2] == b"II" else ">"
        (ifd,) = struct.unpack(order + "I", out[4:8])
        (count,) = struct.unpack(order + "H", out[ifd : ifd + 2])
        for index in range(count):
            at = ifd + 2 + 12 * index
            tag, kind = struct.unpack(order + "HH", out[at : at + 4])
            if tag in (256, 257):
                value = struct.pack(order + ("H" if kind == 3 else "I"), 16000)
                out[at + 8 : at + 8 + len(value)] = value
    elif name == "WebP":
        assert out[12:16] == b"VP8L"
        bits = (16000 - 1) | ((16000 - 1) << 14) | (out[24] >> 4 << 28)
        out[21:25] = struct.pack("<I", bits)
    elif name == "PNM":
        out = bytearray(b"P5\n16000 16000\n255\n" + bytes(data.split(b"\n", 3)[3]))
    return bytes(out)


@pytest.mark.parametrize("name", FORMAT_SUFFIXES)
def test_inflated_size_fields_are_refused_from_the_header(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    path = _write(tmp_path / f"board{FORMAT_SUFFIXES[name]}", _board())
    _no_decoder(monkeypatch)
    with pytest.raises(ImageTooLargeError, match=r"16000x16000"):
        decode_image(_inflate(name, path.read_bytes()), path, max_pixels=25_000_000)


def _png_header_only(width: int, height: int) -> bytes:
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", ihdr)
        + chunk(b"IDAT", zlib.compress(b"\0" * 64))
        + chunk(b"IEND", b"")
    )


def test_opencv_pixel_cap_is_set_when_the_package_is_imported(tmp_path: Path) -> None:
    # OpenCV reads OPENCV_IO_MAX_IMAGE_PIXELS once, when cv2 loads: importing defectdet first must set it,
    # no lower than the default max_pixels (64 M), so OpenCV itself refuses a 9000 x 9000 header
    path = tmp_path / "big.png"
    path.write_bytes(_png_header_only(9000, 9000))
    script = (
        "import os, sys, defectdet, cv2, numpy as np\n"
        "from defectdet.data.imageio import DEFAULT_MAX_PIXELS\n"
        "assert int(os.environ['OPENCV_IO_MAX_IMAGE_PIXELS']) >= DEFAULT_MAX_PIXELS\n"
        "try:\n"
        "    cv2.imdecode(np.fromfile(sys.argv[1], np.uint8), cv2.IMREAD_GRAYSCALE)\n"
        "except cv2.error as error:\n"
        "    print('refused' if 'MAX_IMAGE_PIXELS' in str(error) else error)\n"
    )
    env = {key: value for key, value in os.environ.items() if key != "OPENCV_IO_MAX_IMAGE_PIXELS"}
    done = subprocess.run(
        [sys.executable, "-c", script, str(path)], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "refused"
    # and the decode path names OpenCV's ceiling when max_pixels is set above it
    with pytest.raises(ImageTooLargeError, match="OPENCV_IO_MAX_IMAGE_PIXELS"):
        decode_image(path.read_bytes(), path, max_pixels=10**9)


# ------------------------------------------------------------------ non-regular files (item 9)


def _without_hanging(call: Callable[[], object], fifo: Path) -> BaseException | None:
    """Run `call`; a reader stuck opening `fifo` is released afterwards so the test cannot hang."""
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            call()
            outcome.append(None)
        except BaseException as error:  # noqa: BLE001 - handed to the test
            outcome.append(error)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(20)
    if worker.is_alive():  # it blocked in open(): give it a writer and EOF, then fail
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        worker.join(5)
        pytest.fail(f"reading {fifo} blocked (a FIFO must be refused, not opened)")
    return outcome[0]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_fifo_image_template_and_label_are_refused_not_waited_on(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.png"
    os.mkfifo(fifo)
    good = _write(tmp_path / "good.png", _board())
    for call in (
        lambda: read_image(fifo),
        lambda: read_image_size(fifo),
        lambda: read_pair(good, fifo),
    ):
        error = _without_hanging(call, fifo)
        assert isinstance(error, ImageReadError), error
        assert "pipe.png" in str(error) and "not a regular file" in str(error)

    # a YOLO dataset whose label file is a FIFO: listed as a problem, not waited on
    from defectdet.data.formats import load_dataset

    root = tmp_path / "yolo"
    (root / "images").mkdir(parents=True)
    (root / "labels").mkdir()
    _write(root / "images" / "a.png", _board())
    os.mkfifo(root / "labels" / "a.txt")
    (root / "data.yaml").write_text("path: .\ntrain: images\nval: images\nnames: [short]\n")
    error = _without_hanging(lambda: load_dataset(root, "train"), root / "labels" / "a.txt")
    assert error is None
    split = load_dataset(root, "train")
    assert any("a.txt" in p.path and "not a regular file" in p.message for p in split.problems)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs and symlinks")
def test_collectors_list_folders_named_like_images_loops_and_fifos(tmp_path: Path) -> None:
    from defectdet.runtime.predict import list_sources

    folder = tmp_path / "in"
    folder.mkdir()
    _write(folder / "good.png", _board())
    (folder / "folder.jpg").mkdir()
    (folder / "loop.jpg").symlink_to(folder / "loop.jpg")
    os.mkfifo(folder / "pipe.png")
    (folder / "notes.txt").write_text("not an image suffix: not collected")

    found = list_sources(folder)
    assert [p.name for p in found] == ["folder.jpg", "good.png", "loop.jpg", "pipe.png"]
    reasons = {}
    for path in found:
        try:
            read_image(path)
        except ImageReadError as error:
            reasons[path.name] = str(error)
    assert set(reasons) == {"folder.jpg", "loop.jpg", "pipe.png"}
    assert "is a directory" in reasons["folder.jpg"]
    assert "symbolic link" in reasons["loop.jpg"]
    assert "not a regular file (FIFO" in reasons["pipe.png"]
    assert list_sources(folder / "pipe.png") == [folder / "pipe.png"]
    assert list_sources(folder / "loop.jpg") == [folder / "loop.jpg"]

    problems: list[Problem] = []
    assert list_images(folder, problems) == [folder / "good.png"]
    skipped = {Path(p.path).name: p.message for p in problems}
    assert set(skipped) == {"folder.jpg", "loop.jpg", "pipe.png"}
    assert all(p.severity == "warning" and "skipped" in p.message for p in problems)


# ------------------------------------------------------------------ truncated JPEG (item 9)


def _jpeg(image: np.ndarray) -> bytes:
    ok, encoded = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, 90])
    assert ok
    return encoded.tobytes()


@pytest.mark.parametrize("channels", [1, 3])
def test_truncated_jpeg_with_its_end_marker_put_back_is_refused(tmp_path: Path, channels: int) -> None:
    board = cv2.cvtColor(_board(96, 120), cv2.COLOR_GRAY2BGR)
    board[:, :, 0] //= 2
    data = _jpeg(board)
    cut = data[: len(data) // 2] + b"\xff\xd9"  # decodes as the top half and a flat grey bottom
    with pytest.raises(ImageReadError, match=r"cut\.jpg: JPEG is truncated"):
        decode_image(cut, "cut.jpg", channels=channels)
    path = tmp_path / "cut.jpg"
    path.write_bytes(cut)
    with pytest.raises(ImageReadError, match="truncated"):
        read_image(path)


def test_jpegs_that_really_end_in_flat_grey_are_not_called_truncated() -> None:
    grey = np.full((64, 80), 128, np.uint8)
    assert np.array_equal(decode_image(_jpeg(grey)), grey)
    board = _board(96, 120)
    board[48:] = 128  # a genuine flat grey bottom half
    out = decode_image(_jpeg(cv2.cvtColor(board, cv2.COLOR_GRAY2BGR)), channels=3)
    assert out.shape == (96, 120, 3) and (out[-8:] == 128).all()

"""Robust image decoding: 8/16-bit, gray/RGB/RGBA/palette, EXIF orientation, size limits.

Only the formats in `ACCEPTED_FORMATS` are decoded, recognised by their magic bytes (never by the file
name). Their width and height are read from the header by the parsers here, and an image over
`max_pixels`, or longer than `MAX_ASPECT_RATIO` times its width (or the reverse), is refused before OpenCV or
Pillow sees a byte; OpenCV's own cap (`OPENCV_IO_MAX_IMAGE_PIXELS`, set on package import) is the backstop,
and the Pillow fallback refuses a buffer larger than OpenCV's for `max_pixels` RGB pixels. The common case goes straight
through `cv2.imdecode`, which also applies the EXIF orientation for the non-UNCHANGED flags used here;
Pillow, restricted to the same format, is the fallback. Files are opened only when they are regular
files (a FIFO would block forever). Every failure, including any exception a decoder raises on a
malformed file, is an `ImageReadError` naming the file: this module is the one place that guarantees it.
"""

from __future__ import annotations

import io
import logging
import os
import re
import stat
import struct
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

import cv2
import numpy as np
from PIL import Image, ImageOps

from defectdet._limits import DEFAULT_MAX_PIXELS, OPENCV_PIXELS_VARIABLE, opencv_pixel_ceiling
from defectdet.data.image_types import IMAGE_SUFFIXES as IMAGE_SUFFIXES
from defectdet.data.image_types import image_format
from defectdet.errors import ImageReadError, ImageTooLargeError

logger = logging.getLogger(__name__)


# The formats the product reads (name -> Pillow's name for the fallback decoder). Anything else that
# OpenCV or Pillow could decode (Radiance HDR, OpenEXR, DDS, SPIDER, GIF, ...) is refused: each extra
# decoder is attack surface and has no header check here.
ACCEPTED_FORMATS: dict[str, str] = {
    "PNG": "PNG",
    "JPEG": "JPEG",
    "BMP": "BMP",
    "TIFF": "TIFF",
    "WebP": "WEBP",
    "PNM": "PPM",  # PBM/PGM/PPM, P1..P6
}
# The file name suffixes of those formats (what a folder listing takes as an image, `IMAGE_SUFFIXES`) and
# `image_format`, which tells them apart by their magic bytes: `data.image_types`, imported above
_HEAD_BYTES = 1 << 16  # read_image_size reads this much first, more only if the header needs it
_MAX_HEAD_BYTES = 1 << 24
_TIFF_TILE_ALLOWANCE = 4096 * 4096  # a tile may exceed a small max_pixels, never this
# The longer side over the shorter. Beyond it, an image inside the pixel limit may have rows over the million
# pixels OpenCV's PNG decoder takes, leaving the file to Pillow at four bytes a pixel (a 58 KB PNG of
# 20,000,000 x 1 pixels took 100 MB); thin images such as 1 x 700 stay readable
MAX_ASPECT_RATIO = 1000
# Bytes a pixel takes in Pillow's buffer, by mode (RGB is stored as RGBX); other modes count 4
_PILLOW_PIXEL_BYTES = {"1": 1, "L": 1, "P": 1, "I;16": 2, "I;16B": 2, "I;16L": 2, "I;16N": 2}

# SOF0..SOF15 carry the frame size; C4 (DHT), C8 (JPG) and CC (DAC) share the range but do not.
_JPEG_SOF_MARKERS = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
_EXIF_ORIENTATION_TAG = 0x0112


def read_image(
    path: str | Path,
    channels: int = 1,
    max_pixels: int = DEFAULT_MAX_PIXELS,
    bit_depth: int | None = None,
) -> np.ndarray:
    """Decode an image file to uint8: (H, W) when `channels == 1`, (H, W, 3) RGB when `channels == 3`.

    Deep (16-bit) integer images are scaled by `bit_depth` (a 12-bit camera in a 16-bit PNG:
    `bit_depth=12` maps 4095 -> 255), or, when None, by the image's own effective bit depth (the bits
    its peak needs, at least 8). A tested image and its template must share one mapping: read them
    with `read_pair`, which takes the depth from the pair. 8-bit files are never rescaled. Alpha is
    dropped. EXIF orientation is applied.
    """
    path = Path(path)
    return decode_image(read_file_bytes(path), path, channels, max_pixels, bit_depth)


def decode_image(
    data: bytes,
    name: str | Path = "<bytes>",
    channels: int = 1,
    max_pixels: int = DEFAULT_MAX_PIXELS,
    bit_depth: int | None = None,
) -> np.ndarray:
    """`read_image` on bytes already in memory (uploads, or a file read once for hashing too).

    `name` only labels error messages.
    """
    image = _decode_raw(data, Path(name), channels, max_pixels)
    if image.dtype != np.uint8:
        image = _to_uint8(image, _check_bit_depth(bit_depth))
    return image


def read_pair(
    image_path: str | Path,
    template_path: str | Path,
    channels: int = 1,
    max_pixels: int = DEFAULT_MAX_PIXELS,
    bit_depth: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Decode a tested image and its template to uint8 with ONE intensity mapping for both.

    Scaling each deep image by its own peak would map a 12-bit pair whose peaks straddle 2048 with
    two different factors (x255/4095 and x255/2047): a false global difference. Here the shared bit
    depth is `bit_depth` or the deeper of the two images' effective depths (float images: the higher
    peak). When one file is 8-bit and the other deep they are different encodings and each keeps its own.
    """
    image_path, template_path = Path(image_path), Path(template_path)
    return decode_pair(
        read_file_bytes(image_path),
        read_file_bytes(template_path),
        image_path,
        template_path,
        channels,
        max_pixels,
        bit_depth,
    )


def decode_pair(
    image_data: bytes,
    template_data: bytes,
    image_name: str | Path = "<image bytes>",
    template_name: str | Path = "<template bytes>",
    channels: int = 1,
    max_pixels: int = DEFAULT_MAX_PIXELS,
    bit_depth: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """`read_pair` on bytes already in memory."""
    image, template = decode_planes(
        [image_data, template_data], [image_name, template_name], channels, max_pixels, bit_depth
    )
    return image, template


def read_planes(
    paths: Sequence[str | Path],
    channels: int = 1,
    max_pixels: int = DEFAULT_MAX_PIXELS,
    bit_depth: int | None = None,
) -> list[np.ndarray]:
    """`read_pair` for any number of aligned planes (image, template, companion captures): ONE intensity
    mapping for all of them."""
    paths = [Path(path) for path in paths]
    return decode_planes([read_file_bytes(path) for path in paths], paths, channels, max_pixels, bit_depth)


def decode_planes(
    datas: Sequence[bytes],
    names: Sequence[str | Path],
    channels: int = 1,
    max_pixels: int = DEFAULT_MAX_PIXELS,
    bit_depth: int | None = None,
) -> list[np.ndarray]:
    """`read_planes` on bytes already in memory. Deep planes share one mapping when they are all integer (the
    deepest effective bit depth, or `bit_depth`) or all float (the highest peak); 8-bit planes are kept as
    they are, and a mix of integer and float deep planes maps each plane on its own."""
    bit_depth = _check_bit_depth(bit_depth)
    planes = [
        _decode_raw(data, Path(name), channels, max_pixels) for data, name in zip(datas, names, strict=True)
    ]
    deep = [array for array in planes if array.dtype != np.uint8]
    if len(deep) >= 2:
        if all(np.issubdtype(array.dtype, np.integer) for array in deep):
            shared = bit_depth or max(effective_bit_depth(array) for array in deep)
            return [array if array.dtype == np.uint8 else _to_uint8(array, shared) for array in planes]
        if all(np.issubdtype(array.dtype, np.floating) for array in deep):
            peak = max(_float_peak(array) for array in deep)
            return [
                array if array.dtype == np.uint8 else _to_uint8(array, float_peak=peak) for array in planes
            ]
    return [array if array.dtype == np.uint8 else _to_uint8(array, bit_depth) for array in planes]


def effective_bit_depth(image: np.ndarray) -> int:
    """Bits the peak of an integer image needs, at least 8 (a 12-bit camera's frame: 12, or less if dark)."""
    peak = int(image.max()) if image.size else 0
    return min(max(peak.bit_length(), 8), 32)


def _check_bit_depth(bit_depth: int | None) -> int | None:
    if bit_depth is not None and not 8 <= bit_depth <= 32:
        raise ValueError(f"bit_depth must be between 8 and 32 (or None: from the image), got {bit_depth}")
    return bit_depth


# ---------------------------------------------------------------- files


class NotRegularFileError(OSError):
    """A path that is not a regular file: a folder, FIFO, device or socket (reading one may block)."""


def open_regular(path: str | Path) -> BinaryIO:
    """Open `path` for binary reading only if it is a regular file (symlinks followed).

    `open()` on a FIFO blocks until a writer appears, and reading a device may never end: both are
    refused with `NotRegularFileError` (an `OSError`, so callers' `except OSError` keep working).
    """
    kind = _non_regular_kind(os.stat(path).st_mode)  # ELOOP, ENOENT... surface as the OSError they are
    if kind is None:
        flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)
        descriptor = os.open(path, flags)  # O_NONBLOCK: a FIFO swapped in after the stat cannot block
        kind = _non_regular_kind(os.fstat(descriptor).st_mode)
        if kind is None:
            return os.fdopen(descriptor, "rb")
        os.close(descriptor)
    raise NotRegularFileError(kind)


def _non_regular_kind(mode: int) -> str | None:
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return "is a directory, not a file"
    for test, name in (
        (stat.S_ISFIFO, "FIFO / named pipe"),
        (stat.S_ISCHR, "character device"),
        (stat.S_ISBLK, "block device"),
        (stat.S_ISSOCK, "socket"),
    ):
        if test(mode):
            return f"not a regular file ({name})"
    return "not a regular file"


def read_text_file(path: str | Path) -> str:
    """A (label) text file as str, undecodable bytes replaced; `OSError` for a missing or non-regular file."""
    with open_regular(path) as handle:
        return handle.read().decode("utf-8", errors="replace")


@contextmanager
def _open_image_file(path: Path) -> Iterator[BinaryIO]:
    """`open_regular(path)`, with a missing, irregular or unreadable file (also while reading) as an
    `ImageReadError` naming it."""
    try:
        with open_regular(path) as handle:
            yield handle
    except FileNotFoundError as error:
        raise ImageReadError(f"{path}: image file not found") from error
    except NotRegularFileError as error:
        raise ImageReadError(f"{path}: {error}; give an image file") from None
    except OSError as error:
        raise ImageReadError(f"{path}: cannot read image file ({error.strerror or error})") from error


def read_file_bytes(path: str | Path) -> bytes:
    """The bytes of an image file; `ImageReadError` naming it when missing, empty or not a regular file."""
    path = Path(path)
    with _open_image_file(path) as handle:  # works for non-ASCII paths where cv2.imread does not
        data = handle.read()
    if not data:
        raise ImageReadError(f"{path}: image file is empty (0 bytes)")
    return data


# ---------------------------------------------------------------- decoding


def _accepted_format(data: bytes, path: Path) -> str:
    name = image_format(data)
    if name is None:
        raise ImageReadError(
            f"{path}: not an accepted image format (accepted: {', '.join(ACCEPTED_FORMATS)}; "
            "recognised by content, not by file name); convert it to PNG or TIFF"
        )
    return name


def _decode_raw(data: bytes, path: Path, channels: int, max_pixels: int) -> np.ndarray:
    """Decode to the file's own dtype: (H, W) or (H, W, 3) RGB; uint8, uint16 or float."""
    if channels not in (1, 3):
        raise ValueError(f"channels must be 1 or 3, got {channels}")
    if not data:
        raise ImageReadError(f"{path}: image file is empty (0 bytes)")
    name = _accepted_format(data, path)
    _check_size(path, data, name, max_pixels)
    try:
        image = _decode_accepted(data, path, name, channels, max_pixels)
    except ImageReadError:
        raise
    except Exception as error:  # noqa: BLE001 - any decoder failure on a malformed file is the file's fault
        raise ImageReadError(f"{path}: cannot decode this {name} file ({_describe(error)})") from None
    if image.ndim < 2 or image.shape[0] * image.shape[1] > max_pixels or 0 in image.shape:
        raise ImageReadError(f"{path}: {name} decoded to an unexpected shape {image.shape}; corrupt header")
    return image


def _decode_accepted(data: bytes, path: Path, name: str, channels: int, max_pixels: int) -> np.ndarray:
    flags = cv2.IMREAD_ANYDEPTH | (cv2.IMREAD_GRAYSCALE if channels == 1 else cv2.IMREAD_COLOR)
    try:
        image = cv2.imdecode(np.frombuffer(data, dtype=np.uint8), flags)
    except cv2.error:
        image = None
    if image is None:
        return _decode_with_pillow(path, data, name, channels, max_pixels)
    if name == "JPEG" and _jpeg_ends_early(data, image, flags):
        raise ImageReadError(
            f"{path}: JPEG is truncated (its image data stops early and the rest would decode as flat "
            "grey; an end marker was added after a cut); re-export or drop it"
        )
    if channels == 3 and image.ndim == 3:
        image = cv2.cvtColor(image, cv2.COLOR_BGR2RGB)  # (H, W, 3) RGB
    return image


def _describe(error: BaseException) -> str:
    """A decoder's exception as one short line without object addresses."""
    text = re.sub(r" at 0x[0-9a-fA-F]+", "", " ".join(str(error).split()))[:200]
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _jpeg_ends_early(data: bytes, image: np.ndarray, flags: int) -> bool:
    """True when the JPEG's entropy-coded data ended before the last block (libjpeg then fills the rest
    with zero coefficients: flat 128 grey, and only warns on stderr).

    Cheap test first: a truncated file's last block is exactly 128. Proof second: zero bytes inserted
    before the end marker change nothing in a complete scan (they are extraneous), but are decoded as
    more blocks when the scan was cut short.
    """
    if not (image[-8:, -8:] == 128).all():
        return False
    end = data.rfind(b"\xff\xd9")
    if end < 0:
        return False
    padded = data[:end] + bytes(256) + data[end:]
    try:
        again = cv2.imdecode(np.frombuffer(padded, dtype=np.uint8), flags)
    except cv2.error:
        return False
    return again is not None and again.shape == image.shape and not np.array_equal(again, image)


def read_image_size(path: str | Path) -> tuple[int, int]:
    """(width, height) as `read_image` would return it (EXIF rotation applied), from the header only."""
    path = Path(path)
    with _open_image_file(path) as handle:
        head = handle.read(_HEAD_BYTES)
        name = _accepted_format(head, path) if head else None
        size = _header_size(head, name) if name else None
        while size is None and name and len(head) < _MAX_HEAD_BYTES:
            more = handle.read(len(head))  # a header behind large metadata (JPEG APPn, TIFF IFD)
            if not more:
                break
            head += more
            size = _header_size(head, name)
    if not head:
        raise ImageReadError(f"{path}: image file is empty (0 bytes)")
    if size is None:
        raise ImageReadError(f"{path}: {name} header is truncated or corrupt (no image size found)")
    width, height = size
    if width <= 0 or height <= 0:
        raise ImageReadError(f"{path}: {name} header declares an empty image ({width}x{height})")
    if _orientation(head, name) in (5, 6, 7, 8):  # transposed / rotated by 90 or 270 degrees
        width, height = height, width
    return width, height


def _orientation(head: bytes, name: str) -> int:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with Image.open(io.BytesIO(head), formats=[ACCEPTED_FORMATS[name]]) as image:
                return _exif_orientation(image)
    except Exception:  # noqa: BLE001 - broken metadata must not make an image unreadable
        return 1


def _check_size(path: Path, data: bytes, name: str, max_pixels: int) -> None:
    """Refuse images over `max_pixels` (or OpenCV's cap) from the header, before decoding; detect truncated
    JPEGs and headers that declare no size."""
    if name == "JPEG":
        width, height, scan_start = _jpeg_header(data)
        if scan_start < 0 or data.find(b"\xff\xd9", scan_start) < 0:
            raise ImageReadError(
                f"{path}: JPEG is truncated (no image data end marker); re-export or drop it"
            )
        if width is None or height is None:
            raise ImageReadError(f"{path}: JPEG has no frame header (truncated or corrupt)")
        size: tuple[int, int] | None = (width, height)
    else:
        size = _header_size(data, name)
    if size is None:
        raise ImageReadError(f"{path}: {name} header is truncated or corrupt (no image size found)")
    width, height = size
    if width <= 0 or height <= 0:
        raise ImageReadError(f"{path}: {name} header declares an empty image ({width}x{height})")
    if max(width, height) > MAX_ASPECT_RATIO * min(width, height):
        raise ImageReadError(
            f"{path}: image is {width}x{height} pixels, an aspect ratio of "
            f"{max(width, height) / min(width, height):,.0f}:1; at most {MAX_ASPECT_RATIO}:1 is accepted "
            "(crop it, or cut it into tiles)"
        )
    pixels = width * height
    if pixels > max_pixels:
        raise ImageTooLargeError(
            f"{path}: image is {width}x{height} = {pixels:,} pixels, over the limit of "
            f"{max_pixels:,} (max_pixels); pass a larger max_pixels to read_image to allow it"
        )
    ceiling = opencv_pixel_ceiling()
    if pixels > ceiling:
        raise ImageTooLargeError(
            f"{path}: image is {width}x{height} = {pixels:,} pixels, over OpenCV's decode cap "
            f"{OPENCV_PIXELS_VARIABLE}={ceiling:,}; set that environment variable higher before starting"
        )
    if name == "TIFF":
        tile = _tiff_fields(data, (322, 323))
        if tile is not None and tile[0] * tile[1] > max(max_pixels, _TIFF_TILE_ALLOWANCE):
            raise ImageTooLargeError(f"{path}: TIFF tiles of {tile[0]}x{tile[1]} pixels are over the limit")


def _header_size(data: bytes, name: str) -> tuple[int, int] | None:
    """(width, height) declared by the header of an accepted format; None when `data` ends before it
    (or the header is malformed)."""
    if name == "PNG":
        return _png_size(data)
    if name == "JPEG":
        width, height, _ = _jpeg_header(data)
        return None if width is None or height is None else (width, height)
    if name == "BMP":
        return _bmp_size(data)
    if name == "TIFF":
        return _tiff_fields(data, (256, 257))
    if name == "WebP":
        return _webp_size(data)
    if name == "PNM":
        return _pnm_size(data)
    return None


def _jpeg_header(data: bytes) -> tuple[int | None, int | None, int]:
    """Walk the JPEG marker segments: (width, height, offset of the first scan or -1)."""
    width = height = None
    position = 2
    size = len(data)
    while position + 4 <= size:
        if data[position] != 0xFF:
            return width, height, -1
        marker = data[position + 1]
        if marker == 0xFF:  # fill byte
            position += 1
            continue
        if marker == 0x01 or 0xD0 <= marker <= 0xD7:  # standalone markers without a length
            position += 2
            continue
        if marker == 0xD9:
            return width, height, -1
        if marker == 0xDA:
            return width, height, position
        if marker in _JPEG_SOF_MARKERS and position + 9 <= size:
            height = int.from_bytes(data[position + 5 : position + 7], "big")
            width = int.from_bytes(data[position + 7 : position + 9], "big")
        position += 2 + int.from_bytes(data[position + 2 : position + 4], "big")
    return width, height, -1


def _png_size(data: bytes) -> tuple[int, int] | None:
    if len(data) < 24 or data[12:16] != b"IHDR":
        return None
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def _bmp_size(data: bytes) -> tuple[int, int] | None:
    if len(data) < 26:
        return None
    (header,) = struct.unpack("<I", data[14:18])
    if header == 12:  # OS/2 BITMAPCOREHEADER: unsigned 16-bit
        return struct.unpack("<HH", data[18:22])
    if header < 16:
        return None
    width, height = struct.unpack("<ii", data[18:26])
    return width, abs(height)  # a negative height is a top-down bitmap


def _tiff_fields(data: bytes, tags: tuple[int, int]) -> tuple[int, int] | None:
    """Two SHORT/LONG fields of the first IFD (the page decoders read), e.g. ImageWidth and ImageLength."""
    order = "<" if data[:2] == b"II" else ">"
    if len(data) < 8:
        return None
    (offset,) = struct.unpack(order + "I", data[4:8])
    if offset < 8 or offset + 2 > len(data):
        return None
    (count,) = struct.unpack(order + "H", data[offset : offset + 2])
    found: dict[int, int] = {}
    for index in range(count):
        entry = data[offset + 2 + 12 * index : offset + 14 + 12 * index]
        if len(entry) < 12:
            return None
        tag, kind, number = struct.unpack(order + "HHI", entry[:8])
        if tag in tags and number == 1 and kind in (3, 4):
            found[tag] = struct.unpack(
                order + ("H" if kind == 3 else "I"), entry[8 : 10 if kind == 3 else 12]
            )[0]
    if all(tag in found for tag in tags):
        return found[tags[0]], found[tags[1]]
    return None


def _webp_size(data: bytes) -> tuple[int, int] | None:
    if len(data) < 30:
        return None
    chunk = data[12:16]
    if chunk == b"VP8 " and data[23:26] == b"\x9d\x01\x2a":  # lossy: 14-bit sizes after the start code
        width, height = struct.unpack("<HH", data[26:30])
        return width & 0x3FFF, height & 0x3FFF
    if chunk == b"VP8L" and data[20] == 0x2F:  # lossless: 14-bit (size - 1) fields
        (bits,) = struct.unpack("<I", data[21:25])
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    if chunk == b"VP8X":  # extended: 24-bit (canvas size - 1) fields
        return 1 + int.from_bytes(data[24:27], "little"), 1 + int.from_bytes(data[27:30], "little")
    return None


def _pnm_size(data: bytes) -> tuple[int, int] | None:
    """Width and height: the first two decimal fields after the magic; '#' comments run to the line end."""
    fields: list[int] = []
    position, end = 2, min(len(data), 4096)
    while len(fields) < 2 and position < end:
        byte = data[position]
        if byte == ord("#"):
            newline = data.find(b"\n", position, end)
            if newline < 0:
                return None
            position = newline + 1
        elif byte in b" \t\r\n\v\f":
            position += 1
        elif 0x30 <= byte <= 0x39:
            match = re.match(rb"\d{1,10}", data[position:end])
            assert match is not None
            fields.append(int(match.group()))
            position += len(match.group())
        else:
            return None
    return (fields[0], fields[1]) if len(fields) == 2 else None


def _exif_orientation(image: Image.Image) -> int:
    try:
        return int(image.getexif().get(_EXIF_ORIENTATION_TAG, 1))
    except Exception:  # noqa: BLE001 - broken EXIF must not make an image unreadable
        return 1


def _decode_with_pillow(path: Path, data: bytes, name: str, channels: int, max_pixels: int) -> np.ndarray:
    """Pillow, restricted to the format already recognised (never a guess over all its plugins), and only
    when its buffer fits what OpenCV would allocate for `max_pixels` RGB pixels."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data), formats=[ACCEPTED_FORMATS[name]]) as opened:
                _check_pillow_buffer(path, opened, max_pixels)
                opened.load()
                image = ImageOps.exif_transpose(opened) or opened
                if image.mode in ("I;16", "I;16B", "I;16L", "I;16N", "I", "F"):
                    array = np.asarray(image)  # (H, W) deep gray
                    return array if channels == 1 else np.repeat(array[:, :, None], 3, axis=2)
                return np.asarray(image.convert("L" if channels == 1 else "RGB"))
    except ImageTooLargeError:
        raise
    except Image.DecompressionBombError as error:
        raise ImageTooLargeError(f"{path}: image is too large for Pillow to decode ({error})") from error
    except Exception as error:  # noqa: BLE001 - Pillow's plugins raise many types on malformed files
        raise ImageReadError(
            f"{path}: cannot decode image (corrupt, truncated or not an image: {_describe(error)})"
        ) from None


def _check_pillow_buffer(path: Path, opened: Image.Image, max_pixels: int) -> None:
    """Refuse, from the header Pillow has read, a decode whose buffer is over 3 bytes x `max_pixels`."""
    width, height = opened.size
    allocated = width * height * _PILLOW_PIXEL_BYTES.get(opened.mode, 4)
    if allocated > 3 * max_pixels:
        raise ImageTooLargeError(
            f"{path}: decoding this {width}x{height} {opened.mode} image takes {allocated / 2**20:,.0f} MiB, "
            f"over the {3 * max_pixels / 2**20:,.0f} MiB that {max_pixels:,} RGB pixels take (max_pixels); "
            "pass a larger max_pixels to read_image to allow it"
        )


def _float_peak(image: np.ndarray) -> float:
    finite = np.nan_to_num(image.astype(np.float32), nan=0.0, posinf=0.0, neginf=0.0)
    return float(finite.max()) if finite.size else 0.0


def _to_uint8(image: np.ndarray, bit_depth: int | None = None, float_peak: float | None = None) -> np.ndarray:
    """Scale a deep image to uint8: integers by `bit_depth` (None: their effective bit depth); floats
    that fit [0, 1] by 255, others by `float_peak` (None: their own max)."""
    if np.issubdtype(image.dtype, np.floating):
        finite = np.nan_to_num(image.astype(np.float32), nan=0.0, posinf=0.0, neginf=0.0)
        peak = _float_peak(finite) if float_peak is None else float_peak
        scale = 255.0 if peak <= 1.0 else 255.0 / peak
        return np.clip(finite * scale + 0.5, 0, 255).astype(np.uint8)
    bits = effective_bit_depth(image) if bit_depth is None else bit_depth
    if bits == 8:
        return np.clip(image, 0, 255).astype(np.uint8)
    scale = 255.0 / float((1 << bits) - 1)
    return np.clip(image.astype(np.float32) * scale + 0.5, 0, 255).astype(np.uint8)


def to_uint8(image: np.ndarray, bit_depth: int | None = None) -> np.ndarray:
    """Public form of the deep-image scaling `read_image` applies (for arrays handed to the runtime);
    give a pair's shared `bit_depth` (see `decode_pair`) so both images get one mapping."""
    return _to_uint8(image, _check_bit_depth(bit_depth))

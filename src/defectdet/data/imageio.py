"""Robust image decoding: 8/16-bit, gray/RGB/RGBA/palette, EXIF orientation, size limits.

The common case (8-bit JPEG/PNG) goes straight through `cv2.imdecode`, which also applies
the EXIF orientation for the non-UNCHANGED flags used here. Pillow is the fallback for
whatever OpenCV cannot decode. Everything a user can get wrong raises `ImageReadError`
naming the file.
"""

from __future__ import annotations

import io
import logging
import warnings
from pathlib import Path

import cv2
import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from defectdet.errors import ImageReadError, ImageTooLargeError

logger = logging.getLogger(__name__)

DEFAULT_MAX_PIXELS = 64_000_000

_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_JPEG_SIGNATURE = b"\xff\xd8"
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
    return decode_image(_read_bytes(path), path, channels, max_pixels, bit_depth)


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
        _read_bytes(image_path),
        _read_bytes(template_path),
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
    bit_depth = _check_bit_depth(bit_depth)
    image = _decode_raw(image_data, Path(image_name), channels, max_pixels)
    template = _decode_raw(template_data, Path(template_name), channels, max_pixels)
    deep = [array for array in (image, template) if array.dtype != np.uint8]
    if len(deep) == 2:
        if all(np.issubdtype(array.dtype, np.integer) for array in deep):
            shared = bit_depth or max(effective_bit_depth(array) for array in deep)
            return _to_uint8(image, shared), _to_uint8(template, shared)
        if all(np.issubdtype(array.dtype, np.floating) for array in deep):
            peak = max(_float_peak(array) for array in deep)
            return _to_uint8(image, float_peak=peak), _to_uint8(template, float_peak=peak)
    as_uint8 = [
        array if array.dtype == np.uint8 else _to_uint8(array, bit_depth) for array in (image, template)
    ]
    return as_uint8[0], as_uint8[1]


def effective_bit_depth(image: np.ndarray) -> int:
    """Bits the peak of an integer image needs, at least 8 (a 12-bit camera's frame: 12, or less if dark)."""
    peak = int(image.max()) if image.size else 0
    return min(max(peak.bit_length(), 8), 32)


def _check_bit_depth(bit_depth: int | None) -> int | None:
    if bit_depth is not None and not 8 <= bit_depth <= 32:
        raise ValueError(f"bit_depth must be between 8 and 32 (or None: from the image), got {bit_depth}")
    return bit_depth


def _decode_raw(data: bytes, path: Path, channels: int, max_pixels: int) -> np.ndarray:
    """Decode to the file's own dtype: (H, W) or (H, W, 3) RGB; uint8, uint16 or float."""
    if channels not in (1, 3):
        raise ValueError(f"channels must be 1 or 3, got {channels}")
    if not data:
        raise ImageReadError(f"{path}: image file is empty (0 bytes)")
    _check_size(path, data, max_pixels)

    flags = cv2.IMREAD_ANYDEPTH | (cv2.IMREAD_GRAYSCALE if channels == 1 else cv2.IMREAD_COLOR)
    image = cv2.imdecode(np.frombuffer(data, dtype=np.uint8), flags)
    if image is None:
        image = _decode_with_pillow(path, data, channels)
    elif channels == 3:
        image = cv2.cvtColor(image, cv2.COLOR_BGR2RGB)  # (H, W, 3) RGB
    return image


def read_image_size(path: str | Path) -> tuple[int, int]:
    """(width, height) as `read_image` would return it (EXIF rotation applied), from the header only."""
    path = Path(path)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(path) as image:
                width, height = image.size
                orientation = _exif_orientation(image)
    except FileNotFoundError as error:
        raise ImageReadError(f"{path}: image file not found") from error
    except Image.DecompressionBombError:
        with path.open("rb") as handle:
            size = _header_size(handle.read(1 << 20))
        if size is None:
            raise ImageTooLargeError(f"{path}: image too large to read its size") from None
        return size
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as error:
        if path.is_file() and path.stat().st_size == 0:
            raise ImageReadError(f"{path}: image file is empty (0 bytes)") from error
        raise ImageReadError(f"{path}: not a readable image ({error})") from error
    if orientation in (5, 6, 7, 8):  # transposed / rotated by 90 or 270 degrees
        width, height = height, width
    return width, height


def _read_bytes(path: Path) -> bytes:
    try:
        with path.open("rb") as handle:  # works for non-ASCII paths where cv2.imread does not
            data = handle.read()
    except FileNotFoundError as error:
        raise ImageReadError(f"{path}: image file not found") from error
    except IsADirectoryError as error:
        raise ImageReadError(f"{path}: is a directory, not an image file") from error
    except OSError as error:
        raise ImageReadError(f"{path}: cannot read image file ({error.strerror or error})") from error
    if not data:
        raise ImageReadError(f"{path}: image file is empty (0 bytes)")
    return data


def _check_size(path: Path, data: bytes, max_pixels: int) -> None:
    """Refuse images over `max_pixels` before decoding; detect truncated JPEGs."""
    if data.startswith(_JPEG_SIGNATURE):
        width, height, scan_start = _jpeg_header(data)
        if scan_start < 0 or data.find(b"\xff\xd9", scan_start) < 0:
            raise ImageReadError(
                f"{path}: JPEG is truncated (no image data end marker); re-export or drop it"
            )
    elif data.startswith(_PNG_SIGNATURE):
        size = _png_size(data)
        if size is None:
            raise ImageReadError(f"{path}: PNG is truncated (header incomplete)")
        width, height = size
    else:
        size = _pillow_size(path, data)
        if size is None:  # a format only OpenCV knows; it enforces its own pixel limit
            return
        width, height = size
    if width is None or height is None:
        raise ImageReadError(f"{path}: JPEG has no frame header (truncated or corrupt)")
    if width * height > max_pixels:
        raise ImageTooLargeError(
            f"{path}: image is {width}x{height} = {width * height:,} pixels, over the limit of "
            f"{max_pixels:,} (max_pixels); pass a larger max_pixels to read_image to allow it"
        )


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


def _header_size(data: bytes) -> tuple[int, int] | None:
    if data.startswith(_PNG_SIGNATURE):
        return _png_size(data)
    if data.startswith(_JPEG_SIGNATURE):
        width, height, _ = _jpeg_header(data)
        if width is not None and height is not None:
            return width, height
    return None


def _pillow_size(path: Path, data: bytes) -> tuple[int, int] | None:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data)) as image:
                return image.size
    except Image.DecompressionBombError as error:
        raise ImageTooLargeError(f"{path}: image is too large for Pillow to open ({error})") from error
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError):
        return None


def _exif_orientation(image: Image.Image) -> int:
    try:
        return int(image.getexif().get(_EXIF_ORIENTATION_TAG, 1))
    except Exception:  # noqa: BLE001 - broken EXIF must not make an image unreadable
        return 1


def _decode_with_pillow(path: Path, data: bytes, channels: int) -> np.ndarray:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data)) as opened:
                opened.load()
                image = ImageOps.exif_transpose(opened) or opened
                if image.mode in ("I;16", "I;16B", "I;16L", "I;16N", "I", "F"):
                    array = np.asarray(image)  # (H, W) deep gray
                    return array if channels == 1 else np.repeat(array[:, :, None], 3, axis=2)
                return np.asarray(image.convert("L" if channels == 1 else "RGB"))
    except Image.DecompressionBombError as error:
        raise ImageTooLargeError(f"{path}: image is too large for Pillow to decode ({error})") from error
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as error:
        raise ImageReadError(
            f"{path}: cannot decode image (corrupt, truncated or not an image: {error})"
        ) from error


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

"""The image formats the product reads, told apart without a decoder: by file name suffix (`IMAGE_SUFFIXES`) and by
magic bytes (`image_format`). Imports nothing, so the command line, the dataset readers and the keep folder need not
load OpenCV; `data.imageio` re-exports both."""

from __future__ import annotations

# The suffixes of the formats `data.imageio` reads: what a folder listing (predict, review, the keep folder)
# takes as an image. Decoding still goes by the magic bytes.
IMAGE_SUFFIXES = frozenset(
    {".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff", ".webp", ".pnm", ".pbm", ".pgm", ".ppm"}
)
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
JPEG_SIGNATURE = b"\xff\xd8\xff"


def image_format(data: bytes) -> str | None:
    """The accepted format `data` is in, from its magic bytes (a key of `data.imageio.ACCEPTED_FORMATS`), or
    None."""
    if data.startswith(PNG_SIGNATURE):
        return "PNG"
    if data.startswith(JPEG_SIGNATURE):
        return "JPEG"
    if data.startswith(b"BM"):
        return "BMP"
    if data[:4] in (b"II*\x00", b"MM\x00*"):
        return "TIFF"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "WebP"
    if len(data) >= 3 and data[0] == ord("P") and data[1] in b"123456" and data[2] in b" \t\r\n":
        return "PNM"
    return None

"""Image files written byte by byte, for shapes no encoder writes (OpenCV's PNG encoder refuses very wide rows)."""

from __future__ import annotations

import struct
import zlib


def png(width: int, height: int, color: bool = False) -> bytes:
    """A valid all-black 8-bit PNG of any size: gray, or RGB with `color`."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    row = b"\x00" + bytes(width * (3 if color else 1))
    header = struct.pack(">IIBBBBB", width, height, 8, 2 if color else 0, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(row * height, 9))
        + chunk(b"IEND", b"")
    )

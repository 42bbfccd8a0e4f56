"""Pixel limits shared by the image reader and the package import, which must stay free of cv2.

OpenCV reads its own decode cap, `OPENCV_IO_MAX_IMAGE_PIXELS`, once: when cv2 is first imported.
`defectdet/__init__.py` calls `cap_opencv_pixels` before any of its modules imports cv2, so the CLI, the
server, the torch-free runtime and library users who import defectdet before cv2 all run under it.
"""

from __future__ import annotations

import os

DEFAULT_MAX_PIXELS = 64_000_000  # read_image's default; `serve` uses a lower one
OPENCV_PIXELS_VARIABLE = "OPENCV_IO_MAX_IMAGE_PIXELS"
_OPENCV_BUILTIN_CAP = 1 << 30


def cap_opencv_pixels() -> None:
    """Cap OpenCV's decoder at the default max_pixels unless the environment already sets a cap
    (an operator who reads larger images raises it there, before starting)."""
    os.environ.setdefault(OPENCV_PIXELS_VARIABLE, str(DEFAULT_MAX_PIXELS))


def opencv_pixel_ceiling() -> int:
    """The most pixels OpenCV will decode in this process, as the environment declares it."""
    try:
        return int(os.environ.get(OPENCV_PIXELS_VARIABLE, _OPENCV_BUILTIN_CAP))
    except ValueError:
        return _OPENCV_BUILTIN_CAP

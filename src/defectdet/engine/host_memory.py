"""Keep freed host memory in the process during CPU training instead of handing it back to the kernel.

A CPU training step allocates and frees the same activation tensors every step (a stem feature map of a
batch of 16 crops is about 10 MB). glibc's malloc serves blocks that large with `mmap` and returns them
with `munmap`, and trims the heap's free top back to the kernel, so every step faults the same memory in
again, page by page, with the kernel zeroing each page. `keep_freed_memory` raises the mmap threshold to
glibc's maximum (32 MiB) and stops the trimming, so a freed activation is reused by the next step.

It changes speed, not results. The cost is that the process keeps its peak heap after a peak. Only
glibc (Linux) has `mallopt`; elsewhere, or with DEFECTDET_KEEP_FREED_MEMORY=0, nothing is changed.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform

# glibc's mallopt parameters (malloc.h)
M_TRIM_THRESHOLD = -1
M_TOP_PAD = -2
M_MMAP_THRESHOLD = -3

MMAP_THRESHOLD_BYTES = 32 * 2**20  # glibc's largest accepted value on 64-bit (HEAP_MAX_SIZE / 2)
TOP_PAD_BYTES = 64 * 2**20  # the heap grows by this much beyond a request: fewer brk calls
NO_TRIM_BYTES = 2**31 - 1  # mallopt takes an int: free memory at the heap's top is kept up to 2 GiB
OPT_OUT_VARIABLE = "DEFECTDET_KEEP_FREED_MEMORY"

_applied: str | None = None


def keep_freed_memory() -> str | None:
    """Set glibc's malloc to keep freed memory; returns what was set (for the log), or None when nothing was
    (not glibc, opted out, or mallopt refused). Safe to call more than once."""
    global _applied
    if _applied is not None:
        return _applied
    if os.environ.get(OPT_OUT_VARIABLE, "1").strip().lower() in ("0", "false", "no", "off"):
        return None
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return None
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    accepted = (
        mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)
        and mallopt(M_TOP_PAD, TOP_PAD_BYTES)
        and mallopt(M_TRIM_THRESHOLD, NO_TRIM_BYTES)
    )
    if not accepted:
        return None
    _applied = (
        f"glibc malloc keeps freed memory (mmap threshold {MMAP_THRESHOLD_BYTES >> 20} MiB, no trimming; "
        f"{OPT_OUT_VARIABLE}=0 turns it off)"
    )
    return _applied

"""Errors a user can cause. The CLI prints them without a traceback.

Every message names the file, line or field at fault and says what to do.
"""

from __future__ import annotations


class DefectDetError(Exception):
    """Base class for errors caused by user input (data, config, checkpoints)."""


class DatasetError(DefectDetError):
    """A dataset cannot be read: unknown format, missing file, malformed label file."""


class ImageReadError(DefectDetError):
    """An image file is unreadable, truncated, empty or too large."""


class ImageTooLargeError(ImageReadError):
    """An image holds more pixels than the limit it is read under (decoding it would be a memory risk)."""


class ConfigError(DefectDetError):
    """A config file or override has an unknown key or an invalid value."""


class CheckpointError(DefectDetError):
    """A checkpoint does not match the model (missing / unexpected / mis-shaped keys) or is corrupt."""


class NonFiniteError(DefectDetError):
    """Training produced a NaN/Inf loss or gradient and was told to stop."""


class InputError(DefectDetError):
    """An inference input does not fit the model: missing template, template of another size, bad array."""


def describe_failure(error: BaseException) -> str:
    """One line for a per-file failure: a DefectDetError's own message, else the exception's type and first
    line (decoders raise NotImplementedError, TypeError, ... on malformed files)."""
    text = str(error).strip()
    if isinstance(error, DefectDetError):
        return text
    first = text.splitlines()[0] if text else ""
    return f"{type(error).__name__}: {first}" if first else type(error).__name__

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


# Names retired for one name per concept (threshold, score floor, NMS IoU, input size). Files and scripts
# written with the old names keep working: the old name is read as the new one, with a DeprecationWarning.
TRAIN_CONFIG_RENAMES = {
    "imgsz": "input_size",
    "score_threshold": "score_floor",
    "nms_iou_threshold": "nms_iou",
}


def warn_renamed(old: str, new: str, where: str = "", stacklevel: int = 3) -> None:
    """A DeprecationWarning that `old` is now called `new`."""
    import warnings

    place = f"{where}: " if where else ""
    warnings.warn(f"{place}{old!r} is deprecated: use {new!r}", DeprecationWarning, stacklevel=stacklevel)


def renamed_keys(
    values: dict, renames: dict[str, str], where: str = "", warn: bool = True, stacklevel: int = 4
) -> dict:
    """`values` with each retired key of `renames` moved to its current name (a copy when any moved); both names
    at once is a ConfigError naming them. `stacklevel` points the warning at the caller's caller."""
    found = [old for old in renames if old in values]
    if not found:
        return values
    values = dict(values)
    for old in found:
        new = renames[old]
        if new in values:
            raise ConfigError(f"{where or 'config'}: {old!r} and {new!r} are the same setting: keep {new!r}")
        if warn:
            warn_renamed(old, new, where, stacklevel=stacklevel)
        values[new] = values.pop(old)
    return values


def renamed_keywords(given: dict, renames: dict[str, str], function: str) -> dict:
    """The retired keyword arguments `given` (a function's **kwargs) under their current names, with a
    DeprecationWarning each; a keyword that was never a name is the TypeError Python raises."""
    unknown = sorted(set(given) - set(renames))
    if unknown:
        raise TypeError(f"{function}() got an unexpected keyword argument {unknown[0]!r}")
    for old in given:
        warn_renamed(old, renames[old], f"{function}()", stacklevel=4)
    return {renames[old]: value for old, value in given.items()}

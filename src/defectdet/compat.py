"""Names retired for one name per concept (threshold, score floor, NMS IoU, input size), in one table.

Bundles, config files, scripts and command lines written with an old name keep working: each old name is read
as its current one, with the deprecation note it has always given. Every reader of an old name goes through
this module; the rest of the code only knows the current names. Likewise a function that now takes a settings
object still takes its fields as keyword arguments (`with_keywords`).
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Mapping
from enum import Enum
from typing import Any, TypeVar

from defectdet.errors import ConfigError

Settings = TypeVar("Settings")


class Surface(Enum):
    """Where a name is read: each has its own retired names."""

    TRAIN_CONFIG = (
        "training config"  # TrainConfig fields, training YAML keys, overrides, a run's saved config
    )
    VALIDATE = "validate settings"  # ValidateSettings fields and validate() keywords
    BUNDLE_THRESHOLDS = "bundle thresholds"  # the `thresholds` of a bundle's metadata
    CHECKPOINT_METRICS = "checkpoint metrics"  # the metrics a training checkpoint logged
    PREDICT = "Predictor.predict"  # its keyword arguments
    PREDICT_SOURCE = "predict_source"  # its keyword arguments
    EVALUATE = "evaluate_records"  # its keyword arguments
    DETECT_FORM = "detect form"  # the fields of the service's /v1/detect form
    CLI = "command line"  # the options of every `defectdet` command


RENAMED: dict[Surface, dict[str, str]] = {
    Surface.TRAIN_CONFIG: {
        "imgsz": "input_size",
        "score_threshold": "score_floor",
        "nms_iou_threshold": "nms_iou",
    },
    Surface.VALIDATE: {
        "conf_threshold": "threshold",
        "conf_from": "threshold_from",
        "conf_rule": "threshold_rule",
        "imgsz": "input_size",
    },
    Surface.BUNDLE_THRESHOLDS: {
        "score": "threshold",
        "score_source": "threshold_source",
        "min_score": "score_floor",
    },
    Surface.CHECKPOINT_METRICS: {"conf_threshold": "threshold"},
    Surface.PREDICT: {"conf": "threshold", "min_score": "score_floor"},
    Surface.PREDICT_SOURCE: {"conf": "threshold"},
    Surface.EVALUATE: {"conf_threshold": "threshold"},
    Surface.DETECT_FORM: {"conf": "threshold"},
    Surface.CLI: {
        "--imgsz": "--input-size",
        "--conf": "--threshold",
        "--conf-from": "--threshold-from",
        "--conf-rule": "--threshold-rule",
        "--min-score": "--score-floor",
    },
}


def warn_renamed(old: str, new: str, where: str = "", stacklevel: int = 3) -> None:
    """A DeprecationWarning that `old` is now called `new`."""
    place = f"{where}: " if where else ""
    warnings.warn(f"{place}{old!r} is deprecated: use {new!r}", DeprecationWarning, stacklevel=stacklevel)


def current_keys(
    values: Mapping[str, Any], surface: Surface, where: str = "", warn: bool = True, stacklevel: int = 4
) -> dict[str, Any]:
    """`values` with each retired key of `surface` moved to its current name (a copy when any moved); both
    names at once is a ConfigError naming them. `stacklevel` points the warning at the caller's caller."""
    renames = RENAMED[surface]
    found = [old for old in renames if old in values]
    if not found:
        return values  # type: ignore[return-value]  # unchanged: the caller's own mapping
    current = dict(values)
    for old in found:
        new = renames[old]
        if new in current:
            raise ConfigError(f"{where or 'config'}: {old!r} and {new!r} are the same setting: keep {new!r}")
        if warn:
            warn_renamed(old, new, where, stacklevel=stacklevel)
        current[new] = current.pop(old)
    return current


def current_keywords(given: Mapping[str, Any], surface: Surface) -> dict[str, Any]:
    """The retired keyword arguments `given` (a function's **kwargs) under their current names, with a
    DeprecationWarning each; a keyword that was never a name is the TypeError Python raises."""
    renames, function = RENAMED[surface], surface.value
    unknown = sorted(set(given) - set(renames))
    if unknown:
        raise TypeError(f"{function}() got an unexpected keyword argument {unknown[0]!r}")
    for old in given:
        warn_renamed(old, renames[old], f"{function}()", stacklevel=4)
    return {renames[old]: value for old, value in given.items()}


def retired_names(name: str, surface: Surface) -> list[str]:
    """The names `name` had on `surface` before it was renamed (`threshold` on the detect form: `conf`)."""
    return [old for old, new in RENAMED[surface].items() if new == name]


def current_option_names(args: list[str], note: Callable[[str], None]) -> list[str]:
    """`args` with each retired option name (`--conf 0.5`, `--conf=0.5`) replaced by its current one; `note`
    is told "--conf is deprecated: use --threshold" for each. Arguments after `--` are left as they are."""
    renames = RENAMED[Surface.CLI]
    current = []
    for index, arg in enumerate(args):
        if arg == "--":
            return current + args[index:]
        name, equals, value = arg.partition("=")
        if name in renames:
            note(f"{name} is deprecated: use {renames[name]}")
            arg = renames[name] + equals + value
        current.append(arg)
    return current


def retired_attributes(surface: Surface, where: str) -> type:
    """A mixin with one read-only property per retired name of `surface`: it warns and returns the current
    attribute (`thresholds.score` -> `thresholds.threshold`)."""

    def alias(old: str, new: str) -> property:
        def read(self: Any) -> Any:
            warn_renamed(f"{where}.{old}", f"{where}.{new}")
            return getattr(self, new)

        return property(read, doc=f"Deprecated: `{new}`.")

    return type("RetiredNames", (), {old: alias(old, new) for old, new in RENAMED[surface].items()})


def with_keywords(
    model: type[Settings],
    settings: Settings | None,
    keywords: Mapping[str, Any],
    function: str,
    surface: Surface | None = None,
) -> Settings:
    """`settings` (default: `model()`, all defaults) with `keywords` applied over it: a function that takes a
    settings object (a pydantic model or a dataclass) still takes its fields as keyword arguments, as it did
    before it took the object. Retired names of `surface` are read as their current ones, with a warning; a
    keyword that is no field is the TypeError Python raises for `function`."""
    if surface is not None:
        keywords = current_keys(keywords, surface, f"{function}()", stacklevel=5)
    is_dataclass = dataclasses.is_dataclass(model)
    names = {f.name for f in dataclasses.fields(model)} if is_dataclass else set(model.model_fields)  # type: ignore[arg-type,attr-defined]
    unknown = sorted(set(keywords) - names)
    if unknown:
        raise TypeError(f"{function}() got an unexpected keyword argument {unknown[0]!r}")
    base = settings if settings is not None else model()
    if not keywords:
        return base
    if is_dataclass:
        return dataclasses.replace(base, **keywords)  # type: ignore[type-var]
    return model.model_validate({**dict(base), **keywords})  # type: ignore[attr-defined]

"""What every `defectdet doctor` report shares: findings with a severity, advice, and JSON conversion."""

from __future__ import annotations

import dataclasses
import math
from enum import Enum
from pathlib import Path
from typing import Any

SEVERITIES = ("ok", "info", "warning", "error")


@dataclasses.dataclass
class Finding:
    """One diagnosis: `severity` is ok|info|warning|error; `advice` says what to do about it."""

    severity: str
    topic: str
    message: str
    advice: str = ""

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"severity must be one of {SEVERITIES}, got {self.severity!r}")


def worst_severity(findings: list[Finding]) -> str:
    """The most serious severity among `findings` ('ok' when there are none)."""
    return max((finding.severity for finding in findings), key=SEVERITIES.index, default="ok")


def advice_lines(findings: list[Finding]) -> list[str]:
    """The advice of every finding that is not ok, most serious first, without repeats."""
    ordered = sorted(findings, key=lambda finding: -SEVERITIES.index(finding.severity))
    lines: list[str] = []
    for finding in ordered:
        if finding.advice and finding.severity != "ok" and finding.advice not in lines:
            lines.append(finding.advice)
    return lines


def jsonable(value: Any) -> Any:
    """Dataclasses, paths, tuples, enums, torch dtypes/devices and non-finite floats as plain JSON values."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {field.name: jsonable(getattr(value, field.name)) for field in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(key): jsonable(item) for key, item in value.items()}
    if isinstance(value, list | tuple | set):
        return [jsonable(item) for item in value]
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, str | int | bool) or value is None:
        return value
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, Enum):
        return value.value
    return str(value)  # torch.dtype, torch.device, numpy scalars


def format_bytes(count: float | None) -> str:
    """1536 -> '1.5 KiB'."""
    if count is None:
        return "?"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(count) < 1024 or unit == "TiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    return f"{count:.1f} TiB"  # pragma: no cover

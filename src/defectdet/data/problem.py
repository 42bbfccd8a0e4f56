"""`Problem`, what a dataset reader reports about one file, in a module that imports nothing (no NumPy): the
readers' shared checks (`data.formats`) and the command line load it at start. `data.sample` re-exports it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Severity = Literal["error", "warning"]


@dataclass(frozen=True)
class Problem:
    """Something wrong with one file of a dataset. `line` is 1-based, 0 when not line-specific."""

    severity: Severity
    path: str
    message: str
    line: int = 0

    def __str__(self) -> str:
        where = f"{self.path}:{self.line}" if self.line else self.path
        return f"{self.severity}: {where}: {self.message}"

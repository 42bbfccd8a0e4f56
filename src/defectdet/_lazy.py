"""Lazy package exports (PEP 562): `import defectdet.x` stays cheap and torch-free parts stay torch-free."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(package: str, exports: Mapping[str, str]) -> Callable[[str], Any]:
    """A module `__getattr__` that imports `exports[name]` (a module path) on first use of `name`. A name that
    is its own subpackage (`defectdet.export`) is the subpackage itself (Python binds the subpackage to that
    name anyway once it is imported), which then has to be callable."""

    def __getattr__(name: str) -> Any:
        if name in exports:
            module = importlib.import_module(exports[name])
            return module if exports[name] == f"{package}.{name}" else getattr(module, name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__

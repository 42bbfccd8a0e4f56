"""The typer app of `defectdet` and its sub-apps: help shows a flag by its names alone (`--amp / --no-amp`,
`--json`), not with a `<bool>` value type it never takes. Imports only typer."""

from __future__ import annotations

from typing import Any

import typer
from typer.core import TyperCommand, TyperGroup


def _flags_without_value(params: list[Any]) -> list[Any]:
    for param in params:
        if getattr(param, "is_flag", False) and param.metavar is None:
            param.metavar = ""
    return params


class FlagHelpCommand(TyperCommand):
    """A command whose help shows flags by their names alone."""

    def get_params(self, ctx: Any) -> list[Any]:
        return _flags_without_value(super().get_params(ctx))


class FlagHelpGroup(TyperGroup):
    """A command group whose help shows flags by their names alone."""

    def get_params(self, ctx: Any) -> list[Any]:
        return _flags_without_value(super().get_params(ctx))


class CommandApp(typer.Typer):
    """A typer app whose group and commands show flags by their names alone in help."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("cls", FlagHelpGroup)
        super().__init__(*args, **kwargs)

    def command(self, *args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("cls", FlagHelpCommand)
        return super().command(*args, **kwargs)

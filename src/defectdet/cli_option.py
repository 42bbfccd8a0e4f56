"""`CliOption`: how one field of a settings model shows on the command line.

A settings model (`TrainConfig`, `ValidateSettings`, `ServeSettings`) keeps a table of these beside it, keyed by
field name; `defectdet.cli_settings` turns the table into the command's options. An entry `COMMAND_OPTION` places
an option the command declares itself (`--out`) among them, so that the help lists the options in the table's
order. Imports nothing, so the torch-free runtime and the service may declare their options too.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


class _FieldDefault:
    """The default of `CliOption.default`: the option's default is the field's own."""

    def __repr__(self) -> str:
        return "FIELD_DEFAULT"


FIELD_DEFAULT: Any = _FieldDefault()


class _CommandOption:
    """A table entry that names an option the command declares itself (no field of the model): the option is
    listed at that place, among the model's."""

    def __repr__(self) -> str:
        return "COMMAND_OPTION"


COMMAND_OPTION: Any = _CommandOption()


@dataclass(frozen=True)
class CliOption:
    """One field as a command-line option. Unset parts come from the field: the name (`--input-size` for
    `input_size`), the type (without `None`; a `Literal`'s values' type) and the default.

    `flag`: the names as typed, e.g. "--crop", "--amp/--no-amp", or "--from-scratch" (a bool switched on only).
    `help`: the help text; None: the field's description, else the comment beside it in the source.
    `type`: what the command line reads when it is not the field's type (a comma list read as `str`).
    `to_setting`: the value read -> the field's value; a None from either means "not given": the field keeps
    its default (or, for `train`, the value of the --config file).
    """

    flag: str | None = None
    help: str | None = None
    default: Any = FIELD_DEFAULT
    type: Any = None
    to_setting: Callable[[Any], Any] | None = None

"""Command options generated from a settings model: one field, one option, so a setting is declared once.

A command declares its own arguments (paths, --config) and a parameter named `settings`; `settings_options`
puts one typer option per entry of the model's `CliOption` table in its place and calls the command with
`settings`, the {field: value} of the options given:

    @app.command()
    @settings_options(ValidateSettings, VALIDATE_OPTIONS)
    def val(checkpoint: Path = typer.Argument(...), settings: dict[str, Any] = SETTINGS_OPTIONS) -> None:
        validate(checkpoint, ValidateSettings(**settings))
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, Literal

import typer

from defectdet.cli_option import COMMAND_OPTION, FIELD_DEFAULT, CliOption
from defectdet.engine.config_reference import field_comments

SETTINGS_PARAMETER = "settings"
# the default of a command's `settings` parameter, which `settings_options` replaces by the options
SETTINGS_OPTIONS: Any = None


@dataclasses.dataclass(frozen=True)
class SettingsField:
    """What a settings model says about one field: its type and default."""

    annotation: Any
    default: Any


def settings_field(model: type, name: str) -> SettingsField:
    """The field `name` of a pydantic model or a dataclass; a ValueError names a field the model lacks."""
    if hasattr(model, "model_fields"):
        if name not in model.model_fields:
            raise ValueError(f"{model.__name__} has no field {name!r}")
        info = model.model_fields[name]
        return SettingsField(info.annotation, info.get_default(call_default_factory=True))
    fields = {field.name: field for field in dataclasses.fields(model)}
    if name not in fields:
        raise ValueError(f"{model.__name__} has no field {name!r}")
    field = fields[name]
    default = field.default if field.default is not dataclasses.MISSING else field.default_factory()
    return SettingsField(typing.get_type_hints(model)[name], default)


def field_description(model: type, name: str) -> str:
    """A pydantic field's description, else the comment beside it in the source ("" for a dataclass)."""
    if not hasattr(model, "model_fields"):
        return ""
    return model.model_fields[name].description or field_comments(model)[0].get(name, "")


def command_line_type(annotation: Any) -> Any:
    """The type the command line reads for a field: `int | None` -> int, `Literal["a", "b"]` -> str."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        kinds = [kind for kind in typing.get_args(annotation) if kind is not type(None)]
        if len(kinds) != 1:
            raise TypeError(f"{annotation}: give the CliOption a type")
        annotation = kinds[0]
    if typing.get_origin(annotation) is Literal:
        return type(typing.get_args(annotation)[0])
    return annotation


def option_parameter(model: type, name: str, option: CliOption, field_defaults: bool) -> inspect.Parameter:
    """The typer parameter of field `name`: its type, default (the field's, or None when not `field_defaults`),
    names and help."""
    field = settings_field(model, name)
    kind = option.type or command_line_type(field.annotation)
    if option.default is not FIELD_DEFAULT:
        default = option.default
    else:
        default = field.default if field_defaults else None
    help_text = option.help or field_description(model, name)  # the source is read only when needed
    if not help_text:
        raise ValueError(
            f"{model.__name__}.{name}: no help text (give the field a comment or the option a help)"
        )
    names = [option.flag] if option.flag else []
    return inspect.Parameter(
        name,
        inspect.Parameter.KEYWORD_ONLY,
        default=typer.Option(default, *names, help=help_text),
        annotation=kind if default is not None else kind | None,
    )


def settings_options(
    model: type, options: Mapping[str, CliOption], *, field_defaults: bool = True
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: the command's `settings` parameter becomes the options of `options` (field name -> CliOption,
    in the order shown), and the command receives `settings` as {field: value} of those given (each read value
    through its `to_setting`; a None is left out). An entry `COMMAND_OPTION` lists an option the command declares
    itself at that place. `field_defaults=False`: every option defaults to not given, so that a value from a
    configuration file stays."""
    fields = {name: option for name, option in options.items() if option is not COMMAND_OPTION}

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        generated = [
            name if option is COMMAND_OPTION else option_parameter(model, name, option, field_defaults)
            for name, option in options.items()
        ]
        parameters = _with_options(command, generated)

        @functools.wraps(command)
        def run(**values: Any) -> Any:
            read = {name: values.pop(name) for name in fields}
            return command(**values, **{SETTINGS_PARAMETER: _given_settings(fields, read)})

        run.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
        run.__annotations__ = {parameter.name: parameter.annotation for parameter in parameters}
        return run

    return decorate


def _with_options(
    command: Callable[..., Any], generated: list[inspect.Parameter | str]
) -> list[inspect.Parameter]:
    """`command`'s parameters (their annotations resolved) with `generated` in place of `settings`; a name in
    `generated` is the command's own parameter of that name, moved there."""
    hints = typing.get_type_hints(command)
    own = inspect.signature(command).parameters
    if SETTINGS_PARAMETER not in own:
        raise TypeError(
            f"{command.__name__} has no parameter {SETTINGS_PARAMETER!r} for the settings options"
        )
    placed = {entry for entry in generated if isinstance(entry, str)}
    missing = sorted(placed - set(own))
    if missing:
        raise TypeError(
            f"{command.__name__}: no parameter {', '.join(missing)} to list among the settings options"
        )
    clash = sorted(set(own) & {entry.name for entry in generated if isinstance(entry, inspect.Parameter)})
    if clash:
        raise TypeError(f"{command.__name__}: {', '.join(clash)} declared by hand and as settings options")

    def resolved(parameter: inspect.Parameter) -> inspect.Parameter:
        return parameter.replace(kind=inspect.Parameter.KEYWORD_ONLY, annotation=hints[parameter.name])

    parameters: list[inspect.Parameter] = []
    for parameter in own.values():
        if parameter.name == SETTINGS_PARAMETER:
            parameters += [resolved(own[entry]) if isinstance(entry, str) else entry for entry in generated]
        elif parameter.name not in placed:
            parameters.append(resolved(parameter))
    return parameters


def _given_settings(options: Mapping[str, CliOption], read: dict[str, Any]) -> dict[str, Any]:
    settings = {}
    for name, value in read.items():
        convert = options[name].to_setting
        value = convert(value) if convert is not None and value is not None else value
        if value is not None:
            settings[name] = value
    return settings

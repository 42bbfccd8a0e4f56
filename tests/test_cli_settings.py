"""Command options generated from the settings models: a field declared once is an option of the command."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import typer
import typer.main
from pydantic import Field
from typer.testing import CliRunner

from defectdet.cli import app
from defectdet.cli_option import CliOption
from defectdet.cli_settings import SETTINGS_OPTIONS, settings_options
from defectdet.engine.config import TRAIN_OPTIONS, TrainConfig
from defectdet.errors import ConfigError

runner = CliRunner()


class TrainConfigWithANewSetting(TrainConfig):
    """TrainConfig as it would be with one more setting: the field, its comment and its table entry."""

    hard_example_share: float = Field(0.25, ge=0, le=1)  # share of each batch drawn from the hardest images


def _app_of(
    model: type, options: dict[str, CliOption], field_defaults: bool = True
) -> tuple[typer.Typer, dict]:
    """A one-command app whose command records the settings it is given."""
    received: dict[str, Any] = {}
    tool = typer.Typer()

    @tool.command()
    @settings_options(model, options, field_defaults=field_defaults)
    def run(
        data: Path = typer.Argument(..., help="A dataset."),
        settings: dict[str, Any] = SETTINGS_OPTIONS,
    ) -> None:
        """Record the settings."""
        received.update(settings, data=data)

    @tool.command()
    def other() -> None:
        """A second command, so that `run` is addressed by name."""

    return tool, received


def _help(tool: typer.Typer, *args: str) -> str:
    result = runner.invoke(tool, [*args, "--help"], env={"COLUMNS": "200", "NO_COLOR": "1"})
    assert result.exit_code == 0, result.output
    return re.sub(r"[\s│]+", " ", result.output)


def test_a_new_field_is_an_option_with_its_default_and_the_comment_as_help() -> None:
    options = {**TRAIN_OPTIONS, "hard_example_share": CliOption()}
    tool, received = _app_of(TrainConfigWithANewSetting, options)

    shown = _help(tool, "run")
    assert "--hard-example-share" in shown
    assert "share of each batch drawn from the hardest images" in shown
    assert "[default: 0.25]" in shown

    result = runner.invoke(tool, ["run", "data.yaml", "--hard-example-share", "0.5"])
    assert result.exit_code == 0, result.output
    assert received["hard_example_share"] == 0.5
    assert TrainConfigWithANewSetting(**{**received, "data": None}).hard_example_share == 0.5


def test_train_overrides_only_what_was_given() -> None:
    tool, received = _app_of(TrainConfig, TRAIN_OPTIONS, field_defaults=False)
    given = "--time 2 --crop 64 --strides 16,8 --from-scratch --no-amp --companions L2,UV".split()

    result = runner.invoke(tool, ["run", "data.yaml", *given])

    assert result.exit_code == 0, result.output
    assert received == {
        "data": Path("data.yaml"),
        "time_minutes": 2.0,
        "crop_size": 64,
        "strides": [16, 8],
        "pretrained": False,
        "amp": False,
        "companions": ["L2", "UV"],
    }


def test_a_bad_stride_list_is_one_line_naming_the_option() -> None:
    tool, _ = _app_of(TrainConfig, TRAIN_OPTIONS, field_defaults=False)
    result = runner.invoke(tool, ["run", "data.yaml", "--strides", "8,x"])
    assert isinstance(result.exception, ConfigError)
    assert "--strides" in str(result.exception)


def _command_paths(command: Any, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    paths = [path]
    for name, sub in getattr(command, "commands", {}).items():
        paths += _command_paths(sub, (*path, name))
    return paths


def test_switches_show_as_pairs_not_as_values() -> None:
    shown = _help(app, "train")
    assert "--amp --no-amp" in shown and "--template --no-template" in shown
    for path in _command_paths(typer.main.get_command(app)):
        shown = _help(app, *path)
        assert "<bool>" not in shown and "BOOLEAN" not in shown, path


def test_train_passes_the_given_options_to_the_configuration(monkeypatch: pytest.MonkeyPatch) -> None:
    import defectdet.engine.config as config_module

    seen: dict[str, Any] = {}

    def stop(config: Path | None, overrides: dict[str, Any]) -> None:
        seen.update(overrides)
        raise ConfigError("stopped before training")

    monkeypatch.setattr(config_module, "load_config", stop)
    result = runner.invoke(app, ["train", "data.yaml", "--time", "3", "--no-companions", "--set", "lr=0.002"])

    assert isinstance(result.exception, ConfigError), result.output
    assert seen == {
        "data": Path("data.yaml"),
        "time_minutes": 3.0,
        "epochs": None,
        "companions": [],
        "lr": 0.002,
    }


def test_serve_settings_come_from_the_given_options(monkeypatch: pytest.MonkeyPatch) -> None:
    import defectdet.cli as cli_module
    import defectdet.serve.launch as launch

    served: list[Any] = []
    monkeypatch.setattr(
        launch, "serve_bundle", lambda bundle, host, port, settings, workers: served.append(settings)
    )
    monkeypatch.setattr(cli_module, "_bindable", lambda host, port: (host, port))
    given = ["--max-queue", "3", "--keep", "flagged", "--keep-dir", "kept", "--allowed-host", "line3.local"]

    result = runner.invoke(app, ["serve", "model.onnx", *given], env={"DEFECTDET_TOKEN": ""})

    assert result.exit_code == 0, result.output
    (settings,) = served
    assert (settings.max_queue, settings.max_concurrency, settings.keep, settings.keep_dir) == (
        3,
        2,
        ("flagged",),
        "kept",
    )
    assert "line3.local" in settings.allowed_hosts


def test_an_option_for_a_field_the_model_lacks_is_refused() -> None:
    with pytest.raises(ValueError, match="no field 'no_such_setting'"):
        _app_of(TrainConfig, {"no_such_setting": CliOption(help="?")})


def test_val_settings_come_from_the_given_options(monkeypatch: pytest.MonkeyPatch) -> None:
    import defectdet.engine.validate as validate_module

    seen: list[Any] = []

    def record(checkpoint: Path, data: Path, settings: Any, console: Any) -> dict[str, str]:
        seen.append(settings)
        return {"report": "report.html"}

    monkeypatch.setattr(validate_module, "validate", record)
    given = ["--threshold-from", "train", "--no-register", "--no-merge-fragments", "--clean-shift", "1.5"]

    result = runner.invoke(app, ["val", "best.pt", "data.yaml", *given])

    assert result.exit_code == 0, result.output
    (settings,) = seen
    assert (settings.threshold_from, settings.register_pairs, settings.merge_fragments) == (
        "train",
        False,
        False,
    )
    assert (settings.split, settings.batch, settings.target_escape, settings.repeat_check) == (
        "val",
        8,
        0.01,
        None,
    )
    assert settings.clean_nuisance.shift_px[1] == 1.5


# commands that still declare more than 8 options by hand (each wants a settings model, as train, val and serve
# have); the set may only shrink
NOT_YET_FROM_SETTINGS: set[str] = set()


def test_cli_functions_are_short_take_few_parameters_and_skip_no_formatting() -> None:
    import ast

    import defectdet.cli as cli_module

    source = Path(cli_module.__file__).read_text(encoding="utf-8")
    assert "fmt: skip" not in source
    over = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef):
            parameters = len(node.args.args) + len(node.args.kwonlyargs)
            if node.end_lineno - node.lineno + 1 > 60 or parameters > 8:
                over.add(node.name)
    assert over == NOT_YET_FROM_SETTINGS

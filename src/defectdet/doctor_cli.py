"""`defectdet doctor`: the PyTorch failures every team meets, diagnosed in one command.

Only typer is imported here; each command imports torch and the diagnostics it needs when it runs, so that
`defectdet --help` stays fast. Every command prints a table and "what to do", or JSON with `--json`, and exits
1 when it found an error.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

from defectdet.cli_app import CommandApp
from defectdet.cli_settings import SETTINGS_OPTIONS, settings_options
from defectdet.diagnostics.doctor_settings import (
    CHECKPOINT_OPTIONS,
    LOADER_OPTIONS,
    NAN_OPTIONS,
    CheckpointDoctorSettings,
    LoaderDoctorSettings,
    NanDoctorSettings,
)

doctor_app = CommandApp(
    help="Diagnose the environment, checkpoints, loaders, NaNs and tensors. Without a command: the environment.",
    invoke_without_command=True,
    no_args_is_help=False,
)

JSON_OPTION = typer.Option(False, "--json", help="Print the report as JSON instead of tables.")


def _finish(report: Any, as_json: bool, render: Any, **render_options: Any) -> None:
    from rich.console import Console

    from defectdet.diagnostics.report import jsonable, worst_severity

    if as_json:
        typer.echo(json.dumps(jsonable(report), indent=2))
    else:
        render(report, Console(), **render_options)
    if worst_severity(report.findings) == "error":
        raise typer.Exit(1)


@doctor_app.callback()
def environment(
    context: typer.Context,
    seconds: float = typer.Option(5.0, help="Length of the matmul/conv speed check in seconds (0 skips it)."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Versions, CPU flags, cores vs threads, GPU, ONNX Runtime providers, disk, /dev/shm and a speed check.

    Example: defectdet doctor --seconds 5
    """
    if context.invoked_subcommand is not None:
        return
    from defectdet.diagnostics.environment import environment_report
    from defectdet.diagnostics.render import render_environment

    _finish(environment_report(speed_seconds=seconds), as_json, render_environment)


@doctor_app.command()
@settings_options(CheckpointDoctorSettings, CHECKPOINT_OPTIONS)
def checkpoint(
    path: Path = typer.Argument(
        ..., help="A checkpoint: ours, a bare state_dict, or another framework's dict."
    ),
    settings: dict[str, Any] = SETTINGS_OPTIONS,
    as_json: bool = JSON_OPTION,
) -> None:
    """Why a checkpoint does not load: matching, missing, unexpected and mis-shaped keys, renamings, contents.

    Example: defectdet doctor checkpoint old.pt --model nano --out fixed.pt
    """
    from defectdet.diagnostics.checkpoint_doctor import checkpoint_report
    from defectdet.diagnostics.render import render_checkpoint

    options = CheckpointDoctorSettings(**settings)
    report = checkpoint_report(
        path, model=options.model, rules=options.rules, unsafe=options.unsafe, **options.target_options()
    )
    if options.save_map is not None:
        _save_proposed_map(report, options.save_map)
    if options.out is None:
        _finish(report, as_json, render_checkpoint, show_all=options.show_all)
        return
    _migrate(path, report, options, as_json)


def _save_proposed_map(report: Any, save_map: Path) -> None:
    """Write the report's proposed mapping as a rules YAML, and say so on stderr (--json output stays
    parseable)."""
    from defectdet.diagnostics.key_mapping import save_rules

    if report.proposed_rules:
        save_rules(report.proposed_rules, save_map)
    note = f"saved the proposed mapping to {save_map}" if report.proposed_rules else "no mapping proposed"
    typer.echo(note, err=True)


def _migrate(path: Path, report: Any, options: CheckpointDoctorSettings, as_json: bool) -> None:
    """Write the migrated copy `options.out`; print the report and the migration; exit 1 when the copy does not
    load strictly."""
    from rich.console import Console

    from defectdet.diagnostics.checkpoint_doctor import migrate_checkpoint
    from defectdet.diagnostics.render import render_checkpoint

    result = migrate_checkpoint(
        path,
        options.out,
        model=options.model,
        rules=options.rules,
        unsafe=options.unsafe,
        **options.target_options(),
    )
    if as_json:
        from defectdet.diagnostics.report import jsonable

        typer.echo(json.dumps(jsonable({"before": report, "migration": result}), indent=2))
    else:
        console = Console()
        render_checkpoint(report, console, show_all=options.show_all)
        style = "green" if result.loads_strictly else "bold red"
        console.print(f"[{style}]migrated[/]: {result.message}")
    if not result.loads_strictly:
        raise typer.Exit(1)


@doctor_app.command()
@settings_options(LoaderDoctorSettings, LOADER_OPTIONS)
def loader(
    data: Path = typer.Argument(..., help="data.yaml, COCO json, VOC folder or DeepPCB root."),
    settings: dict[str, Any] = SETTINGS_OPTIONS,
    as_json: bool = JSON_OPTION,
) -> None:
    """Loader speed over workers/batch/prefetch/persistent/pin, the bottleneck, and which sample breaks it.

    Example: defectdet doctor loader data/line3/data.yaml --preset nano
    """
    from defectdet.diagnostics.loader_doctor import loader_report
    from defectdet.diagnostics.render import render_loader

    _finish(loader_report(data, LoaderDoctorSettings(**settings)), as_json, render_loader)


@doctor_app.command()
@settings_options(NanDoctorSettings, NAN_OPTIONS)
def nan(
    checkpoint_path: Path = typer.Argument(
        ..., metavar="CKPT", help="A checkpoint written by `defectdet train`."
    ),
    data: Path = typer.Argument(..., help="The dataset it trains on."),
    settings: dict[str, Any] = SETTINGS_OPTIONS,
    as_json: bool = JSON_OPTION,
) -> None:
    """Forward and backward with hooks on every module, in float32 and under autocast: the first NaN/Inf source.

    Example: defectdet doctor nan runs/train/last.pt data/synth/data.yaml --dtype float16
    """
    from defectdet.diagnostics.render import render_nan
    from defectdet.diagnostics.sources import checkpoint_nan_report

    report = checkpoint_nan_report(checkpoint_path, data, NanDoctorSettings(**settings))
    _finish(report, as_json, render_nan)


@doctor_app.command()
def tensor(
    path: Path = typer.Argument(..., help="A file written by torch.save holding tensors."),
    key: str | None = typer.Option(None, help="Only this tensor (dotted path inside the file)."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Storage sharing, strides, contiguity, dtype, device, autograd, and the ops that would copy silently.

    Example: defectdet doctor tensor features.pt --key layer1
    """
    from rich.console import Console

    from defectdet.diagnostics.render import render_tensors
    from defectdet.diagnostics.report import jsonable
    from defectdet.diagnostics.tensor_inspect import inspect_file

    inspections = inspect_file(path, key=key)
    if as_json:
        typer.echo(json.dumps(jsonable(inspections), indent=2))
    else:
        render_tensors(inspections, Console())

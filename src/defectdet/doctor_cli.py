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

doctor_app = CommandApp(
    help="Diagnose the environment, checkpoints, loaders, NaNs and tensors. Without a command: the environment.",
    invoke_without_command=True,
    no_args_is_help=False,
)

JSON_OPTION = typer.Option(False, "--json", help="Print the report as JSON instead of tables.")
FORMAT_OPTION = typer.Option(
    None, "--format", help="Dataset format: yolo|coco|voc|deeppcb (default: detected)."
)


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
def checkpoint(
    path: Path = typer.Argument(
        ..., help="A checkpoint: ours, a bare state_dict, or another framework's dict."
    ),
    model: str | None = typer.Option(
        None,
        "--model",
        help="Compare with a preset (nano|tiny|small) or another checkpoint (default: its model_config).",
    ),
    mapping: Path | None = typer.Option(
        None, "--map", help="YAML list of {pattern, replace} regex renames to apply."
    ),
    out: Path | None = typer.Option(
        None, "--out", help="Write a migrated copy (with --map, else the proposed mapping)."
    ),
    save_map: Path | None = typer.Option(
        None, "--save-map", help="Write the proposed mapping as a rules YAML to edit."
    ),
    unsafe: bool = typer.Option(
        False, "--unsafe", help="Allow a whole pickled model (runs code from the file!)."
    ),
    num_classes: int | None = typer.Option(
        None, help="Classes of the --model preset (default: from the checkpoint)."
    ),
    in_channels: int | None = typer.Option(None, help="Input channels of the --model preset."),
    template: bool | None = typer.Option(
        None, "--template/--no-template", help="Template input for the --model preset."
    ),
    show_all: bool = typer.Option(
        False, "--all", help="List every tensor, not only the ones that do not match."
    ),
    as_json: bool = JSON_OPTION,
) -> None:
    """Why a checkpoint does not load: matching, missing, unexpected and mis-shaped keys, renamings, contents.

    Example: defectdet doctor checkpoint old.pt --model nano --out fixed.pt
    """
    from rich.console import Console

    from defectdet.diagnostics.checkpoint_doctor import checkpoint_report, migrate_checkpoint
    from defectdet.diagnostics.key_mapping import save_rules
    from defectdet.diagnostics.render import render_checkpoint

    options = {"num_classes": num_classes, "in_channels": in_channels, "template": template}
    report = checkpoint_report(path, model=model, rules=mapping, unsafe=unsafe, **options)
    if save_map is not None:
        if report.proposed_rules:
            save_rules(report.proposed_rules, save_map)
        note = f"saved the proposed mapping to {save_map}" if report.proposed_rules else "no mapping proposed"
        typer.echo(note, err=True)  # stderr: --json output stays parseable
    if out is None:
        _finish(report, as_json, render_checkpoint, show_all=show_all)
        return
    rules = mapping if mapping is not None else None
    result = migrate_checkpoint(path, out, model=model, rules=rules, unsafe=unsafe, **options)
    if as_json:
        from defectdet.diagnostics.report import jsonable

        typer.echo(json.dumps(jsonable({"before": report, "migration": result}), indent=2))
    else:
        console = Console()
        render_checkpoint(report, console, show_all=show_all)
        style = "green" if result.loads_strictly else "bold red"
        console.print(f"[{style}]migrated[/]: {result.message}")
    if not result.loads_strictly:
        raise typer.Exit(1)


def _int_list(text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise typer.BadParameter(f"expected comma-separated integers, got {text!r}") from None


@doctor_app.command()
def loader(
    data: Path = typer.Argument(..., help="data.yaml, COCO json, VOC folder or DeepPCB root."),
    preset: str | None = typer.Option(
        None, help="Model preset whose training step is timed (default: the one `train` would choose)."
    ),
    config: Path | None = typer.Option(None, help="Training YAML (as for `defectdet train --config`)."),
    batch: int | None = typer.Option(None, help="Batch size (default: the config's)."),
    input_size: int | None = typer.Option(
        None, "--input-size", help="Letterbox size (default: the config's)."
    ),
    workers: str | None = typer.Option(
        None, help="Worker counts to time, e.g. 0,1,2 (default: from the cores)."
    ),
    seconds: float = typer.Option(4.0, help="Seconds per loader setting (it stops earlier after --batches)."),
    batches: int = typer.Option(6, help="Batches per loader setting."),
    scan: int | None = typer.Option(None, help="Scan only the first N samples (default: all; 0: no scan)."),
    timeout: float = typer.Option(30.0, help="Seconds after which one sample counts as hung."),
    format: str | None = FORMAT_OPTION,
    as_json: bool = JSON_OPTION,
) -> None:
    """Loader speed over workers/batch/prefetch/persistent/pin, the bottleneck, and which sample breaks it.

    Example: defectdet doctor loader data/line3/data.yaml --preset nano
    """
    from defectdet.diagnostics.loader_doctor import loader_report
    from defectdet.diagnostics.render import render_loader

    report = loader_report(
        data,
        preset=preset,
        config=config,
        batch_size=batch,
        workers=_int_list(workers),
        seconds_per_setting=seconds,
        batches_per_setting=batches,
        scan_limit=scan,
        sample_timeout=timeout,
        overrides={key: value for key, value in {"input_size": input_size, "format": format}.items() if value}
        or None,
    )
    _finish(report, as_json, render_loader)


@doctor_app.command()
def nan(
    checkpoint_path: Path = typer.Argument(
        ..., metavar="CKPT", help="A checkpoint written by `defectdet train`."
    ),
    data: Path = typer.Argument(..., help="The dataset it trains on."),
    batches: int = typer.Option(2, help="Batches to run."),
    batch: int = typer.Option(2, help="Images per batch."),
    split: str | None = typer.Option(
        None, help="Split to take batches from (default: the run's train split)."
    ),
    device: str = typer.Option("auto", help="auto|cpu|cuda."),
    dtype: list[str] = typer.Option(
        [], "--dtype", help="Autocast dtypes to try (default: bfloat16 on CPU, float16 on CUDA)."
    ),
    ema: bool = typer.Option(False, help="Use the EMA weights instead of the training weights."),
    format: str | None = FORMAT_OPTION,
    as_json: bool = JSON_OPTION,
) -> None:
    """Forward and backward with hooks on every module, in float32 and under autocast: the first NaN/Inf source.

    Example: defectdet doctor nan runs/train/last.pt data/synth/data.yaml --dtype float16
    """
    from defectdet.diagnostics.render import render_nan
    from defectdet.diagnostics.sources import checkpoint_nan_report

    report = checkpoint_nan_report(
        checkpoint_path,
        data,
        batches=batches,
        batch_size=batch,
        split=split,
        device=device,
        dtypes=dtype,
        use_ema=ema,
        format=format,
    )
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

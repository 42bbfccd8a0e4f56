"""The `defectdet` command line. Commands only parse arguments and call library functions.

User-caused errors (`defectdet.errors.DefectDetError`) are printed as one red line, no traceback, exit 2.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

import typer
from rich.console import Console

from defectdet import compat
from defectdet.cli_app import CommandApp, FlagHelpGroup
from defectdet.cli_settings import SETTINGS_OPTIONS, settings_options
from defectdet.data.formats.label_settings import (
    COCO_EXPORT_OPTIONS,
    COCO_IMPORT_OPTIONS,
    LABELSTUDIO_IMPORT_OPTIONS,
    TASK_EXPORT_OPTIONS,
    CocoExportSettings,
    CocoImportSettings,
    LabelStudioImportSettings,
    TaskExportSettings,
)
from defectdet.data.synth.settings import SYNTH_OPTIONS, SynthSettings
from defectdet.demo import DEMO_MINUTES
from defectdet.doctor_cli import doctor_app
from defectdet.engine.config import TRAIN_OPTIONS, TrainConfig
from defectdet.engine.validate_settings import VALIDATE_OPTIONS, ValidateSettings
from defectdet.errors import DefectDetError
from defectdet.export.compare_settings import COMPARE_OPTIONS, CompareSettings
from defectdet.export.export_settings import EXPORT_OPTIONS, ExportSettings
from defectdet.runtime.predict_settings import PREDICT_OPTIONS, PredictSettings
from defectdet.serve.review_settings import REVIEW_OPTIONS, ReviewSettings
from defectdet.serve.settings import LOOPBACK_HOSTS, SERVE_OPTIONS, TOKEN_ENV, ServeSettings


def current_option_names(args: list[str]) -> list[str]:
    """`args` with each retired option name (`defectdet.compat`) replaced by its current one, with a note."""
    return compat.current_option_names(args, _note_retired)


def _note_retired(message: str) -> None:
    Console(stderr=True).print(f"[yellow]{message}[/yellow]")


class _Commands(FlagHelpGroup):
    """The root command group; it reads retired option names as their current ones."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        return super().parse_args(ctx, current_option_names(args))


app = CommandApp(
    cls=_Commands,
    name="defectdet",
    help="Industrial visual defect detection: synth -> check -> train -> val, on a CPU.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
)
# soft_wrap: a message is never folded at the terminal's width, so a long path stays one line a user can copy
# (tables still fit the width)
console = Console(stderr=False, soft_wrap=True)


def _setup_logging(verbose: bool) -> None:
    from rich.logging import RichHandler

    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(message)s",
        datefmt="[%X]",
        handlers=[RichHandler(console=Console(stderr=True), show_path=False, rich_tracebacks=False)],
        force=True,
    )
    for noisy in ("matplotlib", "PIL", "albumentations"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


@app.callback()
def _main(verbose: bool = typer.Option(False, "--verbose", "-v", help="Debug logging.")) -> None:
    _setup_logging(verbose)


OVERWRITE_EXPORT = typer.Option(
    False,
    "--overwrite",
    help="Replace a bundle already at the output path (without it, one there is refused).",
)


@app.command()
@settings_options(SynthSettings, SYNTH_OPTIONS)
def synth(
    out: Path = typer.Argument(..., help="Folder to write the YOLO-format dataset into."),
    settings: dict[str, Any] = SETTINGS_OPTIONS,
) -> None:
    """Write a procedural dataset (YOLO data.yaml) with exact defect boxes.

    Example: defectdet synth data/synth --boards 60 --seed 1
    Example: defectdet synth data/surface --kind surface --boards 300
    Example: defectdet synth data/new-lamp --boards 40 --seed 12 --shift lamp
    Example: defectdet synth data/two-lights --kind surface --boards 60 --companion L2
    """
    from defectdet.data.synth import synthesize_dataset
    from defectdet.data.synth.shift import SHIFT_RECORD

    synth_settings = SynthSettings(**settings)
    data_yaml = synthesize_dataset(out, synth_settings)
    kind = "surfaces" if synth_settings.kind == "surface" else "boards"
    console.print(f"[green]wrote[/green] {synth_settings.boards} {kind} -> {data_yaml}")
    if synth_settings.companions:
        from defectdet.data.synth.companion import checked_companion_names

        names = checked_companion_names(synth_settings.companions)
        console.print(f"companion captures {', '.join(names)} -> {data_yaml.parent / 'companions'}")
    if synth_settings.shift:
        record = json.loads((data_yaml.parent / SHIFT_RECORD).read_text(encoding="utf-8"))
        shifts = ", ".join(record["shifts"])
        console.print(f"shifted line ({shifts}): {record['images']} tested images changed, templates kept")


@app.command()
def check(
    data: Path = typer.Argument(..., help="data.yaml, COCO json, VOC folder or DeepPCB root."),
    format: str | None = typer.Option(None, "--format", help="yolo|coco|voc|deeppcb (default: detected)."),
) -> None:
    """Validate a dataset: counts per class, sizes, templates, and every problem with its file and line.

    Exit code 1 when any file has an error, 0 when there are only warnings.

    Example: defectdet check data/line3/data.yaml
    """
    from defectdet.data.check import run_check

    raise typer.Exit(run_check(data, format=format, console=console))


@app.command()
def presets(
    input_size: int = typer.Option(640, "--input-size", help="Input size for the GFLOPs figure."),
) -> None:
    """List the model presets with parameters and GFLOPs.

    Example: defectdet presets --input-size 640
    """
    from rich.table import Table

    from defectdet.engine.autoconfig import auto_preset
    from defectdet.model import PRESETS, build_model, model_info
    from defectdet.model.detector import has_imagenet_backbone
    from defectdet.model.imagenet import weights_path as imagenet_weights_path
    from defectdet.model.pretrained import shipped_weights

    default_for = {auto_preset(True)[0]: "with templates", auto_preset(False)[0]: "without templates"}
    short_budget = auto_preset(False, (0, 1.0))[0]  # what a time budget too short for lite0 gets
    default_for.setdefault(short_budget, "without templates, when the time budget is short for lite0")
    table = Table(title=f"model presets (gray + template input, 6 classes, {input_size}x{input_size})")
    for column in ("preset", "params", "GFLOPs", "strides", "shipped weights", "default for"):
        table.add_column(column, justify="right" if column in ("params", "GFLOPs", "strides") else "left")
    for name in PRESETS:
        model = build_model(name, num_classes=6, in_channels=2, template=True)
        info = model_info(model, input_size)
        layouts = [layout for layout in (True, False) if shipped_weights(name, layout) is not None]
        weights = ", ".join("template" if layout else "plain" for layout in layouts) or "none (random start)"
        if has_imagenet_backbone(name):
            weights = (
                "ImageNet (package)" if imagenet_weights_path() is not None else "ImageNet: not installed"
            )
        table.add_row(
            name,
            f"{info['params']:,}",
            f"{info['gflops']:.3f}",
            ", ".join(map(str, model.strides)),
            weights,
            default_for.get(name, "--preset " + name + " only"),
        )
    console.print(table)


@app.command()
@settings_options(TrainConfig, TRAIN_OPTIONS, field_defaults=False)
def train(
    data: Path = typer.Argument(..., help="data.yaml, COCO json, VOC folder or DeepPCB root."),
    config: Path | None = typer.Option(None, help="YAML with TrainConfig fields; options below override it."),
    settings: dict[str, Any] = SETTINGS_OPTIONS,
    no_companions: bool = typer.Option(
        False, "--no-companions", help="Ignore the dataset's companion captures."
    ),
    set_: list[str] = typer.Option([], "--set", help="Any other TrainConfig field: --set ema_decay=0.999"),
) -> None:
    """Train a detector. Writes last.pt, best.pt, metrics.csv, plots and report.html into the run folder.

    Example: defectdet train data/synth/data.yaml --time 5 --out runs/synth
    """
    from defectdet.engine.autoconfig import choices_table
    from defectdet.engine.config import load_config
    from defectdet.engine.trainer import build_train_data
    from defectdet.engine.trainer import train as run_training

    overrides = _train_overrides(set_, {"data": data, **settings}, no_companions)
    train_config = load_config(config, overrides)
    train_data = build_train_data(train_config)
    rank_zero = os.environ.get("RANK", "0") == "0"  # under torchrun only rank 0 reports
    if rank_zero:
        console.print(choices_table(train_data.choices))
    result = run_training(train_data.config or train_config, data=train_data)
    if rank_zero:
        _print_train_result(result)


def _print_train_result(result: Any) -> None:
    console.print(f"[green]done[/green]: run folder {result.run_dir}")
    if result.best_metrics:
        summary = ", ".join(f"{k}={v:.4f}" for k, v in result.best_metrics.items() if isinstance(v, float))
        console.print(f"best: {summary}")


def _train_overrides(set_: list[str], given: dict[str, Any], no_companions: bool) -> dict[str, Any]:
    """TrainConfig overrides from `train`'s options: --set pairs, then the settings given; --no-companions
    sets no companions, and --time without --epochs clears the default epochs."""
    from defectdet.engine.config import parse_overrides

    if no_companions and "companions" in given:
        raise DefectDetError("--companions and --no-companions exclude each other")
    overrides = parse_overrides(set_)
    overrides.update(given)
    if no_companions:
        overrides["companions"] = []
    if "time_minutes" in given and "epochs" not in given:
        overrides["epochs"] = None
    return overrides


def _recapture_config(nuisance: bool, shift: float | None, rotation: float | None):
    """The clean-board recapture settings of `val`'s options (data.recapture.RecaptureConfig)."""
    from defectdet.data.recapture import RecaptureConfig

    config = RecaptureConfig() if nuisance else RecaptureConfig.none()
    if shift is not None or rotation is not None:
        config = config.with_motion(
            shift if shift is not None else config.shift_px[1],
            rotation if rotation is not None else config.rotation_deg[1],
        )
    return config


@app.command()
def fit(
    images: Path = typer.Argument(..., help="A folder of defect-free images (searched recursively)."),
    out: Path = typer.Option(Path("model.onnx"), "--out", help="Bundle file to write."),
    time: float | None = typer.Option(
        None, "--time", help="Time budget in minutes (default: every image, the full memory bank)."
    ),
    input_size: int | None = typer.Option(
        None,
        "--input-size",
        help="Square input side, a multiple of 32 (default: from the images, at most 640).",
    ),
    false_call_rate: float = typer.Option(
        0.01, "--false-call-rate", help="Share of held-out good images the threshold may flag."
    ),
    seed: int = typer.Option(0, help="Random seed (which images are held out, the memory bank's start)."),
    overwrite: bool = OVERWRITE_EXPORT,
) -> None:
    """Fit a good-parts-only model on defect-free images alone and write a bundle that boxes what does not
    look like them (class "anomaly"); `predict`, `serve` and `Predictor` run it like any bundle.

    Example: defectdet fit good_parts/ --out model.onnx --time 2
    """
    from defectdet.anomaly import FitSettings, fit_good_only

    _refuse_existing_bundle(out, overwrite)
    settings = FitSettings(minutes=time, input_size=input_size, false_call_rate=false_call_rate, seed=seed)
    result = fit_good_only(images, out, settings)
    calibration, meta = result.calibration, result.metadata
    console.print(f"[green]bundle[/green]: {result.bundle} ({result.bundle.stat().st_size / 1024:.0f} KiB)")
    console.print(
        f"input {meta.input_size}x{meta.input_size}, {meta.channels} channel(s); {result.fit_images} images fitted, "
        f"{result.memory_vectors} memory vectors; threshold {meta.thresholds.threshold} flags "
        f"{calibration.false_calls} of {calibration.images} held-out good "
        f"images (target {calibration.target_rate:.2%}); {result.timings['total_s']:.0f} s"
    )
    for name, reason in result.skipped:
        console.print(f"[yellow]skipped[/yellow] {name}: {reason}")


@app.command()
@settings_options(ValidateSettings, VALIDATE_OPTIONS)
def val(
    checkpoint: Path = typer.Argument(
        ..., help="A checkpoint written by `defectdet train` (best.pt / last.pt) or a bundle (model.onnx)."
    ),
    data: Path = typer.Argument(..., help="data.yaml, COCO json, VOC folder or DeepPCB root."),
    settings: dict[str, Any] = SETTINGS_OPTIONS,
    clean_nuisance: bool = typer.Option(
        True,
        "--clean-nuisance/--no-clean-nuisance",
        help="--no-clean-nuisance: the clean board is the template itself (an exactly zero difference).",
    ),
    clean_shift: float | None = typer.Option(None, help="Clean boards: a fixed shift in pixels."),
    clean_rotation: float | None = typer.Option(None, help="Clean boards: a fixed |rotation| in degrees."),
) -> None:
    """Evaluate a checkpoint: COCO mAP (DeepPCB's protocol too on DeepPCB data), operating point, report.html.

    Example: defectdet val runs/train/best.pt data/line3/data.yaml --split val --threshold-from train
    """
    from defectdet.engine.validate import validate

    recapture = _recapture_config(clean_nuisance, clean_shift, clean_rotation)
    metrics = validate(
        checkpoint, data, ValidateSettings(**settings, clean_nuisance=recapture), console=console
    )
    console.print(f"[green]report[/green]: {metrics['report']}")


def _refuse_existing_bundle(bundle: Path, overwrite: bool) -> None:
    """A bundle already at `bundle` may be the one a line serves: replaced only with --overwrite."""
    if bundle.is_dir():
        raise DefectDetError(
            f"--out {bundle}: a folder; give the bundle's file name (e.g. {bundle}/model.onnx)"
        )
    if bundle.exists() and not overwrite:
        raise DefectDetError(
            f"--out {bundle}: a bundle is already there; pass --overwrite to replace it, or choose another --out"
        )


@app.command()
@settings_options(ExportSettings, EXPORT_OPTIONS)
def export(
    checkpoint: Path = typer.Argument(..., help="A checkpoint written by `defectdet train` (best.pt)."),
    out: Path | None = typer.Option(
        None, "--out", help="Bundle file (default: <checkpoint stem>.onnx beside it)."
    ),
    settings: dict[str, Any] = SETTINGS_OPTIONS,
    overwrite: bool = OVERWRITE_EXPORT,
) -> None:
    """Export a checkpoint to ONE self-describing .onnx bundle (EMA weights, BatchNorm folded, thresholds
    measured on the validation split, drift reference) that `predict`, `serve` and `Predictor` run without torch.

    Example: defectdet export runs/train/best.pt --out model.onnx --int8
    """
    from defectdet.export.exporter import export_bundle

    _refuse_existing_bundle(out if out else checkpoint.with_suffix(".onnx"), overwrite)
    result = export_bundle(checkpoint, out, ExportSettings(**settings), console=console)
    _print_export(result)
    if result.int8 is not None:
        _print_int8_report(result.int8)
        if not result.int8["written"]:
            raise typer.Exit(1)


def _print_export(result: Any) -> None:
    """The bundle written (an `ExportResult`): its size, inputs, test-time options, thresholds, extra files."""
    meta = result.metadata
    console.print(f"[green]bundle[/green]: {result.bundle} ({result.bundle.stat().st_size / 1024:.0f} KiB)")
    console.print(
        f"input {meta.input_size}x{meta.input_size}, {meta.channels} channel(s), planes {', '.join(meta.planes)}, "
        f"flip views {meta.flip_views}, repeat check {'on' if meta.repeat_check else 'off'}, fragments merged for "
        f"{', '.join(meta.thresholds.merge_fragments) or 'no class'}; eager vs onnxruntime max |diff| {result.parity_max_abs_diff:.1e}"
    )
    recall = meta.thresholds.recall_threshold
    console.print(
        f"operating threshold {meta.thresholds.threshold:.3f} ({meta.thresholds.threshold_source}); "
        f"recall {meta.thresholds.recall_target:g} threshold: {'unreachable' if recall is None else f'{recall:.3f}'}; "
        f"drift reference: {'yes' if meta.drift_reference else 'no'}"
    )
    for name, path in result.extra_files.items():
        console.print(f"[green]{name}[/green]: {path}")


def _print_int8_report(report: dict[str, Any]) -> None:
    """The int8 model's accuracy and speed against fp32, and whether it was written."""
    verdict = "[green]written[/green]" if report["written"] else "[red]refused[/red]"
    console.print(
        f"int8 {verdict}: mAP@0.5 {report['mAP50_fp32']:.4f} -> {report['mAP50_int8']:.4f} "
        f"(drop {report['mAP50_drop']:+.4f}, limit {report['max_drop']}), p50 {report['p50_ms_fp32']} -> "
        f"{report['p50_ms_int8']} ms (x{report['speedup']})"
        + (f": {report['path']}" if report["path"] else "")
    )
    if report["written"] and report["speedup"] < 1.0:
        console.print(
            f"[yellow]int8 is {1 / report['speedup']:.1f}x slower than fp32 on this CPU[/yellow]: "
            "deploy the fp32 bundle here; int8 may pay on CPUs with fast int8 kernels (VNNI/AMX)"
        )


@app.command()
@settings_options(PredictSettings, PREDICT_OPTIONS)
def predict(
    model: Path = typer.Argument(..., help="A bundle (.onnx) or a training checkpoint (exported first)."),
    source: str = typer.Argument(
        ..., help="An image file, a folder of images, or a quoted glob ('dir/*.jpg')."
    ),
    settings: dict[str, Any] = SETTINGS_OPTIONS,
    out: Path = typer.Option(Path("runs/predict"), help="Output folder."),
) -> None:
    """Predict a file, folder or glob: annotated images, predictions.jsonl and YOLO label files in --out.
    Unreadable files are listed and skipped; exit code 1 when any file failed.

    Example: defectdet predict model.onnx 'line3/*.jpg' --templates golden/ --out runs/line3
    """
    from defectdet.export.resolve import resolve_bundle
    from defectdet.runtime.predict import predict_source

    predict_settings = PredictSettings(**settings)
    bundle = resolve_bundle(model, Path(out), predict_settings.flip_views)
    summary = predict_source(bundle, source, out, predict_settings)
    console.print(
        f"{summary.images} images, {summary.defective} defective, {summary.detections} detections, "
        f"mean {summary.mean_total_ms} ms/image end to end -> {summary.out_dir}/predictions.jsonl"
    )
    if summary.failed:
        console.print(f"[red]{len(summary.failed)} file(s) failed[/red]:")
        for name, error in summary.failed:
            console.print(f"  {name}: {error}")
        raise typer.Exit(1)


@app.command()
@settings_options(CompareSettings, COMPARE_OPTIONS)
def compare(
    old: Path = typer.Argument(
        ..., help="The model on the line now: a bundle (.onnx) or a checkpoint (exported first)."
    ),
    new: Path = typer.Argument(..., help="The candidate: a bundle (.onnx) or a checkpoint (exported first)."),
    data: Path = typer.Argument(..., help="data.yaml, COCO json, VOC folder or DeepPCB root."),
    settings: dict[str, Any] = SETTINGS_OPTIONS,
) -> None:
    """Should NEW replace OLD? Both run through the torch-free runtime on the same held-out images, each at its
    own stored threshold: mAP@0.5 and @0.5:0.95, escapes, false calls, per-class AP50, latency (p50/p95 end to
    end, interleaved), the images where they disagree (disagreements.png), compare.json and a verdict.
    Rule: promote NEW only if its escape rate and missed-defect rate are at most OLD's plus the escape
    tolerance, its mAP@0.5 at least OLD's minus the mAP tolerance, and its false-call rate (defect-free images
    and clean boards flagged) at most OLD's plus the false-call tolerance; a criterion that cannot be measured
    (no defect-free image) keeps OLD. Equal is not worse, but a NEW whose mAP@0.5 or recall is near zero (below
    0.05) is never promoted. Exit code 0: promote, 1: keep OLD, 2: error (models
    that cannot be compared: another input layout, other channels, or other classes; NEW may reorder or add
    classes, which are matched by name). Against a good-parts-only model (`fit`, class "anomaly") with other
    classes, every box counts as one class: the comparison is class-agnostic, and says so.

    Example: defectdet compare line.onnx runs/train/best.pt data.yaml --clean-auto --out runs/compare
    """
    from defectdet.export.compare import PROMOTE, compare_models
    from defectdet.export.compare_view import print_comparison

    document = compare_models(old, new, data, CompareSettings(**settings, progress=True))
    print_comparison(document, console)
    raise typer.Exit(0 if document["verdict"]["decision"] == PROMOTE else 1)


@app.command()
@settings_options(ServeSettings, SERVE_OPTIONS)
def serve(
    bundle: Path = typer.Argument(..., help="A bundle written by `defectdet export` (.onnx)."),
    host: str = typer.Option(
        "127.0.0.1", help="Interface to listen on (0.0.0.0: all interfaces; warns without a token)."
    ),
    port: int = typer.Option(8000, help="TCP port."),
    workers: int = typer.Option(
        1,
        help="Processes sharing the port. /metrics sums them; drift charts, readiness and /v1/results are kept "
        "per worker process, and a drift reset (POST /v1/drift/reset, the page) reaches every worker within 1 s.",
    ),
    token_file: Path | None = typer.Option(
        None,
        help="File holding an access token: every route but /healthz, /readyz and the page then needs "
        "'Authorization: Bearer <token>'. Or set DEFECTDET_TOKEN.",
    ),
    allowed_host: list[str] = typer.Option(
        [], help="A Host name clients use (repeatable); loopback names, IP literals and the bind host always."
    ),
    settings: dict[str, Any] = SETTINGS_OPTIONS,
) -> None:
    """Serve a bundle over HTTP: POST /v1/detect, GET /readyz /metrics /v1/model /openapi.json, a page at /.

    Example: defectdet serve model.onnx --keep flagged,uncertain --keep-dir kept --keep-max-mb 2000 --models-dir models
    """
    from defectdet.serve.launch import serve_bundle

    token = _read_token(token_file, TOKEN_ENV)
    serve_settings = _serve_settings(settings, token, allowed_host, workers)
    serve_bundle(bundle, *_bindable(host, port), serve_settings, workers=workers)


def _bindable(host: str, port: int) -> tuple[str, int]:
    """(host, port), after checking the port: exit 2 with one line when PORT is taken on HOST (another process
    listens there) or not allowed, before the bundle loads: no half-started service, no abort."""
    import errno
    import socket

    address = host.strip("[]")
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            probe.bind((address, port))
        except OSError as error:
            if error.errno not in (errno.EADDRINUSE, errno.EACCES):
                return host, port  # not a port question (another host's address): uvicorn says it
            console.print(
                f"[red]cannot listen on {host}:{port}: {error.strerror or error}[/red] (another process holds "
                "the port? stop it, or choose another with --port)"
            )
            raise typer.Exit(2) from None
    return host, port


def _serve_settings(
    given: dict[str, Any], token: str | None, allowed_host: list[str], workers: int
) -> ServeSettings:
    """`serve`'s ServeSettings: the settings given (the rest: the defaults), the token and the allowed hosts;
    a bad value or combination is a BadParameter naming it."""
    try:
        settings = ServeSettings(**given, token=token, allowed_hosts=(*LOOPBACK_HOSTS, *allowed_host))
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
    except ValueError as error:
        raise typer.BadParameter(str(error)) from None
    return settings


MIN_TOKEN_CHARS = 16


def _read_token(token_file: Path | None, env: str) -> str | None:
    """The access token from `token_file` (else the environment variable `env`): refused when shorter than
    MIN_TOKEN_CHARS; a file that its group or others may read is warned about."""
    token = os.environ.get(env) or None
    where = env
    if token_file is not None:
        try:
            token = token_file.read_text().strip()
            mode = token_file.stat().st_mode
        except OSError as error:
            raise typer.BadParameter(f"cannot read {token_file}: {error.strerror or error}") from None
        if not token:
            raise typer.BadParameter(f"{token_file} is empty: write the token into it")
        where = str(token_file)
        if mode & 0o077:
            logging.getLogger(__name__).warning(
                "%s can be read by its group or others (mode %o): chmod 600 it", token_file, mode & 0o777
            )
            console.print(
                f"[yellow]{token_file} can be read by its group or others (mode {mode & 0o777:o}): "
                "chmod 600 it[/yellow]"
            )
    if token is not None and len(token) < MIN_TOKEN_CHARS:
        raise typer.BadParameter(
            f"the token in {where} has {len(token)} characters; use at least {MIN_TOKEN_CHARS} (for example "
            "python -c 'import secrets; print(secrets.token_urlsafe(32))')"
        )
    return token


@app.command()
@settings_options(ReviewSettings, REVIEW_OPTIONS)
def review(
    folder: Path = typer.Argument(
        ...,
        help="A kept folder (serve --keep-dir) or any folder of images (images/ and optional YOLO labels/).",
    ),
    settings: dict[str, Any] = SETTINGS_OPTIONS,
) -> None:
    """Review kept images in the browser: accept, clean, skip, re-class, delete or draw boxes -> YOLO labels.

    Example: defectdet review kept/ --operator anna   (then open http://127.0.0.1:8001/review)
    """
    from defectdet.serve.review import ReviewFolder
    from defectdet.serve.review_app import run_review

    review_settings = ReviewSettings(**settings)
    review_folder = ReviewFolder(folder, review_settings.classes, review_settings.operator)
    if review_settings.export_coco is not None:
        _export_reviewed(review_folder, review_settings.export_coco)
        return
    try:
        serve_settings = ServeSettings(
            token=_read_token(review_settings.token_file, TOKEN_ENV),
            allowed_hosts=(*LOOPBACK_HOSTS, *review_settings.allowed_hosts),
        )
    except ValueError as error:
        raise typer.BadParameter(str(error)) from None
    run_review(
        review_folder, review_settings.host, review_settings.port, serve_settings, review_settings.model
    )


def _export_reviewed(review_folder: Any, out: Path) -> None:
    """Write the folder's reviewed labels as COCO json to `out`, and say what was written and left out."""
    summary = review_folder.export_coco(out)
    console.print(
        f"{summary['images']} images, {summary['annotations']} boxes -> {out}"
        + (f" ({len(summary['problems'])} left out)" if summary["problems"] else "")
    )
    for problem in summary["problems"]:
        console.print(f"  [yellow]{problem}[/yellow]")


@app.command()
def demo(
    out: Path = typer.Option(Path("runs/demo"), help="Folder for the synthetic data and the run."),
    minutes: float = typer.Option(
        DEMO_MINUTES, help="Training budget in minutes (synthesis, evaluation and export come on top)."
    ),
    boards: int = typer.Option(160, help="Synthetic boards to generate."),
) -> None:
    """The embedded default, offline: synthesize boards, check them, train, evaluate, report.

    Example: defectdet demo --out runs/demo --minutes 6
    """
    from defectdet.demo import run_demo

    run_demo(out, minutes=minutes, boards=boards, console=console)


labels_app = CommandApp(
    help="Interchange with labelling tools: Label Studio tasks and exports, CVAT's COCO 1.0, COCO json.",
    no_args_is_help=True,
)


def _check_unknown_policy(settings: dict[str, Any]) -> None:
    if settings.get("add_classes") and settings.get("skip_unknown"):
        raise typer.BadParameter("--add-classes and --skip-unknown exclude each other")


def _print_import(report, split: str) -> None:
    """The counts of one import (an `ImportReport`)."""
    console.print(
        f"[green]{split}[/green]: {report.images_copied} image(s) copied, {report.images_present} already there; "
        f"labels: {report.labels_written} new, {report.labels_merged} merged, {report.labels_replaced} replaced, "
        f"{report.labels_unchanged} unchanged; {report.boxes} box(es) -> {report.data_yaml}"
    )
    console.print(f"classes: {', '.join(report.class_names)}")
    if report.added_classes:
        console.print(f"[yellow]added classes[/yellow]: {', '.join(report.added_classes)}")
    if report.skipped_boxes:
        console.print(f"[yellow]{report.skipped_boxes} box(es) of unknown classes skipped[/yellow]")
    for line in report.skipped_images:
        console.print(f"[yellow]skipped[/yellow] {line}")
    for line in report.warnings[:20]:
        console.print(f"[yellow]warning[/yellow] {line}")
    if len(report.warnings) > 20:
        console.print(f"[yellow]... and {len(report.warnings) - 20} more warnings[/yellow]")


@labels_app.command("export-labelstudio")
@settings_options(TaskExportSettings, TASK_EXPORT_OPTIONS)
def export_labelstudio(
    source: Path = typer.Argument(
        ...,
        help="`defectdet predict`'s --out folder (or its predictions.jsonl), a `serve --keep` folder, or a "
        "folder of images with a prediction <stem>.json beside each.",
    ),
    out: Path = typer.Argument(..., help="Tasks JSON to write (import it in Label Studio)."),
    settings: dict[str, Any] = SETTINGS_OPTIONS,
) -> None:
    """Images -> Label Studio import tasks (the operator's reviewed labels as annotations, the model's
    detections as predictions where no one reviewed yet, templates as data.template, each companion capture
    NAME as data.companion_NAME), and the labelling config (companion captures shown below the image).

    Example: defectdet labels export-labelstudio runs/line3 tasks.json --document-root /data/line3
    Example: defectdet labels export-labelstudio kept/ tasks.json --model models/line.onnx
    """
    from defectdet.data.formats.labelstudio import export_tasks

    export_settings = TaskExportSettings(**settings)
    if export_settings.model is not None:
        if export_settings.classes:
            raise typer.BadParameter("--model and --classes exclude each other")
        names = _model_class_names(export_settings.model)
        export_settings = dataclasses.replace(export_settings, model=None, classes=names)
    _print_task_export(export_tasks(source, out, export_settings))


def _model_class_names(model: Path) -> list[str]:
    """The class names a bundle's metadata or a checkpoint records, in id order."""
    if model.suffix.lower() == ".onnx":
        from defectdet.runtime.bundle import read_metadata

        return list(read_metadata(model).class_names)
    from defectdet.engine.checkpoint import load_checkpoint

    names = load_checkpoint(model).get("class_names")
    if not names:
        raise typer.BadParameter(
            f"--model {model}: records no class names (a checkpoint of `defectdet train`?)"
        )
    return [str(name) for name in names]


def _print_task_export(result: Any) -> None:
    """What `export_tasks` wrote (a `TasksExport`)."""
    console.print(
        f"[green]wrote[/green] {result.tasks} task(s), {result.annotated} with reviewed labels, "
        f"{result.predictions} with pre-annotations ({result.regions} box(es)) -> {result.tasks_path}"
    )
    console.print(
        f"[green]labelling config[/green] ({', '.join(result.class_names)}) -> {result.config_path}"
    )
    if result.companions:
        console.print(f"{result.companions} companion capture(s) as data.companion_NAME of their tasks")
    console.print(
        f"image URLs are below {result.document_root} (set LABEL_STUDIO_LOCAL_FILES_DOCUMENT_ROOT to it)"
    )
    for line in result.skipped:
        console.print(f"[yellow]left out (predict failed)[/yellow] {line}")


@labels_app.command("import-labelstudio")
@settings_options(LabelStudioImportSettings, LABELSTUDIO_IMPORT_OPTIONS)
def import_labelstudio(
    export: Path = typer.Argument(..., help="Label Studio's 'JSON' export (a list of tasks)."),
    out_dir: Path = typer.Argument(..., help="YOLO dataset folder to import into (made when absent)."),
    settings: dict[str, Any] = SETTINGS_OPTIONS,
    label_config: Path | None = typer.Option(
        None,
        help="The project's labelling config XML (export-labelstudio's, or Settings > Labeling Interface > Code): "
        "its labels in order are the classes (instead of --classes).",
    ),
) -> None:
    """A Label Studio JSON export -> YOLO labels + data.yaml (train and val), images, templates (a task's
    data.template) and companion captures (data.companion_NAME, into companions/NAME/ and data.yaml's
    companions:) copied or linked.

    Example: defectdet labels import-labelstudio project-1.json data/line3 --images /data/line3
    """
    from defectdet.data.formats.labelstudio import config_classes, import_export, import_export_held_out

    if label_config is not None and settings.get("classes"):
        raise typer.BadParameter("--label-config and --classes exclude each other")
    _check_unknown_policy(settings)
    if label_config is not None:
        settings["classes"] = config_classes(label_config)
    import_settings = LabelStudioImportSettings(**settings)
    if import_settings.split is not None:
        report, unlabelled = import_export(export, out_dir, import_settings)
        reports = [report]
    else:
        reports, unlabelled = import_export_held_out(export, out_dir, import_settings)
    for report in reports:
        _print_import(report, report.split)
    if unlabelled:
        console.print(f"{unlabelled} task(s) without an annotation left out")


@labels_app.command("import-coco")
@settings_options(CocoImportSettings, COCO_IMPORT_OPTIONS)
def import_coco(
    export: Path = typer.Argument(
        ..., help="CVAT 'COCO 1.0' export: the unzipped folder (annotations/, images/) or a COCO json."
    ),
    out_dir: Path = typer.Argument(..., help="YOLO dataset folder to import into (made when absent)."),
    settings: dict[str, Any] = SETTINGS_OPTIONS,
) -> None:
    """A CVAT COCO 1.0 export (or any COCO json) -> YOLO labels + data.yaml, images copied (or linked), with
    each image's template_file_name and companions (into companions/NAME/ and data.yaml's companions:).

    CVAT does not keep an image's template or companion captures: its own export names only the images. After
    importing it, add `templates:` / `companions:` to the data.yaml, pointing at their folders (a file of the
    image's name, path or stem there is found).

    Example: defectdet labels import-coco cvat-task-12/ data/line3 --split val
    """
    from defectdet.data.formats.cvat import import_coco as run_import

    _check_unknown_policy(settings)
    for result in run_import(export, out_dir, CocoImportSettings(**settings)):
        console.print(f"{result.json_path}:")
        _print_import(result.report, result.split)
        if result.crowd:
            console.print(f"{result.crowd} crowd (mask) annotation(s) kept by their box")


@labels_app.command("export-coco")
@settings_options(CocoExportSettings, COCO_EXPORT_OPTIONS)
def export_coco_command(
    data: Path = typer.Argument(..., help="data.yaml, COCO json, VOC folder or DeepPCB root."),
    out: Path = typer.Argument(..., help="COCO json to write."),
    settings: dict[str, Any] = SETTINGS_OPTIONS,
) -> None:
    """One split of our dataset -> COCO json (category ids 1..K) for tools that import COCO, e.g. CVAT.

    Each image's template and companion captures go along as template_file_name and companions {NAME: file},
    relative like file_name; import-coco reads them back. CVAT keeps neither: they do not come back in its
    export.

    Example: defectdet labels export-coco data/line3 line3-train.json --split train
    """
    from defectdet.data.formats.interchange import export_coco

    result = export_coco(data, out, CocoExportSettings(**settings))
    console.print(
        f"[green]wrote[/green] {result.images} image(s), {result.annotations} box(es), "
        f"{len(result.categories)} categories ({', '.join(result.categories)}) -> {result.path}"
    )
    console.print(f"file_names are relative to {result.image_root}")
    if result.companions:
        console.print(
            f"[yellow]{result.companions} companion capture(s)[/yellow] in the images' companions field: "
            "CVAT does not keep them (import-coco of a CVAT export comes back without them)"
        )
    if result.warnings:
        console.print(
            f"[yellow]{len(result.warnings)} warning(s)[/yellow]: defectdet check {data} lists them"
        )


app.add_typer(doctor_app, name="doctor")
app.add_typer(labels_app, name="labels")


def main() -> None:
    """Console entry point: user errors become one clear line and exit code 2."""
    try:
        app()
    except DefectDetError as error:
        Console(stderr=True).print(f"[bold red]error:[/bold red] {error}")
        sys.exit(2)


if __name__ == "__main__":
    main()

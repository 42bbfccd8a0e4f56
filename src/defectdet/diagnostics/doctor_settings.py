"""Settings of the doctor's checkpoint, loader and NaN diagnoses, and the `defectdet doctor` options they make.

`CheckpointDoctorSettings` configures `doctor checkpoint` (`checkpoint_doctor.checkpoint_report` and
`migrate_checkpoint`), `LoaderDoctorSettings` `loader_doctor.loader_report`, `NanDoctorSettings`
`sources.checkpoint_nan_report`. Each table beside them (`..._OPTIONS`) makes the command's options. Imports
neither torch nor the diagnostics, so the command line builds its options at start.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from defectdet.cli_option import CliOption

FORMAT_HELP = "Dataset format: yolo|coco|voc|deeppcb (default: detected)."


def int_list(text: str | None) -> list[int] | None:
    """'0,1, 2' -> [0, 1, 2]; anything else is a BadParameter naming it."""
    if text is None:
        return None
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        import typer  # the command line's converter: typer is there

        raise typer.BadParameter(f"expected comma-separated integers, got {text!r}") from None


@dataclass(frozen=True)
class CheckpointDoctorSettings:
    """What `doctor checkpoint` compares a checkpoint with and what it writes.

    `model`: a preset (built with `num_classes`, `in_channels`, `template`; None: from the checkpoint) or another
    checkpoint (None: the checkpoint's model_config). `rules`: a YAML list of {pattern, replace} renames applied
    first. `out`: write a migrated copy (renamed with `rules`, else the proposed mapping); `save_map`: write the
    proposed mapping as a rules YAML. `unsafe`: allow a whole pickled model (runs code from the file).
    `show_all`: list every tensor, not only the ones that do not match.
    """

    model: str | None = None
    rules: Path | None = None
    out: Path | None = None
    save_map: Path | None = None
    unsafe: bool = False
    num_classes: int | None = None
    in_channels: int | None = None
    template: bool | None = None
    show_all: bool = False

    def target_options(self) -> dict[str, Any]:
        """The keywords that build a `model` preset (`checkpoint_doctor.resolve_target`)."""
        return {"num_classes": self.num_classes, "in_channels": self.in_channels, "template": self.template}


@dataclass(frozen=True)
class LoaderDoctorSettings:
    """How `loader_report` builds and times the loader.

    A dataset path is built as `defectdet train` would, with `preset` and `config` (a training YAML);
    `input_size`, `format` and `overrides` (other TrainConfig fields) override it. `batch_size` (None: the
    config's, else 8); `workers`: worker counts to time (None: from the cores). Each loader setting runs for up to
    `seconds_per_setting` over `batches_per_setting` batches; `explore` adds variants around the best worker
    count. `scan_limit` caps the scanned samples (None: all, 0: no scan); a sample counts as hung after
    `sample_timeout` seconds. `time_model` times a training step, for about `model_seconds`.
    """

    preset: str | None = None
    config: Path | None = None
    batch_size: int | None = None
    input_size: int | None = None
    workers: list[int] | None = None
    seconds_per_setting: float = 4.0
    batches_per_setting: int = 6
    scan_limit: int | None = None
    sample_timeout: float = 30.0
    format: str | None = None
    overrides: dict[str, Any] | None = None
    model_seconds: float = 3.0
    time_model: bool = True
    explore: bool = True

    def train_overrides(self) -> dict[str, Any]:
        """The TrainConfig fields given: `overrides`, then `input_size` and `format` when set."""
        given = {"input_size": self.input_size, "format": self.format}
        return {**(self.overrides or {}), **{key: value for key, value in given.items() if value}}


@dataclass(frozen=True)
class NanDoctorSettings:
    """Which batches `checkpoint_nan_report` runs and how: `batches` of `batch_size` images from `split` (None:
    the run's train split) of the data in `format` (None: the run's, else detected), on `device` (auto: CUDA when
    there), in float32 and under each autocast dtype of `dtypes` (None: bfloat16 on CPU, float16 on CUDA), with
    the training weights or (`use_ema`) the EMA ones."""

    batches: int = 2
    batch_size: int = 2
    split: str | None = None
    device: str = "auto"
    dtypes: list[str] | None = None
    use_ema: bool = False
    format: str | None = None


# `defectdet doctor checkpoint`'s options, in the order its help lists them
CHECKPOINT_OPTIONS: dict[str, CliOption] = {
    "model": CliOption(
        flag="--model",
        help="Compare with a preset (nano|tiny|small) or another checkpoint (default: its model_config).",
    ),
    "rules": CliOption(flag="--map", help="YAML list of {pattern, replace} regex renames to apply."),
    "out": CliOption(flag="--out", help="Write a migrated copy (with --map, else the proposed mapping)."),
    "save_map": CliOption(flag="--save-map", help="Write the proposed mapping as a rules YAML to edit."),
    "unsafe": CliOption(flag="--unsafe", help="Allow a whole pickled model (runs code from the file!)."),
    "num_classes": CliOption(help="Classes of the --model preset (default: from the checkpoint)."),
    "in_channels": CliOption(help="Input channels of the --model preset."),
    "template": CliOption(flag="--template/--no-template", help="Template input for the --model preset."),
    "show_all": CliOption(flag="--all", help="List every tensor, not only the ones that do not match."),
}

# `defectdet doctor loader`'s options
LOADER_OPTIONS: dict[str, CliOption] = {
    "preset": CliOption(
        help="Model preset whose training step is timed (default: the one `train` would choose)."
    ),
    "config": CliOption(help="Training YAML (as for `defectdet train --config`)."),
    "batch_size": CliOption(flag="--batch", help="Batch size (default: the config's)."),
    "input_size": CliOption(flag="--input-size", help="Letterbox size (default: the config's)."),
    "workers": CliOption(
        help="Worker counts to time, e.g. 0,1,2 (default: from the cores).", type=str, to_setting=int_list
    ),
    "seconds_per_setting": CliOption(
        flag="--seconds", help="Seconds per loader setting (it stops earlier after --batches)."
    ),
    "batches_per_setting": CliOption(flag="--batches", help="Batches per loader setting."),
    "scan_limit": CliOption(flag="--scan", help="Scan only the first N samples (default: all; 0: no scan)."),
    "sample_timeout": CliOption(flag="--timeout", help="Seconds after which one sample counts as hung."),
    "format": CliOption(flag="--format", help=FORMAT_HELP),
}

# `defectdet doctor nan`'s options
NAN_OPTIONS: dict[str, CliOption] = {
    "batches": CliOption(help="Batches to run."),
    "batch_size": CliOption(flag="--batch", help="Images per batch."),
    "split": CliOption(help="Split to take batches from (default: the run's train split)."),
    "device": CliOption(help="auto|cpu|cuda."),
    "dtypes": CliOption(
        flag="--dtype",
        help="Autocast dtypes to try (default: bfloat16 on CPU, float16 on CUDA).",
        type=list[str],
        default=[],
        to_setting=lambda names: list(names) or None,
    ),
    "use_ema": CliOption(flag="--ema/--no-ema", help="Use the EMA weights instead of the training weights."),
    "format": CliOption(flag="--format", help=FORMAT_HELP),
}

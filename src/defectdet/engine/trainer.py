"""`train(config)`: data, model, optimizer, schedule, EMA, AMP, validation, checkpoints, DDP.

Exact resume: a checkpoint stores model, EMA, optimizer, scaler, the schedule parameters, the
TrainState (epoch, batches consumed in the unfinished epoch, optimizer step, elapsed seconds, best
fitness) and the global RNGs (python, numpy, torch: dropout and the like). The loader order is a pure
function of (seed, epoch) and skips the batches already consumed, and each item's crop and augmentation
draws are derived from (seed, epoch, index) (`engine.loader`), so an epoch-budget run resumed from any
checkpoint (epoch end, or mid-epoch after a `max_steps`/time stop) retraces the uninterrupted run
bit for bit, with any number of loader workers (tests/engine/test_resume_real_data.py).
With a time budget the LR follows elapsed/budget; elapsed is restored on resume, so the schedule
continues where it stopped, but wall-clock timing itself makes such runs non-bitwise-reproducible.
"""

from __future__ import annotations

import csv
import json
import logging
import os
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import Dataset

from defectdet.data.letterbox import DEFAULT_INPUT_SIZE
from defectdet.engine.checkpoint import (
    CHECKPOINT_VERSION,
    capture_rng_state,
    load_checkpoint,
    restore_rng_state,
    save_checkpoint,
)
from defectdet.engine.config import VAL_BUDGET_SHARE, TrainConfig, save_config
from defectdet.engine.distributed import (
    DistributedContext,
    barrier,
    broadcast_values,
    cleanup_distributed,
    init_distributed,
    rank_logger,
    unwrap_model,
    wrap_model,
)
from defectdet.engine.ema import ModelEMA
from defectdet.engine.grad_stats import GradStatsMonitor
from defectdet.engine.loader import Shard, build_loader, start_epoch
from defectdet.engine.loop import (
    EpochSummary,
    LoopOptions,
    TrainState,
    evaluate,
    headline_mAP50,
    resolve_amp,
    train_one_epoch,
)
from defectdet.engine.nonfinite import NonFiniteGuard
from defectdet.engine.optim import WarmupCosineSchedule, build_optimizer, check_optimizer_coverage
from defectdet.engine.progress import TrainProgress
from defectdet.engine.state_dict import load_state_dict_checked
from defectdet.errors import CheckpointError, ConfigError
from defectdet.postprocess import PostprocessSettings

LOGGER_NAME = "defectdet.engine.trainer"
HOLD_OUT_FRACTION = 0.2  # validation share when a dataset has a single split


@dataclass
class TrainResult:
    """What `train` returns: the run folder, the best validation metrics (`mAP50`, ...; empty without
    validation), last.pt and best.pt (None without validation), and the final metrics and state."""

    run_dir: Path
    best_metrics: dict
    last_checkpoint: Path
    best_checkpoint: Path | None
    final_metrics: dict = field(default_factory=dict)
    state: TrainState = field(default_factory=TrainState)


@dataclass
class TrainData:
    """Datasets yielding (image [C,S,S], target [N,5], meta) items plus class names."""

    train: Dataset
    val: Dataset | None
    class_names: list[str]
    in_channels: int = 1
    template: bool = False
    companions: list[str] = field(
        default_factory=list
    )  # companion captures stacked after the image (template)
    collate_fn: Any = None
    config: TrainConfig | None = None  # the config with its auto settings filled (engine.autoconfig)
    choices: list = field(default_factory=list)  # autoconfig.Choice per setting: value and why
    old_val: Dataset | None = None  # `train --from --old-data`: the old data's val split, validated too


def seed_everything(seed: int, deterministic: bool = False) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
    elif torch.cuda.is_available():
        torch.backends.cudnn.benchmark = True


def cache_budget_bytes(cache_mb: int | None, workers: int | None) -> int:
    """The decoded-image cache budget of each loading process: ``cache_mb`` given, else a quarter of the
    available memory (at most 4 GiB), shared between the loader workers (each holds its own copy)."""
    if cache_mb is not None:
        return cache_mb * 2**20
    available = 0
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                available = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return 0
    if workers is None:
        from defectdet.engine.loader import default_workers

        workers = default_workers()
    return min(available // 4, 4 * 2**30) // max(1, workers)


def build_train_data(config: TrainConfig) -> TrainData:
    """Load the dataset splits named in `config`, choose its auto (None) settings from the training
    split (`engine.autoconfig`) and wrap the splits in DetectionDatasets.

    The returned `TrainData.config` is `config` with those settings filled in; `choices` says why.
    """
    from defectdet.data.formats import load_dataset
    from defectdet.data.holdout import same_images
    from defectdet.engine.autoconfig import choose_settings, collect_split_stats
    from defectdet.trainingdata.dataset import DetectionDataset, Draws, ItemLayout, Reading

    if config.data is None:
        raise ConfigError(
            "field 'data': no dataset given (a data.yaml, COCO json, VOC folder or DeepPCB root)"
        )
    train_split = load_dataset(config.data, config.train_split, format=config.format)
    val_split, hold_out_rows = None, []
    if config.val_split:
        val_split = load_dataset(config.data, config.val_split, format=config.format)
        if same_images(train_split, val_split):
            train_split, val_split, hold_out_rows = _grouped_hold_out(config, train_split)
    previous = None
    if config.resume is not None:  # keep the resumed run's choices so the model rebuilds exactly
        previous = load_checkpoint(config.resume).get("config")
        config = _resumed_start(config, previous or {})
    config, train_split, old_val_split, extra_choices = _continue_from(config, train_split)
    stats = collect_split_stats(train_split, seed=config.seed)
    config, choices = choose_settings(stats, config, previous, _step_timer(config))
    choices = _with_start_rows(config, choices + extra_choices) + hold_out_rows
    train_split, extra_rows = _training_images(config, train_split)
    choices += extra_rows
    channels = config.channels or 1
    train_set = DetectionDataset(
        train_split,
        ItemLayout(
            input_size=config.input_size,
            channels=channels,
            template=config.template,
            companions=config.companions or (),
        ),
        Draws(augment=config.augment, train=True, crop_size=config.crop_size or None, seed=config.seed),
        Reading(
            register_pairs=config.register_pairs,
            cache_bytes=cache_budget_bytes(config.cache_mb, config.workers),
        ),
    )
    template = bool(train_set.use_template)
    companions = list(config.companions or [])
    return TrainData(
        train_set,
        _val_set(val_split, config, template),
        list(train_split.class_names),
        channels * (1 + int(template) + len(companions)),
        template,
        companions,
        config=config,
        choices=choices,
        old_val=_val_set(old_val_split, config, template),  # `--from --old-data`: validated on too
    )


def _protocol(config: TrainConfig, dataset: Any) -> str:
    """The run's validation protocol: the one configured, else COCO's (plus DeepPCB's on DeepPCB data)."""
    from defectdet.evaluation.report import protocol_for

    return protocol_for(config.protocol, getattr(getattr(dataset, "split", None), "format", None))


def _step_timer(config: TrainConfig) -> Any:
    """Times one training step of a shape on the device the run will use (engine.step_speed)."""
    from defectdet.engine.distributed import resolve_device
    from defectdet.engine.step_speed import step_seconds_here

    device = resolve_device(config.device)
    return lambda shape: step_seconds_here(shape, device)


def _grouped_hold_out(config: TrainConfig, train_split: Any) -> tuple[Any, Any, list]:
    """A dataset without a separate validation split: (train part, held-out part, the settings row). Whole
    groups are held out (series, companion captures, near-duplicates); a small held-out part is warned about."""
    from defectdet.data.holdout import grouped_hold_out
    from defectdet.engine.autoconfig import Choice

    held = grouped_hold_out(train_split, HOLD_OUT_FRACTION)
    log = logging.getLogger(LOGGER_NAME)
    (log.warning if held.too_small else log.info)("%s: %s", config.data, held.describe())
    value = f"{len(held.val.samples)} images, {held.val_groups} groups"
    return held.train, held.val, [Choice("validation", value, held.describe(), "auto")]


def _training_images(config: TrainConfig, train_split: Any) -> tuple[Any, list]:
    """The training split as trained on: plus clean templates, clean images, rare classes repeated, then the
    synthetic boards (after balancing: N of them per epoch, as asked); and the settings rows of the two options."""
    from defectdet.engine.autoconfig import balance_split, no_clean_images_row
    from defectdet.engine.synthetic_boards import no_synthetic_boards_row

    rows = []
    _check_companion_extras(config)
    if config.clean_templates:
        train_split = _with_clean_templates(config, train_split)
    if config.clean_images is not None:
        train_split, row = _with_clean_images(config, train_split)
        rows.append(row)
    else:
        rows.append(no_clean_images_row(bool(config.template)))
    if config.class_balance == "repeat":
        train_split = balance_split(train_split, config.seed)
    if config.synthetic_boards:
        train_split, row = _with_synthetic_boards(config, train_split)
        rows.append(row)
    else:
        rows.append(no_synthetic_boards_row(bool(config.template), train_split, config.time_minutes))
    return train_split, rows


def _check_companion_extras(config: TrainConfig) -> None:
    """ConfigError when images without companion captures would join a run whose model reads them."""
    extras = {
        "clean_templates": config.clean_templates,
        "clean_images": config.clean_images is not None,
        "synthetic_boards": bool(config.synthetic_boards),
    }
    used = [name for name, on in extras.items() if on]
    if config.companions and used:
        raise ConfigError(
            f"field {used[0]!r}: those images have no companion captures, and this model reads "
            f"{', '.join(config.companions)} beside each image (set companions: [], or leave {used[0]} out)"
        )


def _with_clean_templates(config: TrainConfig, train_split: Any) -> Any:
    """`clean_templates: true`: the training split plus its templates as defect-free images."""
    from defectdet.engine.autoconfig import add_clean_templates

    if config.template:
        raise ConfigError(
            "field 'clean_templates': only for a model trained without templates; this run reads each "
            "template as its second input (set template: false, or clean_templates: false)"
        )
    if not train_split.has_templates:
        logging.getLogger(LOGGER_NAME).warning(
            "clean_templates: %s has no templates in its %r split; nothing added",
            config.data,
            config.train_split,
        )
    return add_clean_templates(train_split)


def _with_clean_images(config: TrainConfig, train_split: Any) -> tuple[Any, Any]:
    """`clean_images: DIR`: the training split plus DIR's images as defect-free samples, and the settings row."""
    from defectdet.data.formats import list_images
    from defectdet.engine.autoconfig import Choice, add_clean_images

    folder = Path(config.clean_images)
    if config.template:
        raise ConfigError(
            f"field 'clean_images': {folder} has images without templates, and this model reads a template "
            "as its second input (set template: false, or leave clean_images out)"
        )
    if not folder.is_dir():
        raise ConfigError(f"field 'clean_images': {folder} is not a folder")
    problems: list = []
    paths = list_images(folder, problems)
    for problem in problems:
        logging.getLogger(LOGGER_NAME).warning("clean_images: %s", problem)
    if not paths:
        raise ConfigError(f"field 'clean_images': no images in {folder}")
    labelled = len(train_split.samples)
    logging.getLogger(LOGGER_NAME).info(
        "clean_images: %d defect-free images from %s join %d labelled ones", len(paths), folder, labelled
    )
    reason = f"{len(paths)} defect-free images from {folder}, beside {labelled} labelled ones"
    return add_clean_images(train_split, paths), Choice("clean_images", str(folder), reason, "user")


def _with_synthetic_boards(config: TrainConfig, train_split: Any) -> tuple[Any, Any]:
    """`synthetic_boards: N`: the training split plus N synthetic boards drawn like its images, and the row."""
    from defectdet.engine.synthetic_boards import SYNTHETIC_SEED, add_synthetic_boards

    return add_synthetic_boards(
        train_split,
        config.synthetic_boards,
        seed=SYNTHETIC_SEED + config.seed,
        color=config.channels == 3,
        template=bool(config.template),
        input_size=int(config.input_size or DEFAULT_INPUT_SIZE),
        minutes=config.time_minutes,
        mode=config.synthetic_boards_mode,
    )


def _with_start_rows(config: TrainConfig, choices: list) -> list:
    """With `start_from`: the settings rows the model fixes marked "[from model]", and the lr row."""
    if config.start_from is None:
        return choices
    from defectdet.engine.start_model import read_start, start_choices

    return start_choices(choices, read_start(config.start_from), config)


def _val_set(split: Any, config: TrainConfig, template: bool) -> Dataset | None:
    """A validation DetectionDataset of `split` (None when it is missing or empty)."""
    from defectdet.trainingdata.dataset import DetectionDataset, Draws, ItemLayout, Reading

    if split is None or not split.samples:
        return None
    channels = config.channels or 1
    return DetectionDataset(
        split,
        ItemLayout(
            input_size=config.input_size,
            channels=channels,
            template=template,
            companions=config.companions or (),
        ),
        Draws(seed=config.seed),
        Reading(register_pairs=config.register_pairs),
    )


def _resumed_start(config: TrainConfig, previous: dict) -> TrainConfig:
    """Resuming: the run's synthetic_boards (count and mode) and clean_images unless set (the same training
    split, so the same loader order); for a fine-tune also its start_from, old_data, new_share (the same data mix)
    and, unless set, its lr."""
    if config.start_from is not None:
        raise ConfigError(
            "--from and --resume exclude each other: --resume continues a run, --from starts one"
        )
    if not config.synthetic_boards and previous.get("synthetic_boards"):
        mode = previous.get("synthetic_boards_mode", "defects")
        config = config.model_copy(
            update={"synthetic_boards": int(previous["synthetic_boards"]), "synthetic_boards_mode": mode}
        )
    if config.clean_images is None and previous.get("clean_images"):
        config = config.model_copy(update={"clean_images": Path(previous["clean_images"])})
    if not previous.get("start_from"):
        return config
    from defectdet.engine.config import DEFAULT_LEARNING_RATES

    old_data = previous.get("old_data")
    update = {
        "start_from": Path(previous["start_from"]),
        "old_data": Path(old_data) if old_data else None,
        "new_share": previous.get("new_share", config.new_share),
    }
    if config.lr == DEFAULT_LEARNING_RATES[config.optimizer] and previous.get("lr"):
        update["lr"] = previous["lr"]
    return config.model_copy(update=update)


def _continue_from(config: TrainConfig, train_split: Any) -> tuple[TrainConfig, Any, Any, list]:
    """With `start_from`: the config with the model's architecture (engine.start_model), and with `old_data`
    the old training split mixed in (engine.data_mix). Returns (config, train split, the old data's
    validation split or None, the extra settings rows)."""
    from defectdet.engine.autoconfig import Choice
    from defectdet.engine.start_model import good_only_start

    config, start_rows = good_only_start(config)
    if config.start_from is None:
        if config.old_data is not None:
            raise ConfigError("field 'old_data': only with start_from (train --from MODEL --old-data OLD)")
        return config, train_split, None, start_rows
    from defectdet.data.formats import load_dataset
    from defectdet.engine.data_mix import mix_splits, remap_classes
    from defectdet.engine.start_model import check_classes, fit_config, read_start

    start = read_start(config.start_from)
    check_classes(start, list(train_split.class_names), config.data)
    config = fit_config(config, start, train_split)
    if config.old_data is None:
        return config, train_split, None, []
    names = list(train_split.class_names)
    old_train = remap_classes(load_dataset(config.old_data, config.train_split), names, config.old_data)
    old_val = None
    if config.val_split:
        old_val = remap_classes(load_dataset(config.old_data, config.val_split), names, config.old_data)
    train_split, mix = mix_splits(train_split, old_train, config.new_share)
    logging.getLogger(LOGGER_NAME).info("data mix: %s", mix.describe())
    why = f"{config.old_data} (old) mixed with {config.data} (new); validated on both val splits"
    return config, train_split, old_val, [Choice("data mix", mix.describe(), why, "auto")]


def resolve_run_dir(config: TrainConfig) -> Path:
    if config.out is not None:
        return Path(config.out)
    if config.resume is not None:
        return Path(config.resume).parent
    base = Path("runs/train")
    candidate, index = base, 2
    while candidate.exists() and any(candidate.iterdir()):
        candidate, index = Path(f"{base}-{index}"), index + 1
    return candidate


class MetricsTable:
    """metrics.csv: one row per epoch; columns are the union seen so far (file rewritten each epoch)."""

    def __init__(self, path: Path, keep_until_epoch: int | None = None):
        self.path = path
        self.rows: list[dict[str, Any]] = []
        if keep_until_epoch is not None and path.is_file():
            with path.open(newline="", encoding="utf-8") as handle:
                self.rows = [
                    row for row in csv.DictReader(handle) if int(float(row["epoch"])) <= keep_until_epoch
                ]

    def append(self, row: dict[str, Any]) -> None:
        self.rows.append(row)
        columns: list[str] = []
        for existing in self.rows:
            columns += [key for key in existing if key not in columns]
        temp = self.path.with_suffix(".csv.tmp")
        with temp.open("w", newline="", encoding="utf-8") as handle:
            writer = csv.DictWriter(handle, fieldnames=columns)
            writer.writeheader()
            for existing in self.rows:
                writer.writerow({k: _csv_value(v) for k, v in existing.items()})
        os.replace(temp, self.path)


def _csv_value(value: Any) -> Any:
    return f"{value:.6g}" if isinstance(value, float) else ("" if value is None else value)


def _fitness(metrics: dict) -> float | None:
    """Best-checkpoint criterion: mAP50, else minus the validation loss."""
    mAP50 = headline_mAP50(metrics)
    if mAP50 is not None:
        return mAP50
    if metrics.get("val_loss") is not None:
        return -float(metrics["val_loss"])
    return None


def _scalar_metrics(metrics: dict) -> dict[str, float]:
    headline = metrics.get("headline") or {}
    values = {
        "mAP50": metrics.get("mAP50"),
        "mAP50_95": headline.get("mAP50_95") or (metrics.get("coco") or {}).get("mAP50_95"),
    }
    values.update({k: v for k, v in metrics.items() if k.startswith("val_")})
    return {k: float(v) for k, v in values.items() if isinstance(v, int | float) and v is not None}


def _warn_config_changes(previous: dict, config: TrainConfig, log: logging.Logger) -> None:
    current = config.to_dict()
    changed = {
        k: (previous.get(k), v)
        for k, v in current.items()
        if k not in ("resume", "out", "progress") and previous.get(k) != v
    }
    if changed:
        log.warning(
            "resuming with settings that differ from the checkpoint: %s",
            ", ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in changed.items()),
        )


def train(
    config: TrainConfig | str | Path | None = None,
    *,
    data: TrainData | str | Path | None = None,
    model: nn.Module | None = None,
    **fields: Any,
) -> TrainResult:
    """Train a detector; what `defectdet train` runs. Writes last.pt, best.pt, metrics.csv, plots and
    report.html into the run folder.

    `config` is a `TrainConfig`, or a YAML file of its fields; `fields` are `TrainConfig` fields set over it
    (`data="data.yaml"`, `time_minutes=5`, `input_size=640`, ...; see the configuration reference). Settings
    left at None are chosen from the data. A `TrainData` as `data` (or a `model`) replaces the one built from
    the config (tests, custom models). Works unchanged under `torchrun --nproc_per_node N`: rank 0 logs,
    validates and saves.

    Example:
        ```python
        from defectdet import train

        result = train(data="data/synth/data.yaml", time_minutes=2, out="runs/synth")
        print(result.best_checkpoint, result.best_metrics.get("mAP50"))
        ```
    """
    if not isinstance(config, TrainConfig) or fields or not isinstance(data, (TrainData, type(None))):
        config, data = _config_and_data(config, data, fields)
    context = init_distributed(config.device)
    try:
        return Trainer(config, context, data, model).run()
    finally:
        cleanup_distributed(context)


def _config_and_data(
    config: TrainConfig | str | Path | None, data: Any, fields: dict[str, Any]
) -> tuple[TrainConfig, TrainData | None]:
    """`train`'s keyword form: a config (object, YAML path or none) with `fields` and a dataset path over it."""
    from defectdet.engine.config import load_config

    if isinstance(data, (str, Path)):
        fields, data = {**fields, "data": str(data)}, None
    if isinstance(config, TrainConfig):
        fields, config = {**config.model_dump(exclude_unset=True), **fields}, None
    return load_config(config, fields), data


class Trainer:
    """One training run: `setup`, then `train_epoch` + `after_epoch` until a budget ends it, then `finish`.

    `setup` builds (or resumes) everything in a fixed order, the order exact resume depends on: run dir,
    seeds, data and its chosen settings, model, optimizer, scaler, EMA, restored state, loader, schedule.
    An "epoch" here is one pass of `train_one_epoch`: it may end early (`max_steps`, time budget) and
    a resumed run starts it mid-epoch. `after_epoch` validates when due, logs a metrics.csv row and writes
    last.pt (and best.pt when the fitness improved); only rank 0 validates, logs and writes.
    """

    def __init__(
        self,
        config: TrainConfig,
        context: DistributedContext,
        data: TrainData | None = None,
        model: nn.Module | None = None,
    ):
        self.config, self.context, self.data, self.model = config, context, data, model
        self.log = rank_logger(LOGGER_NAME, context)
        self.device = context.device

    def run(self) -> TrainResult:
        self.setup()
        with TrainProgress(self.config.progress and self.context.is_main) as progress:
            self.options = self._loop_options(progress)
            config, state = self.config, self.state
            stopped = self.should_stop(state) or (config.epochs is not None and state.epoch >= config.epochs)
            self.validated_at = self.clock()
            while not stopped:
                stopped = self.after_epoch(self.train_epoch())
        return self.finish()

    # ------------------------------------------------------------------------------------------ setup

    def setup(self) -> None:
        config, context = self.config, self.context
        if self.device.type == "cpu":
            from defectdet.engine.host_memory import keep_freed_memory

            kept = keep_freed_memory()  # fewer page faults per step; results unchanged
            if kept:
                self.log.debug("%s", kept)
        self.run_dir = resolve_run_dir(config)
        barrier(context)
        if context.is_main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
        self.checkpoint = load_checkpoint(config.resume) if config.resume is not None else None
        seed_everything(config.seed, config.deterministic)
        self._setup_data()
        self._setup_model()
        self._setup_optimization()
        self._setup_loader_and_schedule()
        self._setup_records()

    def _setup_data(self) -> None:
        """Build the data, take the settings chosen from it into the config and record them."""
        config, run_dir = self.config, self.run_dir
        data = self.data = self.data or build_train_data(config)
        if data.config is not None:  # the settings chosen from the data (config.yaml records them)
            from defectdet.engine.autoconfig import SETTING_NAMES

            config = config.model_copy(update={name: getattr(data.config, name) for name in SETTING_NAMES})
        if config.batch is None:  # data built elsewhere, without settings chosen for it
            from defectdet.engine.autoconfig import BASE_BATCH

            config = config.model_copy(update={"batch": BASE_BATCH})
        if config.preset is None:  # likewise: the preset the data's layout would get
            from defectdet.engine.autoconfig import auto_preset

            config = config.model_copy(update={"preset": auto_preset(data.template)[0]})
        if data.choices:  # the table the command prints says it in words; this line is for logs (-v)
            self.log.debug(
                "settings: %s (reasons in %s)",
                ", ".join(f"{c.name}={c.value} [{c.source}]" for c in data.choices if c.source != "fixed"),
                run_dir / "config.yaml",
            )
        if self.context.is_main:
            save_config(config, run_dir / "config.yaml", _choice_notes(data.choices))
        self.config = config

    def _setup_model(self) -> None:
        """The given model, else `start_from`'s (engine.start_model), else the preset's (from the shipped weights
        unless resuming or from scratch)."""
        config, data = self.config, self.data
        if self.model is None and config.start_from is not None and self.checkpoint is None:
            from defectdet.engine.start_model import build_start_model, read_start

            self.model, summary = build_start_model(read_start(config.start_from), list(data.class_names))
            self.log.info("starting weights: %s", summary)
        if self.model is None:
            from defectdet.engine.autoconfig import model_overrides
            from defectdet.model import build_model

            self.model = build_model(
                config.preset,
                len(data.class_names),
                data.in_channels,
                data.template,
                data.companions,
                **model_overrides(config),
            )
            if config.pretrained and self.checkpoint is None:
                _start_from_shipped_weights(self.model, config.preset, data.template, self.log)
        self.model.to(self.device, memory_format=torch.channels_last)

    def _setup_optimization(self) -> None:
        """AMP, optimizer, scaler, EMA; the checkpoint's state restored into them; the DDP wrapper."""
        config, model = self.config, self.model
        self.amp = resolve_amp(config.amp, config.amp_dtype, self.device)
        self.optimizer = build_optimizer(
            model,
            config.optimizer,
            config.lr,
            config.weight_decay,
            config.momentum,
            config.backbone_lr_scale or 1.0,
        )
        check_optimizer_coverage(model, self.optimizer)
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=self.amp.use_scaler)
        self.ema = ModelEMA(model, config.ema_decay, config.ema_ramp_steps) if config.ema else None
        self.state = TrainState()
        if self.checkpoint is not None:
            self.state = _restore(
                self.checkpoint, config, model, self.optimizer, self.scaler, self.ema, self.log
            )
        self.train_model = wrap_model(model, self.context)

    def _setup_loader_and_schedule(self) -> None:
        config, context, data = self.config, self.context, self.data
        self.train_loader = build_loader(
            data.train,
            config.batch,
            True,
            config.workers,
            config.seed,
            Shard(context.rank, context.world_size),
            data.collate_fn,
            pin_memory=self.device.type == "cuda",
        )
        self.batches_per_epoch = len(self.train_loader)
        if self.batches_per_epoch == 0:
            raise ConfigError(f"the training split has no samples (dataset {config.data})")
        # evaluation reads the validation samples itself (engine.predict.predict_records, as `val` does)
        has_val = data.val is not None and len(data.val) > 0 and context.is_main
        self.val_set = data.val if has_val else None
        total_steps = config.epochs * self.batches_per_epoch if config.epochs is not None else None
        warmup_steps = (
            config.warmup_steps
            if config.warmup_steps is not None
            else round(config.warmup_epochs * self.batches_per_epoch)
        )
        if total_steps is not None:
            warmup_steps = min(warmup_steps, total_steps // 2)
        self.schedule = WarmupCosineSchedule(
            [config.lr * group.get("lr_scale", 1.0) for group in self.optimizer.param_groups],
            warmup_steps,
            config.final_lr_ratio,
            total_steps,
            None if total_steps is not None else config.time_budget_seconds,
        )
        self.session_start, self.base_elapsed = time.perf_counter(), self.state.elapsed_seconds

    def _setup_records(self) -> None:
        """Grad stats, the non-finite guard, metrics.csv, and the best metrics so far."""
        config, run_dir, checkpoint, log = self.config, self.run_dir, self.checkpoint, self.log
        self.grad_monitor = GradStatsMonitor(config.grad_stats_every, run_dir / "grad_stats.csv", log=log)
        self.guard = NonFiniteGuard(config.on_nonfinite, config.max_consecutive_nonfinite, log=log)
        resumed = checkpoint is not None
        self.table = MetricsTable(
            run_dir / "metrics.csv", keep_until_epoch=self.state.epoch if resumed else None
        )
        self.best_metrics: dict = dict(checkpoint.get("best_metrics") or {}) if resumed else {}
        self.final_metrics: dict = {}
        self.last_path, self.best_path = run_dir / "last.pt", run_dir / "best.pt"
        self.saved_best = self.best_path.is_file() and resumed
        log.info(
            "training on %s%s: %d batches per epoch, %s%s, run folder %s",
            self.device,
            f" ({self.context.world_size} processes)" if self.context.world_size > 1 else "",
            self.batches_per_epoch,
            f"{config.epochs} epochs" if config.epochs else f"{config.time_minutes:g} minutes",
            ", mixed precision" if self.amp.enabled else "",
            run_dir,
        )

    def _loop_options(self, progress: TrainProgress) -> LoopOptions:
        return LoopOptions(
            device=self.device,
            amp=self.amp,
            clock=self.clock,
            clip_grad_norm=self.config.clip_grad_norm,
            schedule=self.schedule,
            scaler=self.scaler,
            ema=self.ema,
            grad_monitor=self.grad_monitor,
            guard=self.guard,
            context=self.context,
            should_stop=self.should_stop,
            progress=progress,
            log=self.log,
        )

    def clock(self) -> float:
        """Training seconds, this session's plus those of the runs it resumes."""
        return self.base_elapsed + time.perf_counter() - self.session_start

    def should_stop(self, current: TrainState) -> bool:
        budget, max_steps = self.config.time_budget_seconds, self.config.max_steps
        return bool(
            (budget is not None and current.elapsed_seconds >= budget)
            or (max_steps is not None and current.step >= max_steps)
        )

    # ------------------------------------------------------------------------------------------ epochs

    def train_epoch(self) -> EpochSummary:
        """One pass over the loader from where the state stands (mid-epoch after a resume)."""
        config, state, loader = self.config, self.state, self.train_loader
        epoch = state.epoch
        start_epoch(loader, epoch, state.epoch_batch, config.seed + 1000 * self.context.rank)
        self.options.progress.start(f"epoch {epoch + 1}/{config.epochs or '?'}", len(loader))
        summary = train_one_epoch(self.train_model, loader, self.optimizer, state, self.options)
        if state.epoch_batch >= self.batches_per_epoch:
            state.epoch, state.epoch_batch = state.epoch + 1, 0
        return summary

    def after_epoch(self, summary: EpochSummary) -> bool:
        """Validate when due, log the metrics row, write the checkpoints. Returns whether training ends."""
        config, state, context = self.config, self.state, self.context
        stopped = summary.stopped or (config.epochs is not None and state.epoch >= config.epochs)
        metrics = self._validate_if_due(stopped)
        state.elapsed_seconds = broadcast_values([self.clock()], context)[0]
        fitness = _fitness(metrics) if metrics else None
        improved = fitness is not None and (state.best_fitness is None or fitness > state.best_fitness)
        if improved:
            state.best_fitness, state.best_epoch = fitness, state.epoch
            self.best_metrics = _scalar_metrics(metrics) | {"epoch": state.epoch, "step": state.step}
        if context.is_main:
            self._log_row(summary, metrics)
            self._save_checkpoints(metrics, improved)
        barrier(context)
        return stopped

    def _validate_if_due(self, stopped: bool) -> dict:
        """Evaluate (the EMA weights when kept) at the end of training and when `validation_due`; the
        last evaluation writes its plots and report into the run dir."""
        config, state = self.config, self.state
        if self.val_set is None:
            return {}
        completed = state.epoch_batch == 0
        if not (
            stopped or (completed and validation_due(config, state.epoch, self.clock() - self.validated_at))
        ):
            return {}
        self.validated_at = self.clock()
        _, metrics = evaluate(
            self.ema.module if self.ema is not None else self.model,
            self.val_set,
            self.data.class_names,
            device=self.device,
            amp=self.amp,
            postprocess_settings=PostprocessSettings.from_config(config.to_dict()),
            out_dir=self.run_dir if stopped else self.run_dir / "val",
            protocol=_protocol(config, self.val_set),
            plots=stopped,
            settings=config.to_dict(),
            tiles=bool(config.tiles),
        )
        if self.data.old_val is not None:
            metrics = {**metrics, **self._validate_old(stopped)}
        self.final_metrics = metrics
        return metrics

    def _validate_old(self, stopped: bool) -> dict[str, float]:
        """`train --from --old-data`: the old data's validation split too (val_old_* columns), so a fine-tune
        that forgets the old line shows it."""
        _, metrics = evaluate(
            self.ema.module if self.ema is not None else self.model,
            self.data.old_val,
            self.data.class_names,
            device=self.device,
            amp=self.amp,
            postprocess_settings=PostprocessSettings.from_config(self.config.to_dict()),
            out_dir=self.run_dir / "val_old",
            protocol=_protocol(self.config, self.data.old_val),
            plots=False,
            settings=self.config.to_dict(),
            tiles=bool(self.config.tiles),
        )
        return {
            f"val_old_{key.removeprefix('val_')}": value for key, value in _scalar_metrics(metrics).items()
        }

    def _log_row(self, summary: EpochSummary, metrics: dict) -> None:
        state = self.state
        row = {
            "epoch": state.epoch + (state.epoch_batch / self.batches_per_epoch),
            "step": state.step,
            "lr": self.optimizer.param_groups[0]["lr"],
            "time": round(state.elapsed_seconds, 2),
            "images_per_second": summary.images / max(1e-9, summary.seconds),
            **summary.loss_means,
            **_scalar_metrics(metrics),
        }
        self.table.append(row)
        self.log.info(
            "epoch %s step %d: %s",
            f"{row['epoch']:.4g}",
            state.step,
            ", ".join(
                f"{k}={v:.4g}" for k, v in row.items() if isinstance(v, float) and k not in ("epoch", "time")
            ),
        )

    def _save_checkpoints(self, metrics: dict, improved: bool) -> None:
        """last.pt every time; best.pt when the fitness improved (or once, without validation)."""
        payload = self._checkpoint_payload(_scalar_metrics(metrics))
        save_checkpoint(self.last_path, payload)
        if improved or (not self.saved_best and self.val_set is None):
            save_checkpoint(self.best_path, payload)
            self.saved_best = True

    def _checkpoint_payload(self, metrics: dict) -> dict:
        """Everything a resume needs (weights, optimizer, schedule, progress, random state) and what the run
        reports (config, settings chosen, classes, `metrics`, the best metrics so far)."""
        from defectdet import __version__

        plain = unwrap_model(self.model)
        state, data = self.state, self.data
        return {
            "model": plain.state_dict(),
            "ema": self.ema.state_dict() if self.ema is not None else None,
            "optimizer": self.optimizer.state_dict(),
            "scaler": self.scaler.state_dict(),
            "scheduler": self.schedule.state_dict(),
            "epoch": state.epoch,
            "step": state.step,
            "train_state": state.to_dict(),
            "rng": capture_rng_state(),
            "config": self.config.to_dict(),
            "settings_chosen": [choice.to_dict() for choice in data.choices],
            "model_config": getattr(plain, "config", None),
            "class_names": list(data.class_names),
            "metrics": metrics,
            "best_metrics": self.best_metrics,
            "version": CHECKPOINT_VERSION,
            "defectdet_version": __version__,
            "torch_version": str(torch.__version__),
        }

    # ------------------------------------------------------------------------------------------ finish

    def finish(self) -> TrainResult:
        """metrics.json (best, final, counts) and the result."""
        state, run_dir, best_path = self.state, self.run_dir, self.best_path
        if self.context.is_main:
            summary_json = {
                "best": self.best_metrics,
                "final": _scalar_metrics(self.final_metrics),
                "epochs": state.epoch,
                "steps": state.step,
                "elapsed_seconds": state.elapsed_seconds,
                "skipped_steps": state.skipped_steps,
                "grad_explosion_warnings": self.grad_monitor.explosions,
                "validation": self.final_metrics,
            }
            (run_dir / "metrics.json").write_text(
                json.dumps(summary_json, indent=2, default=str), encoding="utf-8"
            )
            self.log.info(
                "done: %d steps in %.1f s; best %s; run dir %s",
                state.step,
                state.elapsed_seconds,
                self.best_metrics,
                run_dir,
            )
        barrier(self.context)
        return TrainResult(
            run_dir,
            self.best_metrics,
            self.last_path,
            best_path if best_path.is_file() else None,
            self.final_metrics,
            state,
        )


def _start_from_shipped_weights(model: nn.Module, preset: str, template: bool, log: logging.Logger) -> None:
    from defectdet.model.detector import has_imagenet_backbone
    from defectdet.model.pretrained import layout_name, shipped_weights, transfer_weights

    if has_imagenet_backbone(preset):
        from defectdet.model.imagenet import transfer_imagenet_weights

        log.info("starting weights: %s", transfer_imagenet_weights(model).summary())
        return
    path = shipped_weights(preset, template)
    if path is None:
        raise ConfigError(
            f"field 'pretrained': the package ships no weights for the {preset} preset with the "
            f"{layout_name(template)} layout; train with --from-scratch (pretrained: false)"
        )
    log.info("starting weights: %s", transfer_weights(model, path).summary())


def validation_due(config: TrainConfig, epoch: int, seconds_since_validation: float) -> bool:
    """At an epoch end: every `val_every` epochs when set; else every epoch, or with a time budget once
    VAL_BUDGET_SHARE of it has passed since the last validation (short epochs on a CPU budget would
    otherwise spend a third of it validating)."""
    if config.val_every is not None:
        return epoch % config.val_every == 0
    budget = config.time_budget_seconds
    return budget is None or seconds_since_validation >= VAL_BUDGET_SHARE * budget


def _choice_notes(choices: list) -> list[str]:
    if not choices:
        return []
    lines = ["settings chosen for this run (engine.autoconfig; set a field to override it):"]
    return lines + [f"  {c.name} = {c.value} [{c.source}]: {c.reason}" for c in choices]


def _restore(
    checkpoint: dict,
    config: TrainConfig,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler,
    ema: ModelEMA | None,
    log: logging.Logger,
) -> TrainState:
    source = str(config.resume)
    load_state_dict_checked(model, checkpoint["model"], source=f"{source} 'model'")
    try:
        optimizer.load_state_dict(checkpoint["optimizer"])
    except (ValueError, KeyError) as error:
        raise CheckpointError(
            f"{source}: optimizer state does not fit this model/optimizer ({error})"
        ) from None
    if checkpoint.get("scaler"):
        scaler.load_state_dict(checkpoint["scaler"])
    if ema is not None:
        if checkpoint.get("ema"):
            ema.load_state_dict(checkpoint["ema"])
        else:
            log.warning("%s has no EMA weights; EMA restarts from the current weights", source)
            ema.module.load_state_dict(model.state_dict())
    _warn_config_changes(checkpoint.get("config") or {}, config, log)
    state = TrainState.from_dict(
        checkpoint.get("train_state") or {"epoch": checkpoint["epoch"], "step": checkpoint["step"]}
    )
    restore_rng_state(checkpoint["rng"])
    log.info(
        "resumed from %s at epoch %d (+%d batches), step %d",
        source,
        state.epoch,
        state.epoch_batch,
        state.step,
    )
    return state

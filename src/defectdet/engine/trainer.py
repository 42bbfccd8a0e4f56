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
from defectdet.engine.loader import build_loader, start_epoch
from defectdet.engine.loop import (
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
    collate_fn: Any = None
    config: TrainConfig | None = None  # the config with its auto settings filled (engine.autoconfig)
    choices: list = field(default_factory=list)  # autoconfig.Choice per setting: value and why


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
    from defectdet.data.dataset import DetectionDataset
    from defectdet.data.formats import load_dataset
    from defectdet.data.holdout import hold_out, same_images
    from defectdet.engine.autoconfig import balance_split, choose_settings, collect_split_stats

    if config.data is None:
        raise ConfigError(
            "field 'data': no dataset given (a data.yaml, COCO json, VOC folder or DeepPCB root)"
        )
    train_split = load_dataset(config.data, config.train_split, format=config.format)
    val_split = None
    if config.val_split:
        val_split = load_dataset(config.data, config.val_split, format=config.format)
        if same_images(train_split, val_split):
            train_split, val_split = hold_out(train_split, HOLD_OUT_FRACTION)
            logging.getLogger(LOGGER_NAME).warning(
                "%s has no separate %r split (it gives the same images as %r): validating on a fixed "
                "%d%% hold-out (%d images) chosen by file-name hash",
                config.data,
                config.val_split,
                config.train_split,
                round(100 * HOLD_OUT_FRACTION),
                len(val_split.samples),
            )
    previous = None
    if config.resume is not None:  # keep the resumed run's choices so the model rebuilds exactly
        previous = load_checkpoint(config.resume).get("config")
    config, choices = choose_settings(collect_split_stats(train_split, seed=config.seed), config, previous)
    if config.class_balance == "repeat":
        train_split = balance_split(train_split, config.seed)
    channels = config.channels or 1
    train_set = DetectionDataset(
        train_split,
        config.imgsz,
        channels,
        config.template,
        config.augment,
        True,
        config.crop_size or None,
        seed=config.seed,
        register_pairs=config.register_pairs,
        cache_bytes=cache_budget_bytes(config.cache_mb, config.workers),
    )
    template = bool(train_set.use_template)
    val_set = None
    if val_split is not None and val_split.samples:
        val_set = DetectionDataset(
            val_split,
            config.imgsz,
            channels,
            template,
            None,
            False,
            None,
            seed=config.seed,
            register_pairs=config.register_pairs,
        )
    in_channels = channels * (2 if template else 1)
    return TrainData(
        train_set,
        val_set,
        list(train_split.class_names),
        in_channels,
        template,
        config=config,
        choices=choices,
    )


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
    config: TrainConfig,
    *,
    data: TrainData | None = None,
    model: nn.Module | None = None,
) -> TrainResult:
    """Train per `config`; `data`/`model` replace the ones built from config (tests, custom models).

    Works unchanged under `torchrun --nproc_per_node N`: rank 0 logs, validates and saves.
    """
    context = init_distributed(config.device)
    try:
        return _train(config, context, data, model)
    finally:
        cleanup_distributed(context)


def _train(
    config: TrainConfig, context: DistributedContext, data: TrainData | None, model: nn.Module | None
) -> TrainResult:
    log = rank_logger(LOGGER_NAME, context)
    device = context.device
    run_dir = resolve_run_dir(config)
    barrier(context)
    if context.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
    checkpoint = load_checkpoint(config.resume) if config.resume is not None else None

    seed_everything(config.seed, config.deterministic)
    data = data or build_train_data(config)
    if data.config is not None:  # the settings chosen from the data (config.yaml records them)
        from defectdet.engine.autoconfig import SETTING_NAMES

        config = config.model_copy(update={name: getattr(data.config, name) for name in SETTING_NAMES})
    if config.batch is None:  # data built elsewhere, without settings chosen for it
        from defectdet.engine.autoconfig import BASE_BATCH

        config = config.model_copy(update={"batch": BASE_BATCH})
    if data.choices:
        log.info(
            "settings: %s (reasons in %s)",
            ", ".join(f"{c.name}={c.value} [{c.source}]" for c in data.choices if c.source != "fixed"),
            run_dir / "config.yaml",
        )
    if context.is_main:
        save_config(config, run_dir / "config.yaml", _choice_notes(data.choices))
    if model is None:
        from defectdet.engine.autoconfig import model_overrides
        from defectdet.model import build_model

        model = build_model(
            config.preset, len(data.class_names), data.in_channels, data.template, **model_overrides(config)
        )
        if config.pretrained and checkpoint is None:
            _start_from_shipped_weights(model, config.preset, data.template, log)
    model.to(device, memory_format=torch.channels_last)
    amp = resolve_amp(config.amp, config.amp_dtype, device)
    optimizer = build_optimizer(model, config.optimizer, config.lr, config.weight_decay, config.momentum)
    check_optimizer_coverage(model, optimizer)
    scaler = torch.amp.GradScaler(device.type, enabled=amp.use_scaler)
    ema = ModelEMA(model, config.ema_decay, config.ema_ramp_steps) if config.ema else None
    state = TrainState()
    if checkpoint is not None:
        state = _restore(checkpoint, config, model, optimizer, scaler, ema, log)
    train_model = wrap_model(model, context)

    train_loader = build_loader(
        data.train,
        config.batch,
        True,
        config.workers,
        config.seed,
        context.rank,
        context.world_size,
        data.collate_fn,
        pin_memory=device.type == "cuda",
    )
    batches_per_epoch = len(train_loader)
    if batches_per_epoch == 0:
        raise ConfigError(f"the training split has no samples (dataset {config.data})")
    # evaluation reads the validation samples itself (engine.predict.predict_records, as `val` does)
    val_set = data.val if data.val is not None and len(data.val) > 0 and context.is_main else None
    total_steps = config.epochs * batches_per_epoch if config.epochs is not None else None
    warmup_steps = (
        config.warmup_steps
        if config.warmup_steps is not None
        else round(config.warmup_epochs * batches_per_epoch)
    )
    if total_steps is not None:
        warmup_steps = min(warmup_steps, total_steps // 2)
    schedule = WarmupCosineSchedule(
        [config.lr] * len(optimizer.param_groups),
        warmup_steps,
        config.final_lr_ratio,
        total_steps,
        None if total_steps is not None else config.time_budget_seconds,
    )

    budget = config.time_budget_seconds
    session_start, base_elapsed = time.perf_counter(), state.elapsed_seconds

    def clock() -> float:
        return base_elapsed + time.perf_counter() - session_start

    def should_stop(current: TrainState) -> bool:
        return bool(
            (budget is not None and current.elapsed_seconds >= budget)
            or (config.max_steps is not None and current.step >= config.max_steps)
        )

    grad_monitor = GradStatsMonitor(config.grad_stats_every, run_dir / "grad_stats.csv", log=log)
    guard = NonFiniteGuard(config.on_nonfinite, config.max_consecutive_nonfinite, log=log)
    table = MetricsTable(
        run_dir / "metrics.csv", keep_until_epoch=state.epoch if checkpoint is not None else None
    )
    best_metrics: dict = dict(checkpoint.get("best_metrics") or {}) if checkpoint is not None else {}
    final_metrics: dict = {}
    last_path, best_path = run_dir / "last.pt", run_dir / "best.pt"
    saved_best = best_path.is_file() and checkpoint is not None
    log.info(
        "training on %s (world size %d): %d train batches/epoch, %s, amp=%s, run dir %s",
        device,
        context.world_size,
        batches_per_epoch,
        f"{config.epochs} epochs" if config.epochs else f"{config.time_minutes} min",
        amp.enabled,
        run_dir,
    )

    with TrainProgress(config.progress and context.is_main) as progress:
        options = LoopOptions(
            device=device,
            amp=amp,
            clock=clock,
            clip_grad_norm=config.clip_grad_norm,
            schedule=schedule,
            scaler=scaler,
            ema=ema,
            grad_monitor=grad_monitor,
            guard=guard,
            context=context,
            should_stop=should_stop,
            progress=progress,
            log=log,
        )
        stopped = should_stop(state) or (config.epochs is not None and state.epoch >= config.epochs)
        validated_at = clock()
        while not stopped:
            epoch = state.epoch
            start_epoch(train_loader, epoch, state.epoch_batch, config.seed + 1000 * context.rank)
            progress.start(f"epoch {epoch + 1}/{config.epochs or '?'}", len(train_loader))
            summary = train_one_epoch(train_model, train_loader, optimizer, state, options)
            if state.epoch_batch >= batches_per_epoch:
                state.epoch, state.epoch_batch = state.epoch + 1, 0
            stopped = summary.stopped or (config.epochs is not None and state.epoch >= config.epochs)
            completed = state.epoch_batch == 0
            metrics: dict = {}
            if val_set is not None and (
                stopped or (completed and validation_due(config, state.epoch, clock() - validated_at))
            ):
                validated_at = clock()
                eval_model = ema.module if ema is not None else model
                out_dir = run_dir if stopped else run_dir / "val"
                _, metrics = evaluate(
                    eval_model,
                    val_set,
                    data.class_names,
                    device=device,
                    amp=amp,
                    postprocess_settings=PostprocessSettings.from_config(config.to_dict()),
                    out_dir=out_dir,
                    protocol=config.protocol,
                    plots=stopped,
                    settings=config.to_dict(),
                    tiles=bool(config.tiles),
                )
                final_metrics = metrics
            state.elapsed_seconds = broadcast_values([clock()], context)[0]
            fitness = _fitness(metrics) if metrics else None
            improved = fitness is not None and (state.best_fitness is None or fitness > state.best_fitness)
            if improved:
                state.best_fitness, state.best_epoch = fitness, state.epoch
                best_metrics = _scalar_metrics(metrics) | {"epoch": state.epoch, "step": state.step}
            row = {
                "epoch": state.epoch + (state.epoch_batch / batches_per_epoch),
                "step": state.step,
                "lr": optimizer.param_groups[0]["lr"],
                "time": round(state.elapsed_seconds, 2),
                "images_per_second": summary.images / max(1e-9, summary.seconds),
                **summary.loss_means,
                **_scalar_metrics(metrics),
            }
            if context.is_main:
                table.append(row)
                log.info(
                    "epoch %s step %d: %s",
                    f"{row['epoch']:.4g}",
                    state.step,
                    ", ".join(
                        f"{k}={v:.4g}"
                        for k, v in row.items()
                        if isinstance(v, float) and k not in ("epoch", "time")
                    ),
                )
                payload = _checkpoint_payload(
                    config,
                    model,
                    ema,
                    optimizer,
                    scaler,
                    schedule,
                    state,
                    data,
                    _scalar_metrics(metrics),
                    best_metrics,
                )
                save_checkpoint(last_path, payload)
                if improved or (not saved_best and val_set is None):
                    save_checkpoint(best_path, payload)
                    saved_best = True
            barrier(context)

    if context.is_main:
        summary_json = {
            "best": best_metrics,
            "final": _scalar_metrics(final_metrics),
            "epochs": state.epoch,
            "steps": state.step,
            "elapsed_seconds": state.elapsed_seconds,
            "skipped_steps": state.skipped_steps,
            "grad_explosion_warnings": grad_monitor.explosions,
            "validation": final_metrics,
        }
        (run_dir / "metrics.json").write_text(
            json.dumps(summary_json, indent=2, default=str), encoding="utf-8"
        )
        log.info(
            "done: %d steps in %.1f s; best %s; run dir %s",
            state.step,
            state.elapsed_seconds,
            best_metrics,
            run_dir,
        )
    barrier(context)
    return TrainResult(
        run_dir, best_metrics, last_path, best_path if best_path.is_file() else None, final_metrics, state
    )


def _start_from_shipped_weights(model: nn.Module, preset: str, template: bool, log: logging.Logger) -> None:
    from defectdet.model.pretrained import layout_name, shipped_weights, transfer_weights

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


def _checkpoint_payload(
    config, model, ema, optimizer, scaler, schedule, state, data, metrics, best_metrics
) -> dict:
    from defectdet import __version__

    plain = unwrap_model(model)
    return {
        "model": plain.state_dict(),
        "ema": ema.state_dict() if ema is not None else None,
        "optimizer": optimizer.state_dict(),
        "scaler": scaler.state_dict(),
        "scheduler": schedule.state_dict(),
        "epoch": state.epoch,
        "step": state.step,
        "train_state": state.to_dict(),
        "rng": capture_rng_state(),
        "config": config.to_dict(),
        "settings_chosen": [choice.to_dict() for choice in data.choices],
        "model_config": getattr(plain, "config", None),
        "class_names": list(data.class_names),
        "metrics": metrics,
        "best_metrics": best_metrics,
        "version": CHECKPOINT_VERSION,
        "defectdet_version": __version__,
        "torch_version": str(torch.__version__),
    }


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

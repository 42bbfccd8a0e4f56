"""The training step loop and evaluation, as plain functions that can be tested alone."""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from defectdet.compat import with_keywords
from defectdet.engine.distributed import DistributedContext, all_ranks_true, broadcast_values, unwrap_model
from defectdet.engine.ema import ModelEMA
from defectdet.engine.grad_stats import GradStatsMonitor
from defectdet.engine.nonfinite import NonFiniteGuard, diagnose_nonfinite
from defectdet.engine.optim import WarmupCosineSchedule
from defectdet.postprocess import PostprocessSettings

logger = logging.getLogger(__name__)


@dataclass
class TrainState:
    """Training position; stored in checkpoints so a resumed run continues exactly."""

    epoch: int = 0  # completed epochs
    epoch_batch: int = 0  # batches consumed in the current, unfinished epoch
    step: int = 0  # optimizer steps taken
    elapsed_seconds: float = 0.0  # wall clock spent training, summed over resumes
    skipped_steps: int = 0  # non-finite steps skipped
    best_fitness: float | None = None
    best_epoch: int = -1

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> TrainState:
        return cls(**{k: v for k, v in values.items() if k in cls.__dataclass_fields__})


@dataclass(frozen=True)
class AmpSettings:
    enabled: bool = False
    dtype: torch.dtype | None = None
    use_scaler: bool = False  # fp16 on CUDA needs a GradScaler

    def autocast(self, device: torch.device) -> contextlib.AbstractContextManager:
        if not self.enabled:
            return contextlib.nullcontext()
        return torch.autocast(device_type=device.type, dtype=self.dtype)


def resolve_amp(amp: bool | None, amp_dtype: str | None, device: torch.device) -> AmpSettings:
    """CUDA: fp16 (+ GradScaler) unless disabled or bf16 asked; CPU: only bf16, and only when asked."""
    if amp is False:
        return AmpSettings()
    if device.type == "cuda":
        if amp_dtype == "bfloat16":
            return AmpSettings(True, torch.bfloat16, False)
        return AmpSettings(True, torch.float16, True)
    if amp_dtype == "bfloat16":
        return AmpSettings(True, torch.bfloat16, False)
    if amp is True:
        logger.warning("AMP on CPU needs amp_dtype='bfloat16' (float16 autocast on CPU is slow); AMP is off")
    return AmpSettings()


@dataclass
class LoopOptions:
    """What `train_one_epoch` needs beyond model, data and optimizer. Only `device` is required."""

    device: torch.device = torch.device("cpu")
    amp: AmpSettings = field(default_factory=AmpSettings)
    clip_grad_norm: float | None = 10.0
    schedule: WarmupCosineSchedule | None = None
    scaler: torch.amp.GradScaler | None = None
    ema: ModelEMA | None = None
    grad_monitor: GradStatsMonitor | None = None
    guard: NonFiniteGuard = field(default_factory=NonFiniteGuard)
    context: DistributedContext = field(default_factory=DistributedContext)
    clock: Callable[[], float] | None = None  # total elapsed training seconds (incl. earlier sessions)
    should_stop: Callable[[TrainState], bool] | None = None  # checked after each step
    progress: Any = None  # TrainProgress-like: update(losses, images)
    log: logging.Logger = logger
    _warned_dtype: bool = False


@dataclass
class EpochSummary:
    loss_means: dict[str, float]
    batches: int
    steps: int
    images: int
    seconds: float
    stopped: bool  # should_stop ended the epoch early


def _to_device(images: torch.Tensor, targets: Sequence[torch.Tensor], device: torch.device):
    non_blocking = device.type == "cuda"
    # channels_last: oneDNN's depthwise convolutions are faster in NHWC on CPU (not benchmarked in bench/results)
    images = images.to(device, non_blocking=non_blocking, memory_format=torch.channels_last)
    return images, [t.to(device, non_blocking=non_blocking) for t in targets]


def _check_loss_dtypes(losses: dict[str, torch.Tensor], options: LoopOptions) -> None:
    if options._warned_dtype:
        return
    odd = {name: str(value.dtype) for name, value in losses.items() if value.dtype != torch.float32}
    if odd:
        options._warned_dtype = True
        options.log.warning(
            "loss terms are not float32 under autocast (%s): compute losses in float32 to avoid "
            "overflow/underflow",
            odd,
        )


def train_one_epoch(
    model: nn.Module,
    loader: Iterable,
    optimizer: torch.optim.Optimizer,
    state: TrainState,
    options: LoopOptions,
) -> EpochSummary:
    """Run optimizer steps over `loader`, updating `state` in place.

    Each step: zero grads, forward under autocast, non-finite loss check (all ranks agree), backward,
    unscale + clip, non-finite gradient check, optimizer step, EMA update. A non-finite step takes no
    optimizer step; the guard decides skip or stop. Empty batches are skipped.
    """
    device, context = options.device, options.context
    model.train()
    step = _Step(model, optimizer, options)
    sums: dict[str, float] = {}
    counted = batches = steps = images_seen = 0
    started = time.perf_counter()
    stopped = False
    for images, targets, _metas in loader:
        state.epoch_batch += 1
        batches += 1
        if not all_ranks_true(images.shape[0] > 0, context):
            options.log.warning(
                "skipping an empty batch (all its samples failed to load) at step %d", state.step
            )
            continue
        images, targets = _to_device(images, targets, device)
        _sync_clock(state, options)
        if options.schedule is not None:
            options.schedule.apply(optimizer, state.step, state.elapsed_seconds)
        optimizer.zero_grad(set_to_none=True)
        step.snapshot_buffers()
        with options.amp.autocast(device):
            losses = model(images, targets)  # dict of scalar losses, 'loss' is the total
        _check_loss_dtypes(losses, options)
        outcome = step.backward(losses["loss"], state.step)
        if outcome == "overflow":  # fp16 overflow: the scaler skipped this step and lowered its scale
            continue
        if outcome is not None:  # a non-finite 'loss' or 'gradient'
            step.skip_nonfinite(outcome, losses, images, targets, state)
            del losses  # frees the graph of a skipped forward before the next one
            continue
        step.optimizer_step(state.step)
        state.step += 1
        steps += 1
        images_seen += images.shape[0]
        values = {k: float(v.detach().float().item()) for k, v in losses.items()}
        for name, value in values.items():
            sums[name] = sums.get(name, 0.0) + value
        counted += 1
        if options.progress is not None:
            options.progress.update(values, images.shape[0])
        _sync_clock(state, options)
        if options.should_stop is not None and options.should_stop(state):
            stopped = True
            break
    means = {name: total / max(1, counted) for name, total in sums.items()}
    return EpochSummary(means, batches, steps, images_seen, time.perf_counter() - started, stopped)


def _sync_clock(state: TrainState, options: LoopOptions) -> None:
    """Every rank takes rank 0's elapsed seconds, so schedule and budget agree across ranks."""
    if options.clock is not None:
        state.elapsed_seconds = broadcast_values([options.clock()], options.context)[0]


class _Step:
    """The parts of one optimizer step, in the order `train_one_epoch` runs them: buffer snapshot,
    backward with unscale + clip, then either the non-finite skip or the optimizer/EMA step."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, options: LoopOptions):
        self.model, self.optimizer, self.options = model, optimizer, options
        self.parameters = [p for p in model.parameters() if p.requires_grad]
        # A skipped batch must not leave its statistics in BatchNorm buffers (NaN there would poison eval):
        # snapshot buffers before each forward, restore them when the step is skipped.
        self.buffers = list(model.buffers())
        self.snapshot = [b.detach().clone() for b in self.buffers]
        scaler = options.scaler
        self.scaler = scaler if scaler is not None and scaler.is_enabled() else None
        self.total_norm = 0.0

    def snapshot_buffers(self) -> None:
        if self.buffers:
            torch._foreach_copy_(self.snapshot, self.buffers)

    def backward(self, loss: torch.Tensor, step: int) -> str | None:
        """Backward, unscale and clip. Returns None, or what went non-finite: 'loss' (checked on all
        ranks before any backward), 'gradient', or 'overflow' (fp16: the scaler skipped the step)."""
        if not all_ranks_true(bool(torch.isfinite(loss.detach()).all()), self.options.context):
            return "loss"
        scaler = self.scaler
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.unscale_(self.optimizer)
        else:
            loss.backward()
        max_norm = self.options.clip_grad_norm if self.options.clip_grad_norm else float("inf")
        self.total_norm = float(torch.nn.utils.clip_grad_norm_(self.parameters, max_norm))
        if math.isfinite(self.total_norm):
            return None
        if scaler is None:
            return "gradient"
        scaler.step(self.optimizer)
        scaler.update()
        self.options.log.debug("AMP overflow at step %d; scale now %g", step, scaler.get_scale())
        return "overflow"

    def skip_nonfinite(
        self,
        kind: str,
        losses: dict[str, torch.Tensor],
        images: torch.Tensor,
        targets: Sequence[torch.Tensor],
        state: TrainState,
    ) -> None:
        """Skip a step whose `kind` ('loss' or 'gradient') is non-finite: restore the BatchNorm buffers,
        diagnose (a hooked re-run of the batch when this rank's loss is the non-finite one), drop the
        gradients, count the skip and let the guard decide skip or stop."""
        options = self.options
        if self.buffers:
            torch._foreach_copy_(self.buffers, self.snapshot)
        terms = {k: float(v.detach().float().item()) for k, v in losses.items()}
        plain = unwrap_model(self.model)
        local_loss = kind == "loss" and not math.isfinite(terms.get("loss", float("nan")))

        def rerun():
            with options.amp.autocast(options.device):
                return plain(images, targets)

        diagnosis = diagnose_nonfinite(plain, state.step, kind, terms, rerun if local_loss else None)
        if kind == "loss" and not local_loss:
            diagnosis.note = "the non-finite loss happened on another rank"
        self.optimizer.zero_grad(set_to_none=True)
        state.skipped_steps += 1
        options.guard.record(diagnosis)

    def optimizer_step(self, step: int) -> None:
        """Grad statistics, the optimizer step (through the scaler with AMP), the EMA update."""
        options, monitor = self.options, self.options.grad_monitor
        if monitor is not None:
            monitor.observe(step, self.total_norm)
            if monitor.due(step) and options.context.is_main:
                monitor.record(step, unwrap_model(self.model), self.total_norm)
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        if options.ema is not None:
            options.ema.update(unwrap_model(self.model))
        options.guard.finite()


# --------------------------------------------------------------------------------------------- evaluation


def headline_mAP50(metrics: dict) -> float | None:
    """mAP@0.5 from an evaluate_records / coco_metrics dict, None when unavailable."""
    for container in (metrics.get("headline") or {}, metrics.get("coco") or {}, metrics):
        value = container.get("mAP50")
        if value is not None and math.isfinite(float(value)):
            return float(value)
    return None


@dataclass(frozen=True)
class EvaluationReport:
    """What `evaluate` writes: with `out_dir`, what `evaluate_records` writes there by `protocol` (metrics.json,
    and with `plots` the plots and report.html, which lists `settings`); without, nothing (COCO metrics only)."""

    out_dir: str | Path | None = None
    protocol: str = "coco"
    plots: bool = False
    settings: dict | None = None


@torch.no_grad()
def evaluate(
    model: nn.Module,
    dataset: Any,
    class_names: Sequence[str],
    *,
    device: torch.device | str = "cpu",
    amp: AmpSettings | None = None,
    postprocess_settings: PostprocessSettings | None = None,
    tiles: bool = False,
    report: EvaluationReport | None = None,
    **report_fields: Any,
) -> tuple[list, dict]:
    """Predict `dataset` (a `DetectionDataset`: its samples, input_size, channels, use_template, register_pairs)
    with `engine.predict.predict_records`, the very function `defectdet val` runs (with `tiles` as the run
    chose), and score the records against the label-file boxes in original pixels.

    `report` (an `EvaluationReport`; its fields may also be given as keywords, `out_dir=...`) says what is
    written. Returns (records, metrics); metrics always has 'mAP50' (None when undefined).
    """
    report = with_keywords(EvaluationReport, report, report_fields, "evaluate")
    records = _predicted_records(
        model, dataset, torch.device(device), amp or AmpSettings(), postprocess_settings, tiles
    )
    metrics: dict[str, Any]
    if report.out_dir is not None:
        from defectdet.evaluation.report import EvaluationOutputs, evaluate_records

        outputs = EvaluationOutputs(plots=report.plots, settings=report.settings)
        metrics = evaluate_records(
            records, list(class_names), report.out_dir, report.protocol, outputs=outputs
        )
    else:
        from defectdet.evaluation.coco import coco_metrics

        metrics = {"coco": coco_metrics(records, list(class_names))}
    metrics["mAP50"] = headline_mAP50(metrics)
    return records, metrics


def _predicted_records(
    model: nn.Module,
    dataset: Any,
    device: torch.device,
    amp: AmpSettings,
    postprocess_settings: PostprocessSettings | None,
    tiles: bool,
) -> list:
    """`dataset` predicted in eval mode (the model's mode restored after), unreadable images logged."""
    from defectdet.engine.predict import predict_records
    from defectdet.runtime.spec import ModelSpec

    was_training = model.training
    model.eval()
    try:
        spec = ModelSpec(
            input_size=dataset.input_size,
            channels=dataset.channels,
            template=dataset.use_template,
            companions=tuple(getattr(dataset, "companions", ())),
            registration=dataset.use_template and getattr(dataset, "register_pairs", True),
            tiles=tiles,
        ).with_postprocess(postprocess_settings or PostprocessSettings())
        records, skipped = predict_records(
            model, dataset.samples, spec, device=device, autocast=lambda: amp.autocast(device)
        )
    finally:
        model.train(was_training)
    if skipped:
        logger.warning("evaluation skipped %d unreadable images", len(skipped))
    return records

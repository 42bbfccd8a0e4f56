"""`loader_report`: is the DataLoader fast enough for the model, and when it fails, which sample and why.

1. scan the samples in a child process, as a worker reads them (`sample_scan`): errors, deaths (which signal),
   hangs, batches that cannot be collated and the odd-shaped sample that breaks them;
2. time real DataLoaders over num_workers, batch, pin_memory, persistent_workers and prefetch_factor;
3. time the preset's training step on a real batch, to say whether the loader or the model is the bottleneck;
4. check that workers draw different augmentations, and that /dev/shm holds the batches workers prefetch.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset, default_collate

from defectdet.diagnostics.doctor_settings import LoaderDoctorSettings
from defectdet.diagnostics.loader_timing import (
    LoaderRun,
    LoaderSetting,
    ModelStep,
    SeedingCheck,
    batch_length,
    batch_nbytes,
    candidate_workers,
    check_worker_seeding,
    measure_model_step,
    sweep,
)
from defectdet.diagnostics.report import Finding, format_bytes
from defectdet.diagnostics.sample_scan import ScanResult, scan_samples
from defectdet.engine.loader import seed_worker

SHM_ERRORS = ("shared memory", "bus error", "no space left on device", "/dev/shm", "shm_open", "sigbus")
PROBLEM_ADVICE = {
    "error": "fix the file or its label; the message names where it raised",
    "died": "open that file alone (defectdet check DATA); a crash in a worker kills the whole loader",
    "hang": "that sample never finishes: a huge image, a network path or a lock in the dataset; bound it or drop it",
    "collate": "every sample of a batch must have the same shape: letterbox/resize it, or write a collate_fn",
    "shape": "make that sample the same size as the others (or pad in a custom collate_fn)",
    "unreadable": "replace or remove the file; it is skipped, so the epoch runs without it",
}


@dataclasses.dataclass
class LoaderReport:
    dataset: str
    samples: int
    batch_size: int
    scan: ScanResult | None
    settings: list[LoaderSetting]
    best: LoaderSetting | None
    model_step: ModelStep | None
    batch_bytes: int
    shm_free_bytes: int | None
    seeding: SeedingCheck
    findings: list[Finding]


def _shm_free() -> int | None:
    try:
        stats = os.statvfs("/dev/shm")
    except (OSError, AttributeError):
        return None
    return stats.f_bavail * stats.f_frsize


def _problem_findings(scan: ScanResult) -> list[Finding]:
    findings = []
    for problem in scan.problems[:20]:
        where = f"sample {problem.index}" + (f" ({problem.file})" if problem.file else "")
        severity = "warning" if problem.kind == "unreadable" else "error"
        findings.append(
            Finding(severity, problem.kind, f"{where}: {problem.message}", PROBLEM_ADVICE[problem.kind])
        )
    if len(scan.problems) > 20:
        findings.append(Finding("error", "scan", f"... and {len(scan.problems) - 20} more sample problems"))
    if scan.stopped_early:
        findings.append(Finding("warning", "scan", scan.stopped_early, "fix the samples above and run again"))
    return findings


def _timing_findings(report: LoaderReport) -> list[Finding]:
    findings = []
    for setting in report.settings:
        if setting.error:
            shm = any(text in setting.error.lower() for text in SHM_ERRORS)
            findings.append(
                Finding(
                    "error",
                    "shm" if shm else "loader",
                    f"workers={setting.workers} batch={setting.batch_size}: {setting.error}",
                    "enlarge /dev/shm (docker --shm-size=2g) or use fewer workers / a smaller batch"
                    if shm
                    else "see the sample problems above; a dead worker names its sample there",
                )
            )
    best, step = report.best, report.model_step
    if best is None:
        return findings
    findings.append(
        Finding(
            "ok",
            "best",
            f"best: workers={best.workers}, batch={best.batch_size}, prefetch_factor={best.prefetch_factor}, "
            f"persistent_workers={best.persistent_workers}: {best.images_per_second:.1f} img/s, first batch after "
            f"{best.first_batch_seconds:.2f} s",
        )
    )
    if step is not None and best.images_per_second:
        loader_rate, model_rate = best.images_per_second, step.images_per_second
        if loader_rate < model_rate:
            findings.append(
                Finding(
                    "warning",
                    "bottleneck",
                    f"the loader ({loader_rate:.1f} img/s) is slower than the {step.preset} training step "
                    f"({model_rate:.1f} img/s): the model waits for data",
                    f"train with --workers {best.workers} --batch {best.batch_size}; cache decoded images or lower --input-size",
                )
            )
        else:
            findings.append(
                Finding(
                    "ok",
                    "bottleneck",
                    f"the {step.preset} training step ({model_rate:.1f} img/s) is the bottleneck, not the loader "
                    f"({loader_rate:.1f} img/s)",
                )
            )
        if best.workers == 0:
            serial = 1 / (1 / loader_rate + 1 / model_rate)
            findings.append(
                Finding(
                    "info",
                    "serial",
                    f"in-process loading runs in turn with the step: about {serial:.1f} img/s together",
                )
            )
    return findings


def _memory_findings(report: LoaderReport) -> list[Finding]:
    best = report.best
    if best is None or not best.workers or report.shm_free_bytes is None:
        return []
    need = (
        report.batch_bytes * best.workers * (best.prefetch_factor or 2) * 2
    )  # batches in flight, plus margin
    if need > report.shm_free_bytes:
        return [
            Finding(
                "error",
                "shm",
                f"{best.workers} worker(s) keep about {format_bytes(need)} of batches in /dev/shm, which has "
                f"{format_bytes(report.shm_free_bytes)} free: workers will die with a bus error",
                "docker run --shm-size=2g (or --ipc=host), or fewer workers / a smaller batch",
            )
        ]
    return [
        Finding(
            "ok",
            "shm",
            f"/dev/shm: {format_bytes(report.shm_free_bytes)} free for about {format_bytes(need)} of batches",
        )
    ]


def _seeding_finding(seeding: SeedingCheck) -> list[Finding]:
    if seeding.status == "identical":
        return [
            Finding(
                "error",
                "seeding",
                seeding.message,
                "reseed per worker in worker_init_fn (defectdet.engine.loader.seed_worker), or draw from "
                "np.random / torch instead of a generator created in __init__",
            )
        ]
    return [Finding("ok" if seeding.status == "ok" else "info", "seeding", seeding.message)]


def _resolve_dataset(
    data: Any, preset: str | None, config: str | Path | None, overrides: dict[str, Any]
) -> tuple[Dataset, Callable | None, int | None, str, Any]:
    if isinstance(data, Dataset):
        return data, None, None, type(data).__name__, None
    from defectdet.diagnostics.sources import training_data

    train_config, train_data = training_data(data, config=config, preset=preset, **overrides)
    return train_data.train, train_data.collate_fn, train_config.batch, str(data), (train_config, train_data)


def _training_model(train_config: Any, train_data: Any) -> nn.Module:
    """The model `defectdet train` would build for this config and data (channels_last, as it trains)."""
    from defectdet.engine.autoconfig import model_overrides
    from defectdet.model import build_model

    model = build_model(
        train_config.preset,
        len(train_data.class_names),
        train_data.in_channels,
        train_data.template,
        train_data.companions,
        **model_overrides(train_config),
    )
    return model.to(memory_format=torch.channels_last)


def loader_report(
    data: str | Path | Dataset,
    settings: LoaderDoctorSettings | None = None,
    *,
    collate_fn: Callable | None = None,
    worker_init_fn: Callable | None = seed_worker,
    model: nn.Module | None = None,
) -> LoaderReport:
    """Diagnose the loader of `data`: a dataset path (built as `defectdet train` would, with the settings'
    `preset`/`config`) or any torch Dataset (with its `collate_fn`; `model` to time a training step on its
    batches), as `settings` say (default: `LoaderDoctorSettings()`: every sample scanned, 4 s per setting).
    """
    from defectdet.trainingdata.dataset import collate_detections

    settings = settings or LoaderDoctorSettings()
    dataset, data_collate, config_batch, name, training = _resolve_dataset(
        data, settings.preset, settings.config, settings.train_overrides()
    )
    collate = collate_fn or data_collate or (collate_detections if training else default_collate)
    batch_size = settings.batch_size or config_batch or 8
    length = len(dataset)  # type: ignore[arg-type]
    scan = _scan(dataset, length, batch_size, collate, settings)
    good = _readable(length, scan)[: batch_size * settings.batches_per_setting]
    run = LoaderRun(
        collate, worker_init_fn, settings.seconds_per_setting, settings.sample_timeout * batch_size
    )
    workers = list(settings.workers) if settings.workers is not None else candidate_workers()
    timed, first_batch = sweep(dataset, good, batch_size, workers, run, settings.explore)
    working = [setting for setting in timed if setting.images_per_second]
    best = max(working, key=lambda setting: setting.images_per_second or 0) if working else None
    step, step_error = None, ""
    if first_batch is not None and settings.time_model:
        if model is None and training is not None:
            model = _training_model(*training)
        if model is not None:
            step, step_error = _time_model_step(model, first_batch, training, settings.model_seconds)
            if step is not None:
                name = step.preset
    seeding = (
        check_worker_seeding(dataset, good[0], worker_init_fn, timeout=settings.sample_timeout * 2)
        if good
        else SeedingCheck("skipped", "no readable sample")
    )
    report = LoaderReport(
        name, length, batch_size, scan, timed, best, step, batch_nbytes(first_batch), _shm_free(), seeding, []
    )
    report.findings = _findings(report, step_error)
    return report


def _scan(
    dataset: Dataset, length: int, batch_size: int, collate: Callable, settings: LoaderDoctorSettings
) -> ScanResult | None:
    """The scan of the first `settings.scan_limit` samples (None: all; 0: no scan, None returned)."""
    if settings.scan_limit == 0:
        return None
    limit = length if settings.scan_limit is None else min(length, settings.scan_limit)
    return scan_samples(dataset, list(range(limit)), batch_size, collate, settings.sample_timeout)


def _readable(length: int, scan: ScanResult | None) -> list[int]:
    """The sample indices no scan problem names."""
    problems = scan.problems if scan else []
    bad = {problem.index for problem in problems} | {
        index for problem in problems for index in problem.indices
    }
    return [index for index in range(length) if index not in bad]


def _time_model_step(
    model: nn.Module, batch: Any, training: tuple | None, seconds: float
) -> tuple[ModelStep | None, str]:
    """Time training steps of `model` on a loader batch: (the step, "") or (None, why it failed)."""
    try:
        elapsed = measure_model_step(model, batch, seconds=seconds)
    except (RuntimeError, ValueError, TypeError, KeyError) as error:
        return None, f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
    size = batch_length(batch)
    name = training[0].preset if training else type(model).__name__
    return ModelStep(name, size, elapsed, size / elapsed), ""


def _findings(report: LoaderReport, step_error: str) -> list[Finding]:
    """Sample problems, a failed model step, then timing, memory and seeding findings, in that order."""
    step_findings = (
        [
            Finding(
                "error",
                "model",
                f"the training step on a loader batch failed: {step_error}",
                "check the model fits the batch",
            )
        ]
        if step_error
        else []
    )
    return (
        (_problem_findings(report.scan) if report.scan else [])
        + step_findings
        + _timing_findings(report)
        + _memory_findings(report)
        + _seeding_finding(report.seeding)
    )

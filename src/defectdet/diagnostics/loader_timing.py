"""Loader measurements for `loader_report`: settings timed with real DataLoaders, worker seeding, model step."""

from __future__ import annotations

import dataclasses
import gc
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


@dataclasses.dataclass
class LoaderSetting:
    workers: int
    batch_size: int
    pin_memory: bool
    persistent_workers: bool
    prefetch_factor: int | None
    first_batch_seconds: float | None = None
    restart_seconds: float | None = None  # first batch of the next epoch
    images_per_second: float | None = None  # over the whole run, worker start-up included
    error: str = ""


@dataclasses.dataclass(frozen=True)
class LoaderRun:
    """How each loader setting is timed: its `collate_fn` and `worker_init_fn`, for up to `seconds`, a batch
    that takes longer than `timeout` seconds failing it."""

    collate_fn: Callable
    worker_init_fn: Callable | None
    seconds: float
    timeout: float


@dataclasses.dataclass
class SeedingCheck:
    status: str  # ok | identical | deterministic | skipped
    message: str


@dataclasses.dataclass
class ModelStep:
    preset: str
    batch_size: int
    seconds_per_step: float
    images_per_second: float


def batch_length(batch: Any) -> int:
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() else 1
    if isinstance(batch, list | tuple) and batch:
        return batch_length(batch[0])
    if isinstance(batch, dict) and batch:
        return batch_length(next(iter(batch.values())))
    return 1


def batch_nbytes(value: Any) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, list | tuple):
        return sum(batch_nbytes(item) for item in value)
    if isinstance(value, dict):
        return sum(batch_nbytes(item) for item in value.values())
    return 0


def measure_setting(
    dataset: Dataset,
    indices: list[int],
    setting: LoaderSetting,
    collate_fn: Callable,
    worker_init_fn: Callable | None,
    seconds: float,
    timeout: float,
) -> tuple[LoaderSetting, Any]:
    """Fill in the setting's timings over `indices` (or its error); also return the first batch."""
    workers = setting.workers
    loader = DataLoader(
        dataset,
        batch_size=setting.batch_size,
        sampler=indices,
        num_workers=workers,
        collate_fn=collate_fn,
        pin_memory=setting.pin_memory,
        persistent_workers=setting.persistent_workers and workers > 0,
        prefetch_factor=setting.prefetch_factor if workers > 0 else None,
        worker_init_fn=worker_init_fn,
        generator=torch.Generator().manual_seed(0),
        timeout=timeout if workers > 0 else 0,
    )
    first = None
    try:
        start = time.perf_counter()
        iterator = iter(loader)
        first = next(iterator)
        setting.first_batch_seconds = time.perf_counter() - start
        # whole-run throughput, worker start-up included: after a short wait, batches the workers prefetched
        # during it arrive at once, so a rate counted from the first batch would flatter the workers
        images = batch_length(first)
        for batch in iterator:
            images += batch_length(batch)
            if time.perf_counter() - start > seconds:
                break
        setting.images_per_second = images / (time.perf_counter() - start)
        del iterator
        start = time.perf_counter()
        next(iter(loader))
        setting.restart_seconds = time.perf_counter() - start
    except Exception as error:  # a worker death, a timeout, a collate error: the setting failed, say why
        setting.error = (
            f"{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error).strip() else ''}"
        )
    finally:
        del loader
        gc.collect()
    return setting, first


def check_worker_seeding(
    dataset: Dataset,
    index: int,
    worker_init_fn: Callable | None,
    collate_fn: Callable | None = None,
    timeout: float = 60.0,
) -> SeedingCheck:
    """Load sample `index` in two different workers: identical results from a random dataset mean the workers
    share one random state (a generator made in `__init__` and copied into every worker by fork)."""

    def first_tensor(item: Any) -> torch.Tensor | None:
        if isinstance(item, torch.Tensor):
            return item
        if isinstance(item, list | tuple):
            return next((t for t in map(first_tensor, item) if t is not None), None)
        return None

    one, two = first_tensor(dataset[index]), first_tensor(dataset[index])
    if one is None or two is None:
        return SeedingCheck("skipped", "samples hold no tensor to compare")
    if one.shape == two.shape and torch.equal(one, two):
        return SeedingCheck(
            "deterministic", "the dataset returns the same sample twice in one process (no augmentation)"
        )
    loader = DataLoader(
        dataset,
        batch_size=1,
        sampler=[index, index],
        num_workers=2,
        collate_fn=lambda items: items[0],
        worker_init_fn=worker_init_fn,
        generator=torch.Generator().manual_seed(0),
        timeout=timeout,
    )
    try:
        first, second = (first_tensor(item) for item in loader)
    except Exception as error:
        return SeedingCheck("skipped", f"could not run two workers ({type(error).__name__}: {error})")
    if (
        first is not None
        and second is not None
        and first.shape == second.shape
        and torch.equal(first, second)
    ):
        return SeedingCheck(
            "identical",
            f"two workers returned identical random augmentations of sample {index}: every worker repeats the "
            "same random stream",
        )
    return SeedingCheck("ok", "workers draw different augmentations")


def measure_model_step(model: nn.Module, batch: Any, seconds: float = 3.0, steps: int = 5) -> float:
    """Seconds per training step (forward, backward, AdamW step) on `batch`, after one warm-up step."""
    from defectdet.diagnostics.nan_doctor import default_loss

    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    timings = []
    deadline = time.perf_counter() + seconds
    for step in range(steps + 1):
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        default_loss(model, batch).backward()
        optimizer.step()
        if step:
            timings.append(time.perf_counter() - start)
        if time.perf_counter() > deadline and timings:
            break
    return min(timings) if timings else float("nan")


def candidate_workers(cores: int | None = None) -> list[int]:
    """0, 1, 2, half and all usable cores (at most 8)."""
    if cores is None:
        try:
            cores = len(os.sched_getaffinity(0))
        except AttributeError:
            cores = os.cpu_count() or 1
    return sorted({count for count in (0, 1, 2, cores // 2, cores) if count <= min(cores, 8)})


def sweep(
    dataset: Dataset,
    indices: list[int],
    batch_size: int,
    workers: Sequence[int],
    run: LoaderRun,
    explore: bool = True,
) -> tuple[list[LoaderSetting], Any]:
    """Workers first (prefetch 2, persistent); then (`explore`), at the best worker count, prefetch 4,
    non-persistent, half and double batch, and pin_memory when CUDA is there; each setting timed as `run` says."""
    pin = torch.cuda.is_available()
    settings, first_batch = [], None
    for count in workers:
        setting, batch = _measure(
            dataset, indices, LoaderSetting(count, batch_size, pin, count > 0, 2 if count else None), run
        )
        settings.append(setting)
        first_batch = first_batch if first_batch is not None else batch
    working = [s for s in settings if s.images_per_second]
    if not working or not explore:
        return settings, first_batch
    best = max(working, key=lambda s: s.images_per_second or 0)
    variants = [
        dataclasses.replace(best, batch_size=max(1, batch_size // 2)),
        dataclasses.replace(best, batch_size=batch_size * 2),
    ]
    if best.workers:
        variants += [
            dataclasses.replace(best, prefetch_factor=4),
            dataclasses.replace(best, persistent_workers=False),
        ]
    if pin:
        variants.append(dataclasses.replace(best, pin_memory=False))
    for variant in variants:
        variant = dataclasses.replace(
            variant, first_batch_seconds=None, restart_seconds=None, images_per_second=None, error=""
        )
        settings.append(_measure(dataset, indices, variant, run)[0])
    return settings, first_batch


def _measure(
    dataset: Dataset, indices: list[int], setting: LoaderSetting, run: LoaderRun
) -> tuple[LoaderSetting, Any]:
    return measure_setting(
        dataset, indices, setting, run.collate_fn, run.worker_init_fn, run.seconds, run.timeout
    )

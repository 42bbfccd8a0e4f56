"""The one DataLoader factory: training, evaluation and `bench/loader.py` all use `build_loader`.

Order: `ResumableSampler` yields a shuffled (seed, epoch) order, padded and sharded by rank like
DistributedSampler (world_size 1 included), and can start an epoch part-way (resume).

Randomness: the sampler yields `SampleIndex`es, ints that also carry their epoch. `DetectionDataset`
derives each item's crop and augmentation generators from (dataset seed, epoch, index), so an item is
a pure function of those three: the same in-process or in any worker, in an uninterrupted run or after
a mid-epoch resume. Any other map-style dataset just sees an int.
"""

from __future__ import annotations

import functools
import math
import os
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from defectdet.trainingdata.dataset import collate_detections


@dataclass(frozen=True)
class Shard:
    """Which share of the data one process loads: `rank` of `world_size` (one process: 0 of 1)."""

    rank: int = 0
    world_size: int = 1


class SampleIndex(int):
    """A dataset index that carries the epoch it is drawn for (datasets that ignore it see a plain int)."""

    epoch: int

    def __new__(cls, index: int, epoch: int) -> SampleIndex:
        value = super().__new__(cls, index)
        value.epoch = epoch
        return value

    def __reduce__(self) -> tuple[Any, tuple[int, int]]:  # to loader workers
        return SampleIndex, (int(self), self.epoch)

    def __repr__(self) -> str:
        return f"SampleIndex({int(self)}, epoch={self.epoch})"


class ResumableSampler(Sampler[int]):
    """Shuffled (seed, epoch) order, padded to a multiple of world_size and sharded by rank."""

    def __init__(self, length: int, shuffle: bool = True, seed: int = 0, rank: int = 0, world_size: int = 1):
        self.length = length
        self.shuffle = shuffle
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.epoch = 0
        self.start = 0  # samples of this rank's shard to skip (resume mid-epoch)

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        self.epoch = epoch
        self.start = start

    def shard(self) -> list[int]:
        if self.shuffle:
            generator = torch.Generator().manual_seed(self.seed + 1_000_003 * self.epoch)
            order = torch.randperm(self.length, generator=generator).tolist()
        else:
            order = list(range(self.length))
        per_rank = math.ceil(self.length / self.world_size) if self.length else 0
        total = per_rank * self.world_size
        if order and total > len(order):
            order += order[: total - len(order)]
        return order[self.rank : total : self.world_size]

    def __iter__(self) -> Iterator[int]:
        return (SampleIndex(index, self.epoch) for index in self.shard()[self.start :])

    def __len__(self) -> int:
        per_rank = math.ceil(self.length / self.world_size) if self.length else 0
        return max(0, per_rank - self.start)


def default_workers(world_size: int = 1) -> int:
    """Loader processes for one rank: none on <= 2 cores, else half the rank's cores, at most 8.

    On 2 cores a worker competes with the model's two intra-op threads for the same cores; loader
    throughput per worker count: bench/results/loader.json.
    """
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    per_rank = cores // max(1, world_size)
    return 0 if per_rank <= 2 else min(8, per_rank // 2)


def seed_worker(worker_id: int) -> None:
    """Seed a worker's global RNGs (and a dataset's `reseed`, for plain int indices) from torch's worker
    seed (the loader generator's base seed + worker id): workers differ, runs repeat."""
    seed = torch.initial_seed()
    np.random.seed(seed % 2**32)
    random.seed(seed)
    # No cv2.setNumThreads here: called in a forked child after the parent used OpenCV's thread pool,
    # it deadlocks (seen with opencv-python-headless 5.1).
    info = torch.utils.data.get_worker_info()
    if info is not None and hasattr(info.dataset, "reseed"):
        info.dataset.reseed(seed % 2**63)


def build_loader(
    dataset: Dataset,
    batch_size: int,
    train: bool,
    workers: int | None = None,
    seed: int = 0,
    shard: Shard = Shard(),
    collate_fn: Callable | None = None,
    pin_memory: bool | None = None,
) -> DataLoader:
    """The DataLoader for `dataset`: shuffled by (seed, epoch) when `train`, this process's `shard` of it.

    - workers None -> `default_workers(shard.world_size)`: in-process on <= 2 cores per rank.
    - workers > 0: persistent (no fork + dataset copy per epoch), prefetch_factor 2, `seed_worker`.
    - pin_memory None -> only when CUDA is available.
    - drop_last when training with more than one batch per rank: equal batch sizes keep BatchNorm
      statistics sane; never when the data is smaller than a batch (else an epoch would be empty).
    - collate_fn None -> `collate_detections` with the dataset's `output_shape` / `image_dtype` for
      batches where every sample failed to load.
    Call `start_epoch` before iterating each epoch.
    """
    length = len(dataset)  # type: ignore[arg-type]
    rank, world_size = shard.rank, shard.world_size
    sampler = ResumableSampler(length, shuffle=train, seed=seed, rank=rank, world_size=world_size)
    workers = default_workers(world_size) if workers is None else workers
    per_rank = math.ceil(length / world_size) if length else 0
    if collate_fn is None:
        collate_fn = functools.partial(
            collate_detections,
            empty_shape=getattr(dataset, "output_shape", None),
            empty_dtype=getattr(dataset, "image_dtype", torch.float32),
        )
    options: dict[str, Any] = {}
    if workers > 0:
        options.update(worker_init_fn=seed_worker, prefetch_factor=2, persistent_workers=True)
    return DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=sampler,
        num_workers=workers,
        collate_fn=collate_fn,
        drop_last=train and per_rank > batch_size,
        pin_memory=torch.cuda.is_available() if pin_memory is None else pin_memory,
        generator=torch.Generator().manual_seed(seed),
        **options,
    )


def start_epoch(loader: DataLoader, epoch: int, start_batch: int = 0, seed: int = 0) -> None:
    """Position `loader` at `epoch`, skipping `start_batch` batches.

    Items depend on (dataset seed, epoch, index) only; `seed` (rank-dependent under DDP) only seeds the
    workers' global RNGs (for third-party code that uses them) when the workers start.
    """
    sampler = loader.sampler
    if isinstance(sampler, ResumableSampler):
        sampler.set_epoch(epoch, start_batch * (loader.batch_size or 1))
    elif hasattr(sampler, "set_epoch"):
        sampler.set_epoch(epoch)
    if loader.generator is not None:
        loader.generator.manual_seed((seed + 7919 * (epoch + 1) + 104_729 * start_batch) % 2**63)

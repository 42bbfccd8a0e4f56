"""Data loaders whose order is a pure function of (seed, epoch), so training can resume exactly.

`ResumableSampler` shards like DistributedSampler (world_size 1 included) and can start an epoch
part-way through. The loader's generator is reseeded at every epoch, which fixes the worker seeds
(and so the augmentation draws) for that epoch independently of what ran before.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from defectdet.data.dataset import collate_detections, default_workers, seed_worker


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
        return iter(self.shard()[self.start :])

    def __len__(self) -> int:
        per_rank = math.ceil(self.length / self.world_size) if self.length else 0
        return max(0, per_rank - self.start)


def build_resumable_loader(
    dataset: Dataset,
    batch_size: int,
    train: bool,
    workers: int | None = None,
    seed: int = 0,
    rank: int = 0,
    world_size: int = 1,
    collate_fn: Callable | None = None,
    pin_memory: bool = False,
) -> DataLoader:
    """Training loaders drop the last partial batch (when there is more than one batch)."""
    length = len(dataset)  # type: ignore[arg-type]
    sampler = ResumableSampler(length, shuffle=train, seed=seed, rank=rank, world_size=world_size)
    workers = default_workers(world_size) if workers is None else workers
    per_rank = math.ceil(length / world_size) if length else 0
    drop_last = train and per_rank > batch_size
    options: dict[str, Any] = {}
    if workers > 0:
        options.update(worker_init_fn=seed_worker, prefetch_factor=2)
    return DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=sampler,
        num_workers=workers,
        collate_fn=collate_fn or collate_detections,
        drop_last=drop_last,
        pin_memory=pin_memory,
        generator=torch.Generator().manual_seed(seed),
        **options,
    )


def start_epoch(loader: DataLoader, epoch: int, start_batch: int = 0, seed: int = 0) -> None:
    """Position `loader` at `epoch`, skipping `start_batch` batches, and fix the epoch's random streams.

    `seed` drives the worker seeds (pass a rank-dependent value under DDP so ranks augment differently);
    with workers=0 a dataset exposing `reseed(seed)` (our Augmenter) is reseeded instead.
    """
    sampler = loader.sampler
    if isinstance(sampler, ResumableSampler):
        sampler.set_epoch(epoch, start_batch * (loader.batch_size or 1))
    elif hasattr(sampler, "set_epoch"):
        sampler.set_epoch(epoch)
    epoch_seed = (seed + 7919 * (epoch + 1) + 104_729 * start_batch) % 2**63
    if loader.generator is not None:
        loader.generator.manual_seed(epoch_seed)
    reseed = getattr(loader.dataset, "reseed", None)
    if loader.num_workers == 0 and callable(reseed):
        reseed(epoch_seed % 2**32)

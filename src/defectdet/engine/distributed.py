"""torchrun support: read RANK/WORLD_SIZE/LOCAL_RANK, init the process group, small collectives.

Single-process runs use the same code path with world_size 1, where every collective is a no-op.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class DistributedContext:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")
    owns_group: bool = False  # we initialised the process group, so we destroy it

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def resolve_device(preference: str, local_rank: int = 0) -> torch.device:
    """'auto' -> CUDA when available; 'cuda' under torchrun -> cuda:LOCAL_RANK."""
    if preference == "auto":
        preference = "cuda" if torch.cuda.is_available() else "cpu"
    if preference.startswith("cuda"):
        if not torch.cuda.is_available():
            from defectdet.errors import ConfigError

            raise ConfigError(
                "field 'device': 'cuda' requested but torch sees no CUDA device (use --device cpu)"
            )
        if preference == "cuda":
            return torch.device("cuda", local_rank)
    return torch.device(preference)


def init_distributed(device_preference: str = "auto") -> DistributedContext:
    """Set up from torchrun's environment; a plain process gets world_size 1."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = resolve_device(device_preference, local_rank)
    if world_size <= 1:
        return DistributedContext(device=device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    owns_group = False
    if not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend=backend, init_method="env://", rank=rank, world_size=world_size)
        owns_group = True
    return DistributedContext(rank, world_size, local_rank, device, owns_group)


def cleanup_distributed(context: DistributedContext) -> None:
    if context.owns_group and dist.is_initialized():
        dist.destroy_process_group()


def barrier(context: DistributedContext) -> None:
    if context.enabled:
        if context.device.type == "cuda":
            dist.barrier(device_ids=[context.device.index or 0])
        else:
            dist.barrier()


def all_ranks_true(flag: bool, context: DistributedContext) -> bool:
    """True only when `flag` is true on every rank (keeps ranks in lockstep on skip decisions)."""
    if not context.enabled:
        return flag
    value = torch.tensor([1 if flag else 0], dtype=torch.int32, device=_collective_device(context))
    dist.all_reduce(value, op=dist.ReduceOp.MIN)
    return bool(value.item())


def broadcast_values(values: list[float], context: DistributedContext, source: int = 0) -> list[float]:
    """Rank `source`'s `values` on every rank (wall-clock readings, stop flags)."""
    if not context.enabled:
        return values
    tensor = torch.tensor(values, dtype=torch.float64, device=_collective_device(context))
    dist.broadcast(tensor, src=source)
    return tensor.tolist()


def _collective_device(context: DistributedContext) -> torch.device:
    return context.device if context.device.type == "cuda" else torch.device("cpu")


def wrap_model(model: nn.Module, context: DistributedContext) -> nn.Module:
    if not context.enabled:
        return model
    from torch.nn.parallel import DistributedDataParallel

    device_ids = [context.device.index or 0] if context.device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=device_ids)


def unwrap_model(model: nn.Module) -> nn.Module:
    """The plain module under DDP (and torch.compile) wrappers: its state_dict has no 'module.' prefix."""
    while True:
        if isinstance(model, nn.parallel.DistributedDataParallel | nn.DataParallel):
            model = model.module
        elif hasattr(model, "_orig_mod"):
            model = model._orig_mod
        else:
            return model


def rank_logger(name: str, context: DistributedContext) -> logging.Logger:
    """The named logger on rank 0; a disabled logger elsewhere, so only rank 0 logs."""
    if context.is_main:
        return logging.getLogger(name)
    silent = logging.Logger(f"{name}.rank{context.rank}")
    silent.disabled = True
    return silent

"""Optimizer construction and the warmup + cosine learning-rate schedule.

The schedule is a pure function of (optimizer step, progress): progress is step-based for an
epoch budget and wall-clock based (elapsed / budget) for a time budget. Both inputs are stored in
checkpoints, so a resumed run continues at the same point of the schedule.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
from torch import nn

from defectdet.errors import ConfigError


def parameter_groups(model: nn.Module, weight_decay: float, backbone_lr_scale: float = 1.0) -> list[dict]:
    """Weights (ndim > 1, decayed) and biases / norm scales (ndim <= 1, never decayed); with a
    `backbone_lr_scale` other than 1 each is split again into backbone and the rest, the backbone's groups
    carrying ``lr_scale`` (a pretrained backbone takes smaller steps than the new neck and head)."""
    buckets: dict[tuple[bool, bool], list[nn.Parameter]] = {}
    for name, parameter in model.named_parameters():
        if not parameter.requires_grad:
            continue
        in_backbone = backbone_lr_scale != 1.0 and name.startswith("backbone.")
        buckets.setdefault((parameter.ndim > 1, in_backbone), []).append(parameter)
    groups = []
    for (decayed, in_backbone), parameters in sorted(
        buckets.items(), key=lambda item: (not item[0][0], item[0][1])
    ):
        groups.append(
            {
                "params": parameters,
                "weight_decay": weight_decay if decayed else 0.0,
                "name": ("decay" if decayed else "no_decay") + ("_backbone" if in_backbone else ""),
                "lr_scale": backbone_lr_scale if in_backbone else 1.0,
            }
        )
    return groups


def build_optimizer(
    model: nn.Module,
    name: str,
    lr: float,
    weight_decay: float,
    momentum: float = 0.9,
    backbone_lr_scale: float = 1.0,
) -> torch.optim.Optimizer:
    """AdamW or SGD (Nesterov) over `parameter_groups`; `momentum` is AdamW's beta1."""
    groups = parameter_groups(model, weight_decay, backbone_lr_scale)
    if not groups:
        raise ConfigError("model has no trainable parameters (all have requires_grad=False)")
    if name == "adamw":
        return torch.optim.AdamW(groups, lr=lr, betas=(momentum, 0.999))
    if name == "sgd":
        return torch.optim.SGD(groups, lr=lr, momentum=momentum, nesterov=momentum > 0)
    raise ConfigError(f"field 'optimizer': unknown optimizer {name!r} (use 'adamw' or 'sgd')")


def check_optimizer_coverage(model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Raise ConfigError naming every parameter that requires grad but that the optimizer would never update."""
    in_optimizer = {id(p) for group in optimizer.param_groups for p in group["params"]}
    missing = [name for name, p in model.named_parameters() if p.requires_grad and id(p) not in in_optimizer]
    if missing:
        shown = ", ".join(missing[:20]) + (f" ... ({len(missing) - 20} more)" if len(missing) > 20 else "")
        raise ConfigError(
            f"{len(missing)} parameter(s) require grad but are not in the optimizer, so they would never "
            f"train: {shown}. Build the optimizer after adding all modules, or set requires_grad=False."
        )


@dataclass
class WarmupCosineSchedule:
    """lr = base_lr * warmup(step) * cosine(progress).

    warmup(step) rises linearly from 1/warmup_steps to 1 over the first `warmup_steps` optimizer steps;
    cosine(p) goes from 1 to `final_lr_ratio` as p goes 0 -> 1. With an epoch budget
    p = (step - warmup_steps) / (total_steps - warmup_steps); with a time budget (total_steps None)
    p = elapsed_seconds / time_budget_seconds.
    """

    base_lrs: list[float]
    warmup_steps: int
    final_lr_ratio: float
    total_steps: int | None = None
    time_budget_seconds: float | None = None

    def __post_init__(self) -> None:
        if self.total_steps is None and self.time_budget_seconds is None:
            raise ValueError("schedule needs total_steps or time_budget_seconds")

    def progress(self, step: int, elapsed_seconds: float = 0.0) -> float:
        if self.total_steps is not None:
            span = max(1, self.total_steps - self.warmup_steps)
            value = (step - self.warmup_steps) / span
        else:
            value = elapsed_seconds / float(self.time_budget_seconds)  # type: ignore[arg-type]
        return min(1.0, max(0.0, value))

    def factor(self, step: int, elapsed_seconds: float = 0.0) -> float:
        warmup = min(1.0, (step + 1) / self.warmup_steps) if self.warmup_steps > 0 else 1.0
        p = self.progress(step, elapsed_seconds)
        cosine = self.final_lr_ratio + (1.0 - self.final_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * p))
        return warmup * cosine

    def apply(self, optimizer: torch.optim.Optimizer, step: int, elapsed_seconds: float = 0.0) -> float:
        """Set every group's lr for `step`; returns the first group's lr."""
        factor = self.factor(step, elapsed_seconds)
        for group, base in zip(optimizer.param_groups, self.base_lrs, strict=True):
            group["lr"] = base * factor
        return optimizer.param_groups[0]["lr"]

    def state_dict(self) -> dict:
        return {"name": "warmup_cosine", **asdict(self)}

    @classmethod
    def from_state_dict(cls, state: dict) -> WarmupCosineSchedule:
        values = {k: v for k, v in state.items() if k != "name"}
        return cls(**values)

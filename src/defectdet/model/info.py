"""Parameter and FLOP counts."""

from __future__ import annotations

import logging

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

logger = logging.getLogger(__name__)


def model_info(model: nn.Module, imgsz: int = 640) -> dict[str, float | int]:
    """``{"params": int, "gflops": float}``; GFLOPs count FLOPs (2 per multiply-add,
    i.e. 2x MACs) of one eval forward at batch 1 and ``imgsz`` x ``imgsz``."""
    params = sum(parameter.numel() for parameter in model.parameters())
    in_channels = int(getattr(model, "in_channels", 3))
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            model(torch.zeros(1, in_channels, imgsz, imgsz, device=device))
    finally:
        model.train(was_training)
    return {"params": int(params), "gflops": counter.get_total_flops() / 1e9}


def preset_summaries(
    num_classes: int = 6, in_channels: int = 2, template: bool = True, imgsz: int = 640
) -> list[str]:
    """One line per preset: name, parameters and GFLOPs."""
    from defectdet.model.detector import PRESETS, build_model

    lines = []
    for name in PRESETS:
        info = model_info(build_model(name, num_classes, in_channels, template), imgsz)
        lines.append(f"{name:<6} params {info['params'] / 1e6:.3f}M  GFLOPs@{imgsz} {info['gflops']:.3f}")
    return lines


def log_preset_summaries(**kwargs: object) -> None:
    for line in preset_summaries(**kwargs):  # type: ignore[arg-type]
        logger.info(line)

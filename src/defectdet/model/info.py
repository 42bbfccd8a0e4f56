"""Parameter and FLOP counts."""

from __future__ import annotations

import logging

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from defectdet.data.letterbox import DEFAULT_INPUT_SIZE

logger = logging.getLogger(__name__)


def model_info(model: nn.Module, input_size: int = DEFAULT_INPUT_SIZE) -> dict[str, float | int]:
    """``{"params": int, "gflops": float}``; GFLOPs count FLOPs (2 per multiply-add,
    i.e. 2x MACs) of one eval forward at batch 1 and ``input_size`` x ``input_size``."""
    params = sum(parameter.numel() for parameter in model.parameters())
    in_channels = int(getattr(model, "in_channels", 3))
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            model(torch.zeros(1, in_channels, input_size, input_size, device=device))
    finally:
        model.train(was_training)
    return {"params": int(params), "gflops": counter.get_total_flops() / 1e9}


def preset_summaries(
    num_classes: int = 6, in_channels: int = 2, template: bool = True, input_size: int = DEFAULT_INPUT_SIZE
) -> list[str]:
    """One line per preset: name, parameters and GFLOPs."""
    from defectdet.model.detector import PRESETS, build_model

    lines = []
    for name in PRESETS:
        info = model_info(build_model(name, num_classes, in_channels, template), input_size)
        lines.append(
            f"{name:<6} params {info['params'] / 1e6:.3f}M  GFLOPs@{input_size} {info['gflops']:.3f}"
        )
    return lines


def log_preset_summaries(**kwargs: object) -> None:
    for line in preset_summaries(**kwargs):  # type: ignore[arg-type]
        logger.info(line)

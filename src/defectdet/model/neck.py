"""A light top-down FPN over strides 8/16/32, optionally with a bottom-up (PAN) pass."""

from __future__ import annotations

import torch
import torch.nn.functional as functional
from torch import nn

from defectdet.model.backbone import ConvBnAct, SeparableBlock


class FeaturePyramid(nn.Module):
    """Projects backbone maps to one width and mixes them top-down (+ bottom-up).

    Returns only the levels the head uses (``output_levels`` indexes strides 8, 16, 32).
    """

    def __init__(
        self,
        in_channels: tuple[int, ...],
        width: int,
        output_levels: tuple[int, ...],
        bottom_up: bool = False,
        kernel_size: int = 3,
    ) -> None:
        super().__init__()
        self.output_levels = tuple(output_levels)
        self.lateral = nn.ModuleList(ConvBnAct(channels, width, 1) for channels in in_channels)
        self.smooth = nn.ModuleList(
            SeparableBlock(width, width, 1, kernel_size) for _ in in_channels
        )
        self.bottom_up = bottom_up
        if bottom_up:
            self.downsample = nn.ModuleList(
                ConvBnAct(width, width, kernel_size, 2, groups=width) for _ in in_channels[:-1]
            )
            self.refine = nn.ModuleList(
                SeparableBlock(width, width, 1, kernel_size) for _ in in_channels[:-1]
            )

    def forward(self, features: list[torch.Tensor]) -> list[torch.Tensor]:
        laterals = [project(feature) for project, feature in zip(self.lateral, features)]
        # top-down: coarse context into fine levels
        merged = [laterals[-1]]
        for lateral in reversed(laterals[:-1]):
            merged.insert(0, lateral + functional.interpolate(merged[0], scale_factor=2.0, mode="nearest"))
        outputs = [smooth(level) for smooth, level in zip(self.smooth, merged)]
        if self.bottom_up:
            for index in range(1, len(outputs)):
                down = self.downsample[index - 1](outputs[index - 1])
                outputs[index] = self.refine[index - 1](outputs[index] + down)
        return [outputs[level] for level in self.output_levels]

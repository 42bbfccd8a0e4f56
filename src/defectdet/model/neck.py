"""A light top-down FPN over strides 8/16/32, optionally with a bottom-up (PAN) pass."""

from __future__ import annotations

import torch
import torch.nn.functional as functional
from torch import nn

from defectdet.model.backbone import ConvBnAct, SeparableBlock


class FeaturePyramid(nn.Module):
    """Projects backbone maps to one width and mixes them top-down (+ bottom-up).

    ``output_levels`` indexes the input levels (0 = stride 8, 1 = 16, 2 = 32) that the
    head uses; only the modules those outputs need are built, so every parameter
    gets a gradient (DDP without ``find_unused_parameters``).
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
        self.bottom_up = bottom_up
        self.lateral = nn.ModuleList(ConvBnAct(channels, width, 1) for channels in in_channels)
        top = max(self.output_levels)
        self.smoothed_levels = tuple(range(top + 1)) if bottom_up else self.output_levels
        self.smooth = nn.ModuleDict(
            {str(level): SeparableBlock(width, width, 1, kernel_size) for level in self.smoothed_levels}
        )
        if bottom_up:
            self.downsample = nn.ModuleList(
                ConvBnAct(width, width, kernel_size, 2, groups=width) for _ in range(top)
            )
            self.refine = nn.ModuleList(SeparableBlock(width, width, 1, kernel_size) for _ in range(top))

    def forward(self, features: list[torch.Tensor]) -> list[torch.Tensor]:
        laterals = [project(feature) for project, feature in zip(self.lateral, features, strict=True)]
        # top-down: coarse context into finer levels
        merged = [laterals[-1]]
        for lateral in reversed(laterals[:-1]):
            upsampled = functional.interpolate(merged[0], scale_factor=2.0, mode="nearest")
            merged.insert(0, lateral + upsampled)
        outputs = {level: self.smooth[str(level)](merged[level]) for level in self.smoothed_levels}
        if self.bottom_up:
            for level in range(1, max(self.output_levels) + 1):
                down = self.downsample[level - 1](outputs[level - 1])
                outputs[level] = self.refine[level - 1](outputs[level] + down)
        return [outputs[level] for level in self.output_levels]

"""EfficientNet-Lite0 as a detection backbone: ImageNet features for images without a golden template.

The network is the published EfficientNet-Lite0 layout (inverted-residual blocks, ReLU6, no squeeze-excitation,
which is what makes it fast on a CPU), cut after the first block at stride 32: the remaining three 192-wide
blocks, the 320-wide block and the 1280-wide classifier head cost a quarter of the network's time at 640 x 640
and mostly serve ImageNet's 1000 classes, while defects are read at strides 8 and 16. It returns the maps at
strides 8, 16 and 32 (40, 112 and 192 channels), as :class:`defectdet.model.backbone.Backbone` does.

Module names differ from the weight file's (see :mod:`defectdet.model.imagenet`, which maps them); every
convolution is a :class:`~defectdet.model.backbone.ConvBnAct` so the exporter, the drift monitor and BatchNorm
folding treat it like the rest of the model.
"""

from __future__ import annotations

import torch
from torch import nn

from defectdet.model.backbone import ConvBnAct

STEM_WIDTH = 32
# (expansion, kernel, stride, out channels, repeats): EfficientNet-Lite0's seven stages; the last (320 wide)
# is not built (see the module docstring)
STAGES: tuple[tuple[int, int, int, int, int], ...] = (
    (1, 3, 1, 16, 1),
    (6, 3, 2, 24, 2),
    (6, 5, 2, 40, 2),  # ends at stride 8
    (6, 3, 2, 80, 3),
    (6, 5, 1, 112, 3),  # ends at stride 16
    (6, 5, 2, 192, 1),  # its first block, into stride 32 (see the module docstring)
)
# index of the block (counted over all stages) whose output is each returned level: strides 8, 16, 32
TAP_BLOCKS = (4, 10, 11)
FROZEN_BLOCKS = 3  # with `frozen_stem`: the stem and blocks 0-2 (strides 2 and 4)
OUT_CHANNELS = (40, 112, 192)


class ConvBnRelu6(ConvBnAct):
    """ConvBnAct with ReLU6, the activation EfficientNet-Lite was trained with (BatchNorm eps 1e-3 as there)."""

    def __init__(self, *args: int, activation: bool = True, **kwargs: int) -> None:
        super().__init__(*args, activation=activation, **kwargs)
        self.act = nn.ReLU6() if activation else nn.Identity()


class InvertedResidual(nn.Module):
    """1x1 expand -> kxk depthwise (stride s) -> 1x1 project (linear); residual when the shape is kept."""

    def __init__(
        self, in_channels: int, out_channels: int, expansion: int, kernel_size: int, stride: int
    ) -> None:
        super().__init__()
        hidden = in_channels * expansion
        self.expand = ConvBnRelu6(in_channels, hidden, 1) if expansion != 1 else nn.Identity()
        self.depthwise = ConvBnRelu6(hidden, hidden, kernel_size, stride, groups=hidden)
        self.project = ConvBnRelu6(hidden, out_channels, 1, activation=False)
        self.residual = stride == 1 and in_channels == out_channels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.project(self.depthwise(self.expand(x)))
        return x + y if self.residual else y


class EfficientNetLiteBackbone(nn.Module):
    """EfficientNet-Lite0's stem and blocks 0-11; ``forward`` returns the maps at strides 8, 16 and 32.

    ``frozen_stem``: the stem and the blocks at strides 2 and 4 keep their weights and BatchNorm statistics (as
    detectors fine-tuned from ImageNet usually do): they hold generic edge and texture filters, and at full
    resolution they cost a third of a training step's time, which a CPU budget spends better on more steps."""

    def __init__(self, in_channels: int, frozen_stem: bool = False) -> None:
        super().__init__()
        self.frozen_stem = frozen_stem
        self.stem = ConvBnRelu6(in_channels, STEM_WIDTH, 3, 2)
        blocks: list[nn.Module] = []
        previous = STEM_WIDTH
        for expansion, kernel, stride, width, repeats in STAGES:
            for repeat in range(repeats):
                blocks.append(
                    InvertedResidual(previous, width, expansion, kernel, stride if repeat == 0 else 1)
                )
                previous = width
        self.blocks = nn.ModuleList(blocks)
        self.out_channels = OUT_CHANNELS
        for module in self._frozen_modules():
            module.requires_grad_(False)

    def _frozen_modules(self) -> list[nn.Module]:
        return [self.stem, *self.blocks[:FROZEN_BLOCKS]] if self.frozen_stem else []

    def train(self, mode: bool = True) -> EfficientNetLiteBackbone:
        super().train(mode)
        for module in self._frozen_modules():
            module.eval()  # frozen BatchNorm statistics too
        return self

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        x = self.stem(x)
        outputs = []
        for index, block in enumerate(self.blocks):
            x = block(x)
            if index in TAP_BLOCKS:
                outputs.append(x)
        return outputs

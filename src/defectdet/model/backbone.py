"""Input fusion (normalization, template difference, companion planes) and a depthwise-separable backbone."""

from __future__ import annotations

import torch
from torch import nn

# Fixed normalization so the runtime feeds plain [0, 1] images.
INPUT_MEAN = 0.5
INPUT_STD = 0.25


class ConvBnAct(nn.Module):
    """Conv2d (no bias) -> BatchNorm -> SiLU (activation optional)."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int = 1,
        stride: int = 1,
        groups: int = 1,
        padding: int | None = None,
        activation: bool = True,
    ) -> None:
        super().__init__()
        if padding is None:
            padding = kernel_size // 2
        self.conv = nn.Conv2d(
            in_channels, out_channels, kernel_size, stride, padding, groups=groups, bias=False
        )
        self.norm = nn.BatchNorm2d(out_channels, eps=1e-3, momentum=0.03)
        # not in place: under autograd an in-place SiLU copies its input for the backward pass
        self.act = nn.SiLU() if activation else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.norm(self.conv(x)))


class SeparableBlock(nn.Module):
    """Depthwise kxk (stride s) -> pointwise 1x1; residual when shape is kept."""

    def __init__(self, in_channels: int, out_channels: int, stride: int = 1, kernel_size: int = 3) -> None:
        super().__init__()
        self.depthwise = ConvBnAct(in_channels, in_channels, kernel_size, stride, groups=in_channels)
        self.pointwise = ConvBnAct(in_channels, out_channels, 1)
        self.residual = stride == 1 and in_channels == out_channels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.pointwise(self.depthwise(x))
        return x + y if self.residual else y


class InputFusion(nn.Module):
    """Normalizes [0, 1] input; with a template appends the signed difference; companions follow as they are.

    Input channels are ``[tested (c), template (c) if template, companion_1 (c), ..., companion_k (c)]``.
    Output is ``[tested, template, tested - template]`` (the template part only with a template) followed by the
    normalized companions, so the stem sees the change directly, the way AOI compares a board to its golden
    image, and each aligned companion capture (another lighting, focus or band) beside it.
    """

    def __init__(self, in_channels: int, template: bool, companions: int = 0) -> None:
        super().__init__()
        planes = 1 + int(template) + companions
        if companions < 0 or in_channels % planes:
            raise ValueError(
                f"{in_channels} input channels do not split into {planes} planes "
                f"(tested image{', template' if template else ''}, {companions} companion(s))"
            )
        self.in_channels = in_channels
        self.template = template
        self.companions = companions
        self.channels = in_channels // planes  # c: the channels of one plane
        self.out_channels = self.channels * (3 if template else 1) + self.channels * companions

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        # images: (B, C, H, W) in [0, 1]
        if not self.template and not self.companions:
            return (images - INPUT_MEAN) / INPUT_STD
        c = self.channels
        tested = images[:, :c]
        parts = [(tested - INPUT_MEAN) / INPUT_STD]
        if self.template:
            reference = images[:, c : 2 * c]
            difference = (tested - reference) / INPUT_STD  # (B, c, H, W), zero where unchanged
            parts += [(reference - INPUT_MEAN) / INPUT_STD, difference]
        if self.companions:
            parts.append((images[:, c * (1 + int(self.template)) :] - INPUT_MEAN) / INPUT_STD)
        return torch.cat(parts, 1)


class Backbone(nn.Module):
    """Patchify stem (stride 4) then stages at strides 8, 16, 32.

    The stride-4 patchify stem (a 4x4/4 conv) never materializes a full- or
    half-resolution feature map, which is what dominates CPU latency at 640x640;
    the smallest target defects (~24 px) still span 6 stem cells.
    Returns the feature maps at strides 8, 16, 32.
    """

    def __init__(
        self,
        in_channels: int,
        widths: tuple[int, int, int, int],
        depths: tuple[int, int, int, int],
        kernel_size: int = 3,
    ) -> None:
        super().__init__()
        stem_width = widths[0]
        self.stem = ConvBnAct(in_channels, stem_width, kernel_size=4, stride=4, padding=0)
        stages: list[nn.Module] = []
        previous = stem_width
        for index, (width, depth) in enumerate(zip(widths, depths, strict=True)):
            blocks: list[nn.Module] = []
            if index > 0:  # downsample into this stage
                blocks.append(SeparableBlock(previous, width, stride=2, kernel_size=kernel_size))
            elif previous != width:
                blocks.append(ConvBnAct(previous, width, 1))
            blocks += [SeparableBlock(width, width, 1, kernel_size) for _ in range(depth)]
            stages.append(nn.Sequential(*blocks))
            previous = width
        self.stages = nn.ModuleList(stages)
        self.out_channels = tuple(widths[1:])

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        x = self.stem(x)  # (B, w0, H/4, W/4)
        outputs = []
        for index, stage in enumerate(self.stages):
            x = stage(x)
            if index > 0:
                outputs.append(x)  # strides 8, 16, 32
        return outputs

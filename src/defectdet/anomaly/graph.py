"""The networks of a good-parts-only model: ImageNet patch features, and the bundle graph that scores each cell.

`PatchFeatures`: EfficientNet-Lite0 (ImageNet weights, `model.imagenet`) on the normalized input; the stride-8
map and the stride-16 map upsampled to stride 8 are concatenated (40 + 112 channels) and averaged over each
cell's 3 x 3 neighbourhood, so a patch vector describes a cell with a little of its surroundings (PatchCore's
local aggregation). It also answers the per-channel means of the stride 8/16/32 maps, the pooled features the
drift monitor reads from every bundle.

`AnomalyGraph`: what the bundle computes. Per stride-8 cell, the distance to the nearest vector of the memory
bank (``|f|^2 - 2 f M^T + |M|^2``, minimum over the bank), mapped to [0, 1] by the calibration fitted on held-out
good images (a logistic curve in log distance through the operating threshold), and one box of `BOX_CELLS` cells centred on the
cell: the standard predictions ``(B, A, 4 + 1)`` with the single class "anomaly".

Where a cell looks: the patch vector of cell c answers for the content around input pixel ``8c + CELL_CENTRE_PX``
(measured with a small bright dot; `tests/anomaly` measures it again: the ImageNet maps' cells look a little
before their own middle, and the upsampled stride-16 map further still). Each cell's box is centred there, so the
map and its boxes sit on the defect, not a cell and a half beside it.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

STRIDE = 8
FEATURE_CHANNELS = 40 + 112  # the stride-8 map and the upsampled stride-16 map
MIN_DISTANCE = 1e-6  # distances are clamped here before their logarithm
BOX_CELLS = 3.5  # a cell's box side in cells: neighbouring boxes overlap enough for the fragment merge
OPERATING_SCORE = 0.5  # the calibrated score at the operating distance: the bundle's threshold
CELL_CENTRE_PX = -9.0  # the input pixel (index) the patch vector of cell 0 answers for; cell c: 8c + this


class PatchFeatures(nn.Module):
    """``(B, C, S, S)`` in [0, 1] -> patch vectors ``(B, N, D)`` (N = (S/8)^2 cells, row-major) and the pooled
    drift features ``(B, 40 + 112 + 192)``."""

    def __init__(self, fusion: nn.Module, backbone: nn.Module) -> None:
        super().__init__()
        self.fusion = fusion
        self.backbone = backbone

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        maps = self.backbone(self.fusion(images))
        fine, coarse = maps[0], maps[1]
        upsampled = F.interpolate(coarse, scale_factor=2.0, mode="bilinear", align_corners=False)
        patches = F.avg_pool2d(torch.cat([fine, upsampled], 1), 3, 1, 1, count_include_pad=False)
        pooled = torch.cat([level.float().mean((2, 3)) for level in maps], 1)
        return patches.flatten(2).transpose(1, 2), pooled


def cell_boxes(input_size: int, stride: int = STRIDE, cells: float = BOX_CELLS) -> torch.Tensor:
    """``(N, 4)`` xyxy boxes in input pixels, one per stride cell in row-major order, `cells` cells wide and
    high, centred where the cell's features look (``stride x c + CELL_CENTRE_PX``, that pixel's middle)."""
    side = input_size // stride
    ys, xs = torch.meshgrid(torch.arange(side), torch.arange(side), indexing="ij")
    centres = torch.stack([xs, ys], -1).reshape(-1, 2).float() * stride + CELL_CENTRE_PX + 0.5
    half = cells * stride / 2
    return torch.cat([centres - half, centres + half], 1)


def region_boxes(inside: torch.Tensor, boxes: torch.Tensor, side: int) -> torch.Tensor:
    """``(B, N, 4)``: for a cell above the threshold (`inside`, ``(B, N)`` bool), the box around every cell of its
    8-connected region above the threshold; for any other cell its own box (`boxes`, ``(N, 4)``). The regions
    grow by one cell per step, `side` steps (the longest region a ``side x side`` grid can hold)."""
    batch = inside.shape[0]
    mask = inside.reshape(batch, 1, side, side)
    own = boxes.t().reshape(1, 4, side, side)
    extents = torch.cat([-own[:, :2], own[:, 2:]], 1).expand(batch, -1, -1, -1)  # all four grow upwards
    outside = torch.full_like(extents, -1e9)
    grown = torch.where(mask, extents, outside)
    for _ in range(side):
        grown = torch.where(mask, F.max_pool2d(grown, 3, 1, 1), outside)
    grown = torch.cat([-grown[:, :2], grown[:, 2:]], 1).flatten(2).transpose(1, 2)  # (B, N, 4)
    return torch.where(inside.unsqueeze(-1), grown, boxes.unsqueeze(0))


def nearest_distance(patches: torch.Tensor, memory: torch.Tensor, memory_norms: torch.Tensor) -> torch.Tensor:
    """``(B, N, D)`` patch vectors, ``(K, D)`` memory, ``(K,)`` its squared norms -> ``(B, N)`` Euclidean distance of
    each patch to its nearest memory vector."""
    squared = (
        (patches * patches).sum(-1, keepdim=True) - 2.0 * torch.matmul(patches, memory.t()) + memory_norms
    )
    return squared.min(-1).values.clamp_min(0.0).sqrt()


class AnomalyGraph(nn.Module):
    """The bundle's graph: images -> (predictions ``(B, N, 5)``, pooled features ``(B, F)``).

    ``score = sigmoid(gain x (log distance - log shift))``: 0.5 at the operating distance `shift`
    (`anomaly.memory.Calibration`)."""

    def __init__(
        self, features: PatchFeatures, memory: torch.Tensor, shift: float, gain: float, input_size: int
    ) -> None:
        super().__init__()
        self.features = features
        self.register_buffer("memory", memory.float().contiguous())
        self.register_buffer("memory_norms", (memory.float() ** 2).sum(1))
        self.register_buffer("log_shift", torch.tensor(math.log(shift)))
        self.register_buffer("gain", torch.tensor(float(gain)))
        self.register_buffer("boxes", cell_boxes(input_size))
        self.side = input_size // STRIDE

    def distances(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(B, N)`` nearest-memory distances and the pooled features."""
        patches, pooled = self.features(images)
        return nearest_distance(patches, self.memory, self.memory_norms), pooled

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        distance, pooled = self.distances(images)
        score = torch.sigmoid((torch.log(distance.clamp_min(MIN_DISTANCE)) - self.log_shift) * self.gain)
        boxes = region_boxes(score >= OPERATING_SCORE, self.boxes, self.side)
        return torch.cat([boxes, score.unsqueeze(-1)], -1), pooled

    def forward_with_features(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`forward`, under the name the exporter's graph wrapper and parity check call."""
        return self.forward(images)

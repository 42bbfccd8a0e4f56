"""Anchor-free head: per level a separable block, then class logits and ltrb distances."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as functional
from torch import nn

from defectdet.model.backbone import SeparableBlock

CLASS_PRIOR = 0.01  # initial foreground probability (focal-loss style bias init)
INITIAL_DISTANCE = 2.0  # initial ltrb distance in units of stride


class DetectionHead(nn.Module):
    """One head per level (BN statistics differ per stride); cls and box share the tower.

    Returns raw class logits ``(B, A, K)`` and ltrb distances in pixels ``(B, A, 4)``,
    with anchors ordered level by level, row-major inside a level.
    """

    def __init__(
        self,
        width: int,
        num_classes: int,
        strides: tuple[int, ...],
        depth: int = 1,
        kernel_size: int = 3,
    ) -> None:
        super().__init__()
        self.strides = tuple(strides)
        self.num_classes = num_classes
        self.towers = nn.ModuleList(
            nn.Sequential(*[SeparableBlock(width, width, 1, kernel_size) for _ in range(depth)])
            for _ in strides
        )
        self.classifiers = nn.ModuleList(nn.Conv2d(width, num_classes, 1) for _ in strides)
        self.regressors = nn.ModuleList(nn.Conv2d(width, 4, 1) for _ in strides)
        self.reset_output_bias()

    def reset_output_bias(self) -> None:
        for classifier in self.classifiers:
            nn.init.normal_(classifier.weight, std=0.01)
            nn.init.constant_(classifier.bias, -math.log((1 - CLASS_PRIOR) / CLASS_PRIOR))
        inverse_softplus = math.log(math.expm1(INITIAL_DISTANCE))
        for regressor in self.regressors:
            nn.init.normal_(regressor.weight, std=0.01)
            nn.init.constant_(regressor.bias, inverse_softplus)

    def forward(self, features: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        logits, distances = [], []
        for feature, tower, classifier, regressor, stride in zip(
            features, self.towers, self.classifiers, self.regressors, self.strides, strict=True
        ):
            x = tower(feature)  # (B, W, h, w)
            logits.append(classifier(x).flatten(2))  # (B, K, h*w)
            distances.append(functional.softplus(regressor(x)).flatten(2) * stride)  # (B, 4, h*w)
        return torch.cat(logits, 2).transpose(1, 2), torch.cat(distances, 2).transpose(1, 2)


def make_anchor_points(
    features: list[torch.Tensor], strides: tuple[int, ...]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Cell centres in input pixels ``(A, 2)`` (x, y) and each anchor's stride ``(A, 1)``.

    Built from the feature shapes on every call so ONNX export keeps height/width dynamic.
    """
    points, anchor_strides = [], []
    for feature, stride in zip(features, strides, strict=True):
        height, width = feature.shape[-2:]
        device, dtype = feature.device, torch.float32
        xs = (torch.arange(width, device=device, dtype=dtype) + 0.5) * stride
        ys = (torch.arange(height, device=device, dtype=dtype) + 0.5) * stride
        grid_y, grid_x = torch.meshgrid(ys, xs, indexing="ij")
        level_points = torch.stack([grid_x, grid_y], -1).reshape(-1, 2)
        points.append(level_points)
        anchor_strides.append(torch.full_like(level_points[:, :1], float(stride)))
    return torch.cat(points), torch.cat(anchor_strides)


def distances_to_boxes(points: torch.Tensor, distances: torch.Tensor) -> torch.Tensor:
    """ltrb distances ``(B, A, 4)`` around points ``(A, 2)`` -> xyxy ``(B, A, 4)``."""
    top_left = points - distances[..., :2]
    bottom_right = points + distances[..., 2:]
    return torch.cat([top_left, bottom_right], -1)

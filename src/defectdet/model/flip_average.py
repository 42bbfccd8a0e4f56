"""Test-time flips for the dense detector: each anchor's scores and box averaged over mirrored inputs.

The detector predicts one box and one score vector per grid cell. A horizontally flipped image puts the
mirror of cell (y, x) at (y, W - 1 - x) of the same level, so the flipped pass can be mirrored back cell by
cell and averaged with the plain one, before any score floor or NMS: the wrapped model has the detector's
own output, ``(B, A, 4 + K)``, and everything after it (post-processing, evaluation, ONNX export) is
unchanged. Averaging dampens what one view alone fires on; it costs one forward pass per view.
`defectdet val --flip-views` runs a checkpoint this way; `defectdet export --flip-views` writes the views into
the bundle's graph, so the torch-free runtime needs nothing new. What it buys and costs is measured by
`bench/flip_views.py` (figures in `bench/results/flip_views_*.json`).
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

logger = logging.getLogger(__name__)

# Which image axes each view flips: (3,) left-right, (2,) up-down, (2, 3) both.
FLIP_VIEWS: dict[str, tuple[tuple[int, ...], ...]] = {
    "none": (),
    "lr": ((3,),),
    "lr+ud": ((3,), (2,), (2, 3)),
}


def check_views(views: str) -> str:
    """`views` if it names a `FLIP_VIEWS` entry, else ValueError naming the valid ones."""
    if views not in FLIP_VIEWS:
        raise ValueError(f"flip views must be one of {', '.join(FLIP_VIEWS)}, got {views!r}")
    return views


def untrained_flips(views: str, config: Mapping[str, Any] | None) -> list[str]:
    """The flips of `views` the training run never showed the model (its `augment.horizontal_flip` or
    `vertical_flip` was 0): on such data orientation means something and the mirrored view is not the same part."""
    augment = (config or {}).get("augment") or {}
    axes = {3: "horizontal_flip", 2: "vertical_flip"}
    used = {dim for dims in FLIP_VIEWS[check_views(views)] for dim in dims}
    return [axes[dim] for dim in sorted(used, reverse=True) if float(augment.get(axes[dim], 0.5)) == 0.0]


def with_flip_views(
    detector: nn.Module, views: str, config: Mapping[str, Any] | None, source: Any
) -> nn.Module:
    """`detector` wrapped in `FlipAveraged` (itself for "none"), with a warning per flip its training `config`
    never made (`untrained_flips`); `source` names the model in the warning. `val` and `export` both call it."""
    if check_views(views) == "none":
        return detector
    for name in untrained_flips(views, config):
        logger.warning(
            "--flip-views %s: %s trained with augment.%s = 0, so it never saw those mirrors; the views may cost "
            "accuracy",
            views,
            source,
            name,
        )
    return FlipAveraged(detector, views).eval()


def mirrored_anchor_order(
    height: int, width: int, strides: tuple[int, ...], dims: tuple[int, ...]
) -> torch.Tensor:
    """Index ``(A,)``: entry a is where anchor a of the plain image sits in the output of the flipped one."""
    order, offset = [], 0
    for stride in strides:
        rows, cols = height // stride, width // stride
        grid = torch.arange(rows * cols).reshape(rows, cols)
        grid = grid.flip([dim - 2 for dim in dims])  # image axes 2, 3 -> grid axes 0, 1
        order.append(grid.reshape(-1) + offset)
        offset += rows * cols
    return torch.cat(order)


def unflip_boxes(boxes: torch.Tensor, height: int, width: int, dims: tuple[int, ...]) -> torch.Tensor:
    """xyxy boxes ``(..., 4)`` predicted on the image flipped along `dims`, in the plain image's pixels."""
    x0, y0, x1, y1 = boxes.unbind(-1)
    if 3 in dims:
        x0, x1 = width - x1, width - x0
    if 2 in dims:
        y0, y1 = height - y1, height - y0
    return torch.stack([x0, y0, x1, y1], -1)


class FlipAveraged(nn.Module):
    """`detector` run on the image and its flips (`FLIP_VIEWS[views]`), outputs averaged per anchor.

    Input and output as `Detector.forward` in eval mode: ``(B, C, H, W)`` -> ``(B, A, 4 + K)``.
    """

    def __init__(self, detector: nn.Module, views: str = "lr+ud") -> None:
        super().__init__()
        self.detector = detector
        self.views = check_views(views)
        self.strides = tuple(detector.strides)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self._average(images, self.detector(images).float())

    def forward_with_features(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Averaged predictions and the plain pass's pooled features (`Detector.forward_with_features`): the
        drift monitor watches the image as the camera sees it."""
        plain, features = self.detector.forward_with_features(images)
        return self._average(images, plain.float()), features

    def _average(self, images: torch.Tensor, plain: torch.Tensor) -> torch.Tensor:
        with warnings.catch_warnings():  # an exported graph has a fixed input size: the ints are meant
            warnings.simplefilter("ignore", torch.jit.TracerWarning)
            height, width = int(images.shape[2]), int(images.shape[3])
        total = plain
        for dims in FLIP_VIEWS[self.views]:
            flipped = self.detector(images.flip(dims)).float()
            flipped = flipped[:, mirrored_anchor_order(height, width, self.strides, dims).to(images.device)]
            boxes = unflip_boxes(flipped[..., :4], height, width, dims)
            total = total + torch.cat([boxes, flipped[..., 4:]], -1)
        return total / (1 + len(FLIP_VIEWS[self.views]))

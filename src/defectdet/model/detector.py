"""The template-aware anchor-free detector, its presets and ``build_model``.

Measured per preset on the 2-core CPU (no figures are copied here, so none go stale):
params, GFLOPs and ONNX Runtime / torch latency at 640x640 in ``bench/results/latency.json``
(``bench/latency.py``); DeepPCB mAP@0.5 on the held-out groups, time to mAP thresholds and training
images/s in ``bench/results/train_deeppcb_<preset>_<minutes>min.json`` (``bench/train_deeppcb.py``),
each file with the exact training settings it ran with.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from defectdet.errors import ConfigError, DatasetError
from defectdet.model.assigner import TaskAlignedAssigner
from defectdet.model.backbone import Backbone, InputFusion
from defectdet.model.head import DetectionHead, distances_to_boxes, make_anchor_points
from defectdet.model.loss import DetectionLoss
from defectdet.model.neck import FeaturePyramid

STRIDES_BY_LEVEL = (8, 16, 32)
IMAGENET_BACKBONE = "efficientnet_lite0"  # model.efficientnet_lite, weights from model.imagenet

# widths: stem (stride 4) and stages at strides 8/16/32; depths: blocks per stage;
# levels: which of strides 8/16/32 get a head.
PRESETS: dict[str, dict[str, Any]] = {
    "nano": {
        "widths": (16, 32, 64, 96),
        "depths": (1, 2, 2, 1),
        "neck_width": 32,
        "levels": (0, 1),
        "bottom_up": False,
        "head_depth": 1,
        "kernel_size": 3,
    },
    "tiny": {
        "widths": (24, 48, 96, 128),
        "depths": (1, 2, 3, 1),
        "neck_width": 48,
        "levels": (0, 1),
        "bottom_up": False,
        "head_depth": 1,
        "kernel_size": 3,
    },
    "small": {
        "widths": (32, 64, 128, 192),
        "depths": (1, 3, 3, 2),
        "neck_width": 64,
        "levels": (0, 1, 2),
        "bottom_up": True,
        "head_depth": 2,
        "kernel_size": 5,
    },
    # ImageNet features (model.efficientnet_lite, weights: model.imagenet) under the same neck and head: for
    # images without a golden template, where features learned on real images matter most
    "lite0": {
        "backbone": IMAGENET_BACKBONE,
        "frozen_stem": False,  # engine.autoconfig turns it on when the stem starts from ImageNet as it is
        "neck_width": 64,
        "levels": (0, 1),
        "bottom_up": False,
        "head_depth": 1,
        "kernel_size": 3,
    },
    # the largest preset: for an hour or more of CPU, or a GPU
    "base": {
        "widths": (48, 96, 192, 384),
        "depths": (1, 3, 6, 3),
        "neck_width": 128,
        "levels": (0, 1, 2),
        "bottom_up": True,
        "head_depth": 2,
        "kernel_size": 5,
    },
}

LOSS_DEFAULTS: dict[str, Any] = {
    "class_weight": 1.0,
    "box_weight": 2.5,
    "top_k": 10,
    "alpha": 0.5,
    "beta": 6.0,
}


class Detector(nn.Module):
    """Fully convolutional detector; input ``(B, C, H, W)`` in [0, 1], H and W divisible by 32.

    ``forward(images, targets)`` returns a dict of losses (``loss`` is the total);
    ``forward(images)`` returns ``(B, A, 4 + K)``: xyxy boxes in input pixels and
    per-class sigmoid scores. ``config`` holds everything ``build_model`` needs.
    """

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__()
        self.config = copy.deepcopy(config)
        self.num_classes = int(config["num_classes"])
        self.in_channels = int(config["in_channels"])
        self.template = bool(config["template"])
        # aligned companion captures stacked after the tested image (and template); absent in older configs
        self.companions = [str(name) for name in config.get("companions") or []]
        self.strides = tuple(STRIDES_BY_LEVEL[level] for level in config["levels"])
        self.fusion = InputFusion(self.in_channels, self.template, len(self.companions))
        self.backbone = _build_backbone(config, self.fusion.out_channels)
        self.neck = FeaturePyramid(
            self.backbone.out_channels,
            config["neck_width"],
            tuple(config["levels"]),
            config["bottom_up"],
            config["kernel_size"],
        )
        self.head = DetectionHead(
            config["neck_width"], self.num_classes, self.strides, config["head_depth"], config["kernel_size"]
        )
        loss = {**LOSS_DEFAULTS, **config.get("loss", {})}
        self.criterion = DetectionLoss(
            self.num_classes,
            class_weight=loss["class_weight"],
            box_weight=loss["box_weight"],
            assigner=TaskAlignedAssigner(loss["top_k"], loss["alpha"], loss["beta"]),
        )

    def _check_input(self, images: torch.Tensor) -> None:
        if torch.jit.is_tracing() or torch.onnx.is_in_onnx_export():
            return
        if images.dim() != 4 or images.shape[1] != self.in_channels:
            raise ValueError(f"expected images (B, {self.in_channels}, H, W), got {tuple(images.shape)}")
        if images.shape[2] % 32 or images.shape[3] % 32:
            raise ValueError(f"image height and width must be divisible by 32, got {tuple(images.shape[2:])}")

    def _check_targets(self, targets: list[torch.Tensor], batch: int) -> None:
        if len(targets) != batch:
            raise DatasetError(f"got {len(targets)} target tensors for a batch of {batch} images")
        for index, target in enumerate(targets):
            if target.dim() != 2 or target.shape[1] != 5:
                raise DatasetError(
                    f"targets[{index}] must be (N, 5) [class, x1, y1, x2, y2], got {tuple(target.shape)}"
                )
            if target.shape[0] and (target[:, 0].min() < 0 or target[:, 0].max() >= self.num_classes):
                raise DatasetError(
                    f"targets[{index}] has a class id outside 0..{self.num_classes - 1}: "
                    f"{target[:, 0].unique().tolist()}"
                )

    def forward(
        self, images: torch.Tensor, targets: list[torch.Tensor] | None = None
    ) -> torch.Tensor | dict[str, torch.Tensor]:
        self._check_input(images)
        logits, boxes, points, _ = self._run(images)
        if targets is None:
            return torch.cat([boxes, logits.float().sigmoid()], -1)  # (B, A, 4 + K)
        self._check_targets(targets, images.shape[0])
        return self.criterion(logits, boxes, points, targets)

    def forward_with_features(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Eval predictions ``(B, A, 4 + K)`` plus ``(B, F)`` per-channel means of the backbone's
        stride 8/16/32 feature maps: the drift monitor's activation statistics, exported as a second
        ONNX output so a deployed bundle measures itself without hooks or a second pass."""
        self._check_input(images)
        logits, boxes, _, backbone_features = self._run(images)
        pooled = torch.cat([feature.float().mean((2, 3)) for feature in backbone_features], 1)
        return torch.cat([boxes, logits.float().sigmoid()], -1), pooled

    @property
    def feature_channels(self) -> int:
        """F of :meth:`forward_with_features`."""
        return int(sum(self.backbone.out_channels))

    def _run(
        self, images: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[torch.Tensor]]:
        backbone_features = self.backbone(self.fusion(images))
        features = self.neck(backbone_features)
        logits, distances = self.head(features)  # (B, A, K), (B, A, 4)
        points, _ = make_anchor_points(features, self.strides)  # (A, 2)
        boxes = distances_to_boxes(points, distances.float())  # (B, A, 4)
        return logits, boxes, points, backbone_features


def has_imagenet_backbone(preset: str) -> bool:
    """The preset's backbone starts from ImageNet weights (model.imagenet), not from our shipped ones."""
    return PRESETS.get(preset, {}).get("backbone") == IMAGENET_BACKBONE


def _build_backbone(config: dict[str, Any], in_channels: int) -> nn.Module:
    """The preset's backbone: ours (widths, depths) or EfficientNet-Lite0 (``backbone: efficientnet_lite0``)."""
    kind = config.get("backbone", "defectdet")
    if kind == IMAGENET_BACKBONE:
        from defectdet.model.efficientnet_lite import EfficientNetLiteBackbone

        return EfficientNetLiteBackbone(in_channels, bool(config.get("frozen_stem", False)))
    if kind != "defectdet":
        raise ConfigError(f"model.backbone: unknown backbone {kind!r}; valid: defectdet, efficientnet_lite0")
    return Backbone(in_channels, tuple(config["widths"]), tuple(config["depths"]), config["kernel_size"])


def build_model(
    preset: str,
    num_classes: int,
    in_channels: int,
    template: bool,
    companions: Sequence[str] = (),
    **overrides: Any,
) -> Detector:
    """Builds a :class:`Detector` from a named preset; ``overrides`` replace preset keys.

    ``in_channels`` is ``c x (1 + template + len(companions))`` with ``c`` 1 (gray) or 3 (RGB): the tested
    image, its template when ``template``, then one plane of ``c`` channels per named companion capture."""
    if preset not in PRESETS:
        raise ConfigError(f"model.preset: unknown preset {preset!r}; valid presets: {', '.join(PRESETS)}")
    if num_classes < 1:
        raise ConfigError(f"model.num_classes: must be >= 1, got {num_classes}")
    companions = _checked_companions(companions)
    planes = 1 + int(bool(template)) + len(companions)
    valid_channels = (planes, 3 * planes)
    if in_channels not in valid_channels:
        with_companions = f", companions={companions}" if companions else ""
        raise ConfigError(
            f"model.in_channels: {in_channels} is invalid with template={template}{with_companions}; "
            f"use one of {valid_channels}"
        )
    unknown = set(overrides) - set(PRESETS[preset]) - {"loss"}
    if unknown:
        raise ConfigError(
            f"model overrides: unknown keys {sorted(unknown)}; valid: {sorted(PRESETS[preset])}"
        )
    unknown_loss = set(overrides.get("loss", {})) - set(LOSS_DEFAULTS)
    if unknown_loss:
        raise ConfigError(f"model.loss: unknown keys {sorted(unknown_loss)}; valid: {sorted(LOSS_DEFAULTS)}")
    config = {
        **copy.deepcopy(PRESETS[preset]),
        **overrides,
        "preset": preset,
        "num_classes": int(num_classes),
        "in_channels": int(in_channels),
        "template": bool(template),
        "companions": companions,
    }
    return Detector(config)


def _checked_companions(companions: Sequence[str]) -> list[str]:
    """The companion names as a list; ConfigError for a non-string, an empty name or a repeated one."""
    if isinstance(companions, str):
        raise ConfigError(f"model.companions: a list of names, got the string {companions!r}")
    names = list(companions)
    for name in names:
        if not isinstance(name, str) or not name:
            raise ConfigError(f"model.companions: every companion needs a name, got {name!r}")
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise ConfigError(f"model.companions: {repeated} named more than once")
    return names


def detector_from_config(config: dict[str, Any]) -> Detector:
    """Rebuilds a detector from ``Detector.config`` (as stored in a checkpoint)."""
    return Detector(config)

"""Detection loss: quality-aware BCE on soft (IoU-aligned) class targets + GIoU box loss weighted by
relative alignment (each box's best anchor at full weight, whatever its current IoU).

Everything is computed in float32, also under autocast.
"""

from __future__ import annotations

import torch
import torch.nn.functional as functional

from defectdet.model.assigner import EPSILON, TaskAlignedAssigner


def giou_loss(predicted: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """``1 - GIoU`` of matching xyxy boxes ``(N, 4)`` -> ``(N,)``."""
    width = (
        torch.minimum(predicted[:, 2], target[:, 2]) - torch.maximum(predicted[:, 0], target[:, 0])
    ).clamp(min=0)
    height = (
        torch.minimum(predicted[:, 3], target[:, 3]) - torch.maximum(predicted[:, 1], target[:, 1])
    ).clamp(min=0)
    intersection = width * height
    area_predicted = (predicted[:, 2] - predicted[:, 0]) * (predicted[:, 3] - predicted[:, 1])
    area_target = (target[:, 2] - target[:, 0]) * (target[:, 3] - target[:, 1])
    union = area_predicted + area_target - intersection + EPSILON
    iou = intersection / union
    hull_width = torch.maximum(predicted[:, 2], target[:, 2]) - torch.minimum(predicted[:, 0], target[:, 0])
    hull_height = torch.maximum(predicted[:, 3], target[:, 3]) - torch.minimum(predicted[:, 1], target[:, 1])
    hull = hull_width * hull_height + EPSILON
    return 1.0 - (iou - (hull - union) / hull)


def pad_targets(
    targets: list[torch.Tensor], device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """List of ``(N_i, 5)`` [class, x1, y1, x2, y2] -> labels (B, M), boxes (B, M, 4), valid (B, M)."""
    batch = len(targets)
    most = max((int(target.shape[0]) for target in targets), default=0)
    labels = torch.zeros(batch, most, dtype=torch.long, device=device)
    boxes = torch.zeros(batch, most, 4, dtype=torch.float32, device=device)
    valid = torch.zeros(batch, most, dtype=torch.bool, device=device)
    for index, target in enumerate(targets):
        count = int(target.shape[0])
        if count:
            target = target.to(device=device, dtype=torch.float32)
            labels[index, :count] = target[:, 0].long()
            boxes[index, :count] = target[:, 1:5]
            valid[index, :count] = True
    return labels, boxes, valid


class DetectionLoss:
    """Assigns anchors with :class:`TaskAlignedAssigner` and returns named losses.

    Both terms are normalized by the sum of soft class targets (at least 1), so a
    batch without any object still gives a finite, small classification loss.
    """

    def __init__(
        self,
        num_classes: int,
        class_weight: float = 1.0,
        box_weight: float = 2.5,
        assigner: TaskAlignedAssigner | None = None,
    ) -> None:
        self.num_classes = num_classes
        self.class_weight = class_weight
        self.box_weight = box_weight
        self.assigner = assigner or TaskAlignedAssigner()

    def __call__(
        self,
        logits: torch.Tensor,  # (B, A, K)
        boxes: torch.Tensor,  # (B, A, 4) decoded xyxy
        anchor_points: torch.Tensor,  # (A, 2)
        targets: list[torch.Tensor],
    ) -> dict[str, torch.Tensor]:
        with torch.autocast(device_type=logits.device.type, enabled=False):
            logits, boxes = logits.float(), boxes.float()
            gt_labels, gt_boxes, gt_valid = pad_targets(targets, logits.device)
            assignment = self.assigner(
                logits.detach().sigmoid(), boxes.detach(), anchor_points, gt_labels, gt_boxes, gt_valid
            )
            normalizer = assignment.scores.sum().clamp(min=1.0)
            loss_class = (
                functional.binary_cross_entropy_with_logits(logits, assignment.scores, reduction="sum")
                / normalizer
            )
            foreground = assignment.foreground
            if bool(foreground.any()):
                # weighted by alignment relative to the box's best anchor, not by the IoU-scaled class
                # target: a tiny defect starts at IoU ~0.03 with the initial boxes, and an IoU-scaled
                # weight would leave its regression (and so its class target) stuck near zero
                weight = assignment.alignment[foreground]  # (P,) in (0, 1]
                loss_box = (
                    giou_loss(boxes[foreground], assignment.boxes[foreground]) * weight
                ).sum() / normalizer
            else:
                loss_box = boxes.sum() * 0.0
            total = self.class_weight * loss_class + self.box_weight * loss_box
        return {
            "loss": total,
            "loss_cls": loss_class.detach(),
            "loss_box": loss_box.detach(),
            "num_foreground": foreground.sum().detach().float(),
        }

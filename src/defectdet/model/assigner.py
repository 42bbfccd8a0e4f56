"""Task-aligned assigner (TOOD / YOLOv8 style) for anchor-free points."""

from __future__ import annotations

from dataclasses import dataclass

import torch

EPSILON = 1e-9


def pairwise_box_iou(boxes_a: torch.Tensor, boxes_b: torch.Tensor) -> torch.Tensor:
    """IoU of aligned-batch xyxy boxes: ``(B, M, 4)`` x ``(B, A, 4)`` -> ``(B, M, A)``."""
    a = boxes_a.unsqueeze(2)  # (B, M, 1, 4)
    b = boxes_b.unsqueeze(1)  # (B, 1, A, 4)
    width = (torch.minimum(a[..., 2], b[..., 2]) - torch.maximum(a[..., 0], b[..., 0])).clamp(min=0)
    height = (torch.minimum(a[..., 3], b[..., 3]) - torch.maximum(a[..., 1], b[..., 1])).clamp(min=0)
    intersection = width * height
    area_a = (a[..., 2] - a[..., 0]).clamp(min=0) * (a[..., 3] - a[..., 1]).clamp(min=0)
    area_b = (b[..., 2] - b[..., 0]).clamp(min=0) * (b[..., 3] - b[..., 1]).clamp(min=0)
    return intersection / (area_a + area_b - intersection + EPSILON)


@dataclass
class Assignment:
    """Per-anchor training targets. ``foreground`` (B, A) bool; ``labels`` (B, A) int64;
    ``boxes`` (B, A, 4) xyxy; ``scores`` (B, A, K) soft class targets (0 on background);
    ``alignment`` (B, A) the anchor's alignment relative to its box's best anchor, in (0, 1]."""

    foreground: torch.Tensor
    labels: torch.Tensor
    boxes: torch.Tensor
    scores: torch.Tensor
    alignment: torch.Tensor


class TaskAlignedAssigner:
    """Picks, per ground truth, the ``top_k`` candidate anchors with the largest
    ``score**alpha * IoU**beta``; candidates are anchors whose centre lies inside the
    box, plus the nearest anchor so even a box smaller than a stride gets a positive.
    An anchor claimed by several boxes goes to the one it overlaps most.
    Soft targets are the alignment normalized per box to that box's best IoU.
    """

    def __init__(self, top_k: int = 10, alpha: float = 0.5, beta: float = 6.0) -> None:
        self.top_k = top_k
        self.alpha = alpha
        self.beta = beta

    @torch.no_grad()
    def __call__(
        self,
        pred_scores: torch.Tensor,  # (B, A, K) probabilities
        pred_boxes: torch.Tensor,  # (B, A, 4) xyxy
        anchor_points: torch.Tensor,  # (A, 2)
        gt_labels: torch.Tensor,  # (B, M) int64
        gt_boxes: torch.Tensor,  # (B, M, 4)
        gt_valid: torch.Tensor,  # (B, M) bool, False for padding
    ) -> Assignment:
        batch, anchors, classes = pred_scores.shape
        if gt_boxes.shape[1] == 0:
            return _empty_assignment(batch, anchors, classes, pred_scores.device)
        pred_scores, pred_boxes, gt_boxes = pred_scores.float(), pred_boxes.float(), gt_boxes.float()
        candidate = _candidates(anchor_points.float().view(1, 1, anchors, 2), gt_boxes, gt_valid)
        overlaps = pairwise_box_iou(gt_boxes, pred_boxes)  # (B, M, A)
        label_index = gt_labels.clamp(min=0).unsqueeze(1).expand(-1, anchors, -1)  # (B, A, M)
        class_scores = pred_scores.gather(2, label_index).transpose(1, 2)  # (B, M, A)
        alignment = class_scores.pow(self.alpha) * overlaps.pow(self.beta)
        alignment = torch.where(candidate, alignment + EPSILON, torch.full_like(alignment, -1.0))

        top_k = min(self.top_k, anchors)
        top_indices = alignment.topk(top_k, dim=2).indices  # (B, M, k)
        selected = torch.zeros_like(candidate)
        selected.scatter_(2, top_indices, True)
        positive = _one_owner_each(selected & candidate, overlaps, candidate)  # (B, M, A)

        foreground = positive.any(1)  # (B, A)
        assigned_gt = positive.float().argmax(1)  # (B, A)
        labels = gt_labels.gather(1, assigned_gt).clamp(min=0)  # (B, A)
        boxes = gt_boxes.gather(1, assigned_gt.unsqueeze(-1).expand(-1, -1, 4))  # (B, A, 4)
        scores, relative = _soft_targets(alignment, overlaps, positive, labels, classes)
        scores = scores * foreground.unsqueeze(-1)
        return Assignment(
            foreground=foreground, labels=labels, boxes=boxes, scores=scores, alignment=relative.amax(1)
        )


def _empty_assignment(batch: int, anchors: int, classes: int, device: torch.device) -> Assignment:
    """All background: the targets of a batch without a ground-truth box."""
    return Assignment(
        foreground=torch.zeros(batch, anchors, dtype=torch.bool, device=device),
        labels=torch.zeros(batch, anchors, dtype=torch.long, device=device),
        boxes=torch.zeros(batch, anchors, 4, device=device),
        scores=torch.zeros(batch, anchors, classes, device=device),
        alignment=torch.zeros(batch, anchors, device=device),
    )


def _candidates(points: torch.Tensor, gt_boxes: torch.Tensor, gt_valid: torch.Tensor) -> torch.Tensor:
    """``(B, M, A)`` the candidate anchors of each valid box: centre inside the box, or the single nearest
    anchor. `points` ``(1, 1, A, 2)``."""
    inside = (
        (points[..., 0] > gt_boxes[..., 0:1])
        & (points[..., 0] < gt_boxes[..., 2:3])
        & (points[..., 1] > gt_boxes[..., 1:2])
        & (points[..., 1] < gt_boxes[..., 3:4])
    )  # (B, M, A)
    centres = (gt_boxes[..., :2] + gt_boxes[..., 2:]) / 2  # (B, M, 2)
    distance = (points - centres.unsqueeze(2)).square().sum(-1)  # (B, M, A)
    nearest = torch.zeros_like(inside)
    nearest.scatter_(2, distance.argmin(2, keepdim=True), True)
    return (inside | nearest) & gt_valid.unsqueeze(2)


def _one_owner_each(positive: torch.Tensor, overlaps: torch.Tensor, candidate: torch.Tensor) -> torch.Tensor:
    """`positive` ``(B, M, A)`` with each anchor claimed by several boxes left to the one it overlaps most."""
    claims = positive.sum(1)  # (B, A)
    if bool((claims > 1).any()):
        best_gt = overlaps.masked_fill(~candidate, -1.0).argmax(1)  # (B, A)
        owner = torch.zeros_like(positive)
        owner.scatter_(1, best_gt.unsqueeze(1), True)
        positive = torch.where((claims > 1).unsqueeze(1), positive & owner, positive)
    return positive


def _soft_targets(
    alignment: torch.Tensor,
    overlaps: torch.Tensor,
    positive: torch.Tensor,
    labels: torch.Tensor,
    classes: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The soft class targets ``(B, A, K)`` (alignment / the box's best alignment x the box's best IoU, at
    each anchor's label; background not yet zeroed) and the relative alignment ``(B, M, A)``."""
    alignment = alignment.clamp(min=0) * positive
    max_alignment = alignment.amax(2, keepdim=True)  # (B, M, 1)
    max_overlap = (overlaps * positive).amax(2, keepdim=True)  # (B, M, 1)
    relative = alignment / (max_alignment + EPSILON)  # (B, M, A), 1 at each box's best anchor
    normalized = (relative * max_overlap).amax(1)  # (B, A)
    scores = torch.zeros(*labels.shape, classes, device=labels.device)
    scores.scatter_(2, labels.unsqueeze(-1), normalized.unsqueeze(-1))
    return scores, relative

"""Task-aligned assigner and loss on hand-made cases."""

from __future__ import annotations

import torch

from defectdet.model.assigner import TaskAlignedAssigner, pairwise_box_iou
from defectdet.model.head import make_anchor_points
from defectdet.model.loss import DetectionLoss, giou_loss


def _grid(size: int = 64, strides: tuple[int, ...] = (8, 16)) -> torch.Tensor:
    features = [torch.zeros(1, 1, size // stride, size // stride) for stride in strides]
    points, _ = make_anchor_points(features, strides)
    return points  # (A, 2)


def test_anchor_points_are_cell_centres() -> None:
    points = _grid(32, (8, 16))
    assert points.shape == (16 + 4, 2)
    torch.testing.assert_close(points[0], torch.tensor([4.0, 4.0]))
    torch.testing.assert_close(points[1], torch.tensor([12.0, 4.0]))  # row-major: x first
    torch.testing.assert_close(points[16], torch.tensor([8.0, 8.0]))


def test_every_gt_gets_a_positive_including_tiny_and_overlapping() -> None:
    points = _grid()
    anchors = points.shape[0]
    gt_boxes = torch.tensor(
        [[[2.0, 2.0, 30.0, 30.0], [10.0, 10.0, 40.0, 40.0], [50.0, 50.0, 53.0, 53.0]]]
    )  # the third box is smaller than a stride and contains no anchor centre
    gt_labels = torch.tensor([[0, 1, 2]])
    valid = torch.ones(1, 3, dtype=torch.bool)
    scores = torch.full((1, anchors, 3), 0.1)
    # predictions: a 16x16 box around every anchor
    boxes = torch.cat([points - 8, points + 8], -1).unsqueeze(0)
    assignment = TaskAlignedAssigner(top_k=4)(scores, boxes, points, gt_labels, gt_boxes, valid)
    assert assignment.foreground.sum() >= 3
    for index in range(3):
        owned = assignment.foreground[0] & (assignment.boxes[0] == gt_boxes[0, index]).all(-1)
        assert owned.any(), f"gt {index} has no positive"
        assert (assignment.labels[0][owned] == gt_labels[0, index]).all()
    # soft targets live only on the assigned class of foreground anchors, in [0, 1]
    assert (assignment.scores[0][~assignment.foreground[0]] == 0).all()
    assert assignment.scores.max() <= 1.0 and assignment.scores.max() > 0
    # padding gts are ignored
    padded = TaskAlignedAssigner(top_k=4)(
        scores, boxes, points, gt_labels, gt_boxes, torch.tensor([[True, True, False]])
    )
    assert not (padded.boxes[0][padded.foreground[0]] == gt_boxes[0, 2]).all(-1).any()


def test_assigner_prefers_well_aligned_anchors() -> None:
    points = _grid()
    anchors = points.shape[0]
    gt_boxes = torch.tensor([[[0.0, 0.0, 32.0, 32.0]]])
    boxes = torch.cat([points - 2, points + 2], -1).unsqueeze(0)  # poor boxes everywhere
    good = 5  # anchor at (44, 4)... choose the one at (12, 12): row 1, col 1 of the 8x8 grid
    good = 1 * 8 + 1
    boxes[0, good] = torch.tensor([0.0, 0.0, 32.0, 32.0])
    scores = torch.full((1, anchors, 1), 0.5)
    assignment = TaskAlignedAssigner(top_k=1)(
        scores, boxes, points, torch.tensor([[0]]), gt_boxes, torch.ones(1, 1, dtype=torch.bool)
    )
    assert assignment.foreground[0].nonzero().flatten().tolist() == [good]
    assert float(assignment.scores[0, good, 0]) > 0.99  # its IoU is 1


def test_pairwise_iou_and_giou() -> None:
    a = torch.tensor([[[0.0, 0.0, 10.0, 10.0]]])
    b = torch.tensor([[[0.0, 0.0, 10.0, 10.0], [5.0, 0.0, 15.0, 10.0], [20.0, 20.0, 30.0, 30.0]]])
    torch.testing.assert_close(
        pairwise_box_iou(a, b)[0, 0], torch.tensor([1.0, 1 / 3, 0.0]), atol=1e-6, rtol=0
    )
    loss = giou_loss(a[0].expand(3, 4), b[0])
    assert float(loss[0]) < 1e-6 and 0 < float(loss[1]) < 1 and float(loss[2]) > 1


def test_loss_is_float32_under_autocast_and_zero_targets_finite() -> None:
    points = _grid()
    anchors = points.shape[0]
    logits = torch.randn(2, anchors, 3, requires_grad=True)
    boxes = torch.cat([points - 8, points + 8], -1).unsqueeze(0).repeat(2, 1, 1).requires_grad_()
    criterion = DetectionLoss(3)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        losses = criterion(
            logits.bfloat16(), boxes.bfloat16(), points, [torch.zeros(0, 5), torch.zeros(0, 5)]
        )
    assert losses["loss"].dtype == torch.float32 and torch.isfinite(losses["loss"])
    losses["loss"].backward()
    target = [torch.tensor([[2.0, 8.0, 8.0, 40.0, 40.0]]), torch.zeros(0, 5)]
    losses = criterion(logits, boxes, points, target)
    assert torch.isfinite(losses["loss"]) and float(losses["loss_box"]) > 0
    assert float(losses["num_foreground"]) >= 1


def test_tiny_box_regression_is_trained_at_full_weight_while_its_class_target_stays_iou_scaled() -> None:
    points = _grid()
    anchors = points.shape[0]
    gt_boxes = torch.tensor([[[50.0, 50.0, 54.0, 54.0]]])  # 4 px: IoU ~0.06 with the 16 px predictions
    boxes = torch.cat([points - 8, points + 8], -1).unsqueeze(0).requires_grad_(True)
    logits = torch.full((1, anchors, 1), -2.0, requires_grad=True)
    assignment = TaskAlignedAssigner(top_k=3)(
        logits.detach().sigmoid(),
        boxes.detach(),
        points,
        torch.tensor([[0]]),
        gt_boxes,
        torch.ones(1, 1, dtype=torch.bool),
    )
    foreground = assignment.foreground[0]
    assert float(assignment.alignment[0][foreground].max()) > 0.9  # the best anchor: about full weight
    assert float(assignment.scores[0][foreground].max()) < 0.1  # the class target: its (poor) IoU
    losses = DetectionLoss(1)(logits, boxes, points, [torch.tensor([[0.0, 50.0, 50.0, 54.0, 54.0]])])
    losses["loss"].backward()
    # the box term is not scaled down by the poor IoU (weighted by the IoU-scaled target it was ~0.05)
    assert float(losses["loss_box"]) > 0.5
    assert boxes.grad[0][foreground].abs().sum() > 0

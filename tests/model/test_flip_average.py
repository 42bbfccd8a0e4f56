"""Flip averaging: mirrored cells line up, boxes come back in the plain image's pixels."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from defectdet.model import build_model
from defectdet.model.flip_average import (
    FLIP_VIEWS,
    FlipAveraged,
    mirrored_anchor_order,
    unflip_boxes,
    untrained_flips,
)
from defectdet.model.head import make_anchor_points


class EquivariantDetector(nn.Module):
    """A stand-in whose output mirrors exactly with its input: each cell's score is the mean of the image
    over the cell, its box is centred on the cell and as wide as the score says, skewed by the score of the
    cells beside it so that a box mirrored the wrong way round is caught."""

    strides = (8, 16)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        scores, boxes = [], []
        for stride in self.strides:
            cells = F.avg_pool2d(images[:, :1], stride)  # (B, 1, h, w)
            right = torch.cat([cells[..., 1:], cells[..., :1] * 0], -1)
            left = torch.cat([cells[..., :1] * 0, cells[..., :-1]], -1)
            below = torch.cat([cells[..., 1:, :], cells[..., :1, :] * 0], -2)
            above = torch.cat([cells[..., :1, :] * 0, cells[..., :-1, :]], -2)
            scores.append(cells.flatten(2).transpose(1, 2))
            extent = torch.stack(
                [1 + 3 * right, 1 + 2 * below, 1 + 3 * left, 1 + 2 * above], -1
            )  # l, t, r, b
            boxes.append(extent.flatten(1, 3))
        points, _ = make_anchor_points(
            [torch.zeros(1, 1, images.shape[2] // s, images.shape[3] // s) for s in self.strides],
            self.strides,
        )
        distances = torch.cat(boxes, 1)
        return torch.cat([points - distances[..., :2], points + distances[..., 2:], torch.cat(scores, 1)], -1)


@pytest.mark.parametrize("views", ["lr", "lr+ud"])
def test_mirrored_cells_line_up_exactly(views: str) -> None:
    torch.manual_seed(0)
    images = torch.rand(2, 1, 64, 96)
    detector = EquivariantDetector()
    plain = detector(images)
    assert torch.allclose(FlipAveraged(detector, views)(images), plain, atol=1e-5)
    # and without the reordering the flipped pass does not match: the test can fail
    for dims in FLIP_VIEWS[views]:
        flipped = detector(images.flip(dims))
        assert not torch.allclose(unflip_boxes(flipped[..., :4], 64, 96, dims), plain[..., :4], atol=1e-3)


def test_anchor_order_is_a_permutation_and_its_own_inverse() -> None:
    for dims in FLIP_VIEWS["lr+ud"]:
        order = mirrored_anchor_order(64, 96, (8, 16, 32), dims)
        assert sorted(order.tolist()) == list(range(len(order)))
        assert torch.equal(order[order], torch.arange(len(order)))


def test_the_real_detector_keeps_its_output_shape_and_box_range() -> None:
    torch.manual_seed(0)
    model = build_model("nano", num_classes=3, in_channels=1, template=False).eval()
    images = torch.rand(1, 1, 128, 96)
    with torch.inference_mode():
        plain, averaged = model(images), FlipAveraged(model)(images)
    assert averaged.shape == plain.shape
    assert torch.all((averaged[..., 4:] >= 0) & (averaged[..., 4:] <= 1))
    # the average of a box and its mirrored-back twin stays near the plain box's cell
    centres = (averaged[..., :2] + averaged[..., 2:4]) / 2
    plain_centres = (plain[..., :2] + plain[..., 2:4]) / 2
    assert (centres - plain_centres).abs().median() < 16


def test_unknown_views_are_refused() -> None:
    with pytest.raises(ValueError, match="flip views must be one of"):
        FlipAveraged(EquivariantDetector(), "diagonal")


def test_flips_the_training_never_made_are_named() -> None:
    no_vertical = {"augment": {"horizontal_flip": 0.5, "vertical_flip": 0.0}}
    assert untrained_flips("lr+ud", no_vertical) == ["vertical_flip"]
    assert untrained_flips("lr", no_vertical) == []
    assert untrained_flips("lr+ud", {"augment": {"horizontal_flip": 0, "vertical_flip": 0}}) == [
        "horizontal_flip",
        "vertical_flip",
    ]
    assert untrained_flips("lr+ud", {}) == []  # the defaults flip both ways

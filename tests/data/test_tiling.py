"""Tiled inference: where tiles go, which tile detections are kept, and a small defect that only tiles find."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from defectdet.data.sample import Sample
from defectdet.data.tiling import (
    KEEP_BELOW_PX,
    MAX_TILES_PER_SIDE,
    TILE_OVERLAP,
    Tile,
    keep_tile_boxes,
    merge_tile_detections,
    plan_tiles,
    tile_canvases,
)
from defectdet.engine.predict import predict_records
from defectdet.runtime.spec import ModelSpec


@given(
    width=st.integers(16, 6000),
    height=st.integers(16, 6000),
    size=st.sampled_from([128, 352, 640]),
)
@settings(max_examples=150, deadline=None)
def test_tiles_cover_the_image_overlap_and_stay_bounded(width: int, height: int, size: int) -> None:
    plan = plan_tiles(width, height, size)
    if max(width, height) <= 1.5 * size:
        assert len(plan) == 0
        return
    assert 0 < plan.scale <= 1.0 and plan.whole_scale < plan.scale
    xs = sorted({tile.x0 for tile in plan.tiles})
    ys = sorted({tile.y0 for tile in plan.tiles})
    assert len(xs) <= MAX_TILES_PER_SIDE and len(ys) <= MAX_TILES_PER_SIDE
    covered = np.zeros((plan.resized_height, plan.resized_width), bool)
    for tile in plan.tiles:
        assert 0 < tile.width <= size and 0 < tile.height <= size
        covered[tile.y0 : tile.y0 + tile.height, tile.x0 : tile.x0 + tile.width] = True
    assert covered.all()
    for starts in (xs, ys):  # neighbours overlap by at least TILE_OVERLAP of a tile
        assert all(b - a <= size * (1 - TILE_OVERLAP) + 1 for a, b in zip(starts, starts[1:], strict=False))


def test_a_moderately_large_image_is_tiled_at_native_resolution_a_huge_one_shrunk() -> None:
    assert plan_tiles(1000, 700, 352).scale == 1.0
    huge = plan_tiles(4000, 3000, 640)
    assert huge.scale == pytest.approx((640 + 3 * 480) / 4000, rel=1e-6)
    assert len(huge) == MAX_TILES_PER_SIDE * 3  # 4:3 image: 4 across, 3 down


def test_tile_canvases_cut_image_and_template_alike_without_resizing() -> None:
    image = np.arange(800 * 500, dtype=np.uint32).reshape(500, 800) % 251
    image = image.astype(np.uint8)
    plan = plan_tiles(800, 500, 256)
    assert plan.scale == 1.0
    pairs = tile_canvases(image, image.copy(), plan, 256, pad_value=7)
    assert len(pairs) == len(plan)
    for (canvas, template_canvas), tile in zip(pairs, plan.tiles, strict=True):
        assert canvas.shape == (256, 256)
        np.testing.assert_array_equal(canvas, template_canvas)
        np.testing.assert_array_equal(
            canvas[: tile.height, : tile.width],
            image[tile.y0 : tile.y0 + tile.height, tile.x0 : tile.x0 + tile.width],
        )
        assert (canvas[tile.height :] == 7).all() and (canvas[:, tile.width :] == 7).all()


def test_only_small_uncut_tile_detections_are_kept() -> None:
    tile = Tile(x0=100, y0=0, width=256, height=256, scale=1.0, inner_edges=(True, False, True, False))
    whole_scale = 0.25  # a tile box under KEEP_BELOW_PX / 0.25 = 32 px is the tile pass's
    boxes = np.array(
        [
            [50, 50, 60, 60],  # small, inside: kept
            [50, 50, 50 + 4 * KEEP_BELOW_PX, 60],  # too long for the tile pass: the whole image has it
            [0, 80, 10, 90],  # touches the left edge shared with a neighbour: cut
            [100, 0, 110, 10],  # touches the top edge of the image (not shared): kept
            [246, 120, 256, 130],  # touches the right edge shared with a neighbour: cut
        ],
        np.float32,
    )
    assert keep_tile_boxes(boxes, tile, whole_scale).tolist() == [True, False, False, True, False]


def test_merge_joins_duplicates_from_overlapping_tiles_and_keeps_the_whole_image_boxes() -> None:
    left = Tile(0, 0, 256, 256, 1.0, (False, False, True, False))
    right = Tile(192, 0, 256, 256, 1.0, (True, False, False, False))
    dot_left = np.array([[200, 100, 210, 110]], np.float32)  # the same dot seen by both tiles
    dot_right = np.array([[8, 100, 18, 110]], np.float32)
    whole = (np.array([[10, 10, 300, 200]], np.float32), np.array([0.9], np.float32), np.array([1]))
    boxes, scores, classes = merge_tile_detections(
        whole,
        [
            (left, dot_left, np.array([0.8], np.float32), np.array([0])),
            (right, dot_right, np.array([0.7], np.float32), np.array([0])),
        ],
        whole_scale=0.25,
        nms_iou=0.5,
        max_detections=10,
    )
    assert scores.tolist() == pytest.approx([0.9, 0.8]) and classes.tolist() == [1, 0]
    np.testing.assert_allclose(boxes[1], [200, 100, 210, 110])


class DarkSpotModel(torch.nn.Module):
    """A stand-in detector: one box around the input's pixels darker than 0.2, score 0.9, class 0."""

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        batch, _, height, width = images.shape
        out = torch.zeros(batch, 1, 5)
        for index, image in enumerate(images[:, 0]):
            ys, xs = torch.nonzero(image < 0.2, as_tuple=True)
            if len(xs):
                out[index, 0] = torch.tensor(
                    [xs.min(), ys.min(), xs.max() + 1, ys.max() + 1, 0.9], dtype=torch.float32
                )
        return out


def test_a_pin_hole_lost_by_the_letterbox_is_found_by_tiles(tmp_path) -> None:
    import cv2

    image = np.full((1500, 2000), 230, np.uint8)
    image[700:706, 1203:1209] = 0  # a 6 px pin-hole: about 1 px at the 352 letterbox, washed out
    path = tmp_path / "plate.png"
    cv2.imwrite(str(path), image)
    sample = Sample(
        image_path=path,
        boxes=np.array([[1203, 700, 1209, 706]], np.float32),
        classes=np.array([0]),
        image_id="plate",
    )
    found = {}
    for tiles in (False, True):
        spec = ModelSpec(input_size=352, channels=1, template=False, tiles=tiles)
        records, skipped = predict_records(DarkSpotModel(), [sample], spec)
        assert not skipped
        found[tiles] = records[0]
    assert len(found[False].det_boxes) == 0
    boxes = found[True].det_boxes
    assert len(boxes) == 1
    np.testing.assert_allclose(boxes[0], [1203, 700, 1209, 706], atol=2.0)


def test_a_tile_box_reaching_into_the_padding_ends_at_the_image_border() -> None:
    edge = Tile(x0=900, y0=0, width=100, height=256, scale=0.5, inner_edges=(True, False, False, False))
    boxes, scores, _ = merge_tile_detections(
        (np.zeros((0, 4), np.float32), np.zeros(0, np.float32), np.zeros(0, np.int64)),
        [(edge, np.array([[95, 10, 104, 19]], np.float32), np.array([0.5], np.float32), np.array([2]))],
        whole_scale=0.1,
        nms_iou=0.5,
        max_detections=10,
    )
    # tile x 95..100 (the tile ends at 100) -> resized 995..1000 -> original 1990..2000: the image's right edge
    np.testing.assert_allclose(boxes, [[1990, 20, 2000, 38]])
    assert scores.tolist() == pytest.approx([0.5])

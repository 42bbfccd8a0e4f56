"""bench/good_only.py: how each protocol splits its images into fit, defective and good ones; skips without data."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest

from bench import good_only

ROOT = Path(__file__).resolve().parents[1]
AGDD = ROOT.parent / "shared" / "datasets" / "agdd"


def test_tile_split_keeps_clear_tiles_good_and_whole_boxes_defective() -> None:
    boxes = np.array([[10, 10, 30, 30], [150, 10, 170, 30], [5, 110, 20, 125]], np.float32)
    good, defective = good_only.tile_split(boxes, 200, 200, 100, margin=8)
    # each box lies wholly inside one tile; (100, 100) has nothing within 8 px
    assert good == [(100, 100)]
    found = dict(defective)
    assert list(found) == [(0, 0), (100, 0), (0, 100)]
    np.testing.assert_allclose(found[(0, 0)], [[10, 10, 30, 30]])
    np.testing.assert_allclose(found[(100, 0)], [[50, 10, 70, 30]])  # shifted into the tile
    np.testing.assert_allclose(found[(0, 100)], [[5, 10, 20, 25]])


def test_tile_split_drops_slivers_and_near_misses() -> None:
    sliver = np.array([[90, 10, 190, 30]], np.float32)  # 10 % in tile (0, 0), 90 % in tile (100, 0)
    good, defective = good_only.tile_split(sliver, 200, 100, 100, margin=8)
    assert good == [] and [corner for corner, _ in defective] == [(100, 0)]
    np.testing.assert_allclose(defective[0][1], [[0, 10, 90, 30]])
    near = np.array([[104, 10, 120, 30]], np.float32)  # 4 px right of tile (0, 0): neither good nor defective
    good, defective = good_only.tile_split(near, 200, 100, 100, margin=8)
    assert good == [] and [corner for corner, _ in defective] == [(100, 0)]


def _tiny_coco(root: Path) -> None:
    """Two splits of one 64 x 64 sample each, two lightings; one box in the top-left tile of each."""
    (root / "images").mkdir(parents=True)
    for split, sample in (("train", "1335000"), ("val", "1412000")):
        images, annotations = [], []
        for number, lighting in enumerate(("L1", "L2"), 1):
            name = f"{sample}_{lighting}.png"
            cv2.imwrite(str(root / "images" / name), np.full((64, 64, 3), 100 * number, np.uint8))
            images.append({"id": number, "file_name": name, "width": 64, "height": 64, "group": sample[:4]})
            annotations.append({"id": number, "image_id": number, "bbox": [2, 2, 10, 10], "category_id": 1})
        doc = {"images": images, "annotations": annotations, "categories": [{"id": 1, "name": "spot"}]}
        (root / f"{split}.json").write_text(json.dumps(doc), encoding="utf-8")


def test_agdd_fits_on_clear_training_tiles_and_scores_val_tiles_of_one_lighting(tmp_path: Path) -> None:
    _tiny_coco(tmp_path / "agdd")
    data = good_only.agdd_images(tmp_path / "agdd", "L2", 32, tmp_path / "tiles")
    assert len(data["fit"]) == 3 and all("train" in path.parts for path in data["fit"])
    assert len(data["good"]) == 3 and all("val" in path.parts for path in data["good"])
    assert [path.name for path, _ in data["defective"]] == ["1412000_L2_0_0.png"]
    np.testing.assert_allclose(data["defective"][0][1], [[2, 2, 12, 12]])
    assert all("_L2_" in path.name for path in data["fit"] + data["good"])
    assert cv2.imread(str(data["fit"][0]))[0, 0, 0] == 200  # the L2 image's pixels, cut at full resolution
    assert data["groups"] == {"fit": ["1335"], "held_out": ["1412"]}


def test_surfaces_fit_on_defect_free_renders_and_score_the_rest(tmp_path: Path) -> None:
    fit, scored = good_only.surface_split(10)
    assert list(fit) == list(range(7)) and list(scored) == [7, 8, 9]
    data = good_only.surface_images(3, 10, 64, "cast", tmp_path)
    assert [path.name for path in data["fit"]] == [f"clean_{index:04d}.png" for index in range(7)]
    assert [path.name for path in data["good"]] == [f"clean_{index:04d}.png" for index in (7, 8, 9)]
    assert all(len(boxes) and path.name.startswith("defective_") for path, boxes in data["defective"])
    assert cv2.imread(str(data["fit"][0]), cv2.IMREAD_UNCHANGED).shape == (64, 64)
    again = good_only.surface_images(3, 10, 64, "cast", tmp_path / "again")  # a fixed seed: the same images
    assert (cv2.imread(str(again["fit"][4])) == cv2.imread(str(data["fit"][4]))).all()


@pytest.mark.parametrize("dataset", ["deeppcb", "agdd"])
def test_a_missing_shared_folder_is_skipped(
    dataset: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(good_only, "write_result", lambda *a: pytest.fail("nothing is written"))
    argv = ["good_only.py", "--dataset", dataset, "--shared", str(tmp_path / "absent"), "--allow-dirty"]
    monkeypatch.setattr(sys, "argv", argv)
    assert good_only.main() == 0
    assert "skipped" in capsys.readouterr().out


@pytest.mark.skipif(not (AGDD / "train.json").is_file(), reason="needs ../shared/datasets/agdd")
def test_agdd_good_training_tiles_are_clear_of_every_box() -> None:
    for name, boxes, width, height, _ in good_only._coco_boxes(AGDD / "train.json", "L1")[:40]:
        good, _ = good_only.tile_split(boxes, width, height, 160)
        for x0, y0 in good:
            clear = (
                (boxes[:, 2] <= x0 - good_only.TILE_MARGIN)
                | (boxes[:, 0] >= x0 + 160 + good_only.TILE_MARGIN)
                | (boxes[:, 3] <= y0 - good_only.TILE_MARGIN)
                | (boxes[:, 1] >= y0 + 160 + good_only.TILE_MARGIN)
            )
            assert clear.all(), name

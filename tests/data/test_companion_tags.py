"""Companion captures found by their capture tag: both lightings in one folder (`part_L1.png`, `part_L2.png`) train
the way `predict --companion` reads them, and a capture is never trained on as an image of its own."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import torch

from defectdet.data.check import check_dataset
from defectdet.data.formats import load_dataset
from defectdet.runtime.predict import companion_files
from defectdet.trainingdata.dataset import DetectionDataset, ItemLayout


def _one_folder(root: Path, parts: int = 3) -> Path:
    """`images/train/part<i>_L1.png` beside `part<i>_L2.png` (each labelled, as a labelling tool may leave them),
    plus one L1 image without its L2; data.yaml names the image folder as the L2 companion folder."""
    for index in range(parts + 1):
        for tag, level in (("L1", 90), ("L2", 170)):
            if index == parts and tag == "L2":
                continue
            image = np.full((40, 48), level + index, np.uint8)
            path = root / "images" / "train" / f"part{index}_{tag}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            assert cv2.imwrite(str(path), image)
            label = root / "labels" / "train" / f"part{index}_{tag}.txt"
            label.parent.mkdir(parents=True, exist_ok=True)
            label.write_text("0 0.5 0.5 0.25 0.25\n")
    yaml_path = root / "data.yaml"
    yaml_path.write_text("path: .\ntrain: images/train\nnames: [scratch]\ncompanions:\n  L2: images/train\n")
    return yaml_path


def test_one_folder_pairs_by_tag_like_predict_and_trains_no_capture_alone(tmp_path: Path) -> None:
    yaml_path = _one_folder(tmp_path)
    split = load_dataset(yaml_path, "train")
    assert [s.image_path.name for s in split.samples] == [f"part{i}_L1.png" for i in range(4)]
    folder = tmp_path / "images" / "train"
    for sample in split.samples[:3]:
        assert sample.companion_paths == companion_files(sample.image_path, {"L2": folder})  # one rule
        assert sample.companion_paths["L2"].name == sample.image_path.name.replace("_L1", "_L2")
    messages = [problem.message for problem in split.problems]
    assert sum("3 listed image(s) are another image's companion capture" in m for m in messages) == 1
    assert sum("companion 'L2' not found" in m for m in messages) == 1  # part3_L1 only, no capture warned
    assert "1 of 4 images have no companion 'L2'" in " ".join(messages)
    report = check_dataset(yaml_path)
    assert report.splits[0].images == 4 and report.splits[0].companions_found == {"L2": 3}
    dataset = DetectionDataset(split, ItemLayout(input_size=64, dtype=torch.uint8, companions=["L2"]))
    assert len(dataset) == 3 and dataset.left_out == [str(split.samples[3].image_path)]
    tensor, _, _ = dataset[0]
    assert tensor.shape == (2, 64, 64) and int(tensor[1].max()) > int(tensor[0].max())  # L2 is the brighter


def test_separate_folder_with_tagged_names(tmp_path: Path) -> None:
    yaml_path = _one_folder(tmp_path)
    captures = tmp_path / "captures"
    captures.mkdir()
    for path in sorted((tmp_path / "images" / "train").glob("*_L2.png")):
        path.rename(captures / path.name)
        (tmp_path / "labels" / "train" / f"{path.stem}.txt").unlink()
    yaml_path.write_text(yaml_path.read_text().replace("L2: images/train", "L2: captures"))
    split = load_dataset(yaml_path, "train")
    found = [s.companion_paths.get("L2") for s in split.samples]
    assert found == [captures / f"part{i}_L2.png" for i in range(3)] + [None]
    assert not any("companion capture; they are read" in p.message for p in split.problems)


def test_coco_capture_listed_as_an_image_is_read_with_its_image_only(tmp_path: Path) -> None:
    import json

    from defectdet.data.formats.coco import read_coco

    _one_folder(tmp_path)
    records = [
        {"id": 2 * i + j + 1, "file_name": f"images/train/part{i}_{tag}.png", "width": 48, "height": 40}
        for i in range(2)
        for j, tag in enumerate(("L1", "L2"))
    ]
    for record in records[::2]:
        record["companions"] = {"L2": record["file_name"].replace("_L1", "_L2")}
    document = {"images": records, "annotations": [], "categories": [{"id": 1, "name": "scratch"}]}
    (tmp_path / "train.json").write_text(json.dumps(document))
    split = read_coco(tmp_path / "train.json")
    assert [s.image_path.name for s in split.samples] == ["part0_L1.png", "part1_L1.png"]
    assert sum("2 listed image(s) are another image's companion" in p.message for p in split.problems) == 1

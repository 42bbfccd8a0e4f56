"""Round trips through the labelling tools: what goes out comes back with the same boxes, classes, splits,
templates and companion captures (Label Studio tasks from a reviewed keep folder; COCO/CVAT from a dataset with
templates and companions)."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import cv2
import numpy as np
import yaml
from typer.testing import CliRunner

from defectdet.cli import app
from defectdet.data.formats import load_dataset

runner = CliRunner()
MODEL_CLASSES = [
    "open",
    "short",
    "spur",
    "pin-hole",
]  # the model's full list: only two are ever labelled here


def _board(path: Path, value: int, size: tuple[int, int] = (80, 60)) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    image = np.full(size[::-1], 60, np.uint8)
    cv2.rectangle(image, (value % 50, 5), (value % 50 + 20, 30), 200, -1)
    image[0, 0] = value
    assert cv2.imwrite(str(path), image)
    return path


def _keep_folder(root: Path) -> dict[str, list]:
    """A served keep folder after review: 8 images with templates, companion captures L2 and model predictions
    (class 'spur' only); 6 reviewed with the operator's boxes, one skipped, one not reviewed. Returns the reviewed
    boxes by name."""
    from defectdet.serve.review import ReviewFolder

    reviewed = {}
    for index in range(8):
        name = f"20261206T10{index:02d}00Z-1-{index:08x}.png"
        _board(root / "images" / name, 10 + index)
        _board(root / "templates" / name, 100 + index)
        _board(root / "companions" / "L2" / name, 200 + index)
        sidecar = {
            "image": f"images/{name}", "class_names": MODEL_CLASSES, "threshold": 0.5, "image_size": [80, 60],
            "companions": {"L2": f"companions/L2/{name}"},
            "detections": [{"class_id": 2, "class_name": "spur", "score": 0.8, "box": [40.0, 30.0, 55.0, 50.0]}],
        }  # fmt: skip
        (root / "predictions").mkdir(exist_ok=True)
        (root / "predictions" / f"{Path(name).stem}.json").write_text(json.dumps(sidecar))
    folder = ReviewFolder(root, operator="olga")
    for index, image in enumerate(folder.images()):
        if index == 6:
            folder.decide(image.name, "skip")
        elif index < 6:
            boxes = [{"class_id": index % 2, "box": [2.0 + index, 3.0, 20.5 + index, 17.25]}]
            folder.decide(image.name, "accept" if index else "clean", boxes if index else None)
            reviewed[image.name] = [] if index == 0 else [(index % 2, boxes[0]["box"])]
    return reviewed


def test_labelstudio_round_trip_keeps_reviewed_labels_classes_splits_and_templates(tmp_path: Path) -> None:
    kept = tmp_path / "kept"
    reviewed = _keep_folder(kept)
    tasks = tmp_path / "ls" / "tasks.json"
    result = runner.invoke(app, ["labels", "export-labelstudio", str(kept), str(tasks)])
    assert result.exit_code == 0, result.output
    assert "8 task(s), 6 with reviewed labels, 2 with pre-annotations" in result.output
    config = tasks.with_name("tasks_config.xml")
    assert "spur" in config.read_text() and "pin-hole" in config.read_text()  # the full list, in order
    assert '<Image name="companion_L2" value="$companion_L2"' in config.read_text()  # shown beside the image
    assert stat.S_IMODE(tasks.stat().st_mode) == 0o644 and stat.S_IMODE(config.stat().st_mode) == 0o644
    document = json.loads(tasks.read_text())
    by_name = {Path(task["data"]["defectdet_image"]).name: task for task in document}
    for name, task in by_name.items():
        assert task["data"]["template"] == f"/data/local-files/?d=templates/{name}"
        assert task["data"]["companion_L2"] == f"/data/local-files/?d=companions/L2/{name}"
        assert ("annotations" in task) == (name in reviewed) and ("predictions" in task) != (name in reviewed)
    from defectdet.serve.review import ReviewFolder

    coco = json.loads(Path(ReviewFolder(kept).export_coco(tmp_path / "coco.json")["path"]).read_text())
    assert len(coco["images"]) == 6 and [image["companions"] for image in coco["images"]] == [
        {"L2": image["file_name"].replace("kept/images/", "kept/companions/L2/")} for image in coco["images"]
    ]
    exported = [
        {"id": number, **task} for number, task in enumerate(document, start=1)
    ]  # Label Studio adds ids
    tasks.write_text(json.dumps(exported))

    out = tmp_path / "dataset"
    result = runner.invoke(app, ["labels", "import-labelstudio", str(tasks), str(out), "--label-config",
                                 str(config), "--images", str(kept), "--val-fraction", "0.3"])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert yaml.safe_load((out / "data.yaml").read_text())["names"] == MODEL_CLASSES
    train, val = load_dataset(out / "data.yaml", "train"), load_dataset(out / "data.yaml", "val")
    assert train.problems == [] and val.problems == []
    names = [[s.image_path.name for s in split.samples] for split in (train, val)]
    assert (
        names[0] and names[1] and sorted(names[0] + names[1]) == sorted(reviewed)
    )  # skipped, unreviewed out
    for sample in train.samples + val.samples:
        expected = reviewed[sample.image_path.name]
        assert sample.classes.tolist() == [class_id for class_id, _ in expected]
        np.testing.assert_allclose(sample.boxes, [box for _, box in expected] or np.zeros((0, 4)), atol=0.05)
        assert sample.template_path is not None
        assert sample.template_path.read_bytes() == (kept / "templates" / sample.image_path.name).read_bytes()
        companion = kept / "companions" / "L2" / sample.image_path.name
        assert sample.companion_paths["L2"].read_bytes() == companion.read_bytes()
    assert train.companion_names == ["L2"] and val.companion_names == ["L2"]
    again = tmp_path / "again"
    result = runner.invoke(app, ["labels", "import-labelstudio", str(tasks), str(again), "--label-config",
                                 str(config), "--images", str(kept), "--val-fraction", "0.3"])  # fmt: skip
    assert sorted(p.name for p in (again / "images" / "val").iterdir()) == sorted(names[1])  # the same split


def test_coco_round_trip_keeps_boxes_classes_splits_and_templates(tmp_path: Path) -> None:
    data = tmp_path / "data"
    boxes = {}
    for split, count in (("train", 3), ("val", 2)):
        for index in range(count):
            name = f"{split}{index}.png"
            _board(data / "images" / split / name, 20 * index + len(split))
            _board(data / "templates" / split / name, 150 + 20 * index + len(split))
            _board(data / "L2" / name, 7 + 20 * index + len(split))
            line = f"{index % 3} 0.5 0.5 0.25 0.5\n"
            (data / "labels" / split).mkdir(parents=True, exist_ok=True)
            (data / "labels" / split / f"{name[:-4]}.txt").write_text(line)
            boxes[name] = (index % 3, [30.0, 15.0, 50.0, 45.0])
    (data / "data.yaml").write_text(
        "path: .\ntrain: images/train\nval: images/val\ntemplates:\n  train: templates/train\n  val: templates/val\n"
        "companions:\n  L2: L2\n"
        f"names: {json.dumps(MODEL_CLASSES)}\n"
    )
    cvat = tmp_path / "cvat"
    for split in ("train", "val"):
        result = runner.invoke(app, ["labels", "export-coco", str(data / "data.yaml"),
                                     str(cvat / "annotations" / f"instances_{split}.json"), "--split", split,
                                     "--image-root", str(data)])  # fmt: skip
        assert result.exit_code == 0, result.output
    written = json.loads((cvat / "annotations" / "instances_train.json").read_text())
    assert written["images"][0]["template_file_name"] == "templates/train/train0.png"
    assert written["images"][0]["companions"] == {"L2": "L2/train0.png"}
    assert "1 companion" not in result.output and "2 companion capture(s)" in result.output  # val: CVAT note
    out = tmp_path / "back"
    result = runner.invoke(app, ["labels", "import-coco", str(cvat), str(out), "--images", str(data)])
    assert result.exit_code == 0, result.output
    assert yaml.safe_load((out / "data.yaml").read_text())["names"] == MODEL_CLASSES  # every category
    for split, count in (("train", 3), ("val", 2)):
        samples = load_dataset(out / "data.yaml", split).samples
        assert len(samples) == count
        for sample in samples:
            class_id, box = boxes[sample.image_path.name]
            assert sample.classes.tolist() == [class_id]
            np.testing.assert_allclose(sample.boxes, [box], atol=0.05)
            original = data / "templates" / split / sample.image_path.name
            assert (
                sample.template_path is not None
                and sample.template_path.read_bytes() == original.read_bytes()
            )
            companion = data / "L2" / sample.image_path.name
            assert sample.companion_paths["L2"].read_bytes() == companion.read_bytes()


def test_export_labelstudio_takes_the_full_class_list_of_a_model(tmp_path: Path) -> None:
    import torch

    from defectdet.engine.checkpoint import REQUIRED_KEYS

    kept = tmp_path / "kept"
    _keep_folder(kept)
    for sidecar in (kept / "predictions").glob("*.json"):  # sidecars that do not name the classes
        entry = json.loads(sidecar.read_text())
        entry.pop("class_names")
        sidecar.write_text(json.dumps(entry))
    (kept / "classes.txt").write_text("open\nshort\n")  # what the review knew: the labelled ones
    checkpoint = tmp_path / "best.pt"
    torch.save({**{key: {} for key in REQUIRED_KEYS}, "class_names": MODEL_CLASSES}, checkpoint)
    tasks = tmp_path / "tasks.json"
    result = runner.invoke(
        app, ["labels", "export-labelstudio", str(kept), str(tasks), "--model", str(checkpoint)]
    )
    assert result.exit_code == 0, result.output
    labels = [
        line.split('"')[1]
        for line in tasks.with_name("tasks_config.xml").read_text().splitlines()
        if "<Label " in line
    ]
    assert labels == MODEL_CLASSES

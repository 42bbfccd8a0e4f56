"""Label Studio and CVAT interchange on hand-written files in those tools' documented formats.

Label Studio: labelstud.io/guide/task_format (tasks with annotations/predictions, rectanglelabels in percent,
original_width/height) and /guide/predictions; CVAT: its "COCO 1.0" export (annotations/instances_default.json,
images/, category ids from 1, attributes, segmentation, iscrowd).
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from defectdet.cli import app
from defectdet.data.formats import load_dataset
from defectdet.data.formats.coco import read_coco
from defectdet.data.formats.cvat import import_coco
from defectdet.data.formats.interchange import export_coco
from defectdet.data.formats.label_settings import (
    CocoExportSettings,
    CocoImportSettings,
    LabelStudioImportSettings,
    TaskExportSettings,
)
from defectdet.data.formats.labelstudio import (
    config_classes,
    export_tasks,
    import_export,
    labeling_config,
    read_export,
)
from defectdet.errors import DatasetError

runner = CliRunner()


def _percent(box: tuple[float, float, float, float], width: int, height: int) -> dict:
    x1, y1, x2, y2 = box
    return {"x": 100 * x1 / width, "y": 100 * y1 / height, "width": 100 * (x2 - x1) / width,
            "height": 100 * (y2 - y1) / height}  # fmt: skip


def _region(box, label: str, width: int, height: int, rotation: float = 0) -> dict:
    return {
        "id": f"r{label}{box[0]}", "from_name": "label", "to_name": "image", "type": "rectanglelabels",
        "original_width": width, "original_height": height, "image_rotation": 0,
        "value": {**_percent(box, width, height), "rotation": rotation, "rectanglelabels": [label]},
    }  # fmt: skip


# Two annotated tasks (a local-files path and an upload), one clean, one not labelled yet.
BOXES_A = [((20.0, 10.0, 60.0, 40.0), "short"), ((150.5, 55.25, 190.0, 95.0), "open")]
BOXES_C = [((5.0, 5.0, 25.0, 30.0), "open")]


def _ls_export(tmp_path: Path, writers) -> Path:
    root = tmp_path / "ls_files"
    writers.image(root / "line1/a.png", 200, 100, value=1)
    writers.image(root / "upload/3/1a2b3c4d-c.png", 64, 48, value=2)
    writers.image(root / "line1/b.png", 200, 100, value=3)
    writers.image(root / "line1/d.png", 200, 100, value=4)
    tasks = [
        {
            "id": 1, "data": {"image": "/data/local-files/?d=line1/a.png"}, "project": 1,
            "annotations": [
                {"id": 11, "was_cancelled": True, "result": [_region((0, 0, 10, 10), "short", 200, 100)],
                 "created_at": "2026-12-01T10:00:00Z"},
                {"id": 12, "was_cancelled": False, "ground_truth": False, "created_at": "2026-12-01T09:00:00Z",
                 "result": [_region(box, label, 200, 100) for box, label in BOXES_A]},
            ],
            "predictions": [],
        },
        {"id": 2, "data": {"image": "/data/local-files/?d=line1%2Fb.png"},
         "annotations": [{"id": 21, "result": []}]},
        {"id": 3, "data": {"image": "/data/upload/3/1a2b3c4d-c.png"},
         "annotations": [{"id": 31, "result": [_region(box, label, 64, 48) for box, label in BOXES_C]}]},
        {"id": 4, "data": {"image": "/data/local-files/?d=line1/d.png"}, "annotations": []},
    ]  # fmt: skip
    return writers.text(tmp_path / "export.json", json.dumps(tasks, indent=2))


def _by_name(split) -> dict:
    return {sample.image_path.name: sample for sample in split.samples}


def test_labelstudio_export_to_yolo_keeps_boxes_within_a_pixel(tmp_path: Path, writers) -> None:
    export = _ls_export(tmp_path, writers)
    out = tmp_path / "dataset"
    report, unlabelled = import_export(export, out, LabelStudioImportSettings(images=[tmp_path / "ls_files"]))
    assert unlabelled == 1  # task 4: no annotation yet, so no label file that would call it clean
    assert (report.images_copied, report.labels_written, report.boxes) == (3, 3, 3)
    assert yaml.safe_load((out / "data.yaml").read_text())["names"] == ["short", "open"]
    split = load_dataset(out, "train")
    assert split.problems == []
    samples = _by_name(split)
    assert set(samples) == {"a.png", "b.png", "c.png"}  # the upload's 8-hex prefix is dropped
    a = samples["a.png"]
    np.testing.assert_allclose(a.boxes, [box for box, _ in BOXES_A], atol=1.0)
    assert [split.class_names[c] for c in a.classes] == ["short", "open"]
    assert len(samples["b.png"].boxes) == 0 and (out / "labels/train/b.txt").read_text() == ""
    np.testing.assert_allclose(samples["c.png"].boxes, [BOXES_C[0][0]], atol=1.0)
    assert not (out / "images/train/d.png").exists()


def test_labelstudio_rotated_box_becomes_its_envelope(tmp_path: Path, writers) -> None:
    writers.image(tmp_path / "r.png", 200, 100)
    region = _region((100, 20, 140, 40), "short", 200, 100, rotation=90)  # 40x20 turned about (100, 20)
    writers.text(tmp_path / "e.json", json.dumps([{"id": 9, "data": {"image": "r.png"},
                                                    "annotations": [{"result": [region]}]}]))  # fmt: skip
    import_export(tmp_path / "e.json", tmp_path / "out")
    box = load_dataset(tmp_path / "out", "train").samples[0].boxes[0]
    np.testing.assert_allclose(box, [80, 20, 100, 60], atol=1.0)  # clockwise, y down: the box swings left


def _predict_output(tmp_path: Path, writers) -> tuple[Path, dict]:
    """What `defectdet predict --out pred` writes: predictions.jsonl (one failed file) and classes.txt."""
    images = tmp_path / "line3"
    detections = {
        "p1.png": [("short", 0.91, [12.0, 8.0, 52.0, 33.5]), ("spur", 0.55, [100.0, 60.0, 130.0, 90.0])],
        "p2.png": [],
    }
    lines = []
    for index, (name, found) in enumerate(detections.items()):
        writers.image(images / name, 160, 120, value=index + 5)
        lines.append({
            "file": str(images / name), "labels": f"labels/{name[:-4]}.txt", "verdict": "defective",
            "threshold": 0.5, "image_size": [160, 120],
            "detections": [{"class_id": ["open", "short", "spur"].index(c), "class_name": c, "score": s, "box": b}
                           for c, s, b in found],
        })  # fmt: skip
    lines.append({"file": str(images / "broken.png"), "error": "broken.png: image file is empty (0 bytes)"})
    pred = tmp_path / "pred"
    writers.text(pred / "predictions.jsonl", "".join(json.dumps(line) + "\n" for line in lines))
    writers.text(pred / "classes.txt", "open\nshort\nspur\n")
    return pred, detections


def test_predictions_to_labelstudio_tasks_and_back(tmp_path: Path, writers) -> None:
    pred, detections = _predict_output(tmp_path, writers)
    result = export_tasks(pred, tmp_path / "tasks.json", TaskExportSettings(model_version="line3-v2"))
    assert (result.tasks, result.predictions, result.regions) == (2, 2, 2) and len(result.skipped) == 1
    tasks = json.loads((tmp_path / "tasks.json").read_text())
    first = tasks[0]
    assert first["data"]["image"] == "/data/local-files/?d=p1.png"
    prediction = first["predictions"][0]
    assert prediction["model_version"] == "line3-v2" and prediction["score"] == pytest.approx(0.91)
    region = prediction["result"][0]
    assert region["type"] == "rectanglelabels" and (region["original_width"], region["original_height"]) == (
        160,
        120,
    )
    assert region["value"]["rectanglelabels"] == ["short"] and region["score"] == pytest.approx(0.91)
    assert region["value"]["x"] == pytest.approx(100 * 12 / 160) and region["value"][
        "height"
    ] == pytest.approx(100 * 25.5 / 120)
    config = ElementTree.parse(result.config_path).getroot()
    labels = config.find("RectangleLabels")
    assert [label.get("value") for label in labels] == ["open", "short", "spur"]  # the model's order
    assert labels.get("name") == region["from_name"] and labels.get("toName") == region["to_name"]
    assert config.find("Image").get("name") == region["to_name"]
    # An annotator accepts every pre-annotation; Label Studio exports the tasks with ids and annotations.
    for number, task in enumerate(tasks, start=1):
        task["id"] = number
        task["annotations"] = [{"id": 100 + number, "result": task["predictions"][0]["result"]}]
    writers.text(tmp_path / "accepted.json", json.dumps(tasks))
    out = tmp_path / "dataset"
    import_export(
        tmp_path / "accepted.json",
        out,
        LabelStudioImportSettings(images=[result.document_root], classes=["open", "short", "spur"]),
    )
    samples = _by_name(load_dataset(out, "train"))
    np.testing.assert_allclose(samples["p1.png"].boxes, [d[2] for d in detections["p1.png"]], atol=1.0)
    assert samples["p1.png"].classes.tolist() == [1, 2] and len(samples["p2.png"].boxes) == 0


def test_keep_folder_sidecars_become_tasks(tmp_path: Path, writers) -> None:
    keep = tmp_path / "kept"
    writers.image(keep / "images/20261204T000000Z-abcd1234.png", 80, 60)
    sidecar = {"image": "images/20261204T000000Z-abcd1234.png", "bundle": "model.onnx", "threshold": 0.5,
               "image_size": [80, 60], "detections": [
                   {"class_id": 0, "class_name": "open", "score": 0.8, "box": [1, 2, 30, 40]},
                   {"class_id": 0, "class_name": "open", "score": 0.45, "box": [50, 5, 70, 25]}]}  # fmt: skip
    writers.text(keep / "predictions/20261204T000000Z-abcd1234.json", json.dumps(sidecar))
    result = export_tasks(keep, tmp_path / "t.json")
    task = json.loads((tmp_path / "t.json").read_text())[0]
    assert task["predictions"][0]["model_version"] == "model.onnx"
    assert (
        len(task["predictions"][0]["result"]) == 1
    )  # the near-threshold detection the sidecar keeps stays out
    assert result.document_root == keep / "images"


def test_two_tasks_of_one_image_keep_the_later(tmp_path: Path, writers) -> None:
    writers.image(tmp_path / "x.png", 100, 100)
    tasks = [{"id": n, "data": {"image": "x.png"}, "annotations": [{"result": [_region(box, "short", 100, 100)]}]}
             for n, box in ((1, (0, 0, 10, 10)), (2, (50, 50, 70, 70)))]  # fmt: skip
    writers.text(tmp_path / "dup.json", json.dumps(tasks))
    report, _ = import_export(tmp_path / "dup.json", tmp_path / "out")
    assert report.labels_written == 1 and "task 2 labels the same image as task 1" in report.warnings[0]
    np.testing.assert_allclose(load_dataset(tmp_path / "out").samples[0].boxes, [[50, 50, 70, 70]], atol=1.0)


def test_label_config_gives_the_class_order(tmp_path: Path, writers) -> None:
    config = writers.text(tmp_path / "c.xml", labeling_config(["open", "short", 'a "quoted" & <odd> name']))
    assert config_classes(config) == ["open", "short", 'a "quoted" & <odd> name']
    writers.text(tmp_path / "bad.xml", "<View>\n  <RectangleLabels name='label'>\n</View>")
    with pytest.raises(DatasetError, match=r"bad\.xml:3:3: invalid XML"):
        config_classes(tmp_path / "bad.xml")
    writers.text(tmp_path / "none.xml", "<View><Image name='image' value='$image'/></View>")
    with pytest.raises(DatasetError, match="no <RectangleLabels>"):
        config_classes(tmp_path / "none.xml")


# ---------------------------------------------------------------- bad input


def test_unknown_class_names_the_task_and_writes_nothing(tmp_path: Path, writers) -> None:
    export = _ls_export(tmp_path, writers)
    out = tmp_path / "dataset"
    writers.text(out / "data.yaml", "path: .\ntrain: images/train\nnames: [short]\n")
    with pytest.raises(DatasetError, match=r"task 1: class 'open'.*task 3: class 'open'.*--add-classes"):
        import_export(export, out, LabelStudioImportSettings(images=[tmp_path / "ls_files"]))
    assert not (out / "labels").exists() and not (out / "images").exists()
    report, _ = import_export(
        export, out, LabelStudioImportSettings(images=[tmp_path / "ls_files"], skip_unknown=True)
    )
    assert report.skipped_boxes == 2 and report.class_names == ["short"]
    assert load_dataset(out, "train").samples[0].classes.tolist() == [0]


def test_unknown_class_can_be_added(tmp_path: Path, writers) -> None:
    export = _ls_export(tmp_path, writers)
    with pytest.raises(DatasetError, match="not in --classes"):
        import_export(
            export,
            tmp_path / "o",
            LabelStudioImportSettings(images=[tmp_path / "ls_files"], classes=["short"]),
        )
    adding = LabelStudioImportSettings(images=[tmp_path / "ls_files"], classes=["short"], add_classes=True)
    report, _ = import_export(export, tmp_path / "o", adding)
    assert report.added_classes == ["open"]
    assert yaml.safe_load((tmp_path / "o/data.yaml").read_text())["names"] == ["short", "open"]


def test_malformed_json_names_file_and_position(tmp_path: Path, writers) -> None:
    bad = writers.text(
        tmp_path / "bad.json", '[\n  {"id": 1, "data": {"image": "x.png"}},\n  {"id": 2,, }\n]'
    )
    with pytest.raises(DatasetError, match=r"bad\.json:3:12: invalid JSON .*character 54"):
        read_export(bad)
    writers.text(tmp_path / "obj.json", '{"tasks": []}')
    with pytest.raises(DatasetError, match="expected a list of tasks"):
        read_export(tmp_path / "obj.json")
    region = _region((1, 1, 5, 5), "short", 10, 10)
    region["value"]["x"] = "left"
    writers.image(tmp_path / "x.png", 10, 10)
    writers.text(tmp_path / "v.json", json.dumps([{"id": 5, "data": {"image": "x.png"},
                                                    "annotations": [{"result": [region]}]}]))  # fmt: skip
    with pytest.raises(DatasetError, match=r"v\.json: task 5: result\[0\]: value\.x must be a number"):
        import_export(tmp_path / "v.json", tmp_path / "out")


def test_missing_image_names_the_task(tmp_path: Path, writers) -> None:
    export = _ls_export(tmp_path, writers)
    (tmp_path / "ls_files/upload/3/1a2b3c4d-c.png").unlink()
    with pytest.raises(DatasetError, match=r"task 3: image '/data/upload/3/1a2b3c4d-c.png' not found"):
        import_export(export, tmp_path / "out", LabelStudioImportSettings(images=[tmp_path / "ls_files"]))
    assert not (tmp_path / "out").exists()
    report, _ = import_export(
        export, tmp_path / "out", LabelStudioImportSettings(images=[tmp_path / "ls_files"], skip_missing=True)
    )
    assert report.labels_written == 2 and report.skipped_images[0].startswith("task 3:")


def test_existing_labels_are_never_overwritten_silently(tmp_path: Path, writers) -> None:
    export = _ls_export(tmp_path, writers)
    out = tmp_path / "dataset"
    import_export(export, out, LabelStudioImportSettings(images=[tmp_path / "ls_files"]))
    again, _ = import_export(
        export, out, LabelStudioImportSettings(images=[tmp_path / "ls_files"])
    )  # the same export: nothing changes
    assert (again.labels_unchanged, again.images_present, again.labels_written) == (3, 3, 0)
    label = out / "labels/train/a.txt"
    mine = "0 0.900000 0.900000 0.100000 0.100000\n"  # someone added a box here since
    label.write_text(label.read_text() + mine)
    before = label.read_text()
    with pytest.raises(DatasetError, match=r"task 1: .*a\.txt already holds 3 box\(es\).*--existing merge"):
        import_export(export, out, LabelStudioImportSettings(images=[tmp_path / "ls_files"]))
    assert label.read_text() == before
    merged, _ = import_export(
        export, out, LabelStudioImportSettings(images=[tmp_path / "ls_files"], existing="merge")
    )
    assert merged.labels_merged == 0 and merged.labels_unchanged == 3 and label.read_text() == before
    replaced, _ = import_export(
        export, out, LabelStudioImportSettings(images=[tmp_path / "ls_files"], existing="replace")
    )
    assert replaced.labels_replaced == 1 and mine not in label.read_text()
    # merge adds the imported boxes to what is there
    label.write_text(mine)
    import_export(export, out, LabelStudioImportSettings(images=[tmp_path / "ls_files"], existing="merge"))
    assert label.read_text().splitlines()[0] == mine.strip() and len(label.read_text().splitlines()) == 3
    assert not list(out.rglob("*.tmp"))


def test_another_image_of_the_same_name_is_refused(tmp_path: Path, writers) -> None:
    export = _ls_export(tmp_path, writers)
    out = tmp_path / "dataset"
    writers.image(out / "images/train/a.png", 200, 100, value=99)
    with pytest.raises(DatasetError, match=r"task 1: .*a\.png already holds another image"):
        import_export(export, out, LabelStudioImportSettings(images=[tmp_path / "ls_files"]))
    assert not (out / "labels").exists()


# ---------------------------------------------------------------- CVAT COCO 1.0


def _cvat_export(tmp_path: Path, writers) -> Path:
    root = tmp_path / "cvat"
    writers.image(root / "images/default/sub/a.png", 120, 80, value=1)
    writers.image(root / "images/default/b.png", 120, 80, value=2)
    cvat_attributes = {"occluded": False}
    document = {
        "licenses": [{"name": "", "id": 0, "url": ""}],
        "info": {"contributor": "", "date_created": "", "description": "", "url": "", "version": "", "year": ""},
        "categories": [{"id": 1, "name": "short", "supercategory": ""}, {"id": 2, "name": "open", "supercategory": ""}],
        "images": [
            {"id": 1, "width": 120, "height": 80, "file_name": "sub/a.png", "license": 0, "flickr_url": "",
             "coco_url": "", "date_captured": 0},
            {"id": 2, "width": 120, "height": 80, "file_name": "b.png", "license": 0, "flickr_url": "",
             "coco_url": "", "date_captured": 0},
        ],
        "annotations": [
            {"id": 1, "image_id": 1, "category_id": 1, "segmentation": [], "area": 300.0,
             "bbox": [10.0, 12.5, 20.0, 15.0], "iscrowd": 0, "attributes": {**cvat_attributes, "rotation": 0.0}},
            {"id": 2, "image_id": 1, "category_id": 2, "segmentation": [[60, 10, 80, 10, 80, 30, 60, 30]],
             "area": 400.0, "bbox": [60.0, 10.0, 20.0, 20.0], "iscrowd": 0, "attributes": cvat_attributes},
            {"id": 3, "image_id": 2, "category_id": 2, "segmentation": {"counts": [0, 6, 114], "size": [80, 120]},
             "area": 6.0, "bbox": [0.0, 0.0, 3.0, 2.0], "iscrowd": 1, "attributes": cvat_attributes},
            {"id": 4, "image_id": 2, "category_id": 1, "segmentation": [], "area": 200.0,
             "bbox": [50.0, 40.0, 20.0, 10.0], "iscrowd": 0, "attributes": {**cvat_attributes, "rotation": 90.0}},
        ],
    }  # fmt: skip
    writers.text(root / "annotations/instances_default.json", json.dumps(document))
    return root


CVAT_BOXES = {"a.png": [[10, 12.5, 30, 27.5], [60, 10, 80, 30]], "b.png": [[0, 0, 3, 2], [55, 35, 65, 55]]}


def test_cvat_coco_to_dataset_and_back_to_coco(tmp_path: Path, writers) -> None:
    export = _cvat_export(tmp_path, writers)
    out = tmp_path / "dataset"
    (result,) = import_coco(export, out, CocoImportSettings(split="val"))
    assert result.split == "val" and result.crowd == 1 and result.report.boxes == 4
    split = load_dataset(out, "val")
    assert split.class_names == ["short", "open"]  # CVAT's ids 1, 2 -> 0, 1
    samples = _by_name(split)
    assert (out / "images/val/sub/a.png").is_file()  # the subfolder of file_name is kept
    for name, boxes in CVAT_BOXES.items():
        np.testing.assert_allclose(samples[name].boxes, boxes, atol=1.0)  # the 90-degree box: its envelope
    assert samples["a.png"].classes.tolist() == [0, 1] and samples["b.png"].classes.tolist() == [1, 0]
    written = export_coco(
        out, tmp_path / "round.json", CocoExportSettings(split="val", image_root=out / "images/val")
    )
    assert (written.images, written.annotations) == (2, 4)
    document = json.loads((tmp_path / "round.json").read_text())
    assert [c["id"] for c in document["categories"]] == [1, 2]
    names = {image["id"]: image["file_name"] for image in document["images"]}
    assert set(names.values()) == {"sub/a.png", "b.png"}
    boxes: dict[str, list] = {}
    for annotation in document["annotations"]:
        x, y, w, h = annotation["bbox"]
        boxes.setdefault(Path(names[annotation["image_id"]]).name, []).append([x, y, x + w, y + h])
    for name, expected in CVAT_BOXES.items():
        np.testing.assert_allclose(boxes[name], expected, atol=1.0)
    again = read_coco(tmp_path / "round.json", image_roots=(out / "images/val",))  # our reader reads it back
    assert again.problems == [] and again.class_names == ["short", "open"]
    for name, expected in CVAT_BOXES.items():
        np.testing.assert_allclose(_by_name(again)[name].boxes, expected, atol=1.0)


def test_cvat_crowd_can_be_left_out_and_unknown_category_is_named(tmp_path: Path, writers) -> None:
    export = _cvat_export(tmp_path, writers)
    (result,) = import_coco(export, tmp_path / "a", CocoImportSettings(split="train", keep_crowd=False))
    assert result.report.boxes == 3
    out = tmp_path / "b"
    writers.text(out / "data.yaml", "path: .\ntrain: images/train\nnames: [short]\n")
    with pytest.raises(DatasetError, match=r"instances_default\.json image 1 \(sub/a\.png\): class 'open'"):
        import_coco(export, out)


def test_cvat_missing_image_is_named(tmp_path: Path, writers) -> None:
    export = _cvat_export(tmp_path, writers)
    (export / "images/default/b.png").unlink()
    with pytest.raises(DatasetError, match=r"images\[1\] \(id 2\): image file 'b.png' not found"):
        import_coco(export, tmp_path / "out")
    (result,) = import_coco(export, tmp_path / "out", CocoImportSettings(split="train", skip_missing=True))
    assert result.report.labels_written == 1 and len(result.report.skipped_images) == 1


def test_cvat_default_subset_goes_to_train_and_val_from_the_command(tmp_path: Path, writers) -> None:
    out = tmp_path / "out"
    result = runner.invoke(app, ["labels", "import-coco", str(_cvat_export(tmp_path, writers)), str(out)])
    assert result.exit_code == 0, result.output
    train, val = load_dataset(out, "train"), load_dataset(out, "val")
    names = sorted(s.image_path.name for s in train.samples + val.samples)
    assert names == ["a.png", "b.png"] and train.samples and val.samples  # two images: one on each side


# ---------------------------------------------------------------- the commands


def test_labels_commands_end_to_end(tmp_path: Path, writers) -> None:
    pred, _ = _predict_output(tmp_path, writers)
    tasks = tmp_path / "tasks.json"
    result = runner.invoke(app, ["labels", "export-labelstudio", str(pred), str(tasks)])
    assert result.exit_code == 0, result.output
    assert (
        "2 task(s), 0 with reviewed labels, 2 with pre-annotations (2 box(es))" in result.output
        and "tasks_config.xml" in result.output
    )
    export = _ls_export(tmp_path, writers)
    out = tmp_path / "dataset"
    result = runner.invoke(app, ["labels", "import-labelstudio", str(export), str(out), "--images",
                                 str(tmp_path / "ls_files"), "--classes", "short,open", "--split", "train"])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert (
        "3 image(s) copied" in result.output
        and "labels: 3 new" in result.output
        and "1 task(s) without" in result.output
    )
    result = runner.invoke(app, ["labels", "import-coco", str(_cvat_export(tmp_path, writers)), str(out),
                                 "--split", "val"])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "4 box(es)" in result.output and "1 crowd" in result.output
    result = runner.invoke(app, ["labels", "export-coco", str(out), str(tmp_path / "train.json")])
    assert result.exit_code == 0, result.output
    assert "3 image(s), 3 box(es), 2 categories (short, open)" in result.output
    result = runner.invoke(app, ["labels", "import-labelstudio", str(export), str(out), "--images",
                                 str(tmp_path / "ls_files"), "--add-classes", "--skip-unknown"])  # fmt: skip
    assert result.exit_code != 0 and "exclude each other" in result.output
    result = runner.invoke(app, ["labels", "import-labelstudio", str(export), str(tmp_path / "fresh"), "--images",
                                 str(tmp_path / "ls_files"), "--classes", "short"])  # fmt: skip
    assert isinstance(result.exception, DatasetError)  # main() prints it as one line and exits 2
    assert "task 1: class 'open'" in str(result.exception) and not (tmp_path / "fresh").exists()


# ---------------------------------------------------------------- hostile files


def test_deeply_nested_json_is_refused_with_the_file_named(tmp_path: Path, writers) -> None:
    deep = "[" * 5000 + "]" * 5000  # Python's parser stops near 1000 levels with a RecursionError
    tasks = writers.text(tmp_path / "tasks.json", f'[{{"id": 1, "data": {{"image": "x.png", "n": {deep}}}}}]')
    with pytest.raises(DatasetError, match=r"tasks\.json: JSON nested 5003 levels deep \(at most 64\)"):
        read_export(tasks)
    coco = writers.text(tmp_path / "ann.json", f'{{"images": [], "annotations": {deep}}}')
    with pytest.raises(DatasetError, match=r"ann\.json: JSON nested"):
        import_coco(coco, tmp_path / "out")
    result = runner.invoke(app, ["labels", "import-coco", str(coco), str(tmp_path / "out")])
    assert result.exit_code != 0 and not isinstance(result.exception, RecursionError)


def test_imports_refuse_names_that_climb_out_of_the_images_folder(tmp_path: Path, writers) -> None:
    writers.image(tmp_path / "secret.png", 20, 20)
    writers.image(tmp_path / "ls/line/a.png", 20, 20)
    region = _region((1, 1, 5, 5), "short", 20, 20)
    tasks = [
        {
            "id": 7,
            "data": {"image": "/data/local-files/?d=../../secret.png"},
            "annotations": [{"result": [region]}],
        }
    ]
    export = writers.text(tmp_path / "ls/line/export.json", json.dumps(tasks))
    with pytest.raises(
        DatasetError, match=r"export\.json: task 7: data\.image .*\.\./\.\./secret\.png.* leads out"
    ):
        import_export(export, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    root = tmp_path / "cvat"
    writers.image(root / "images/default/a.png", 20, 20)
    document = {
        "categories": [{"id": 1, "name": "short"}],
        "images": [{"id": 1, "width": 20, "height": 20, "file_name": "a.png"},
                   {"id": 2, "width": 20, "height": 20, "file_name": "../../../secret.png"}],
        "annotations": [{"id": 1, "image_id": 2, "category_id": 1, "bbox": [1, 1, 4, 4], "iscrowd": 0}],
    }  # fmt: skip
    writers.text(root / "annotations/instances_default.json", json.dumps(document))
    with pytest.raises(
        DatasetError, match=r"images\[1\] \(id 2\): file_name '\.\./\.\./\.\./secret\.png' leads out"
    ):
        import_coco(root, tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "url",
    [
        "{secret}",  # an absolute path
        "file://{secret}",
        "/data/upload/1/../../secret.png",
        "http://studio:8080/data/upload/1/..%2F..%2Fsecret.png",
        "/data/local-files/?d=line/../../secret.png",
    ],
)
def test_labelstudio_import_refuses_files_outside_the_images_folder(
    tmp_path: Path, writers, url: str
) -> None:
    """The importers share one rule (formats.leaves_folder): a name that is absolute, file:// or climbs with
    '..' is refused, whatever the URL form; the path our export stored is used only below --images."""
    secret = writers.image(tmp_path / "secret.png", 20, 20)
    images = tmp_path / "ls" / "images"
    writers.image(images / "a.png", 20, 20)
    region = _region((1, 1, 5, 5), "short", 20, 20)
    task = {"id": 3, "data": {"image": url.format(secret=secret)}, "annotations": [{"result": [region]}]}
    export = writers.text(tmp_path / "ls" / "export.json", json.dumps([task]))
    with pytest.raises(DatasetError, match=r"task 3: data\.image .* leads out of the images folder"):
        import_export(export, tmp_path / "out", LabelStudioImportSettings(images=[images]))
    assert not (tmp_path / "out").exists()
    # a task naming a plain file name, with our stored path pointing outside --images: not followed
    task = {
        "id": 4,
        "data": {"image": "https://cdn/secret.png", "defectdet_image": str(secret)},
        "annotations": [{"result": [region]}],
    }
    writers.text(export, json.dumps([task]))
    with pytest.raises(DatasetError, match=r"1 task image\(s\) not found"):
        import_export(export, tmp_path / "out", LabelStudioImportSettings(images=[images]))
    assert not (tmp_path / "out").exists()

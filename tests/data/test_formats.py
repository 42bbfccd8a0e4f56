"""The four dataset readers and format detection, on tiny datasets written into tmp_path."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from defectdet.data.formats import available_splits, detect_format, load_dataset
from defectdet.data.formats.deeppcb import CLASS_NAMES, DEFAULT_VAL_GROUPS, group_of, split_by_groups
from defectdet.data.sample import DatasetSplit
from defectdet.errors import DatasetError


def _problems(split: DatasetSplit) -> list[tuple[str, str, int]]:
    return [(p.severity, Path(p.path).name, p.line) for p in split.problems]


# ---------------------------------------------------------------- YOLO


def _yolo(tmp_path: Path, writers, templates: bool = False) -> Path:
    root = tmp_path / "yolo"
    writers.image(root / "images/train/a.png", 100, 50, value=1)
    writers.image(root / "images/train/b.png", 100, 50, value=2)  # no label file: clean image
    writers.image(root / "images/val/c.png", 100, 50, value=3)
    writers.text(root / "labels/train/a.txt", "1 0.5 0.5 0.2 0.4\n0 0.1 0.1 0.1 0.1\n")
    writers.text(root / "labels/val/c.txt", "0 0.5 0.5 0.5 0.5\n")
    yaml_text = "path: .\ntrain: images/train\nval: images/val\nnames: {0: scratch, 1: dent}\n"
    if templates:
        writers.image(root / "templates/train/a.png", 100, 50, value=4)
        yaml_text += "templates: {train: templates/train}\n"
    writers.text(root / "data.yaml", yaml_text)
    return root


def test_yolo_folder_split_converts_normalized_boxes(tmp_path: Path, writers) -> None:
    root = _yolo(tmp_path, writers)
    assert detect_format(root) == "yolo" and detect_format(root / "data.yaml") == "yolo"
    assert available_splits(root) == ["train", "val"]
    train = load_dataset(root / "data.yaml", "train")
    assert train.class_names == ["scratch", "dent"] and train.format == "yolo"
    by_name = {s.image_path.name: s for s in train.samples}
    assert set(by_name) == {"a.png", "b.png"}
    a = by_name["a.png"]
    np.testing.assert_allclose(a.boxes, [[40, 15, 60, 35], [5, 2.5, 15, 7.5]], atol=1e-4)
    assert a.classes.tolist() == [1, 0] and (a.width, a.height) == (100, 50)
    assert len(by_name["b.png"].boxes) == 0
    assert train.problems == []
    assert not train.has_templates


def test_yolo_templates(tmp_path: Path, writers) -> None:
    root = _yolo(tmp_path, writers, templates=True)
    train = load_dataset(root, "train")
    by_name = {s.image_path.name: s for s in train.samples}
    assert by_name["a.png"].template_path == root / "templates/train/a.png"
    assert by_name["b.png"].template_path is None
    assert _problems(train) == [("warning", "b.png", 0)]  # missing template
    assert "template" in train.problems[0].message


def test_yolo_list_split_and_label_problems(tmp_path: Path, writers) -> None:
    root = tmp_path / "yolo"
    for name in "abc":
        writers.image(root / f"images/{name}.jpg", 200, 100, value=ord(name))
    writers.text(root / "train.txt", "./images/a.jpg\nimages/b.jpg\nimages/missing.jpg\n")
    writers.text(root / "val.txt", "images/c.jpg")
    writers.text(
        root / "labels/a.txt",
        "0 0.5 0.5 0.1 0.1\n"  # 1: fine
        "0 0.5 0.5\n"  # 2: wrong field count
        "x 0.5 0.5 0.1 0.1\n"  # 3: not a number
        "5 0.5 0.5 0.1 0.1\n"  # 4: class out of range
        "1 0.95 0.5 0.3 0.1\n"  # 5: beyond the right edge by 0.1
        "1 0.5 0.5 0 0.1\n"  # 6: zero area
        "1 0.5 0.5 0.005 0.1\n"  # 7: 1 px wide: tiny, kept
        "1 0.999 0.5 0.02 0.1\n",  # 8: over the edge within tolerance: clipped
    )
    writers.text(root / "data.yaml", "train: train.txt\nval: val.txt\nnames: [pad, via]\n")
    train = load_dataset(root / "data.yaml", "train")
    assert [s.image_path.name for s in train.samples] == ["a.jpg", "b.jpg"]
    a = train.samples[0]
    assert a.classes.tolist() == [0, 1, 1]
    assert a.boxes[2, 2] == pytest.approx(200.0)  # clipped to the image
    assert sorted(_problems(train)) == sorted(
        [
            ("error", "train.txt", 3),
            ("error", "a.txt", 2),
            ("error", "a.txt", 3),
            ("error", "a.txt", 4),
            ("error", "a.txt", 5),
            ("error", "a.txt", 6),
            ("warning", "a.txt", 7),
        ]
    )
    messages = {p.line: p.message for p in train.problems if p.path.endswith("a.txt")}
    assert "5 fields" in messages[2] and "out of range 0..1" in messages[4] and "outside" in messages[5]


def test_yolo_label_without_image_and_bad_yaml(tmp_path: Path, writers) -> None:
    root = _yolo(tmp_path, writers)
    writers.text(root / "labels/train/ghost.txt", "0 0.5 0.5 0.1 0.1\n")
    train = load_dataset(root, "train")
    assert ("error", "ghost.txt", 0) in _problems(train)
    with pytest.raises(DatasetError, match="'test'"):
        load_dataset(root, "test")
    writers.text(root / "data.yaml", "train: [unclosed\n")
    with pytest.raises(DatasetError, match=r"data\.yaml"):
        load_dataset(root, "train")


# ---------------------------------------------------------------- COCO


def test_coco_arbitrary_category_ids(tmp_path: Path, writers) -> None:
    writers.image(tmp_path / "images/p1.png", 80, 60, value=1)
    writers.image(tmp_path / "p2.png", 80, 60, value=2)  # beside the json
    writers.image(tmp_path / "images/p1_ref.png", 80, 60, value=3)
    document = {
        "images": [
            {"id": 7, "file_name": "p1.png", "width": 80, "height": 60, "template_file_name": "p1_ref.png"},
            {"id": 9, "file_name": "p2.png", "width": 80, "height": 60},
            {"id": 11, "file_name": "gone.png", "width": 80, "height": 60},
        ],
        "categories": [{"id": 40, "name": "short"}, {"id": 3, "name": "open"}],
        "annotations": [
            {"id": 1, "image_id": 7, "category_id": 40, "bbox": [10, 5, 20, 10]},
            {"id": 2, "image_id": 7, "category_id": 3, "bbox": [0, 0, 5, 5]},
            {"id": 3, "image_id": 99, "category_id": 3, "bbox": [0, 0, 5, 5]},
            {"id": 4, "image_id": 9, "category_id": 12, "bbox": [0, 0, 5, 5]},
            {"id": 5, "image_id": 9, "category_id": 3, "bbox": [0, 0, 0, 5]},
            {"id": 6, "image_id": 9, "category_id": 3, "bbox": [70, 50, 30, 5]},
        ],
    }
    json_path = writers.coco(tmp_path, document)
    assert detect_format(json_path) == "coco"
    assert available_splits(json_path) == ["instances_val"]
    split = load_dataset(json_path, "train")  # the json is the split
    assert split.split == "instances_val" and split.class_names == ["open", "short"]
    by_id = {s.image_id: s for s in split.samples}
    assert set(by_id) == {"7", "9"}
    np.testing.assert_allclose(by_id["7"].boxes, [[10, 5, 30, 15], [0, 0, 5, 5]])
    assert by_id["7"].classes.tolist() == [1, 0]
    assert by_id["7"].template_path == tmp_path / "images/p1_ref.png"
    assert by_id["9"].image_path == tmp_path / "p2.png" and len(by_id["9"].boxes) == 0
    messages = " | ".join(p.message for p in split.problems)
    assert len(split.problems) == 5 and all(p.severity == "error" for p in split.problems)
    for expected in ("gone.png", "image_id 99", "category_id 12", "non-positive", "outside"):
        assert expected in messages


def test_coco_invalid_json_names_line(tmp_path: Path, writers) -> None:
    path = writers.text(tmp_path / "broken.json", '{"images": [\n  {"id": 1,,}\n]}')
    with pytest.raises(DatasetError, match=r"broken\.json:2"):
        load_dataset(path)


# ---------------------------------------------------------------- VOC


def _voc_xml(
    filename: str, objects: list[tuple[str, int, int, int, int]], width: int = 90, height: int = 70
) -> str:
    body = "".join(
        f"<object><name>{name}</name><difficult>1</difficult><bndbox><xmin>{x1}</xmin><ymin>{y1}</ymin>"
        f"<xmax>{x2}</xmax><ymax>{y2}</ymax></bndbox></object>"
        for name, x1, y1, x2, y2 in objects
    )
    return f"<annotation><filename>{filename}</filename><size><width>{width}</width><height>{height}</height></size>{body}</annotation>"


def test_voc_with_image_sets(tmp_path: Path, writers) -> None:
    root = tmp_path / "voc"
    for index, stem in enumerate(["b1", "b2", "b3"]):
        writers.image(root / f"JPEGImages/{stem}.jpg", 90, 70, value=index)
    writers.text(
        root / "Annotations/b1.xml", _voc_xml("b1.jpg", [("spur", 11, 21, 40, 50), ("open", 1, 1, 5, 5)])
    )
    writers.text(root / "Annotations/b2.xml", _voc_xml("b2.jpg", [("short", 1, 1, 200, 10)]))
    writers.text(
        root / "Annotations/b3.xml", "<annotation><filename>b3.jpg</filename>\n<object>\n</annotation>"
    )
    writers.text(root / "ImageSets/Main/train.txt", "b1\nb2\nb3\nb4\n")
    writers.text(root / "ImageSets/Main/val.txt", "b1\n")
    writers.text(root / "ImageSets/Main/spur_train.txt", "b1  1\n")
    assert detect_format(root) == "voc"
    assert available_splits(root) == ["train", "val"]
    train = load_dataset(root, "train")
    assert train.class_names == ["open", "short", "spur"]  # sorted union over all annotations
    b1 = next(s for s in train.samples if s.image_id == "b1")
    np.testing.assert_allclose(b1.boxes, [[10, 20, 40, 50], [0, 0, 5, 5]])  # 1-based -> 0-based
    assert b1.classes.tolist() == [2, 0] and (b1.width, b1.height) == (90, 70)
    found = _problems(train)
    assert ("error", "b3.xml", 3) in found  # malformed XML with the parser's line
    assert ("error", "train.txt", 4) in found  # b4 has no annotation
    assert any(p.path.endswith("b2.xml") and "outside" in p.message for p in train.problems)


def test_voc_flat_folder_with_class_file(tmp_path: Path, writers) -> None:
    writers.image(tmp_path / "x.png", 90, 70)
    writers.text(tmp_path / "x.xml", _voc_xml("x.png", [("dent", 5, 5, 20, 20), ("rust", 5, 5, 20, 20)]))
    writers.text(tmp_path / "classes.txt", "scratch\ndent\n")
    assert detect_format(tmp_path) == "voc"
    split = load_dataset(tmp_path, "train")
    assert split.split == "all" and split.class_names == ["scratch", "dent"]
    assert split.samples[0].classes.tolist() == [1]
    assert "'rust'" in split.problems[0].message


# ---------------------------------------------------------------- DeepPCB


@pytest.mark.parametrize("separator", [" ", ","])
def test_deeppcb_pairs_and_separators(tmp_path: Path, writers, separator: str) -> None:
    root = writers.deeppcb(tmp_path / "pcb", separator)
    assert detect_format(root) == "deeppcb"
    assert available_splits(root) == ["train", "val", "test", "trainval"]
    trainval = load_dataset(root, "trainval")
    assert trainval.class_names == CLASS_NAMES and trainval.problems == []
    assert len(trainval.samples) == 3  # the last list line has no newline
    first = trainval.samples[0]
    assert first.image_path == root / "group1000/1000/1000000_test.jpg"
    assert first.template_path == root / "group1000/1000/1000000_temp.jpg"
    assert first.image_id == "1000000" and (first.width, first.height) == (100, 80)
    np.testing.assert_allclose(first.boxes, [[10, 10, 30, 20]])
    assert first.classes.tolist() == [0]
    assert trainval.samples[1].classes.tolist() == [0, 5]
    assert [s.image_id for s in load_dataset(root, "test").samples] == ["1000000"]


def test_deeppcb_group_holdout(deeppcb_root: Path) -> None:
    trainval = load_dataset(deeppcb_root, "trainval")
    assert [group_of(s) for s in trainval.samples] == ["1000", "1000", "2000"]
    assert DEFAULT_VAL_GROUPS(trainval.samples) == ["2000"]  # highest group, 1/3 >= 20%
    train, val = split_by_groups(trainval.samples, ["2000"])
    assert len(train) == 2 and len(val) == 1
    assert [s.image_id for s in load_dataset(deeppcb_root, "val").samples] == ["2000000"]
    assert [s.image_id for s in load_dataset(deeppcb_root, "train").samples] == ["1000000", "1000001"]


def test_deeppcb_bad_labels(deeppcb_root: Path, writers) -> None:
    label = deeppcb_root / "group1000/1000_not/1000001.txt"
    writers.text(label, "10 10 30 20 7\n10,10,30\n5 5 5 9 2\n1 1 4 4 3")
    (deeppcb_root / "group2000/2000/2000000_temp.jpg").unlink()
    trainval = load_dataset(deeppcb_root, "trainval")
    assert sorted(_problems(trainval)) == [
        ("error", "1000001.txt", 1),
        ("error", "1000001.txt", 2),
        ("error", "1000001.txt", 3),
        ("warning", "trainval.txt", 3),
    ]
    assert "out of range 1..6" in trainval.problems[0].message
    assert trainval.samples[1].classes.tolist() == [2]


def test_unknown_format_says_what_was_looked_for(tmp_path: Path, writers) -> None:
    writers.text(tmp_path / "notes.txt", "hello\n")
    with pytest.raises(DatasetError, match=r"data\.yaml.*json.*Annotations.*DeepPCB"):
        detect_format(tmp_path)
    with pytest.raises(DatasetError, match="not found"):
        load_dataset(tmp_path / "nope")


def _coco_folder(root: Path, writers, annotations_folder: bool = False) -> Path:
    """A COCO dataset folder: train.json and val.json (or annotations/instances_*.json) and images/."""
    json_folder = root / "annotations" if annotations_folder else root
    for index, split in enumerate(("train", "val")):
        writers.image(root / "images" / f"{split}.png", 80, 60, value=index)
        document = {
            "info": {"description": "a tiny set"},
            "images": [{"id": 1, "file_name": f"{split}.png", "width": 80, "height": 60}],
            "categories": [{"id": 1, "name": "short"}],
            "annotations": [{"id": 1, "image_id": 1, "category_id": 1, "bbox": [10, 5, 20, 10]}],
        }
        name = f"instances_{split}.json" if annotations_folder else f"{split}.json"
        writers.text(json_folder / name, json.dumps(document))
    return root


@pytest.mark.parametrize("annotations_folder", [False, True], ids=["beside", "annotations"])
def test_a_coco_folder_is_detected(tmp_path: Path, writers, annotations_folder: bool) -> None:
    root = _coco_folder(tmp_path / "coco", writers, annotations_folder)
    assert detect_format(root) == "coco"
    names = ["instances_train", "instances_val"] if annotations_folder else ["train", "val"]
    assert available_splits(root) == names
    split = load_dataset(root, names[1])
    assert split.format == "coco" and len(split.samples) == 1 and split.samples[0].boxes.shape == (1, 4)


def test_a_folder_of_other_json_is_not_coco(tmp_path: Path, writers) -> None:
    writers.text(tmp_path / "settings.json", json.dumps({"threshold": 0.5}))
    with pytest.raises(DatasetError, match=r"--format"):
        detect_format(tmp_path)


def test_other_json_beside_a_coco_folder_is_not_a_split(tmp_path: Path, writers) -> None:
    root = _coco_folder(tmp_path / "coco", writers)
    writers.text(root / "settings.json", json.dumps({"threshold": 0.5}))
    assert detect_format(root) == "coco" and available_splits(root) == ["train", "val"]

"""Synthetic PCB generator: files, exact boxes, determinism, template/defect consistency."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest
import yaml

from defectdet.data.formats import load_dataset
from defectdet.data.synth import CLASS_NAMES, generate_board, synthesize_dataset
from defectdet.errors import DefectDetError

SMALL = {"boards": 4, "min_size": 256, "max_size": 320, "progress": False}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return synthesize_dataset(tmp_path_factory.mktemp("synth") / "set", seed=3, **SMALL)


def _labels(root: Path) -> dict[str, str]:
    return {str(path.relative_to(root)): path.read_text() for path in sorted(root.glob("labels/*/*.txt"))}


def _images(root: Path, kind: str = "images") -> list[Path]:
    return sorted(root.glob(f"{kind}/*/*.png"))


def test_files_and_data_yaml(dataset: Path) -> None:
    root = dataset.parent
    config = yaml.safe_load(dataset.read_text())
    assert config["path"] == "."
    assert config["train"] == "images/train" and config["val"] == "images/val"
    assert config["templates"] == {"train": "templates/train", "val": "templates/val"}
    assert (
        config["names"]
        == list(CLASS_NAMES)
        == ["open", "short", "mousebite", "spur", "copper", "pin-hole", "missing-hole"]
    )
    images = _images(root)
    assert len(images) == 4
    assert {path.parent.name for path in images} == {"train", "val"}
    for image_path in images:
        split, name = image_path.parent.name, image_path.stem
        assert (root / "labels" / split / f"{name}.txt").is_file()
        template = cv2.imread(str(root / "templates" / split / f"{name}.png"), cv2.IMREAD_UNCHANGED)
        image = cv2.imread(str(image_path), cv2.IMREAD_UNCHANGED)
        assert image.dtype == np.uint8 and image.ndim == 2  # grayscale by default
        assert template.shape == image.shape
        assert 256 <= image.shape[0] <= 320 and 256 <= image.shape[1] <= 320


def test_label_boxes_inside_and_classes_in_range(dataset: Path) -> None:
    root = dataset.parent
    total = 0
    for image_path in _images(root):
        height, width = cv2.imread(str(image_path), cv2.IMREAD_GRAYSCALE).shape
        lines = (root / "labels" / image_path.parent.name / f"{image_path.stem}.txt").read_text().splitlines()
        assert 3 <= len(lines) <= 12
        for line in lines:
            fields = line.split()
            assert len(fields) == 5 and all(len(value.split(".")[1]) == 6 for value in fields[1:])
            class_id = int(fields[0])
            cx, cy, box_w, box_h = map(float, fields[1:])
            assert 0 <= class_id < len(CLASS_NAMES)
            assert box_w > 0 and box_h > 0
            assert cx - box_w / 2 >= -1e-6 and cx + box_w / 2 <= 1 + 1e-6
            assert cy - box_h / 2 >= -1e-6 and cy + box_h / 2 <= 1 + 1e-6
            # annotator padding: small defects are not sub-15 px boxes
            assert min(box_w * width, box_h * height) >= 15
            total += 1
    assert total >= 12


def test_deterministic_and_seed_dependent(dataset: Path, tmp_path: Path) -> None:
    again = synthesize_dataset(tmp_path / "again", seed=3, **SMALL).parent
    root = dataset.parent
    assert _labels(again) == _labels(root)
    for first, second in zip(
        _images(root) + _images(root, "templates"), _images(again) + _images(again, "templates"), strict=True
    ):
        assert first.name == second.name
        assert np.array_equal(
            cv2.imread(str(first), cv2.IMREAD_UNCHANGED), cv2.imread(str(second), cv2.IMREAD_UNCHANGED)
        )
    other = synthesize_dataset(tmp_path / "other", seed=4, **SMALL).parent
    assert _labels(other) != _labels(root)


def _structure(image: np.ndarray) -> np.ndarray:
    """High-pass: lighting, exposure and glare differ between the two renders on purpose."""
    image = image.astype(np.float32)
    return image - cv2.GaussianBlur(image, (0, 0), 8)


def test_defects_change_pixels_inside_boxes_only() -> None:
    """Tested vs template differ strongly inside every box and only sparsely outside."""
    ratios = []
    for index in range(6):
        board = generate_board(11, index, min_size=256, max_size=320)
        difference = np.abs(_structure(board.image) - _structure(board.template)) > 40
        inside = np.zeros(difference.shape, bool)
        for x1, y1, x2, y2 in board.boxes.astype(int):
            assert difference[y1:y2, x1:x2].sum() >= 10, "a defect box shows no change"
            inside[y1:y2, x1:x2] = True
        density_inside = difference[inside].mean()
        density_outside = difference[~inside].mean()
        assert density_inside > 0.02
        ratios.append(density_inside / max(density_outside, 1e-6))
    # misregistration leaves thin edge differences outside (as in DeepPCB), defects dominate
    assert min(ratios) > 3
    assert float(np.median(ratios)) > 8


def test_boxes_do_not_overlap_heavily() -> None:
    for index in range(4):
        boxes = generate_board(5, index, min_size=256, max_size=320).boxes
        for first in range(len(boxes)):
            for second in range(first + 1, len(boxes)):
                a, b = boxes[first], boxes[second]
                width = min(a[2], b[2]) - max(a[0], b[0])
                height = min(a[3], b[3]) - max(a[1], b[1])
                if width > 0 and height > 0:
                    smaller = min((a[2] - a[0]) * (a[3] - a[1]), (b[2] - b[0]) * (b[3] - b[1]))
                    assert width * height / smaller < 0.3


def test_several_classes_per_board_and_all_classes_used() -> None:
    seen: set[int] = set()
    for index in range(6):
        classes = generate_board(2, index, min_size=256, max_size=320).classes
        assert len(set(classes.tolist())) >= 3
        seen |= set(classes.tolist())
    assert seen == set(range(len(CLASS_NAMES)))


def test_without_template_and_color(tmp_path: Path) -> None:
    data_yaml = synthesize_dataset(tmp_path / "plain", seed=1, template=False, color=True, **SMALL)
    config = yaml.safe_load(data_yaml.read_text())
    assert "templates" not in config
    assert not (tmp_path / "plain" / "templates").exists()
    image = cv2.imread(str(_images(tmp_path / "plain")[0]), cv2.IMREAD_UNCHANGED)
    assert image.ndim == 3 and image.shape[2] == 3
    assert np.abs(image[..., 1].astype(int) - image[..., 0].astype(int)).mean() > 10  # not gray


def test_rejects_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(DefectDetError, match="boards"):
        synthesize_dataset(tmp_path / "bad", boards=0, progress=False)
    with pytest.raises(DefectDetError, match="min_size"):
        synthesize_dataset(tmp_path / "bad", min_size=500, max_size=400, progress=False)
    with pytest.raises(DefectDetError, match="seed"):
        synthesize_dataset(tmp_path / "bad", seed=-1, progress=False)


def test_loads_through_formats(dataset: Path) -> None:
    train = load_dataset(dataset, split="train")
    val = load_dataset(dataset, split="val")
    assert len(train.samples) + len(val.samples) == 4
    assert list(train.class_names) == list(CLASS_NAMES)
    for sample in train.samples + val.samples:
        assert sample.template_path is not None and Path(sample.template_path).is_file()
        assert len(sample.boxes) == len(sample.classes) >= 3
        assert (sample.boxes[:, 2] > sample.boxes[:, 0]).all()
        assert (sample.boxes[:, 2] <= sample.width + 1e-3).all()
    assert not [problem for problem in train.problems if problem.severity == "error"]

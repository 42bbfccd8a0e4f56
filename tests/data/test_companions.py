"""Companion captures: aligned extra planes of each image, read, augmented and stacked with it."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from companion_data import COMPANION, make_companion_dataset

from defectdet.data.check import check_dataset
from defectdet.data.formats import load_dataset
from defectdet.data.formats.coco import read_coco
from defectdet.data.holdout import grouped_hold_out
from defectdet.data.letterbox import letterbox_image
from defectdet.data.planes import input_array, stack_planes
from defectdet.data.sample import DatasetSplit, Sample, common_companions, companion_name_problem
from defectdet.errors import DatasetError
from defectdet.trainingdata.augment import AugmentConfig, build_augment
from defectdet.trainingdata.dataset import DetectionDataset, Draws, ItemLayout, Reading

AGDD = Path(__file__).resolve().parents[3] / "shared" / "datasets" / "agdd"  # ../shared beside the repo
PLANES_ONLY = {  # no photometric change and no pair jitter: every plane gets exactly the image's geometry
    "brightness_contrast_prob": 0.0,
    "gamma_prob": 0.0,
    "blur_prob": 0.0,
    "noise_prob": 0.0,
    "glare_prob": 0.0,
    "pair_jitter_prob": 0.0,
}


@pytest.fixture
def companion_yaml(tmp_path: Path) -> Path:
    return make_companion_dataset(tmp_path / "parts")


def test_companion_dataset_is_aligned_and_differs(companion_yaml: Path) -> None:
    root = companion_yaml.parent
    image = cv2.imread(str(root / "images" / "train" / "train_000.png"), cv2.IMREAD_GRAYSCALE)
    companion = cv2.imread(str(root / COMPANION / "train_000.png"), cv2.IMREAD_GRAYSCALE)
    assert image.shape == companion.shape == (96, 96)
    assert abs(float(image.mean()) - float(companion.mean())) > 10


def test_yaml_companions_found_per_image_with_missing_ones_warned_and_counted(companion_yaml: Path) -> None:
    (companion_yaml.parent / COMPANION / "val_010.png").unlink()
    train, val = load_dataset(companion_yaml, "train"), load_dataset(companion_yaml, "val")
    assert train.companion_names == val.companion_names == [COMPANION]
    assert all(s.companion_paths[COMPANION].name == s.image_path.name for s in train.samples)
    assert common_companions(train.samples, train.companion_names) == [COMPANION]
    assert common_companions(val.samples, val.companion_names) == []
    messages = [f"{p.path}: {p.message}" for p in val.problems if p.severity == "warning"]
    assert any("val_010.png: companion 'L2' not found" in message for message in messages)
    assert any("1 of 4 images have no companion 'L2'" in message for message in messages)
    report = check_dataset(companion_yaml)
    stats = {split.name: split for split in report.splits}
    assert stats["val"].companions_found == {COMPANION: 3} and stats["val"].companions_missing == {
        COMPANION: 1
    }
    assert stats["train"].companions_found == {COMPANION: 8}


def test_yaml_companion_folder_per_split_and_name_errors(companion_yaml: Path) -> None:
    text = companion_yaml.read_text().replace(f"  {COMPANION}: {COMPANION}\n", "")
    companion_yaml.write_text(text + f"  {COMPANION}:\n    val: {COMPANION}\n")
    assert load_dataset(companion_yaml, "train").companion_names == []
    assert load_dataset(companion_yaml, "val").companion_names == [COMPANION]
    for bad, why in (("2nd", "must start with a letter"), ("template", "is reserved"), ("a b", "letters")):
        companion_yaml.write_text(text + f"  '{bad}': {COMPANION}\n")
        with pytest.raises(DatasetError, match=rf"data\.yaml: field 'companions': companion name .*{why}"):
            load_dataset(companion_yaml, "train")
    assert companion_name_problem("L2") is None and companion_name_problem("x" * 33) is not None


def test_check_warns_when_a_companion_is_the_image_itself(companion_yaml: Path) -> None:
    import shutil

    shutil.copytree(companion_yaml.parent / "images" / "train", companion_yaml.parent / "copies")
    text = companion_yaml.read_text().replace(f"  {COMPANION}: {COMPANION}\n", "  L2: copies\n")
    companion_yaml.write_text(text)
    messages = [p.message for p in check_dataset(companion_yaml).problems]
    assert sum("companion 'L2' is the same file content as its image" in m for m in messages) == 8
    companion_yaml.write_text(text.replace("  L2: copies\n", "  L2: images/train\n"))
    split = load_dataset(companion_yaml, "train")  # the image's own folder: never the image itself
    assert not any(sample.companion_paths for sample in split.samples)
    assert sum("companion 'L2' not found" in p.message for p in split.problems) == 8


def _agdd_like_coco(folder: Path, records: list[dict]) -> Path:
    """A COCO json whose images are the companion dataset's train images (in `folder`/images)."""
    document = {
        "images": records,
        "annotations": [{"id": 1, "image_id": 1, "category_id": 1, "bbox": [4, 4, 10, 10]}],
        "categories": [{"id": 1, "name": "defect"}],
    }
    path = folder / "train.json"
    path.write_text(json.dumps(document))
    return path


def test_coco_companions_field_order_missing_and_containment(companion_yaml: Path) -> None:
    root = companion_yaml.parent
    records = [
        {"id": 1, "file_name": "images/train/train_000.png", "companions": {"L2": "L2/train_000.png"}},
        {"id": 2, "file_name": "images/train/train_001.png", "companions": {"UV": "L2/x.png", "L2": "L2/train_001.png"}},
    ]  # fmt: skip
    split = read_coco(_agdd_like_coco(root, records))
    assert split.companion_names == ["L2", "UV"]  # first-seen order
    assert [sorted(s.companion_paths) for s in split.samples] == [["L2"], ["L2"]]
    assert split.samples[0].companion_paths["L2"] == root / "L2" / "train_000.png"
    assert any("companion 'UV' file 'L2/x.png' not found" in p.message for p in split.problems)
    records[1]["companions"] = {"L2": "../outside.png"}
    contained = read_coco(_agdd_like_coco(root, records), contained=True)
    assert [s.image_id for s in contained.samples] == ["1"]
    assert any("companions.L2 '../outside.png' leads out" in p.message for p in contained.problems)
    records[1]["companions"] = {"nms_iou": "L2/train_001.png"}
    with pytest.raises(
        DatasetError, match=r"train\.json: images\[1\] \(id 2\): field 'companions'.*reserved"
    ):
        read_coco(_agdd_like_coco(root, records))


def test_planes_stack_in_contract_order() -> None:
    image, template, first, second = (np.full((4, 5), value, np.uint8) for value in (1, 2, 3, 4))
    stacked = stack_planes(image, template, [first, second])
    assert stacked.shape == (4, 4, 5) and stacked[:, 0, 0].tolist() == [1, 2, 3, 4]
    assert stack_planes(image, None, [second])[:, 0, 0].tolist() == [1, 4]
    assert input_array(image, None, companions=[first]).dtype == np.float32
    with pytest.raises(ValueError, match="differs"):
        stack_planes(image, None, [np.zeros((4, 6), np.uint8)])


@pytest.mark.parametrize("rgb", [False, True])
def test_geometry_keeps_a_companion_equal_to_its_image(rgb: bool) -> None:
    rng = np.random.default_rng(0)
    image = rng.integers(0, 255, (64, 64, 3) if rgb else (64, 64), dtype=np.uint8)
    config = AugmentConfig(rotate_degrees=20, scale=(0.7, 1.3), translate=0.2, **PLANES_ONLY)
    augmenter = build_augment(config, train=True, seed=1)
    moved = 0
    for seed in range(10):
        augmenter.reseed(seed)
        out, template, planes, _, _ = augmenter.augment(
            image, image.copy(), [image.copy()] * 2, np.zeros((0, 4)), []
        )
        assert all(np.array_equal(out, plane) for plane in (template, *planes))
        moved += not np.array_equal(out, image)
    assert moved >= 8
    jitter = build_augment(AugmentConfig(pair_shift=3.0, **{**PLANES_ONLY, "pair_jitter_prob": 1.0}))
    out, _, planes, _, _ = jitter.augment(image, None, [image.copy()], np.zeros((0, 4)), [])
    assert not np.array_equal(out, planes[0])  # each companion gets its own small misalignment


def test_companion_draws_leave_the_image_and_template_draws_unchanged() -> None:
    rng = np.random.default_rng(1)
    image, template = (rng.integers(0, 255, (48, 48), dtype=np.uint8) for _ in range(2))
    augmenter = build_augment(AugmentConfig(), train=True, seed=0)
    for seed in range(5):
        augmenter.reseed(seed)
        plain = augmenter.augment(image, template, [], np.zeros((0, 4)), [])
        augmenter.reseed(seed)
        with_companion = augmenter.augment(image, template, [image.copy()], np.zeros((0, 4)), [])
        assert np.array_equal(plain[0], with_companion[0]) and np.array_equal(plain[1], with_companion[1])


def test_dataset_stacks_image_then_companion(companion_yaml: Path) -> None:
    split = load_dataset(companion_yaml, "train")
    dataset = DetectionDataset(
        split,
        ItemLayout(input_size=64, dtype=torch.uint8, companions=[COMPANION]),
        reading=Reading(cache_bytes=10**6),
    )
    tensor, target, meta = dataset[0]
    assert dataset.input_channels == 2 and tensor.shape == (2, 64, 64) == dataset.output_shape
    sample = dataset.samples[0]
    for plane, path in enumerate((sample.image_path, sample.companion_paths[COMPANION])):
        expected, _ = letterbox_image(cv2.imread(str(path), cv2.IMREAD_GRAYSCALE), 64)
        assert np.array_equal(tensor[plane].numpy(), expected)
    assert meta["companion_paths"] == {COMPANION: str(sample.companion_paths[COMPANION])}
    assert dataset.cache_info["bytes"] == 2 * 64 * 64  # both planes cached
    rgb = DetectionDataset(
        split,
        ItemLayout(input_size=64, channels=3, companions=[COMPANION]),
        Draws(augment=AugmentConfig(), train=True, crop_size=32),
    )
    assert rgb[1][0].shape == (6, 32, 32) and DetectionDataset(split, ItemLayout(input_size=64))[0][
        0
    ].shape == (
        1,
        64,
        64,
    )


def test_dataset_planes_are_image_template_companion(companion_yaml: Path) -> None:
    # each image is its own template
    companion_yaml.write_text(companion_yaml.read_text() + "templates: {train: images/train}\n")
    split = load_dataset(companion_yaml, "train")
    dataset = DetectionDataset(
        split,
        ItemLayout(input_size=96, dtype=torch.uint8, companions=[COMPANION]),
        reading=Reading(register_pairs=False),
    )
    tensor = dataset[0][0]
    assert dataset.use_template and tensor.shape == (3, 96, 96)
    companion = cv2.imread(str(dataset.samples[0].companion_paths[COMPANION]), cv2.IMREAD_GRAYSCALE)
    assert torch.equal(tensor[0], tensor[1]) and np.array_equal(tensor[2].numpy(), companion)


def test_dataset_leaves_out_samples_without_the_companion(
    companion_yaml: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (companion_yaml.parent / COMPANION / "train_002.png").unlink()
    split = load_dataset(companion_yaml, "train")
    with caplog.at_level(logging.WARNING, logger="defectdet.trainingdata.dataset"):
        dataset = DetectionDataset(split, ItemLayout(input_size=32, companions=[COMPANION]))
    assert len(dataset) == 7 and [Path(p).name for p in dataset.left_out] == ["train_002.png"]
    assert any("leaving out 1 of 8 images" in record.getMessage() for record in caplog.records)
    (companion_yaml.parent / COMPANION / "train_003.png").write_bytes(b"not a png")
    assert dataset[2] is None and dataset.skipped_paths[0].endswith("L2/train_003.png")
    with pytest.raises(DatasetError, match="no image of split 'train' has the companion 'UV'"):
        DetectionDataset(split, ItemLayout(input_size=32, companions=["UV"]))


def test_hold_out_keeps_an_image_and_its_companion_together() -> None:
    names = [f"part{letter}x" for letter in "abcdefghijklmnopqrst"]  # no frame numbers: no series
    samples = [Sample(Path(f"/d/{n}.png"), np.zeros((0, 4)), np.zeros(0)) for n in names]
    for first, second in zip(
        samples[::2], samples[1::2], strict=True
    ):  # unrelated names: only the file joins
        first.companion_paths["L2"] = second.image_path
    split = DatasetSplit(samples, ["defect"], "coco", "all", Path("/d"), companion_names=["L2"])
    held = grouped_hold_out(split, 0.3, signatures=False)
    assert held.val.companion_names == ["L2"] and held.grouping.count == 10
    val = {s.image_path for s in held.val.samples}
    assert all((s.image_path in val) == (s.companion_paths["L2"] in val) for s in samples[::2])


@pytest.mark.skipif(not (AGDD / "train.json").is_file(), reason="needs ../shared/datasets/agdd")
def test_agdd_second_lighting_as_a_companion(tmp_path: Path) -> None:
    document = json.loads((AGDD / "train.json").read_text())
    images = [record for record in document["images"] if record["file_name"].endswith("_L1.png")][:4]
    for record in images:
        record["companions"] = {"L2": record["file_name"].replace("_L1.png", "_L2.png")}
    ids = {record["id"] for record in images}
    subset = {
        "images": images,
        "annotations": [a for a in document["annotations"] if a["image_id"] in ids],
        "categories": document["categories"],
    }
    path = tmp_path / "agdd_l1.json"
    path.write_text(json.dumps(subset))
    split = read_coco(path, image_roots=(AGDD / "images",))
    assert len(split.samples) == 4 and split.companion_names == ["L2"] and not split.problems
    dataset = DetectionDataset(split, ItemLayout(input_size=160, dtype=torch.uint8, companions=["L2"]))
    tensor, target, _ = dataset[0]
    assert tensor.shape == (2, 160, 160) and len(target) > 0
    sample = dataset.samples[0]
    for plane, file in enumerate((sample.image_path, sample.companion_paths["L2"])):
        expected, _ = letterbox_image(cv2.imread(str(file), cv2.IMREAD_GRAYSCALE), 160)
        assert np.array_equal(tensor[plane].numpy(), expected)
    assert not torch.equal(tensor[0], tensor[1])  # two lightings, not one image twice

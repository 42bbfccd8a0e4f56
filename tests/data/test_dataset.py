"""DetectionDataset shapes and targets, crops, collate, bad files, the loader, and (seed, epoch, index) draws."""

from __future__ import annotations

import logging
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

from defectdet.data.sample import DatasetSplit, Sample
from defectdet.engine.loader import SampleIndex, build_loader, default_workers, start_epoch
from defectdet.errors import DatasetError
from defectdet.trainingdata.augment import AugmentConfig
from defectdet.trainingdata.dataset import DetectionDataset, Draws, ItemLayout, Reading, collate_detections

CLASS_NAMES = ["open", "short", "spur"]


def write_pair(
    folder: Path, name: str, width: int, height: int, boxes: list[list[float]], seed: int
) -> Sample:
    rng = np.random.default_rng(seed)
    template = (rng.random((height, width, 3)) * 60).astype(np.uint8)
    image = template.copy()
    for x1, y1, x2, y2 in boxes:
        image[int(y1) : int(y2), int(x1) : int(x2)] = 250
    image_path, template_path = folder / f"{name}_test.png", folder / f"{name}_temp.png"
    cv2.imwrite(str(image_path), image)
    cv2.imwrite(str(template_path), template)
    classes = [index % len(CLASS_NAMES) for index in range(len(boxes))]
    return Sample(image_path, np.array(boxes, dtype=np.float32), np.array(classes), template_path)


@pytest.fixture
def split(tmp_path: Path) -> DatasetSplit:
    samples = [
        write_pair(tmp_path, "a", 96, 64, [[10, 10, 30, 24], [60, 40, 80, 60]], seed=0),
        write_pair(tmp_path, "b", 64, 96, [], seed=1),
        write_pair(tmp_path, "c", 80, 80, [[5, 50, 15, 79]], seed=2),
    ]
    return DatasetSplit(samples, CLASS_NAMES, "yolo", "train", tmp_path)


@pytest.mark.parametrize(
    ("channels", "use_template", "expected"), [(1, False, 1), (1, True, 2), (3, False, 3), (3, True, 6)]
)
def test_item_shapes_and_targets(
    split: DatasetSplit, channels: int, use_template: bool, expected: int
) -> None:
    dataset = DetectionDataset(split, ItemLayout(input_size=64, channels=channels, template=use_template))
    assert dataset.output_shape == (expected, 64, 64)
    image, target, meta = dataset[0]
    assert image.shape == (expected, 64, 64) and image.dtype == torch.float32
    assert 0.0 <= float(image.min()) and float(image.max()) <= 1.0
    # a 96x64 image letterboxed to 64: 64x43 pixels (x scale 2/3, y scale 43/64), pad_y = (64 - 43) // 2 = 10
    transform = meta["transform"]
    assert meta["orig_size"] == (96, 64)
    assert (transform.scale_x, transform.scale_y) == pytest.approx((2 / 3, 43 / 64))
    sx, sy, pad_y = 2 / 3, 43 / 64, 10
    expected_target = [
        [0, 10 * sx, 10 * sy + pad_y, 30 * sx, 24 * sy + pad_y],
        [1, 60 * sx, 40 * sy + pad_y, 80 * sx, 60 * sy + pad_y],
    ]
    torch.testing.assert_close(target, torch.tensor(expected_target), atol=1e-4, rtol=0)
    if use_template:
        # the template half has no bright defect squares, the tested half does
        assert float(image[channels:].max()) < 0.5 < float(image[:channels].max())


def test_uint8_images_hold_the_same_pixels(split: DatasetSplit) -> None:
    as_float = DetectionDataset(split, ItemLayout(input_size=64))[0][0]
    as_bytes = DetectionDataset(split, ItemLayout(input_size=64, dtype=torch.uint8))[0][0]
    assert as_bytes.dtype == torch.uint8
    torch.testing.assert_close(as_bytes.float() / 255, as_float)


def test_template_is_automatic_only_when_every_sample_has_one(split: DatasetSplit) -> None:
    assert DetectionDataset(split, ItemLayout(input_size=64)).use_template
    split.samples[1].template_path = None
    assert not DetectionDataset(split, ItemLayout(input_size=64)).use_template
    with pytest.raises(DatasetError, match="b_test.png"):
        DetectionDataset(split, ItemLayout(input_size=64, template=True))


@pytest.mark.parametrize("channels", [1, 3])
def test_training_crop_shapes_bias_and_bounds(split: DatasetSplit, channels: int) -> None:
    dataset = DetectionDataset(
        split,
        ItemLayout(input_size=64, channels=channels),
        Draws(augment=AugmentConfig(), train=True, crop_size=32, seed=1),
    )
    assert dataset.output_shape == (2 * channels, 32, 32)
    with_defect = 0
    for _ in range(25):
        image, target, meta = dataset[2]  # one 10x29 px box
        assert image.shape == (2 * channels, 32, 32)
        assert target.shape[1] == 5
        boxes = target[:, 1:]
        assert (boxes >= 0).all() and (boxes <= 32).all()
        assert (boxes[:, 2:] > boxes[:, :2]).all()
        offset_x, offset_y = meta["crop_offset"]
        assert 0 <= offset_x <= 32 and 0 <= offset_y <= 32
        with_defect += len(target) > 0
    assert with_defect >= 15  # 80% of crops aim at a defect; uniform crops would hit far less often


def test_evaluation_ignores_crop_and_augmentation(split: DatasetSplit) -> None:
    dataset = DetectionDataset(
        split, ItemLayout(input_size=64), Draws(augment=AugmentConfig(), train=False, crop_size=32)
    )
    first, second = dataset[0], dataset[0]
    assert first[0].shape == (2, 64, 64)
    assert torch.equal(first[0], second[0]) and torch.equal(first[1], second[1])


def test_template_of_another_size_is_resized_with_one_warning(
    split: DatasetSplit, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    for sample in split.samples:
        template = cv2.imread(str(sample.template_path))
        cv2.imwrite(str(sample.template_path), cv2.resize(template, (50, 50)))
    dataset = DetectionDataset(split, ItemLayout(input_size=64))
    with caplog.at_level(logging.WARNING, logger="defectdet.trainingdata.dataset"):
        shapes = [dataset[index][0].shape for index in range(3)]
    assert shapes == [(2, 64, 64)] * 3
    assert sum("resizing templates" in record.getMessage() for record in caplog.records) == 1


def test_collate_varying_counts_and_failures(split: DatasetSplit) -> None:
    dataset = DetectionDataset(split, ItemLayout(input_size=64))
    items = [dataset[0], dataset[1], None, dataset[2]]
    images, targets, metas = collate_detections(items)
    assert images.shape == (3, 2, 64, 64)
    assert [len(target) for target in targets] == [2, 0, 1]
    assert targets[1].shape == (0, 5)
    assert [meta["image_id"] for meta in metas] == ["a_test", "b_test", "c_test"]
    empty, targets, metas = collate_detections([None, None], empty_shape=dataset.output_shape)
    assert empty.shape == (0, 2, 64, 64) and targets == [] and metas == []


def test_corrupt_image_is_skipped_with_one_warning(
    split: DatasetSplit, caplog: pytest.LogCaptureFixture
) -> None:
    broken = split.samples[1].image_path
    broken.write_bytes(b"\x89PNG\r\n\x1a\n not really a png")
    dataset = DetectionDataset(split, ItemLayout(input_size=64))
    loader = build_loader(dataset, batch_size=3, train=False, workers=0)
    with caplog.at_level(logging.WARNING, logger="defectdet.trainingdata.dataset"):
        for _ in range(2):  # two epochs: the file is named once
            (images, targets, metas) = next(iter(loader))
            assert images.shape == (2, 2, 64, 64)
            assert [meta["image_id"] for meta in metas] == ["a_test", "c_test"]
    assert dataset.skipped_paths == [str(broken)]
    messages = [record.getMessage() for record in caplog.records if str(broken) in record.getMessage()]
    assert len(messages) == 1


def test_all_failed_batch_is_empty(split: DatasetSplit) -> None:
    for sample in split.samples:
        sample.image_path.write_bytes(b"")
    loader = build_loader(
        DetectionDataset(split, ItemLayout(input_size=64)), batch_size=3, train=False, workers=0
    )
    images, targets, _ = next(iter(loader))
    assert images.shape == (0, 2, 64, 64) and targets == []


def test_loader_defaults(split: DatasetSplit) -> None:
    dataset = DetectionDataset(split, ItemLayout(input_size=64), Draws(augment=AugmentConfig(), train=True))
    loader = build_loader(dataset, batch_size=2, train=True, workers=0)
    assert loader.drop_last and loader.num_workers == 0 and not loader.pin_memory
    assert len(loader) == 1  # 3 samples, batch 2, last partial batch dropped
    tiny = build_loader(dataset, batch_size=8, train=True, workers=0)
    assert not tiny.drop_last and len(tiny) == 1  # fewer samples than a batch: keep them
    assert 0 <= default_workers() <= 8
    assert default_workers(world_size=64) == 0  # a rank with <= 2 cores loads in-process


def augmented_items(dataset: DetectionDataset, workers: int, epoch: int = 0) -> list[torch.Tensor]:
    loader = build_loader(dataset, batch_size=2, train=True, workers=workers, seed=3)
    start_epoch(loader, epoch, seed=3)
    return [image for images, _, _ in loader for image in images]


def test_items_depend_on_seed_epoch_and_index_only(tmp_path: Path) -> None:
    # four copies of one image: only the (seed, epoch, index) draws tell the items apart
    sample = write_pair(tmp_path, "same", 48, 48, [[10, 10, 20, 20]], seed=0)
    split = DatasetSplit([sample] * 4, CLASS_NAMES, "yolo", "train", tmp_path)

    def dataset(seed: int = 0) -> DetectionDataset:
        return DetectionDataset(
            split,
            ItemLayout(input_size=48),
            Draws(augment=AugmentConfig(), train=True, crop_size=40, seed=seed),
        )

    first = dataset()
    item = first[SampleIndex(2, epoch=5)][0]
    for _ in range(3):  # whatever was drawn before, in this or another instance
        first[SampleIndex(1, epoch=0)]
        first[0]
    assert torch.equal(dataset()[SampleIndex(2, epoch=5)][0], item)
    assert torch.equal(first[SampleIndex(2, epoch=5)][0], item)
    assert not torch.equal(first[SampleIndex(2, epoch=6)][0], item)  # another epoch, other draws
    assert not torch.equal(first[SampleIndex(3, epoch=5)][0], item)  # another index, other draws
    assert not torch.equal(dataset(seed=1)[SampleIndex(2, epoch=5)][0], item)
    # plain int indices still vary from call to call
    assert not all(torch.equal(first[0][0], first[0][0]) for _ in range(3))

    # the parent has used OpenCV's thread pool before forking workers (regression: a deadlock)
    cv2.warpAffine(np.zeros((512, 512), np.uint8), np.eye(2, 3), (512, 512))
    in_process = augmented_items(first, workers=0, epoch=1)
    with_workers = augmented_items(dataset(), workers=2, epoch=1)
    assert len(in_process) == 4
    assert all(torch.equal(a, b) for a, b in zip(in_process, with_workers, strict=True))
    assert not all(
        torch.equal(a, b) for a, b in zip(in_process, augmented_items(first, workers=0, epoch=2), strict=True)
    )


def test_the_decoded_image_cache_changes_nothing_but_the_work(split: DatasetSplit) -> None:
    def dataset(cache_bytes: int) -> DetectionDataset:
        return DetectionDataset(
            split,
            ItemLayout(input_size=96, template=True),
            Draws(augment=AugmentConfig(), train=True, crop_size=64),
            Reading(cache_bytes=cache_bytes),
        )

    cached, plain = dataset(10 * 2**20), dataset(0)
    for epoch in (0, 1):  # the second epoch reads from the cache
        for index in range(len(split.samples)):
            ours, theirs = cached[SampleIndex(index, epoch)], plain[SampleIndex(index, epoch)]
            assert torch.equal(ours[0], theirs[0]) and torch.equal(ours[1], theirs[1])
    assert cached.cache_info == {"samples": 3, "bytes": 3 * 2 * 96 * 96, "budget_bytes": 10 * 2**20}
    assert plain.cache_info["samples"] == 0
    small = dataset(2 * 96 * 96 + 10)  # room for one pair only
    for index in range(3):
        small[SampleIndex(index, 0)]
    assert small.cache_info["samples"] == 1 and small.cache_info["bytes"] <= small.cache_bytes

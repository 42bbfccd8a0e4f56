"""A dataset without a validation split: the trainer holds out whole groups and says so in its settings table."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import cv2
import numpy as np
import pytest

from defectdet.engine.config import TrainConfig
from defectdet.engine.trainer import build_train_data


def _series_coco(folder: Path, parts: int, frames: int) -> Path:
    """`parts` parts, each filmed as `frames` numbered frames (`partN_frameK.png`), one box each."""
    rng = np.random.default_rng(1)
    images, annotations = [], []
    for part in range(parts):
        base = cv2.resize(rng.uniform(0, 255, (8, 8)).astype(np.float32), (96, 96))
        for frame in range(frames):
            name = f"part{part}_{frame:03d}.png"
            cv2.imwrite(
                str(folder / name), np.clip(base + rng.normal(0, 3, base.shape), 0, 255).astype(np.uint8)
            )
            image_id = len(images) + 1
            images.append({"id": image_id, "file_name": name, "width": 96, "height": 96})
            annotations.append(
                {
                    "id": image_id,
                    "image_id": image_id,
                    "category_id": 1,
                    "bbox": [30, 30, 20, 12],
                    "iscrowd": 0,
                }
            )
    path = folder / "all.json"
    categories = [{"id": 1, "name": "scratch"}]
    path.write_text(json.dumps({"images": images, "annotations": annotations, "categories": categories}))
    return path


def test_the_settings_table_says_how_the_held_out_split_was_grouped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    data = _series_coco(tmp_path, parts=8, frames=4)
    with caplog.at_level(logging.WARNING):
        built = build_train_data(TrainConfig(data=data, epochs=1, workers=0, progress=False))
    row = next(choice for choice in built.choices if choice.name == "validation")
    val_parts = {s.image_path.name.split("_")[0] for s in built.val.split.samples}
    train_parts = {s.image_path.name.split("_")[0] for s in built.train.split.samples}
    assert val_parts and not val_parts & train_parts  # no part on both sides
    assert row.value == f"{len(built.val.split.samples)} images, {len(val_parts)} groups"
    assert "8 groups of 32 images" in row.reason and "series 24" in row.reason
    assert "too small to trust" in row.reason and "too small to trust" in caplog.text  # < 20 images held out


def test_val_on_the_training_data_scores_the_held_out_groups_only(tmp_path: Path) -> None:
    from defectdet.engine.trainer import train
    from defectdet.engine.validate import validate

    data = _series_coco(tmp_path, parts=8, frames=4)
    config = TrainConfig(
        data=data, input_size=96, batch=4, max_steps=1, workers=0, progress=False, out=tmp_path / "run"
    )
    built = build_train_data(config)
    result = train(built.config, data=built)
    held = len(built.val.split.samples)
    metrics = validate(result.last_checkpoint, data, split="val", protocol="coco", out=tmp_path / "val")
    assert metrics["num_images"] == held < 32  # not the images it trained on
    other = tmp_path / "other.json"  # the same images under another dataset: every image is scored
    other.write_text(data.read_text())
    metrics = validate(result.last_checkpoint, other, split="val", protocol="coco", out=tmp_path / "val2")
    assert metrics["num_images"] == 32

"""Single-split datasets get a stable, disjoint validation hold-out."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from defectdet.data.holdout import hold_out, same_images
from defectdet.data.sample import DatasetSplit, Sample


def _split(names: list[str]) -> DatasetSplit:
    samples = [Sample(Path(f"/data/{n}.png"), np.zeros((0, 4)), np.zeros((0,))) for n in names]
    return DatasetSplit(samples, ["defect"], "coco", "all", Path("/data"))


def test_hold_out_is_disjoint_complete_and_stable() -> None:
    split = _split([f"img{i:03d}" for i in range(200)])
    train, val = hold_out(split, 0.2)
    train_names = {s.image_path.name for s in train.samples}
    val_names = {s.image_path.name for s in val.samples}
    assert not train_names & val_names
    assert len(train_names) + len(val_names) == 200
    assert 20 <= len(val_names) <= 60
    # order of samples does not matter: the hash of the file name decides
    shuffled = _split([f"img{i:03d}" for i in reversed(range(200))])
    assert {s.image_path.name for s in hold_out(shuffled, 0.2)[1].samples} == val_names


def test_tiny_dataset_still_holds_one_out_and_same_images_detects_one_split() -> None:
    split = _split(["a", "b"])
    train, val = hold_out(split, 0.2)
    assert len(val.samples) == 1 and len(train.samples) == 1
    assert same_images(split, _split(["b", "a"]))
    assert not same_images(train, val)

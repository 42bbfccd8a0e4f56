"""Single-split datasets get a stable, disjoint validation hold-out."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from defectdet.data.grouping import SERIES_BLOCK
from defectdet.data.holdout import grouped_hold_out, hold_out, same_images
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


def _scenes(folder: Path, scenes: int, frames: int) -> DatasetSplit:
    """`scenes` distinct random textures, each saved as `frames` near-identical frames (a little noise, a
    one-pixel shift) under unrelated file names, so only the image signature can join them."""
    import cv2

    rng = np.random.default_rng(0)
    samples = []
    for scene in range(scenes):
        base = cv2.resize(rng.uniform(0, 255, (8, 8)).astype(np.float32), (96, 96))
        for frame in range(frames):
            image = np.roll(base, frame % 2, axis=1) + rng.normal(0, 3, base.shape)
            name = f"{rng.integers(1 << 40):x}z.png"  # no series in the name
            cv2.imwrite(str(folder / name), np.clip(image, 0, 255).astype(np.uint8))
            samples.append(Sample(folder / name, np.zeros((0, 4)), np.zeros((0,)), image_id=f"s{scene}"))
    return DatasetSplit(samples, ["defect"], "coco", "all", folder)


def test_near_identical_frames_never_straddle_the_split(tmp_path: Path) -> None:
    split = _scenes(tmp_path, scenes=12, frames=5)
    held = grouped_hold_out(split, 0.2)
    assert held.grouping.signatures_checked and held.grouping.count == 12
    train_scenes = {s.image_id for s in held.train.samples}
    val_scenes = {s.image_id for s in held.val.samples}
    assert val_scenes and train_scenes and not train_scenes & val_scenes
    assert held.val_groups == len(val_scenes) and held.train_groups == len(train_scenes)
    # without the signature every frame is its own group and the scenes straddle
    loose = grouped_hold_out(split, 0.2, signatures=False)
    assert {s.image_id for s in loose.val.samples} & {s.image_id for s in loose.train.samples}
    # deterministic: the same split again, and from shuffled samples; another seed may pick other groups
    again = grouped_hold_out(DatasetSplit(split.samples[::-1], ["defect"], "coco", "all", tmp_path), 0.2)
    assert {s.image_path for s in again.val.samples} == {s.image_path for s in held.val.samples}
    assert held.too_small and "too small to trust" in held.describe()  # 12 images, 2-3 groups held out


def test_file_name_series_and_companion_captures_stay_together() -> None:
    names = [f"C{part:04d}_{frame:04d}" for part in range(30) for frame in range(4)]
    names += [f"{sample}_L{light}" for sample in range(100, 160) for light in (1, 2)]
    names += [f"crazing_{number}" for number in range(1, 41)]
    held = grouped_hold_out(_split(names), 0.2, signatures=False)
    side = {s.image_path.stem: "val" for s in held.val.samples}
    side |= {s.image_path.stem: "train" for s in held.train.samples}
    for part in range(30):
        assert len({side[f"C{part:04d}_{frame:04d}"] for frame in range(4)}) == 1
    for sample in range(100, 160):
        assert side[f"{sample}_L1"] == side[f"{sample}_L2"]
    # a letters-only prefix is a naming scheme: cut into blocks of consecutive numbers, not one group
    assert held.grouping.count == 30 + 60 + 40 // SERIES_BLOCK
    assert 0.1 * len(names) <= len(held.val.samples) <= 0.3 * len(names)
    assert not held.too_small and "held out" in held.describe()


AGDD = Path(__file__).resolve().parents[3] / "shared" / "datasets" / "agdd"


@pytest.mark.skipif(not (AGDD / "train.json").is_file(), reason="needs ../shared/datasets/agdd")
def test_agdd_both_lightings_of_a_sample_land_on_one_side() -> None:
    from defectdet.data.formats import load_dataset

    split = load_dataset(AGDD / "train.json", "train")
    held = grouped_hold_out(split, 0.2, signatures=False)  # the file names alone join the two lightings
    side = {s.image_path.name: "val" for s in held.val.samples}
    side |= {s.image_path.name: "train" for s in held.train.samples}
    pairs = [name for name in side if name.endswith("_L1.png")]
    assert len(pairs) == len(split.samples) // 2
    assert all(side[name] == side[name.replace("_L1.png", "_L2.png")] for name in pairs)
    assert held.grouping.rules["companion"] == len(pairs) and not held.too_small

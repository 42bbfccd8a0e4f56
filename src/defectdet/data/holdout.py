"""A validation hold-out for datasets that ship a single split (a lone COCO json, VOC without ImageSets)."""

from __future__ import annotations

import dataclasses
import hashlib

from defectdet.data.sample import DatasetSplit


def same_images(first: DatasetSplit, second: DatasetSplit) -> bool:
    """True when both splits list the same image files (the reader had only one split to give)."""
    return {s.image_path.resolve() for s in first.samples} == {s.image_path.resolve() for s in second.samples}


def hold_out(split: DatasetSplit, fraction: float = 0.2) -> tuple[DatasetSplit, DatasetSplit]:
    """Split by a hash of each image's file name: stable across runs, machines and sample order."""
    if not 0 < fraction < 1:
        raise ValueError(f"fraction must be in (0, 1), got {fraction}")

    def bucket(name: str) -> float:
        return int(hashlib.sha1(name.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF

    held = [s for s in split.samples if bucket(s.image_path.name) < fraction]
    if not held and len(split.samples) > 1:  # tiny datasets: still validate on something
        held = [min(split.samples, key=lambda s: bucket(s.image_path.name))]
    held_ids = {id(s) for s in held}
    kept = [s for s in split.samples if id(s) not in held_ids]
    return (
        dataclasses.replace(split, samples=kept, split=f"{split.split} (train part)"),
        dataclasses.replace(split, samples=held, split=f"{split.split} (held-out part)"),
    )

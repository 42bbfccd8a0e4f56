"""Old plus new data for a fine-tune (`train --from MODEL --old-data OLD`): one training split, with how it mixed.

The new images (relabelled captures, usually a few dozen) are repeated a whole number of times so they make at
least `new_share` of each epoch, and the old training set is kept whole so the model keeps seeing the old line.
Whole repeats keep the loader's order a pure function of (seed, epoch), as exact resume needs. Class ids of
the old data are remapped by name onto the new data's class list.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from defectdet.data.sample import DatasetSplit
from defectdet.errors import ConfigError


@dataclass(frozen=True)
class DataMix:
    """How a fine-tune's training split was made: images per source, the new images' repeat, the shares."""

    old_images: int
    new_images: int
    new_repeat: int
    wanted_share: float

    @property
    def new_share(self) -> float:
        drawn = self.new_images * self.new_repeat
        return drawn / max(1, drawn + self.old_images)

    def describe(self) -> str:
        return (
            f"old {self.old_images} + new {self.new_images} x{self.new_repeat} images per epoch: new "
            f"{self.new_share:.0%} of each epoch (at least {self.wanted_share:.0%} wanted, --new-share)"
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"new_share": round(self.new_share, 4)}


def remap_classes(split: DatasetSplit, class_names: list[str], source: str | Path) -> DatasetSplit:
    """`split` with its class ids moved onto `class_names` by name; ConfigError naming a class it lacks."""
    if list(split.class_names) == list(class_names):
        return split
    missing = [name for name in split.class_names if name not in class_names]
    if missing:
        raise ConfigError(
            f"{source}: classes {missing} are not in the new data's classes {class_names}; add them to the new "
            "data's class list so the old labels keep their meaning"
        )
    table = [class_names.index(name) for name in split.class_names]
    samples = []
    for sample in split.samples:
        classes = sample.classes.copy()
        valid = (classes >= 0) & (classes < len(table))
        classes[valid] = [table[index] for index in classes[valid].tolist()]
        samples.append(dataclasses.replace(sample, classes=classes))
    return dataclasses.replace(split, samples=samples, class_names=list(class_names))


def new_repeat(old_images: int, new_images: int, share: float) -> int:
    """The least whole repeat of the new images that makes them >= `share` of the mixed epoch."""
    if old_images == 0 or new_images == 0:
        return 1
    return max(1, math.ceil(share * old_images / ((1 - share) * new_images) - 1e-9))


def mix_splits(new: DatasetSplit, old: DatasetSplit, share: float) -> tuple[DatasetSplit, DataMix]:
    """The old split whole plus the new one repeated per `new_repeat` (same class list: remap first)."""
    repeat = new_repeat(len(old.samples), len(new.samples), share)
    samples = list(old.samples) + [sample for _ in range(repeat) for sample in new.samples]
    mixed = dataclasses.replace(new, samples=samples, class_names=list(new.class_names))
    return mixed, DataMix(len(old.samples), len(new.samples), repeat, share)

"""A validation hold-out for datasets that ship a single split (a lone COCO json, VOC without ImageSets).

Whole groups are held out (`data.grouping`: companion captures and templates, file-name series, near-duplicate
images), so frames of one part or both lightings of one sample never sit on both sides. Which groups: the
smallest hashes of each group's first file name, so the split is the same across runs, machines and sample order.
"""

from __future__ import annotations

import dataclasses
import hashlib

from defectdet.data.grouping import Grouping, group_samples
from defectdet.data.sample import DatasetSplit

MIN_TRUSTED_IMAGES = 20  # a held-out split smaller than this or than MIN_TRUSTED_GROUPS groups: warned
MIN_TRUSTED_GROUPS = 5


@dataclasses.dataclass(frozen=True)
class HoldOut:
    """Both sides of a grouped hold-out and how it grouped."""

    train: DatasetSplit
    val: DatasetSplit
    grouping: Grouping
    train_groups: int
    val_groups: int

    @property
    def too_small(self) -> bool:
        return len(self.val.samples) < MIN_TRUSTED_IMAGES or self.val_groups < MIN_TRUSTED_GROUPS

    def describe(self) -> str:
        """One line for the settings table: what was grouped, the groups on each side, a warning when small."""
        rules = ", ".join(f"{name} {count}" for name, count in self.grouping.rules.items() if count)
        signature = "" if self.grouping.signatures_checked else "; near-duplicates not checked"
        if self.grouping.note:
            signature = f"; {self.grouping.note}"
        text = (
            f"no separate validation split: whole groups held out ({self.grouping.count} groups of "
            f"{len(self.train.samples) + len(self.val.samples)} images; images joined by {rules or 'no rule'}"
            f"{signature}): train {len(self.train.samples)} images in {self.train_groups} groups, held out "
            f"{len(self.val.samples)} images in {self.val_groups} groups"
        )
        if self.too_small:
            text += (
                f"; too small to trust (fewer than {MIN_TRUSTED_IMAGES} images or {MIN_TRUSTED_GROUPS} groups): "
                "give a validation split of other parts"
            )
        return text


def same_images(first: DatasetSplit, second: DatasetSplit) -> bool:
    """True when both splits list the same image files (the reader had only one split to give)."""
    return {s.image_path.resolve() for s in first.samples} == {s.image_path.resolve() for s in second.samples}


def hold_out(split: DatasetSplit, fraction: float = 0.2) -> tuple[DatasetSplit, DatasetSplit]:
    """(train part, held-out part) of `split`: whole groups, about `fraction` of the images held out."""
    held = grouped_hold_out(split, fraction)
    return held.train, held.val


def grouped_hold_out(
    split: DatasetSplit, fraction: float = 0.2, seed: int = 0, signatures: bool = True
) -> HoldOut:
    """Hold out whole groups until about `fraction` of the images; `seed` picks another split of the same
    groups. A dataset of one group holds out single images (and says so through `too_small`'s groups)."""
    if not 0 < fraction < 1:
        raise ValueError(f"fraction must be in (0, 1), got {fraction}")
    grouping = group_samples(split.samples, signatures)
    if grouping.count < 2:
        grouping = Grouping(
            list(range(len(split.samples))), {}, False, "all images formed one group: single images held out"
        )
    members: dict[int, list[int]] = {}
    for index, label in enumerate(grouping.labels):
        members.setdefault(label, []).append(index)

    def bucket(group: list[int]) -> int:
        name = min(split.samples[index].image_path.name for index in group)
        return int(hashlib.sha1(f"{seed}:{name}".encode()).hexdigest()[:8], 16)

    target = fraction * len(split.samples)
    held: list[int] = []
    held_groups = 0
    for group in sorted(members.values(), key=bucket):
        if held and len(held) >= target:
            break
        if held and len(held) + len(group) > 1.5 * target:
            continue
        if held_groups == len(members) - 1:  # always leave at least one group for training
            break
        held += group
        held_groups += 1
    held_set = set(held)
    kept = [sample for index, sample in enumerate(split.samples) if index not in held_set]
    chosen = [sample for index, sample in enumerate(split.samples) if index in held_set]
    return HoldOut(
        dataclasses.replace(split, samples=kept, split=f"{split.split} (train part)"),
        dataclasses.replace(split, samples=chosen, split=f"{split.split} (held-out part)"),
        grouping,
        len(members) - held_groups,
        held_groups,
    )

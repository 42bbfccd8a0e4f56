"""Groups of images that must stay on one side of a hold-out: images taken as a series leak across a random split.

Three rules join images into one group (union-find, deterministic):

- **companion captures and templates**: file stems that differ only by a capture tag (`_L1`/`_L2`, `_cam2`,
  `_light1`, `_test`/`_temp`, ...) and images that share a file (a template, a companion capture, or one
  image that is another's companion);
- **file-name series**: stems ending in a frame number. A prefix that itself holds a digit (`C0001_0003`) names
  one series: all its frames are one group. A prefix of letters only (`frame_0001`, `crazing_12`) is often a
  naming scheme rather than one part, so runs of consecutive numbers are cut into blocks of `SERIES_BLOCK`;
- **near-duplicate images**: a 16x16 grayscale average hash of a downscaled read; pairs closer than both
  `NEAR_DUPLICATE_BITS` and a quarter of the dataset's median pairwise distance join, closest pairs first,
  while the joined group stays at most `max(SERIES_BLOCK, 5%)` of the images (so smooth surfaces that all look
  alike at 16x16 do not chain into one group).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from defectdet.data.sample import Sample

SERIES_BLOCK = 8  # consecutive frames of a letters-only prefix held together
HASH_SIDE = 16  # average hash of HASH_SIDE x HASH_SIDE pixels
NEAR_DUPLICATE_BITS = round(0.1 * HASH_SIDE * HASH_SIDE)
MAX_SIGNATURE_IMAGES = 3000  # above this, near-duplicates are not looked for (reading every image is slow)
LARGEST_NEAR_DUPLICATE_SHARE = 0.05

_CAPTURE_TAG = re.compile(
    r"[_\-. ](?:l|light|lighting|illum|illumination|lamp|cam|camera|view|ch|channel|band|plane|side|focus)\d+$"
    r"|[_\-. ](?:test|temp|template|ref|reference|golden|gold)$",
    re.IGNORECASE,
)
_FRAME = re.compile(r"^(?P<prefix>.*?)[_\-. ]*(?P<number>\d+)$")


@dataclass(frozen=True)
class Grouping:
    """`labels[i]` is the group of sample i; `rules` counts the images each rule joined to another."""

    labels: list[int]
    rules: dict[str, int]
    signatures_checked: bool
    note: str = ""

    @property
    def count(self) -> int:
        return len(set(self.labels))


class _UnionFind:
    def __init__(self, size: int) -> None:
        self.parent = list(range(size))
        self.size = [1] * size

    def find(self, item: int) -> int:
        while self.parent[item] != item:
            self.parent[item] = self.parent[self.parent[item]]
            item = self.parent[item]
        return item

    def union(self, first: int, second: int, limit: int | None = None) -> bool:
        first, second = self.find(first), self.find(second)
        if first == second or (limit is not None and self.size[first] + self.size[second] > limit):
            return False
        if first > second:
            first, second = second, first
        self.parent[second] = first
        self.size[first] += self.size[second]
        return True


def capture_stem(stem: str) -> str:
    """The stem without a trailing capture tag: `123_L2` -> `123`, `00041000_temp` -> `00041000`."""
    return _CAPTURE_TAG.sub("", stem)


def series_key(stem: str) -> tuple[str, int] | None:
    """(series prefix, frame number) of a stem that ends in a frame number after a non-empty prefix."""
    match = _FRAME.match(stem)
    if match is None or not match.group("prefix"):
        return None
    return match.group("prefix").lower(), int(match.group("number"))


def group_samples(samples: Sequence[Sample], signatures: bool = True) -> Grouping:
    """Group `samples` by the three rules of the module docstring (`signatures=False`: no image is read)."""
    union = _UnionFind(len(samples))
    rules = {"companion": 0, "series": 0, "near-duplicate": 0}
    rules["companion"] = _join_by_key(union, [_companion_key(sample) for sample in samples])
    rules["companion"] += _join_by_key(
        union, [str(s.template_path) if s.template_path is not None else None for s in samples]
    )
    rules["companion"] += _join_shared_files(union, samples)
    rules["series"] = _join_by_key(union, _series_keys(samples))
    checked = signatures and 1 < len(samples) <= MAX_SIGNATURE_IMAGES
    if checked:
        rules["near-duplicate"] = _join_near_duplicates(union, [s.image_path for s in samples])
    roots = [union.find(index) for index in range(len(samples))]
    return Grouping(roots, rules, checked)


def _companion_key(sample: Sample) -> str:
    path = sample.image_path
    return str(path.parent / capture_stem(path.stem))


def _series_keys(samples: Sequence[Sample]) -> list[str | None]:
    keys: list[str | None] = [None] * len(samples)
    by_prefix: dict[str, list[tuple[int, int]]] = {}
    for index, sample in enumerate(samples):
        found = series_key(capture_stem(sample.image_path.stem))
        if found is None:
            continue
        prefix, number = found
        folder_prefix = f"{sample.image_path.parent}/{prefix}"
        if any(character.isdigit() for character in prefix):
            keys[index] = folder_prefix
        else:
            by_prefix.setdefault(folder_prefix, []).append((number, index))
    for prefix, frames in by_prefix.items():
        block, in_block, previous = 0, 0, None
        for number, index in sorted(frames):
            new_frame = number != previous
            if previous is not None and new_frame and (number - previous > 1 or in_block >= SERIES_BLOCK):
                block, in_block = block + 1, 0
            in_block += new_frame
            keys[index] = f"{prefix}#{block}"
            previous = number
    return keys


def _join_shared_files(union: _UnionFind, samples: Sequence[Sample]) -> int:
    """Join samples whose image or companion files overlap (a file given as one image's companion and as an
    image of its own, or one companion shared by two images)."""
    if not any(sample.companion_paths for sample in samples):
        return 0
    first_of: dict[str, int] = {}
    joined = 0
    for index, sample in enumerate(samples):
        for path in (sample.image_path, *sample.companion_paths.values()):
            key = str(path.resolve())
            if key in first_of:
                joined += union.union(first_of[key], index)
            else:
                first_of[key] = index
    return joined


def _join_by_key(union: _UnionFind, keys: Sequence[str | None]) -> int:
    first_of: dict[str, int] = {}
    joined = 0
    for index, key in enumerate(keys):
        if key is None:
            continue
        if key in first_of:
            joined += union.union(first_of[key], index)
        else:
            first_of[key] = index
    return joined


def image_signature(path: Path) -> np.ndarray | None:
    """A HASH_SIDE^2-bit average hash of the grayscale image (decoded at a quarter size where the codec can);
    None when the file cannot be read."""
    import cv2

    try:
        image = cv2.imread(str(path), cv2.IMREAD_REDUCED_GRAYSCALE_4)
    except cv2.error:
        return None
    if image is None or image.size == 0:
        return None
    small = cv2.resize(image, (HASH_SIDE, HASH_SIDE), interpolation=cv2.INTER_AREA).astype(np.float32)
    return (small > small.mean()).ravel()


def _join_near_duplicates(union: _UnionFind, paths: Sequence[Path]) -> int:
    found = [(index, image_signature(path)) for index, path in enumerate(paths)]
    found = [(index, bits) for index, bits in found if bits is not None]
    if len(found) < 2:
        return 0
    indices = np.array([index for index, _ in found])
    bits = np.stack([signature for _, signature in found]).astype(np.float32)
    distance = bits @ (1 - bits).T + (1 - bits) @ bits.T  # Hamming distance of every pair
    upper = np.triu_indices(len(found), 1)
    threshold = min(NEAR_DUPLICATE_BITS, 0.25 * float(np.median(distance[upper])))
    close = distance[upper] <= threshold
    pairs = np.stack([upper[0][close], upper[1][close]], axis=1)
    order = np.argsort(distance[upper][close], kind="stable")
    limit = max(SERIES_BLOCK, round(LARGEST_NEAR_DUPLICATE_SHARE * len(paths)))
    joined = 0
    for first, second in pairs[order]:
        joined += union.union(int(indices[first]), int(indices[second]), limit)
    return joined

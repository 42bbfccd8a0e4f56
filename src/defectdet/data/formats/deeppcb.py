"""DeepPCB: a root of `*.txt` list files (each a split) naming tested/template pairs and label files.

List line: `groupG/G/ID.jpg groupG/G_not/ID.txt` -> tested image `groupG/G/ID_test.jpg`, template
`groupG/G/ID_temp.jpg`, labels `x1 y1 x2 y2 type` (space or comma separated, type 1..6).
Without `train.txt`/`val.txt`, `train`/`val` come from `trainval.txt` by holding out whole
board groups (images of one board are near-duplicates, so a random split would leak).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from defectdet.data.formats import check_box, is_deeppcb_list, order_splits
from defectdet.data.imageio import read_image_size, read_text_file
from defectdet.data.sample import DatasetSplit, Problem, Sample
from defectdet.errors import DatasetError, ImageReadError, describe_failure

CLASS_NAMES = ["open", "short", "mousebite", "spur", "copper", "pin-hole"]
DERIVED_SPLITS = ("train", "val")
TRAINVAL = "trainval"
_FIELD_SEPARATOR = re.compile(r"[,\s]+")


@dataclass(frozen=True)
class HoldOutRule:
    """Pick validation groups: the highest-numbered groups until >= `min_fraction` of images."""

    min_fraction: float = 0.2

    def __call__(self, samples: list[Sample]) -> list[str]:
        counts: dict[str, int] = {}
        for sample in samples:
            group = group_of(sample)
            counts[group] = counts.get(group, 0) + 1
        total = sum(counts.values())
        chosen: list[str] = []
        held_out = 0
        for group in sorted(counts, key=_group_sort_key, reverse=True):
            if total and held_out >= self.min_fraction * total:
                break
            if len(chosen) == len(counts) - 1:  # always leave at least one group for training
                break
            chosen.append(group)
            held_out += counts[group]
        return chosen


DEFAULT_VAL_GROUPS = HoldOutRule(min_fraction=0.2)


def group_of(sample: Sample) -> str:
    """The board group of a sample, e.g. '92000' for `group92000/92000/92000123_test.jpg`."""
    for part in reversed(sample.image_path.parts[:-1]):
        if part.startswith("group") and len(part) > len("group"):
            return part[len("group") :]
    return sample.image_path.parent.name


def split_by_groups(
    samples: list[Sample], val_groups: list[str] | set[str]
) -> tuple[list[Sample], list[Sample]]:
    """(train, val): samples whose group is in `val_groups` go to val."""
    held_out = set(val_groups)
    train = [sample for sample in samples if group_of(sample) not in held_out]
    val = [sample for sample in samples if group_of(sample) in held_out]
    return train, val


def splits(path: Path) -> list[str]:
    root, list_files = _list_files(path)
    names = set(list_files)
    if TRAINVAL in names:
        names.update(DERIVED_SPLITS)
    return order_splits(names)


def load(path: Path, split: str) -> DatasetSplit:
    root, list_files = _list_files(path)
    if path.is_file():  # a list file given directly is the split
        split = path.stem
    if split in list_files:
        samples, problems = _read_list(root, list_files[split])
        return DatasetSplit(samples, list(CLASS_NAMES), "deeppcb", split, root, problems)
    if split in DERIVED_SPLITS and TRAINVAL in list_files:
        samples, problems = _read_list(root, list_files[TRAINVAL])
        val_groups = DEFAULT_VAL_GROUPS(samples)
        train, val = split_by_groups(samples, val_groups)
        chosen = train if split == "train" else val
        return DatasetSplit(chosen, list(CLASS_NAMES), "deeppcb", split, root, problems)
    raise DatasetError(
        f"{root}: DeepPCB split {split!r} not found; no {split}.txt list file"
        + (" and no trainval.txt to derive it from" if split in DERIVED_SPLITS else "")
        + f". Available: {', '.join(splits(path)) or 'none'}"
    )


def _list_files(path: Path) -> tuple[Path, dict[str, Path]]:
    if path.is_file():
        if not is_deeppcb_list(path):
            raise DatasetError(
                f"{path}: not a DeepPCB list file (lines 'groupG/G/ID.jpg groupG/G_not/ID.txt')"
            )
        return path.parent, {path.stem: path}
    found = {
        candidate.stem: candidate for candidate in sorted(path.glob("*.txt")) if is_deeppcb_list(candidate)
    }
    if not found:
        raise DatasetError(
            f"{path}: no DeepPCB list files (*.txt with lines 'groupG/G/ID.jpg groupG/G_not/ID.txt') in this folder"
        )
    return path, found


def _read_list(root: Path, list_file: Path) -> tuple[list[Sample], list[Problem]]:
    try:
        lines = list_file.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError as error:
        raise DatasetError(f"{list_file}: cannot read DeepPCB list file ({error})") from error
    samples: list[Sample] = []
    problems: list[Problem] = []
    for line_number, line in enumerate(lines, start=1):
        fields = line.split()
        if not fields:
            continue
        if len(fields) != 2:
            problems.append(
                Problem(
                    "error",
                    str(list_file),
                    f"expected 'IMAGE LABELS' (2 fields), got {len(fields)}",
                    line_number,
                )
            )
            continue
        sample = _read_pair(root, fields[0], fields[1], str(list_file), line_number, problems)
        if sample is not None:
            samples.append(sample)
    return samples, problems


def _read_pair(
    root: Path, image_name: str, label_name: str, list_path: str, line_number: int, problems: list[Problem]
) -> Sample | None:
    listed = root / image_name
    tested = listed.with_name(f"{listed.stem}_test{listed.suffix}")
    template: Path | None = listed.with_name(f"{listed.stem}_temp{listed.suffix}")
    if not tested.is_file():
        if listed.is_file():  # a plain image without the _test/_temp pair convention
            tested, template = listed, None
        else:
            problems.append(Problem("error", list_path, f"image {tested} not found", line_number))
            return None
    if template is not None and not template.is_file():
        problems.append(Problem("warning", list_path, f"template {template} not found", line_number))
        template = None
    label_path = root / label_name
    try:
        label_lines = read_text_file(label_path).splitlines()  # a FIFO is refused, not waited on
    except FileNotFoundError:
        problems.append(Problem("error", list_path, f"label file {label_path} not found", line_number))
        return None
    except OSError as error:
        problems.append(Problem("error", str(label_path), f"cannot read label file ({error})"))
        return None
    try:
        width, height = read_image_size(tested)
    except ImageReadError as error:
        problems.append(Problem("error", str(tested), str(error).removeprefix(f"{tested}: ")))
        return None
    except Exception as error:  # noqa: BLE001 - a header reader crash is this file's error, not the dataset's
        problems.append(
            Problem("error", str(tested), f"cannot read the image header ({describe_failure(error)})")
        )
        return None
    boxes, classes = _parse_labels(label_lines, str(label_path), width, height, problems)
    return Sample(
        image_path=tested,
        boxes=np.asarray(boxes, dtype=np.float32).reshape(-1, 4),
        classes=np.asarray(classes, dtype=np.int64),
        template_path=template,
        source=str(label_path),
        image_id=listed.stem,
        width=width,
        height=height,
    )


def _parse_labels(
    lines: list[str], label_path: str, width: int, height: int, problems: list[Problem]
) -> tuple[list[tuple[float, float, float, float]], list[int]]:
    boxes: list[tuple[float, float, float, float]] = []
    classes: list[int] = []
    for line_number, line in enumerate(lines, start=1):
        text = line.strip().strip(",")
        if not text:
            continue
        fields = _FIELD_SEPARATOR.split(text)
        if len(fields) != 5:
            problems.append(
                Problem(
                    "error",
                    label_path,
                    f"expected 'x1 y1 x2 y2 type' (5 fields), got {len(fields)}",
                    line_number,
                )
            )
            continue
        try:
            x1, y1, x2, y2 = (float(value) for value in fields[:4])
            defect_type = float(fields[4])
        except ValueError:
            problems.append(Problem("error", label_path, f"non-numeric field in {text!r}", line_number))
            continue
        if defect_type != int(defect_type) or not 1 <= defect_type <= len(CLASS_NAMES):
            problems.append(
                Problem(
                    "error",
                    label_path,
                    f"defect type {fields[4]} out of range 1..{len(CLASS_NAMES)}",
                    line_number,
                )
            )
            continue
        box = check_box((x1, y1, x2, y2), width, height, problems, label_path, line_number)
        if box is not None:
            boxes.append(box)
            classes.append(int(defect_type) - 1)
    return boxes, classes


def _group_sort_key(group: str) -> tuple[int, int | str]:
    return (1, int(group)) if group.isdigit() else (0, group)

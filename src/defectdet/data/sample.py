"""The record every dataset reader produces, and the problems it reports."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

import numpy as np

from defectdet.data.problem import Problem as Problem
from defectdet.data.problem import Severity as Severity
from defectdet.errors import DatasetError

COMPANION_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,31}")
# names a companion cannot take: the other planes and the request fields they share a namespace with
RESERVED_NAMES = frozenset({"image", "template", "threshold", "score_floor", "nms_iou"})


@dataclass
class Sample:
    """One labelled image.

    `boxes` are xyxy float32 pixels of the original image, `classes` int64 0-based ids.
    `source` names the label file (and `source_line` the first line) the boxes came from,
    so later errors can point back to it. `companion_paths` maps a companion name to the file of that aligned
    extra capture (another lighting, focus or band) of the same part.
    """

    image_path: Path
    boxes: np.ndarray  # (N, 4) float32 xyxy, original pixels
    classes: np.ndarray  # (N,) int64
    template_path: Path | None = None
    source: str = ""
    image_id: str = ""
    width: int | None = None  # from the label file when it states it (COCO/VOC), else None
    height: int | None = None
    companion_paths: dict[str, Path] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.image_path = Path(self.image_path)
        if self.template_path is not None:
            self.template_path = Path(self.template_path)
        self.companion_paths = {name: Path(path) for name, path in self.companion_paths.items()}
        self.boxes = np.asarray(self.boxes, dtype=np.float32).reshape(-1, 4)
        self.classes = np.asarray(self.classes, dtype=np.int64).reshape(-1)
        if len(self.boxes) != len(self.classes):
            raise ValueError(
                f"{self.source or self.image_path}: {len(self.boxes)} boxes but {len(self.classes)} classes"
            )
        if not self.image_id:
            self.image_id = self.image_path.stem


def companion_name_problem(name: object) -> str | None:
    """Why `name` cannot name a companion, or None when it can."""
    if not isinstance(name, str) or not COMPANION_NAME.fullmatch(name):
        return (
            f"companion name {name!r} must start with a letter and hold only letters, digits, '_' and '-' "
            "(at most 32 characters)"
        )
    if name in RESERVED_NAMES:
        return f"companion name {name!r} is reserved (reserved: {', '.join(sorted(RESERVED_NAMES))})"
    return None


def check_companion_name(name: object, where: str) -> str:
    """`name` when it can name a companion; else DatasetError starting with `where` (file and field)."""
    problem = companion_name_problem(name)
    if problem is not None:
        raise DatasetError(f"{where}: {problem}")
    return str(name)


def common_companions(samples: Iterable[Sample], names: Iterable[str] | None = None) -> list[str]:
    """The companion names every sample has, in the order of `names` (default: first seen); [] without samples."""
    samples = list(samples)
    if not samples:
        return []
    order = (
        list(names)
        if names is not None
        else list(dict.fromkeys(n for s in samples for n in s.companion_paths))
    )
    return [name for name in order if all(name in sample.companion_paths for sample in samples)]


def id_path(image_id: str, suffix: str) -> PurePosixPath:
    """A file path for one image's output below an output folder: the image id's sub-folders kept
    (`images/a` -> `images/a.txt`), roots, `.` and `..` dropped so that it stays inside the folder."""
    parts = [
        part for part in PurePosixPath(str(image_id).replace("\\", "/")).parts if part not in ("/", ".", "..")
    ]
    return PurePosixPath(*(parts or ["image"])).with_name(f"{(parts or ['image'])[-1]}{suffix}")


@dataclass
class DatasetSplit:
    """The samples of one split plus the class names and any problems met while parsing."""

    samples: list[Sample]
    class_names: list[str]
    format: str
    split: str
    root: Path
    problems: list[Problem] = field(default_factory=list)
    companion_names: list[str] = field(default_factory=list)  # declared order, which is the planes' order

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    @property
    def has_templates(self) -> bool:
        return any(s.template_path is not None for s in self.samples)


def missing_companions(dataset: DatasetSplit, where: str) -> list[Problem]:
    """One warning per companion that some images lack, with the count (each image is warned about apart)."""
    problems = []
    for name in dataset.companion_names:
        missing = sum(1 for sample in dataset.samples if name not in sample.companion_paths)
        if missing:
            problems.append(
                Problem(
                    "warning",
                    where,
                    f"split '{dataset.split}': {missing} of {len(dataset.samples)} images have no companion "
                    f"'{name}'; they are left out when training with it",
                )
            )
    return problems

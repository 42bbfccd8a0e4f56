"""The record every dataset reader produces, and the problems it reports."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Literal

import numpy as np


@dataclass
class Sample:
    """One labelled image.

    `boxes` are xyxy float32 pixels of the original image, `classes` int64 0-based ids.
    `source` names the label file (and `source_line` the first line) the boxes came from,
    so later errors can point back to it.
    """

    image_path: Path
    boxes: np.ndarray  # (N, 4) float32 xyxy, original pixels
    classes: np.ndarray  # (N,) int64
    template_path: Path | None = None
    source: str = ""
    image_id: str = ""
    width: int | None = None  # from the label file when it states it (COCO/VOC), else None
    height: int | None = None

    def __post_init__(self) -> None:
        self.image_path = Path(self.image_path)
        if self.template_path is not None:
            self.template_path = Path(self.template_path)
        self.boxes = np.asarray(self.boxes, dtype=np.float32).reshape(-1, 4)
        self.classes = np.asarray(self.classes, dtype=np.int64).reshape(-1)
        if len(self.boxes) != len(self.classes):
            raise ValueError(
                f"{self.source or self.image_path}: {len(self.boxes)} boxes but {len(self.classes)} classes"
            )
        if not self.image_id:
            self.image_id = self.image_path.stem


def id_path(image_id: str, suffix: str) -> PurePosixPath:
    """A file path for one image's output below an output folder: the image id's sub-folders kept
    (`images/a` -> `images/a.txt`), roots, `.` and `..` dropped so that it stays inside the folder."""
    parts = [
        part for part in PurePosixPath(str(image_id).replace("\\", "/")).parts if part not in ("/", ".", "..")
    ]
    return PurePosixPath(*(parts or ["image"])).with_name(f"{(parts or ['image'])[-1]}{suffix}")


Severity = Literal["error", "warning"]


@dataclass(frozen=True)
class Problem:
    """Something wrong with one file of a dataset. `line` is 1-based, 0 when not line-specific."""

    severity: Severity
    path: str
    message: str
    line: int = 0

    def __str__(self) -> str:
        where = f"{self.path}:{self.line}" if self.line else self.path
        return f"{self.severity}: {where}: {self.message}"


@dataclass
class DatasetSplit:
    """The samples of one split plus the class names and any problems met while parsing."""

    samples: list[Sample]
    class_names: list[str]
    format: str
    split: str
    root: Path
    problems: list[Problem] = field(default_factory=list)

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    @property
    def has_templates(self) -> bool:
        return any(s.template_path is not None for s in self.samples)

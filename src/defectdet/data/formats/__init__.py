"""Dataset readers: YOLO data.yaml, COCO json, Pascal VOC folder, DeepPCB root -> `DatasetSplit`.

Each reader module exposes `load(path, split) -> DatasetSplit` and `splits(path) -> list[str]`.
Parse problems become `Problem`s on the split; only an unreadable dataset raises `DatasetError`.
The reader modules are imported lazily so importing this package stays cheap.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import stat
from pathlib import Path
from typing import TYPE_CHECKING

from defectdet.data.image_types import IMAGE_SUFFIXES
from defectdet.data.problem import Problem
from defectdet.errors import DatasetError

if TYPE_CHECKING:  # the readers make them; this package's own checks only name them
    from defectdet.data.sample import DatasetSplit

FORMATS = ("yolo", "coco", "voc", "deeppcb")
# Boxes may overshoot the image by this fraction of its side (at least 1 px) before it is an error.
BOX_TOLERANCE = 0.01
TINY_BOX_PIXELS = 2.0

# Labelling exports nest a handful of levels (COCO 3, Label Studio 6); deeper is not one of them, and Python's
# parser would give up with a RecursionError near 1000.
MAX_JSON_DEPTH = 64
_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_JSON_BRACKETS = str.maketrans({char: None for char in map(chr, range(128)) if char not in "[]{}"})

_COCO_KEY = re.compile(r'"(?:images|annotations|categories)"\s*:\s*\[')
_COCO_SNIFF_CHARS = 64 * 1024
_DEEPPCB_LINE = re.compile(
    r"^\S+\.(?:" + "|".join(sorted(suffix[1:] for suffix in IMAGE_SUFFIXES)) + r")\s+\S+\.txt$",
    re.IGNORECASE,
)


def load_json(text: str, where: str | Path) -> object:
    """`json.loads` of a labelling file's text; nesting deeper than `MAX_JSON_DEPTH` is a DatasetError naming
    `where` (a JSONDecodeError still comes through for the caller to place)."""
    depth = deepest = 0
    for char in _JSON_STRING.sub("", text).translate(_JSON_BRACKETS):
        depth += 1 if char in "[{" else -1
        deepest = max(deepest, depth)
    if deepest > MAX_JSON_DEPTH:
        raise DatasetError(
            f"{where}: JSON nested {deepest} levels deep (at most {MAX_JSON_DEPTH}); not a labelling export"
        )
    try:
        return json.loads(text)
    except RecursionError:
        raise DatasetError(f"{where}: JSON nested too deep to read") from None


def leaves_folder(name: str) -> bool:
    """The rule every importer applies to a file name a labelling export gives (COCO `file_name`, a Label
    Studio image URL's path): True when it is absolute (`/x`, `C:/x`, `file:///x` once parsed) or climbs with
    `..` (either slash), so that it is not below the images folder and must be refused, not followed."""
    posix = name.replace("\\", "/")
    return posix.startswith("/") or Path(name).is_absolute() or ".." in posix.split("/") or posix[1:2] == ":"


def below(path: Path, roots: list[Path] | tuple[Path, ...]) -> bool:
    """True when `path`, made absolute and normalised (as written: `..` removed, no link followed), lies in one
    of `roots`: an importer reads only files below the images folders it was given."""
    target = Path(os.path.normpath(os.path.abspath(path)))
    for root in roots:
        base = Path(os.path.normpath(os.path.abspath(root)))
        if target == base or base in target.parents:
            return True
    return False


def detect_format(path: str | Path) -> str:
    """Guess the dataset format of `path`: 'yolo', 'coco', 'voc' or 'deeppcb'."""
    path = Path(path)
    if not path.exists():
        raise DatasetError(f"{path}: dataset not found")
    if path.is_file():
        suffix = path.suffix.lower()
        if suffix in (".yaml", ".yml"):
            return "yolo"
        if suffix == ".json":
            return "coco"
        if suffix == ".txt" and is_deeppcb_list(path):
            return "deeppcb"
    else:
        if (path / "data.yaml").is_file() or (path / "data.yml").is_file():
            return "yolo"
        if (path / "Annotations").is_dir() and any((path / "Annotations").glob("*.xml")):
            return "voc"
        if any(path.glob("*.xml")):
            return "voc"
        if any(is_deeppcb_list(candidate) for candidate in sorted(path.glob("*.txt"))):
            return "deeppcb"
        jsons = sorted(path.glob("*.json")) or sorted((path / "annotations").glob("*.json"))
        if jsons and any(is_coco_json(candidate) for candidate in jsons):
            return "coco"
    raise DatasetError(
        f"{path}: cannot tell the dataset format. Looked for a YOLO data.yaml (a .yaml/.yml file or a folder "
        "holding data.yaml), a COCO .json file (or a folder of them, e.g. train.json and val.json beside images/, "
        "or annotations/*.json), a Pascal VOC folder (Annotations/*.xml, or *.xml beside the images) and a DeepPCB "
        "root (*.txt list files with lines 'groupG/G/ID.jpg groupG/G_not/ID.txt'). "
        f"Pass --format (one of {', '.join(FORMATS)})."
    )


def load_dataset(path: str | Path, split: str = "train", format: str | None = None) -> DatasetSplit:
    """Read one split of the dataset at `path` (format detected unless given)."""
    return _reader(path, format).load(Path(path), split)


def available_splits(path: str | Path, format: str | None = None) -> list[str]:
    """The split names `load_dataset` accepts for this dataset."""
    return _reader(path, format).splits(Path(path))


def _reader(path: str | Path, format: str | None):
    name = format or detect_format(path)
    if name not in FORMATS:
        raise DatasetError(f"unknown dataset format {name!r}; expected one of {', '.join(FORMATS)}")
    if not Path(path).exists():
        raise DatasetError(f"{path}: dataset not found")
    return importlib.import_module(f"defectdet.data.formats.{name}")


def is_coco_json(path: Path) -> bool:
    """True when the start of the JSON object at `path` names a COCO key ('images', 'annotations' or
    'categories'); reads at most 64 KiB, so a large annotation file is not parsed to detect it."""
    try:
        with path.open("r", encoding="utf-8", errors="replace") as handle:
            head = handle.read(_COCO_SNIFF_CHARS)
    except OSError:
        return False
    return head.lstrip().startswith("{") and bool(_COCO_KEY.search(head))


def is_deeppcb_list(path: Path) -> bool:
    """True when the first non-empty line of `path` looks like 'groupG/G/ID.jpg groupG/G_not/ID.txt'."""
    try:
        with path.open("r", encoding="utf-8", errors="replace") as handle:
            for _, line in zip(range(20), handle, strict=False):
                if line.strip():
                    return bool(_DEEPPCB_LINE.match(line.strip()))
    except OSError:
        return False
    return False


def list_images(folder: Path, problems: list[Problem] | None = None) -> list[Path]:
    """Image files under `folder`, recursively, in sorted order. Entries named like an image that are not
    regular files (a folder ``x.jpg``, a symlink loop, a FIFO) are skipped with a warning in `problems`."""
    found = []
    for path in sorted(p for p in folder.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES):
        if path.is_file():
            found.append(path)
        elif problems is not None:
            problems.append(Problem("warning", str(path), f"skipped: {_not_a_file(path)}"))
    return found


def _not_a_file(path: Path) -> str:
    try:
        mode = path.stat().st_mode
    except OSError as error:  # a broken link or a symlink loop
        return f"cannot be read ({error.strerror or error})"
    if stat.S_ISDIR(mode):
        return "a folder named like an image"
    return "not a regular file (FIFO, device or socket)"


def order_splits(names: set[str] | list[str]) -> list[str]:
    """train, val, test first, then the rest alphabetically."""
    preferred = [name for name in ("train", "val", "test") if name in names]
    return preferred + sorted(set(names) - set(preferred))


def check_box(
    box: tuple[float, float, float, float],
    width: float | None,
    height: float | None,
    problems: list[Problem],
    path: str,
    line: int = 0,
    what: str = "box",
) -> tuple[float, float, float, float] | None:
    """Validate an xyxy pixel box: None (and an error) when unusable, else the box clipped to the image.

    Zero/negative area and boxes beyond the image by more than `BOX_TOLERANCE` are errors;
    boxes under `TINY_BOX_PIXELS` on a side are kept with a warning.
    """
    x1, y1, x2, y2 = box
    if not (x2 > x1 and y2 > y1):
        problems.append(Problem("error", path, f"{what} {_format_box(box)} has zero or negative area", line))
        return None
    if width is not None and height is not None:
        tolerance_x = max(1.0, BOX_TOLERANCE * width)
        tolerance_y = max(1.0, BOX_TOLERANCE * height)
        if x1 < -tolerance_x or y1 < -tolerance_y or x2 > width + tolerance_x or y2 > height + tolerance_y:
            problems.append(
                Problem(
                    "error",
                    path,
                    f"{what} {_format_box(box)} is outside the {width:g}x{height:g} image",
                    line,
                )
            )
            return None
        x1, x2 = min(max(x1, 0.0), width), min(max(x2, 0.0), width)
        y1, y2 = min(max(y1, 0.0), height), min(max(y2, 0.0), height)
        if not (x2 > x1 and y2 > y1):
            problems.append(
                Problem("error", path, f"{what} {_format_box(box)} has no area inside the image", line)
            )
            return None
    if x2 - x1 < TINY_BOX_PIXELS or y2 - y1 < TINY_BOX_PIXELS:
        problems.append(
            Problem(
                "warning", path, f"{what} {_format_box(box)} is tiny (under {TINY_BOX_PIXELS:g} px)", line
            )
        )
    return x1, y1, x2, y2


def _format_box(box: tuple[float, float, float, float]) -> str:
    return "(" + ", ".join(f"{value:.4g}" for value in box) + ")"

"""Settings of the label interchange with labelling tools, and the `defectdet labels` options they make.

`TaskExportSettings` configures `labelstudio.export_tasks`, `LabelStudioImportSettings` `labelstudio.import_export`
(and its held-out form), `CocoImportSettings` `cvat.import_coco` and `CocoExportSettings` `interchange.export_coco`.
Each table beside them (`..._OPTIONS`) makes the command's options. Imports nothing heavy, so the command line
builds its options at start.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from defectdet.cli_option import CliOption

Unknown = Literal["error", "add", "skip"]
Existing = Literal["refuse", "merge", "replace"]
LOCAL_FILES = "/data/local-files/?d="


def class_list(text: str | None) -> list[str] | None:
    """'a, b,c' -> ['a', 'b', 'c']; an empty text -> None (not given)."""
    return [name.strip() for name in text.split(",") if name.strip()] if text else None


def _folders(folders: list[Path]) -> list[Path] | None:
    return list(folders) or None


@dataclass(frozen=True)
class TaskExportSettings:
    """How `export_tasks` writes Label Studio import tasks.

    `config_path`: the labelling config XML (None: <tasks stem>_config.xml beside the tasks). `classes`: the
    model's full class list (None: the source's, then the names used). `model`: a bundle or checkpoint whose
    class list the command takes as `classes` (`export_tasks` itself takes the names: read them first, from a
    bundle's metadata or a checkpoint's class_names). `model_version` of the pre-annotations ("defectdet": the bundle a sidecar names). Image
    URLs are `url_prefix` + the path below `document_root` (None: the folder holding all the images). `images`:
    where the files predictions.jsonl names are now, when they moved. `score_floor`: detections under it are left
    out (None: the threshold each record states).
    """

    config_path: Path | None = None
    classes: list[str] | None = None
    model: Path | None = None
    model_version: str = "defectdet"
    document_root: Path | None = None
    url_prefix: str = LOCAL_FILES
    images: Path | None = None
    score_floor: float | None = None


@dataclass(frozen=True)
class LabelImportSettings:
    """How an import from a labelling tool writes into our YOLO dataset.

    `classes`: class names in id order (None: the target's data.yaml, else the export's). `images`: folders to
    find the images in. `split`: the one split to import into (None: train and val, `val_fraction` of the images
    held out). Classes outside the list stop the import, unless `add_classes` appends them or `skip_unknown`
    drops their boxes. `existing`: a label file that already holds other boxes is refused, merged or replaced.
    `skip_missing`: import the rest when images are missing; `link`: symlink images instead of copying them.
    """

    classes: list[str] | None = None
    images: list[Path] | None = None
    split: str | None = None
    val_fraction: float = 0.2
    add_classes: bool = False
    skip_unknown: bool = False
    existing: Existing = "refuse"
    skip_missing: bool = False
    link: bool = False

    def __post_init__(self) -> None:
        if self.add_classes and self.skip_unknown:
            raise ValueError("--add-classes and --skip-unknown exclude each other")

    @property
    def unknown(self) -> Unknown:
        """The policy for classes outside the list: add, skip or error."""
        return "add" if self.add_classes else "skip" if self.skip_unknown else "error"


@dataclass(frozen=True)
class LabelStudioImportSettings(LabelImportSettings):
    """`LabelImportSettings` of a Label Studio export; `image_key`: the task data field holding the image
    (None: image)."""

    image_key: str | None = None


@dataclass(frozen=True)
class CocoImportSettings(LabelImportSettings):
    """`LabelImportSettings` of a CVAT COCO export (its 'default' subset goes to `split`, or to train and val);
    `keep_crowd`: keep iscrowd annotations (CVAT's masks) by their box."""

    keep_crowd: bool = True


@dataclass(frozen=True)
class CocoExportSettings:
    """Which split `export_coco` writes, the dataset `format` (None: detected), and `image_root`, the folder the
    file names are relative to (None: the folder holding all the split's images)."""

    split: str = "train"
    image_root: Path | None = None
    format: str | None = None


EXISTING_HELP = (
    "A label file in OUT_DIR that already holds other boxes: refuse (default; nothing is written), merge "
    "(keep its boxes, add the new ones) or replace."
)
IMPORT_CLASSES = CliOption(
    help="Class names, comma-separated, in id order (default: OUT_DIR's data.yaml, else the export's).",
    type=str,
    to_setting=class_list,
)
# the options both imports share after --split and --val-fraction, in the order their help lists them
_IMPORT_POLICIES: dict[str, CliOption] = {
    "add_classes": CliOption(flag="--add-classes", help="Append classes not in the list to it."),
    "skip_unknown": CliOption(flag="--skip-unknown", help="Drop boxes of classes not in the list."),
    "existing": CliOption(help=EXISTING_HELP),
    "skip_missing": CliOption(flag="--skip-missing", help="Import the rest when images are missing."),
    "link": CliOption(flag="--link", help="Symlink images instead of copying them."),
}

# `defectdet labels export-labelstudio`'s options, in the order its help lists them
TASK_EXPORT_OPTIONS: dict[str, CliOption] = {
    "config_path": CliOption(
        flag="--config", help="Labelling config XML to write (default: <OUT stem>_config.xml beside OUT)."
    ),
    "classes": CliOption(
        help="Class names, comma-separated (default: predict's classes.txt, then the predicted names).",
        type=str,
        to_setting=class_list,
    ),
    "model": CliOption(
        flag="--model",
        help="The model's bundle (.onnx) or checkpoint (.pt): its full class list goes into the labelling config "
        "(instead of --classes).",
    ),
    "model_version": CliOption(
        help="model_version of the pre-annotations (default: the bundle a sidecar names)."
    ),
    "document_root": CliOption(
        help="Label Studio's LABEL_STUDIO_LOCAL_FILES_DOCUMENT_ROOT: image URLs are paths below it "
        "(default: the folder holding all the images)."
    ),
    "url_prefix": CliOption(help="Put before each image's path below --document-root."),
    "images": CliOption(help="Where the images predictions.jsonl names are now, when they moved since."),
    "score_floor": CliOption(
        flag="--score-floor",
        help="Leave out detections under this score (default: the threshold each record states).",
    ),
}

# `defectdet labels import-labelstudio`'s options (--label-config, another way to give the classes, is the
# command's own)
LABELSTUDIO_IMPORT_OPTIONS: dict[str, CliOption] = {
    "classes": IMPORT_CLASSES,
    "images": CliOption(
        help="Folder to find task images in (repeatable; default: the export's folder).",
        type=list[Path],
        default=[],
        to_setting=_folders,
    ),
    "split": CliOption(
        help="Import every image into this one split (default: train and val, see --val-fraction)."
    ),
    "val_fraction": CliOption(
        flag="--val-fraction",
        help="Share of the images held out as the val split (an image and its template, and images sharing a "
        "template, stay on one side).",
    ),
    **_IMPORT_POLICIES,
    "image_key": CliOption(help="The task data field holding the image (default: image)."),
}

# `defectdet labels import-coco`'s options
COCO_IMPORT_OPTIONS: dict[str, CliOption] = {
    "classes": IMPORT_CLASSES,
    "images": CliOption(
        help="More folders to find images in (repeatable).", type=list[Path], default=[], to_setting=_folders
    ),
    "split": CliOption(
        help="Split for the 'default' subset (or a single json); default: train and val, see --val-fraction. "
        "Other subsets (train, val, test) go to their own split."
    ),
    "val_fraction": CliOption(
        flag="--val-fraction",
        help="Without --split: the share of the 'default' subset held out as val (an image and its template "
        "on one side).",
    ),
    **_IMPORT_POLICIES,
    "keep_crowd": CliOption(
        flag="--crowd/--no-crowd", help="Keep iscrowd annotations (CVAT's masks) by their box."
    ),
}

# `defectdet labels export-coco`'s options
COCO_EXPORT_OPTIONS: dict[str, CliOption] = {
    "split": CliOption(help="Split to export."),
    "image_root": CliOption(
        help="file_names are relative to this folder (default: the folder holding all the split's images)."
    ),
    "format": CliOption(flag="--format", help="yolo|coco|voc|deeppcb (default: detected)."),
}

"""CVAT's "COCO 1.0" export into our YOLO dataset, through our COCO reader.

The export (docs.cvat.ai, formats/format-coco) is `annotations/instances_<subset>.json` with the images under
`images/` (older CVAT) or `images/<subset>/` (CVAT 2.x); `file_name`s may hold subfolders. Its specifics:
category ids start at 1 (our reader maps sorted ids to 0..K-1 whatever they are); every annotation has
`segmentation` (empty for boxes, polygons, or an RLE mask) and `bbox`, which we use; `attributes` carries
`occluded` and, for rotated boxes, `rotation` in degrees (the reader takes the rotated box's envelope); and CVAT
marks a mask drawn as one region `iscrowd: 1` with a real box, so crowd annotations are kept unless asked not to.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from defectdet.data.formats import load_json
from defectdet.data.formats.coco import read_coco
from defectdet.data.formats.interchange import (
    ImportReport,
    LabelledImage,
    YoloWrite,
    hold_out_groups,
    write_yolo,
)
from defectdet.data.formats.label_settings import CocoImportSettings
from defectdet.data.sample import DatasetSplit
from defectdet.errors import DatasetError

DEFAULT_SUBSET = "default"
_LISTED = 10


@dataclass
class CocoImport:
    """One subset's import: which json went into which split, and what it wrote."""

    json_path: Path
    split: str
    report: ImportReport
    crowd: int  # crowd (mask) annotations kept as boxes


def instance_files(export: Path) -> list[Path]:
    """The COCO jsons of a CVAT export folder (annotations/instances_*.json), or the one json given."""
    export = Path(export)
    if export.is_file():
        return [export]
    if not export.is_dir():
        raise DatasetError(f"{export}: CVAT export not found")
    found = sorted((export / "annotations").glob("*.json")) or sorted(export.glob("*.json"))
    if not found:
        raise DatasetError(
            f"{export}: no COCO json here or in annotations/ (CVAT writes annotations/instances_default.json)"
        )
    return found


def subset_of(json_path: Path) -> str:
    """instances_default.json -> 'default'; other names -> their stem."""
    return json_path.stem.removeprefix("instances_")


def import_coco(export: Path, out_dir: Path, settings: CocoImportSettings | None = None) -> list[CocoImport]:
    """Import a CVAT COCO export (a json, or the unzipped export folder) into the YOLO dataset `out_dir`, as
    `settings` say (default: `CocoImportSettings()`).

    Subset 'default' (and a single json) goes to `settings.split`, or without one to train and val (the
    `val_fraction` held out, `hold_out_groups`: an image and its template on one side); other subsets (train,
    val, test) to their own split. Image-level `template_file_name`s come along into the split's template
    folder, and each image's `companions` into that companion's folder (data.yaml `companions:`).
    """
    settings = settings or CocoImportSettings()
    files = instance_files(export)
    results = []
    for json_path in files:
        subset = subset_of(json_path)
        if len(files) == 1 or subset == DEFAULT_SUBSET:
            held_out = settings.val_fraction if settings.split is None else 0.0
            results += _import_one(json_path, out_dir, settings, settings.split or "train", held_out)
        else:
            results += _import_one(json_path, out_dir, settings, subset, 0.0)
    return results


def _import_one(
    json_path: Path, out_dir: Path, settings: CocoImportSettings, split: str, val_fraction: float
) -> list[CocoImport]:
    """Import one json into `split`, or with `val_fraction` into train and val."""
    base = json_path.parent.parent if json_path.parent.name == "annotations" else json_path.parent
    roots = tuple(Path(p) for p in settings.images or ()) + (base / "images" / subset_of(json_path),)
    dataset = read_coco(json_path, keep_crowd=settings.keep_crowd, image_roots=roots, contained=True)
    missing = _checked_problems(json_path, dataset, settings.skip_missing)
    document = load_json(json_path.read_text(encoding="utf-8"), json_path)  # read_coco parsed it: valid
    file_names = {
        str(record["id"]): record["file_name"]
        for record in document.get("images", [])
        if isinstance(record, dict) and "id" in record and isinstance(record.get("file_name"), str)
    }
    crowd = sum(1 for a in document.get("annotations", []) if isinstance(a, dict) and a.get("iscrowd"))
    items = _items(dataset, json_path, file_names)
    parts = [(split, items)]
    if val_fraction > 0:
        train, val = hold_out_groups(items, val_fraction)
        parts = [("train", train)] + ([("val", val)] if val else [])
    results = []
    for index, (name, chosen) in enumerate(parts):
        target = YoloWrite(
            split=name,
            classes=settings.classes if index == 0 else None,
            source_classes=dataset.class_names,
            unknown=settings.unknown,
            existing=settings.existing,
            link=settings.link,
            origin_kind="image",
        )
        report = write_yolo(chosen, out_dir, target)
        if index == 0:
            report.skipped_images.extend(missing)
            report.warnings[:0] = [str(p) for p in dataset.problems if p.severity == "warning"]
        kept_crowd = crowd if settings.keep_crowd and index == 0 else 0
        results.append(CocoImport(json_path, name, report, kept_crowd))
    return results


def _checked_problems(json_path: Path, dataset: DatasetSplit, skip_missing: bool) -> list[str]:
    """The images the json names that are not there ("json: message"); a DatasetError for any other error, and
    for missing images unless `skip_missing`."""
    missing = [f"{json_path}: {p.message}" for p in dataset.problems if _missing_image(p.severity, p.message)]
    errors = [
        str(p)
        for p in dataset.problems
        if p.severity == "error" and not _missing_image(p.severity, p.message)
    ]
    if errors:
        listed = "\n  ".join(errors[:_LISTED])
        more = f"\n  (and {len(errors) - _LISTED} more)" if len(errors) > _LISTED else ""
        raise DatasetError(f"{json_path}: nothing imported, {len(errors)} error(s):\n  {listed}{more}")
    if missing and not skip_missing:
        listed = "\n  ".join(missing[:_LISTED])
        more = f"\n  (and {len(missing) - _LISTED} more)" if len(missing) > _LISTED else ""
        raise DatasetError(
            f"{json_path}: {len(missing)} image(s) not found:\n  {listed}{more}\n"
            "Export from CVAT with 'Save images', or pass --images DIR; --skip-missing imports the rest"
        )
    return missing


def _items(dataset: DatasetSplit, json_path: Path, file_names: dict[str, str]) -> list[LabelledImage]:
    """The samples as labelled images named by their `file_name` (no `..`), with their templates and companion
    captures."""
    items = []
    for sample in dataset.samples:
        name = PurePosixPath(file_names.get(sample.image_id, sample.image_path.name))
        items.append(
            LabelledImage(
                sample.image_path,
                PurePosixPath(*[part for part in name.parts if part not in ("..", "/")]),
                [tuple(box) for box in sample.boxes.tolist()],
                [dataset.class_names[c] for c in sample.classes.tolist()],
                f"{json_path.name} image {sample.image_id} ({name})",
                sample.width,
                sample.height,
                sample.template_path,
                dict(sample.companion_paths),
            )
        )
    return items


def _missing_image(severity: str, message: str) -> bool:
    return severity == "error" and "image file" in message and message.endswith("not found")

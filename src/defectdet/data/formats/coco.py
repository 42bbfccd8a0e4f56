"""COCO detection json: `images`, `annotations` (bbox x, y, w, h in pixels), `categories`.

The json is the split (named by its stem). Category ids may be arbitrary; sorted ids map to
0..K-1. Image `file_name`s resolve against the json's folder, an `images/` folder beside it,
or the same two one level up (the `annotations/` + `images/` layout). Our extensions: an image
record may carry `template_file_name` and `companions: {name: file_name}` (aligned extra captures, resolved like
`file_name`; the order names first appear in is the order of the model's input planes). Crowd annotations (`iscrowd: 1`) are skipped by `load`
(`read_coco(keep_crowd=True)` keeps them: CVAT writes a mask as a crowd annotation with a real box). CVAT's
`attributes.rotation` (degrees about the box centre) turns the box into its axis-aligned envelope.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from defectdet.data.companions import leave_out_companion_images
from defectdet.data.formats import check_box, is_coco_json, leaves_folder, load_json, order_splits
from defectdet.data.sample import DatasetSplit, Problem, Sample, check_companion_name, missing_companions
from defectdet.errors import DatasetError


def splits(path: Path) -> list[str]:
    return order_splits([json_path.stem for json_path in _json_files(path)])


def load(path: Path, split: str) -> DatasetSplit:
    return read_coco(path, split)


def read_coco(
    path: Path,
    split: str = "",
    *,
    keep_crowd: bool = False,
    image_roots: tuple[Path, ...] = (),
    contained: bool = False,
) -> DatasetSplit:
    """One COCO json (or the `split` json of a folder); `image_roots` are more folders to find images in.
    `contained` (an import from a labelling tool): a `file_name`, `template_file_name` or companion file name
    that is absolute or climbs out with `..` is an error instead of a path to follow."""
    if path.is_dir():
        by_stem = {json_path.stem: json_path for json_path in _json_files(path)}
        if split not in by_stem:
            raise DatasetError(
                f"{path}: no COCO json named {split}.json; available: {', '.join(sorted(by_stem))}"
            )
        path = by_stem[split]
    document = _read_json(path)
    json_name = str(path)
    problems: list[Problem] = []
    category_index, class_names = _categories(path, document)
    companion_names = _companion_names(path, _records(path, document, "images"))
    samples_by_id: dict[Any, Sample] = {}
    for position, record in enumerate(_records(path, document, "images")):
        sample = _image_sample(path, position, record, problems, image_roots, contained)
        if sample is not None:
            samples_by_id[record["id"]] = sample
    boxes, classes = _annotations(path, document, samples_by_id, category_index, problems, keep_crowd)
    for image_id, sample in samples_by_id.items():
        sample.boxes = np.asarray(boxes[image_id], np.float32).reshape(-1, 4)
        sample.classes = np.asarray(classes[image_id], np.int64)
    samples, left_out = leave_out_companion_images(list(samples_by_id.values()), json_name, path.stem)
    problems.extend(left_out)
    dataset = DatasetSplit(samples, class_names, "coco", path.stem, path.parent, problems, companion_names)
    problems.extend(missing_companions(dataset, json_name))
    return dataset


def _companion_names(path: Path, records: list[dict[str, Any]]) -> list[str]:
    """Every companion name of the image records, in the order they first appear; a bad name is an error."""
    names: dict[str, None] = {}
    for position, record in enumerate(records):
        companions = record.get("companions")
        if companions is None:
            continue
        where = f"{path}: images[{position}] (id {record.get('id', '?')}): field 'companions'"
        if not isinstance(companions, dict) or not all(isinstance(v, str) for v in companions.values()):
            raise DatasetError(f"{where} must map a companion name to a file name, got {companions!r}")
        for name in companions:
            names.setdefault(check_companion_name(name, where), None)
    return list(names)


def _annotations(
    path: Path,
    document: dict[str, Any],
    samples_by_id: dict[Any, Sample],
    category_index: dict[Any, int],
    problems: list[Problem],
    keep_crowd: bool,
) -> tuple[dict[Any, list[tuple[float, float, float, float]]], dict[Any, list[int]]]:
    """The checked boxes and class indices of each image id; bad annotations become problems."""
    json_name = str(path)
    known_images = {record.get("id") for record in document.get("images", []) if isinstance(record, dict)}
    boxes: dict[Any, list[tuple[float, float, float, float]]] = {image_id: [] for image_id in samples_by_id}
    classes: dict[Any, list[int]] = {image_id: [] for image_id in samples_by_id}
    for position, annotation in enumerate(_records(path, document, "annotations")):
        where = f"annotations[{position}] (id {annotation.get('id', '?')})"
        if annotation.get("iscrowd", 0) and not keep_crowd:
            continue
        image_id = annotation.get("image_id")
        if image_id not in known_images:
            problems.append(Problem("error", json_name, f"{where}: image_id {image_id!r} is not in 'images'"))
            continue
        if annotation.get("category_id") not in category_index:
            problems.append(
                Problem(
                    "error",
                    json_name,
                    f"{where}: category_id {annotation.get('category_id')!r} is not in 'categories'",
                )
            )
            continue
        if image_id not in samples_by_id:
            continue  # its image is missing; reported once with the image
        bbox = annotation.get("bbox")
        if not (isinstance(bbox, list) and len(bbox) == 4 and all(isinstance(v, (int, float)) for v in bbox)):
            problems.append(
                Problem("error", json_name, f"{where}: bbox must be 4 numbers [x, y, w, h], got {bbox!r}")
            )
            continue
        x, y, box_width, box_height = (float(value) for value in bbox)
        if box_width <= 0 or box_height <= 0:
            problems.append(
                Problem("error", json_name, f"{where}: bbox {bbox} has non-positive width or height")
            )
            continue
        sample = samples_by_id[image_id]
        checked = check_box(
            _rotated_envelope(x, y, box_width, box_height, annotation.get("attributes")),
            sample.width,
            sample.height,
            problems,
            json_name,
            what=f"{where}: bbox",
        )
        if checked is not None:
            boxes[image_id].append(checked)
            classes[image_id].append(category_index[annotation["category_id"]])
    return boxes, classes


def _rotated_envelope(
    x: float, y: float, width: float, height: float, attributes: Any
) -> tuple[float, float, float, float]:
    """xyxy of the box, or of the axis-aligned envelope of it turned by CVAT's `rotation` about its centre."""
    rotation = attributes.get("rotation") if isinstance(attributes, dict) else None
    if not isinstance(rotation, (int, float)) or not math.isfinite(rotation) or rotation % 180 == 0:
        return x, y, x + width, y + height
    angle = math.radians(rotation)
    half_w = (abs(math.cos(angle)) * width + abs(math.sin(angle)) * height) / 2
    half_h = (abs(math.sin(angle)) * width + abs(math.cos(angle)) * height) / 2
    center_x, center_y = x + width / 2, y + height / 2
    return center_x - half_w, center_y - half_h, center_x + half_w, center_y + half_h


def _json_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    found = sorted(path.glob("*.json")) or sorted((path / "annotations").glob("*.json"))
    if not found:
        raise DatasetError(f"{path}: no COCO .json file here or in annotations/")
    coco = [candidate for candidate in found if is_coco_json(candidate)]
    return coco or found  # other json files beside (settings, results) are not splits


def _read_json(path: Path) -> dict[str, Any]:
    try:
        document = load_json(path.read_text(encoding="utf-8"), path)
    except FileNotFoundError as error:
        raise DatasetError(f"{path}: COCO json not found") from error
    except json.JSONDecodeError as error:
        raise DatasetError(
            f"{path}:{error.lineno}: invalid JSON ({error.msg}, column {error.colno})"
        ) from error
    if not isinstance(document, dict) or not isinstance(document.get("images"), list):
        raise DatasetError(f"{path}: not a COCO detection file (needs an 'images' list)")
    return document


def _records(path: Path, document: dict[str, Any], key: str) -> list[dict[str, Any]]:
    records = document.get(key, [])
    if not isinstance(records, list):
        raise DatasetError(f"{path}: field '{key}' must be a list")
    return [record for record in records if isinstance(record, dict)]


def _categories(path: Path, document: dict[str, Any]) -> tuple[dict[Any, int], list[str]]:
    categories = _records(path, document, "categories")
    if not categories:  # derive from the annotations rather than refuse the file
        ids = sorted({a.get("category_id") for a in _records(path, document, "annotations")}, key=str)
        return {category_id: index for index, category_id in enumerate(ids)}, [str(i) for i in ids]
    by_id: dict[Any, str] = {}
    for category in categories:
        category_id = category.get("id")
        if category_id in by_id:
            raise DatasetError(f"{path}: field 'categories': id {category_id!r} appears twice")
        by_id[category_id] = str(category.get("name", category_id))
    try:
        ordered = sorted(by_id)
    except TypeError as error:
        raise DatasetError(f"{path}: field 'categories': ids must all be numbers (or all strings)") from error
    return {category_id: index for index, category_id in enumerate(ordered)}, [by_id[i] for i in ordered]


def _image_sample(
    path: Path,
    position: int,
    record: dict[str, Any],
    problems: list[Problem],
    image_roots: tuple[Path, ...] = (),
    contained: bool = False,
) -> Sample | None:
    where = f"images[{position}] (id {record.get('id', '?')})"
    file_name = record.get("file_name")
    if "id" not in record or not isinstance(file_name, str):
        problems.append(Problem("error", str(path), f"{where}: needs 'id' and 'file_name'"))
        return None
    companions = record.get("companions")
    companions = companions if isinstance(companions, dict) else {}
    if contained and _leaves_folder(path, where, record, companions, problems):
        return None
    image_path = resolve_image(path.parent, file_name, image_roots)
    if image_path is None:
        problems.append(Problem("error", str(path), f"{where}: image file {file_name!r} not found"))
        return None
    template_path = None
    template_name = record.get("template_file_name")
    if isinstance(template_name, str):
        template_path = resolve_image(path.parent, template_name, image_roots)
        if template_path is None:
            problems.append(Problem("warning", str(path), f"{where}: template {template_name!r} not found"))
    width, height = record.get("width"), record.get("height")
    return Sample(
        image_path,
        np.zeros((0, 4), np.float32),
        np.zeros(0, np.int64),
        template_path=template_path,
        source=str(path),
        image_id=str(record["id"]),
        width=int(width) if isinstance(width, (int, float)) and width > 0 else None,
        height=int(height) if isinstance(height, (int, float)) and height > 0 else None,
        companion_paths=_companion_paths(path, where, companions, problems, image_roots),
    )


def _leaves_folder(
    path: Path, where: str, record: dict[str, Any], companions: dict[str, Any], problems: list[Problem]
) -> bool:
    """Whether a file name of the image record (its own, its template's, a companion's) leads out of the images
    folder (an error, then)."""
    fields = [
        ("file_name", record.get("file_name")),
        ("template_file_name", record.get("template_file_name")),
    ]
    fields += [(f"companions.{name}", value) for name, value in companions.items()]
    for field, value in fields:
        if isinstance(value, str) and leaves_folder(value):
            problems.append(
                Problem(
                    "error", str(path), f"{where}: {field} {value!r} leads out of the images folder; refused"
                )
            )
            return True
    return False


def _companion_paths(
    path: Path, where: str, companions: dict[str, Any], problems: list[Problem], image_roots: tuple[Path, ...]
) -> dict[str, Path]:
    """The companion captures of an image record found (a warning for each one missing), by name."""
    found_paths = {}
    for name, companion_name in companions.items():
        found = resolve_image(path.parent, str(companion_name), image_roots)
        if found is None:
            problems.append(
                Problem(
                    "warning", str(path), f"{where}: companion '{name}' file {companion_name!r} not found"
                )
            )
        else:
            found_paths[str(name)] = found
    return found_paths


def resolve_image(folder: Path, file_name: str, extra: tuple[Path, ...] = ()) -> Path | None:
    """The first existing of folder/name, folder/images/name, the same one level up, then extra/name."""
    name = Path(file_name)
    if name.is_absolute():
        return name if name.is_file() else None
    for base in (folder, folder / "images", folder.parent, folder.parent / "images", *extra):
        if (base / name).is_file():
            return base / name
    return None

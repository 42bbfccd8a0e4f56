"""Label Studio interchange: our predictions out as import tasks with pre-annotations, its JSON export back in.

Label Studio's documented formats (labelstud.io/guide/task_format, /guide/predictions, /guide/export):
a task is `{"id", "data": {"image": URL}, "annotations": [...], "predictions": [...]}`; a rectangle region is
`{"type": "rectanglelabels", "from_name", "to_name", "original_width", "original_height",
"value": {"x", "y", "width", "height", "rotation", "rectanglelabels": [name]}}` with x, y, width, height in
percent of the image and `rotation` in degrees clockwise about the top-left corner. A prediction adds
`model_version` and `score`. Images are URLs: `/data/local-files/?d=<path below the local-files document root>`,
`/data/upload/<project>/<8 hex>-<name>` for uploads, or http(s)/cloud URLs.

Our additions, read and written: a task's `data.template` is the URL of the image's defect-free template (the
same forms as `data.image`; Label Studio shows and keeps it, the labelling config need not use it), and
`data.defectdet_image` / `data.defectdet_template` our absolute paths for the way back; each aligned companion
capture NAME of the image (another lighting, focus or band) travels the same way, as `data.companion_NAME` (its
URL) and `data.defectdet_companion_NAME` (our path). Exported tasks carry the
operator's reviewed labels as `annotations` and the model's detections as `predictions` only for images no one
reviewed yet.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import math
import os
import re
import xml.etree.ElementTree as ElementTree
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlparse
from xml.sax.saxutils import quoteattr

from defectdet.data.formats import IMAGE_SUFFIXES, below, leaves_folder, load_json
from defectdet.data.formats.interchange import (
    ImportReport,
    LabelledImage,
    YoloWrite,
    atomic_write_text,
    hold_out_groups,
    write_yolo,
)
from defectdet.data.formats.label_settings import (
    LabelStudioImportSettings,
    TaskExportSettings,
)
from defectdet.data.imageio import read_image_size
from defectdet.data.sample import check_companion_name, companion_name_problem
from defectdet.errors import DatasetError, ImageReadError

FROM_NAME, TO_NAME = "label", "image"
OUR_IMAGE_KEY = "defectdet_image"  # our absolute path of the image, kept in the task's data for the way back
TEMPLATE_KEY = "template"  # the task data field with the URL of the image's template
OUR_TEMPLATE_KEY = "defectdet_template"
COMPANION_KEY = "companion_"  # + NAME: the task data field with the URL of the image's companion capture NAME
OUR_COMPANION_KEY = "defectdet_companion_"
_NOT_IMAGES = frozenset({OUR_IMAGE_KEY, TEMPLATE_KEY, OUR_TEMPLATE_KEY})
_UPLOAD_PREFIX = re.compile(r"^[0-9a-f]{8}-", re.IGNORECASE)
_LISTED = 10


# ---------------------------------------------------------------- predictions -> import tasks


@dataclass
class Predicted:
    """One image and what the model found on it (xyxy pixels of the image)."""

    image: Path
    detections: list[tuple[str, float, tuple[float, float, float, float]]]  # class name, score, box
    width: int | None = None
    height: int | None = None
    predicted: bool = True  # False: an image without a prediction record (a task to label from scratch)
    model_version: str | None = None  # the bundle a sidecar names
    template: Path | None = None
    labels: list[tuple[str, tuple[float, float, float, float]]] | None = (
        None  # the operator's; None: unreviewed
    )
    companions: dict[str, Path] = field(default_factory=dict)  # aligned captures by companion name


@dataclass
class TasksExport:
    """What `export_tasks` wrote."""

    tasks_path: Path
    config_path: Path
    tasks: int
    predictions: int
    regions: int
    document_root: Path
    class_names: list[str]
    skipped: list[str] = field(default_factory=list)  # predict's failed files
    annotated: int = 0  # tasks carrying the operator's reviewed labels as an annotation
    companions: int = 0  # companion captures carried as data.companion_NAME


def config_classes(path: Path) -> list[str]:
    """The class names of a labelling config XML in order: the `Label` values of its first `RectangleLabels`
    (Label Studio's export carries no class list, so this fixes the class ids of a new dataset)."""
    path = Path(path)
    try:
        root = ElementTree.parse(path).getroot()
    except FileNotFoundError:
        raise DatasetError(f"{path}: labelling config not found") from None
    except ElementTree.ParseError as error:
        line, column = error.position
        raise DatasetError(f"{path}:{line}:{column + 1}: invalid XML ({error})") from None
    labels = root if root.tag == "RectangleLabels" else root.find(".//RectangleLabels")
    names = [label.get("value", "") for label in labels.iter("Label")] if labels is not None else []
    if not names or not all(names):
        raise DatasetError(f"{path}: no <RectangleLabels> with <Label value=...> children")
    return names


def labeling_config(class_names: list[str], companions: Sequence[str] = ()) -> str:
    """The labelling interface XML: the image and one RectangleLabels with our classes; below them each
    companion capture, to look at while drawing the boxes on the image (a defect one lighting hides)."""
    labels = "".join(f"    <Label value={quoteattr(name)}/>\n" for name in class_names)
    views = "".join(
        f"  <Header value={quoteattr(f'companion {name}')}/>\n"
        f'  <Image name="{COMPANION_KEY}{name}" value="${COMPANION_KEY}{name}" zoom="true"/>\n'
        for name in companions
    )
    return (
        "<View>\n"
        f'  <Image name="{TO_NAME}" value="$image" zoom="true"/>\n'
        f'  <RectangleLabels name="{FROM_NAME}" toName="{TO_NAME}">\n'
        f"{labels}"
        "  </RectangleLabels>\n"
        f"{views}"
        "</View>\n"
    )


def export_tasks(source: Path, out: Path, settings: TaskExportSettings | None = None) -> TasksExport:
    """Write Label Studio import tasks for the images of `source`, and the labelling config of their classes, as
    `settings` say (default: `TaskExportSettings()`).

    `source`: `defectdet predict`'s output folder or its predictions.jsonl; the service's keep folder
    (`serve --keep`: `predictions/NAME.json` sidecars naming `images/NAME.ext`, the review's `labels/NAME.txt`,
    `templates/`); or a folder of images with a prediction JSON beside each (`<stem>.json` holding
    `detections`, as `PredictionResult.to_dict` writes them), where images without one become tasks without
    predictions. An image the operator reviewed carries its labels as an annotation; the others carry the
    model's detections as a prediction, those under `score_floor` (default: the threshold a record states) left
    out. `classes` (or the class list of `model`): the model's full class list (default: the source's, then the
    names used). Image and template URLs are `url_prefix` + the path below `document_root` (default: the folder
    holding them all), which is what Label Studio's local-files storage serves when
    LABEL_STUDIO_LOCAL_FILES_DOCUMENT_ROOT is that folder. `images` is where to find the files predictions.jsonl
    names when they moved since.
    """
    settings = settings or TaskExportSettings()
    source = Path(source)
    records, class_hint, skipped = read_predictions(source, settings.images, settings.score_floor)
    if not records:
        raise DatasetError(f"{source}: no images to export")
    names = _task_classes(records, _given_classes(settings), class_hint)
    paths = [record.image.absolute() for record in records]
    root = _document_root(records, paths, settings.document_root)
    model_version = settings.model_version
    if model_version == "defectdet":
        model_version = next((r.model_version for r in records if r.model_version), model_version)
    tasks, counts = [], {"predictions": 0, "regions": 0, "annotated": 0}
    for record, path in zip(records, paths, strict=True):
        tasks.append(_task(record, path, root, settings.url_prefix, model_version, counts))
    out = Path(out)
    config_path = Path(settings.config_path or out.with_name(f"{out.stem}_config.xml"))
    atomic_write_text(out, json.dumps(tasks, indent=1))
    companions = list(dict.fromkeys(name for record in records for name in record.companions))
    atomic_write_text(config_path, labeling_config(names, companions))
    return TasksExport(
        tasks_path=out,
        config_path=config_path,
        tasks=len(tasks),
        predictions=counts["predictions"],
        regions=counts["regions"],
        document_root=root,
        class_names=names,
        skipped=skipped,
        annotated=counts["annotated"],
        companions=sum(len(record.companions) for record in records),
    )


def _given_classes(settings: TaskExportSettings) -> list[str] | None:
    """`settings.classes`; a `model` must have been read into them (the labels command does)."""
    if settings.model is not None:
        raise DatasetError(
            f"--model {settings.model}: give its class names as classes (a bundle's metadata or a checkpoint "
            "records them)"
        )
    return settings.classes


def _document_root(records: list[Predicted], paths: list[Path], document_root: Path | None) -> Path:
    """`document_root`, else the folder holding every image, template and companion capture."""
    if document_root:
        return Path(document_root).absolute()
    folders = [p.parent for p in paths] + [r.template.absolute().parent for r in records if r.template]
    folders += [c.absolute().parent for r in records for c in r.companions.values()]
    return Path(os.path.commonpath([str(folder) for folder in folders]))


def _task_classes(records: list[Predicted], classes: list[str] | None, hint: list[str]) -> list[str]:
    """The class list of the labelling config: `classes` (the model's full list) or the source's, then any
    other name a detection or label uses (an error when `classes` was given)."""
    names = list(classes) if classes else list(hint)
    for record in records:
        used = [name for name, _, _ in record.detections] + [name for name, _ in record.labels or []]
        for name in used:
            if name not in names:
                if classes:
                    raise DatasetError(
                        f"{record.image}: class {name!r} is not in the model's classes {','.join(classes)}"
                    )
                names.append(name)
    return names


def _url(path: Path, root: Path, url_prefix: str, what: str) -> str:
    try:
        relative = path.relative_to(root).as_posix()
    except ValueError:
        raise DatasetError(f"{path}: {what} not below --document-root {root}") from None
    return url_prefix + quote(relative, safe="/")


def _task(
    record: Predicted, path: Path, root: Path, url_prefix: str, model_version: str, counts: dict[str, int]
) -> dict[str, Any]:
    """One import task: the image (and template) URLs; the operator's labels as an annotation, else the
    model's detections as a prediction."""
    data = {"image": _url(path, root, url_prefix, "image"), OUR_IMAGE_KEY: str(path)}
    if record.template is not None:
        template = record.template.absolute()
        data.update(
            {TEMPLATE_KEY: _url(template, root, url_prefix, "template"), OUR_TEMPLATE_KEY: str(template)}
        )
    for name, companion in record.companions.items():
        companion = companion.absolute()
        data[COMPANION_KEY + name] = _url(companion, root, url_prefix, f"companion {name!r}")
        data[OUR_COMPANION_KEY + name] = str(companion)
    task: dict[str, Any] = {"data": data}
    if record.labels is None and not record.predicted:
        return task
    width, height = record.width, record.height
    if width is None or height is None:
        width, height = _image_size(path, str(path))
    if record.labels is not None:
        result = [_region(f"l{i}", name, box, width, height) for i, (name, box) in enumerate(record.labels)]
        task["annotations"] = [{"result": result, "was_cancelled": False, "ground_truth": False}]
        counts["annotated"] += 1
        return task
    result = [
        _region(f"d{index}", name, box, width, height, score)
        for index, (name, score, box) in enumerate(record.detections)
    ]
    scores = [score for _, score, _ in record.detections]
    task["predictions"] = [
        {"model_version": model_version, "score": float(max(scores)) if scores else 0.0, "result": result}
    ]
    counts["predictions"] += 1
    counts["regions"] += len(result)
    return task


def _region(
    region_id: str,
    name: str,
    box: tuple[float, float, float, float],
    width: int,
    height: int,
    score: float | None = None,
) -> dict[str, Any]:
    x1, y1, x2, y2 = box
    return {
        "id": region_id,
        "type": "rectanglelabels",
        "from_name": FROM_NAME,
        "to_name": TO_NAME,
        "original_width": width,
        "original_height": height,
        "image_rotation": 0,
        "value": {
            "x": round(100 * x1 / width, 5),
            "y": round(100 * y1 / height, 5),
            "width": round(100 * (x2 - x1) / width, 5),
            "height": round(100 * (y2 - y1) / height, 5),
            "rotation": 0,
            "rectanglelabels": [name],
        },
        **({} if score is None else {"score": float(score)}),  # unrounded: Label Studio filters by it
    }


def read_predictions(
    source: Path, images: Path | None = None, score_floor: float | None = None
) -> tuple[list[Predicted], list[str], list[str]]:
    """(images with their detections, class names in the model's order when known, failed files)."""
    source = Path(source)
    if source.is_dir() and (source / "predictions.jsonl").is_file():
        source = source / "predictions.jsonl"
    if source.is_file() and source.suffix.lower() == ".jsonl":
        return _read_jsonl(source, images, score_floor)
    if source.is_dir() and (source / "predictions").is_dir() and any((source / "predictions").glob("*.json")):
        return _read_keep_folder(source, score_floor)
    if source.is_dir():
        return _read_sidecars(source, score_floor)
    raise DatasetError(
        f"{source}: expected `defectdet predict`'s output folder, its predictions.jsonl, or a folder of images"
    )


def _read_jsonl(
    path: Path, images: Path | None, score_floor: float | None
) -> tuple[list[Predicted], list[str], list[str]]:
    classes_file = path.parent / "classes.txt"
    class_names = (
        [line.strip() for line in classes_file.read_text(encoding="utf-8").splitlines() if line.strip()]
        if classes_file.is_file()
        else []
    )
    records, skipped = [], []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            entry = load_json(line, f"{path}:{number}")
        except json.JSONDecodeError as error:
            raise DatasetError(f"{path}:{number}: invalid JSON ({error.msg}, column {error.colno})") from None
        if not isinstance(entry, dict) or not isinstance(entry.get("file"), str):
            raise DatasetError(f"{path}:{number}: expected an object with 'file'")
        if entry.get("error"):
            skipped.append(f"{entry['file']}: {entry['error']}")
            continue
        image = _find_predicted_image(entry["file"], path, images)
        if image is None:
            where = f" or in {images}" if images else ""
            raise DatasetError(
                f"{path}:{number}: image {entry['file']!r} not found (relative to here, to {path.parent}{where}); "
                "pass --images DIR"
            )
        record = _predicted(image, entry, class_names, f"{path}:{number}", score_floor)
        template = entry.get("template")
        if isinstance(template, str):
            record.template = _find_predicted_image(template, path, images)
        companions = entry.get("companions")
        for name, file in (companions if isinstance(companions, dict) else {}).items():
            found = _find_predicted_image(file, path, images) if isinstance(file, str) else None
            if found is not None:
                record.companions[str(name)] = found
        records.append(record)
    return records, class_names, skipped


def _find_predicted_image(name: str, jsonl: Path, images: Path | None) -> Path | None:
    candidate = Path(name)
    options = [candidate] if candidate.is_absolute() else [candidate, jsonl.parent / candidate]
    if images is not None:
        options += [images / candidate.name]
    return next((option for option in options if option.is_file()), None)


def _read_keep_folder(
    folder: Path, score_floor: float | None
) -> tuple[list[Predicted], list[str], list[str]]:
    """The keep folder the service writes and the review labels: each sidecar's detections, the image's
    template (`templates/`) and, where the operator decided (not skip) or a label file exists, their labels."""
    records, names = [], _folder_classes(folder)
    skipped = _skipped_images(folder)
    for sidecar in sorted((folder / "predictions").glob("*.json")):
        whole = _read_json_file(sidecar)
        entry = _prediction_record(whole, sidecar)
        name = entry.get("image")
        if isinstance(name, str) and leaves_folder(name):
            raise DatasetError(f"{sidecar}: image {name!r} leads out of {folder}; refused")
        image = folder / name if isinstance(name, str) else None
        if image is None or not image.is_file():
            raise DatasetError(f"{sidecar}: its image {name!r} is not in {folder}")
        if not names and isinstance(entry.get("class_names"), list):
            names = [str(value) for value in entry["class_names"]]
        record = _predicted(image, entry, names, str(sidecar), score_floor)
        bundle = entry.get("bundle")
        record.model_version = str(bundle) if bundle else None
        record.template = _kept_template(folder, image)
        record.companions = _kept_companions(folder, image, whole)
        if image.name not in skipped:
            record.labels = _reviewed_labels(folder / "labels" / f"{image.stem}.txt", image, record, names)
        records.append(record)
    return records, names, []


def _folder_classes(folder: Path) -> list[str]:
    path = folder / "classes.txt"
    if not path.is_file():
        return []
    return [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _skipped_images(folder: Path) -> set[str]:
    """Images whose last review decision is skip (decisions.jsonl; a torn line is ignored)."""
    path, last = folder / "decisions.jsonl", {}
    if path.is_file():
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                entry = json.loads(line)
                last[PurePosixPath(str(entry["image"])).name] = entry["action"]
            except (ValueError, KeyError, TypeError):
                continue
    return {name for name, action in last.items() if action == "skip"}


def _kept_template(folder: Path, image: Path, below: Path | None = None) -> Path | None:
    """The file of the image's stem in `below` (default: the keep folder's `templates/`)."""
    candidates = sorted((below or folder / "templates").glob(f"{glob.escape(image.stem)}.*"))
    return next((c for c in candidates if c.suffix.lower() in IMAGE_SUFFIXES and c.is_file()), None)


def _kept_companions(folder: Path, image: Path, sidecar: Any) -> dict[str, Path]:
    """The image's companion captures in the keep folder (`companions/NAME/`): the files its sidecar names, in
    that order, then any other capture folder holding a file of the image's stem."""
    named = sidecar.get("companions") if isinstance(sidecar, dict) else None
    found: dict[str, Path] = {}
    for name, relative in (named if isinstance(named, dict) else {}).items():
        path = folder / "companions" / str(name) / PurePosixPath(str(relative)).name
        if path.is_file():
            found[str(name)] = path
    root = folder / "companions"
    for capture in sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []:
        if capture.name not in found and companion_name_problem(capture.name) is None:
            file = _kept_template(folder, image, capture)
            if file is not None:
                found[capture.name] = file
    return found


def _reviewed_labels(
    path: Path, image: Path, record: Predicted, names: list[str]
) -> list[tuple[str, tuple[float, float, float, float]]] | None:
    """The boxes of a YOLO label file in pixels with class names; None when there is no label file."""
    if not path.is_file():
        return None
    if record.width is None or record.height is None:
        record.width, record.height = _image_size(image, str(image))
    width, height = record.width, record.height
    labels = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        parts = line.split()
        if not parts:
            continue
        try:
            class_id, cx, cy, w, h = (float(part) for part in parts)
        except ValueError:
            raise DatasetError(
                f"{path}:{number}: expected 'class cx cy w h', got {line.strip()[:60]!r}"
            ) from None
        if class_id != int(class_id) or not 0 <= class_id < len(names):
            raise DatasetError(f"{path}:{number}: class {parts[0]} is not one of the {len(names)} classes")
        box = ((cx - w / 2) * width, (cy - h / 2) * height, (cx + w / 2) * width, (cy + h / 2) * height)
        labels.append((names[int(class_id)], box))
    return labels


def _read_json_file(path: Path) -> Any:
    try:
        return load_json(path.read_text(encoding="utf-8"), path)
    except json.JSONDecodeError as error:
        raise DatasetError(
            f"{path}:{error.lineno}: invalid JSON ({error.msg}, column {error.colno})"
        ) from None


def _read_sidecars(folder: Path, score_floor: float | None) -> tuple[list[Predicted], list[str], list[str]]:
    records = []
    images = sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())
    if not images:
        raise DatasetError(f"{folder}: no images here (and no predictions.jsonl)")
    for image in images:
        sidecar = next(
            (p for p in (image.with_suffix(".json"), image.with_name(image.name + ".json")) if p.is_file()),
            None,
        )
        if sidecar is None:
            records.append(Predicted(image, [], predicted=False))
            continue
        entry = _prediction_record(_read_json_file(sidecar), sidecar)
        records.append(_predicted(image, entry, [], str(sidecar), score_floor))
    return records, [], []


def _prediction_record(entry: Any, where: Path) -> dict[str, Any]:
    """The object holding `detections`: the sidecar itself or one level down (`result`, `prediction`, ...)."""
    if isinstance(entry, dict):
        if isinstance(entry.get("detections"), list):
            return entry
        for value in entry.values():
            if isinstance(value, dict) and isinstance(value.get("detections"), list):
                return value
    raise DatasetError(f"{where}: no 'detections' list (the prediction JSON defectdet writes per image)")


def _predicted(
    image: Path, entry: dict[str, Any], class_names: list[str], where: str, score_floor: float | None
) -> Predicted:
    floor = score_floor if score_floor is not None else entry.get("threshold")
    floor = float(floor) if _number(floor) else 0.0
    detections = []
    for index, detection in enumerate(entry.get("detections") or []):
        at = f"{where}: detections[{index}]"
        box = detection.get("box") if isinstance(detection, dict) else None
        if not (isinstance(box, list) and len(box) == 4 and all(_number(v) for v in box)):
            raise DatasetError(f"{at}: 'box' must be 4 numbers [x1, y1, x2, y2] in pixels, got {box!r}")
        name = detection.get("class_name")
        if not isinstance(name, str):
            class_id = detection.get("class_id")
            if not (isinstance(class_id, int) and 0 <= class_id < len(class_names)):
                raise DatasetError(f"{at}: needs 'class_name' (or a 'class_id' of classes.txt)")
            name = class_names[class_id]
        score = float(detection["score"]) if _number(detection.get("score")) else 1.0
        if score >= floor:
            detections.append((name, score, tuple(float(v) for v in box)))
    size = entry.get("image_size")
    width, height = (
        (int(size[0]), int(size[1])) if isinstance(size, list) and len(size) == 2 else (None, None)
    )
    return Predicted(image, detections, width, height)


# ---------------------------------------------------------------- Label Studio JSON export -> our dataset


def read_export(path: Path) -> list[dict[str, Any]]:
    """The tasks of a Label Studio JSON export; malformed JSON names the file, line, column and character."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DatasetError(f"{path}: Label Studio export not found") from None
    except UnicodeDecodeError as error:
        raise DatasetError(
            f"{path}: not UTF-8 text (byte {error.start}); expected Label Studio's JSON export"
        ) from None
    try:
        document = load_json(text, path)
    except json.JSONDecodeError as error:
        raise DatasetError(
            f"{path}:{error.lineno}:{error.colno}: invalid JSON ({error.msg}, character {error.pos})"
        ) from None
    if isinstance(document, dict) and "data" in document:
        document = [document]  # one task saved on its own
    if not isinstance(document, list):
        raise DatasetError(
            f"{path}: expected a list of tasks (Label Studio's 'JSON' export), got {type(document).__name__}"
        )
    for position, task in enumerate(document):
        if not isinstance(task, dict) or not isinstance(task.get("data"), dict):
            raise DatasetError(f"{path}: task [{position}]: expected an object with a 'data' object")
    return document


@dataclass
class _Parsed:
    items: list[LabelledImage]
    classes: list[str]
    unlabelled: int
    missing: list[str]
    warnings: list[str]


def import_export(
    export: Path, out_dir: Path, settings: LabelStudioImportSettings | None = None
) -> tuple[ImportReport, int]:
    """Import a Label Studio JSON export into one split (`settings.split`, default train) of the YOLO dataset
    `out_dir`, as `settings` say (default: `LabelStudioImportSettings()`); returns the report and the number of
    tasks without a (non-cancelled) annotation, which are left out. Images are looked for in `settings.images`
    (default: the export's folder): the `d` path of a local-files URL below each, then the file name (an
    upload's 8-hex prefix dropped), then the path our `export_tasks` stored in the task. A task's
    `data.template` comes along into the split's template folder."""
    settings = settings or LabelStudioImportSettings()
    parsed = _parsed_export(Path(export), settings)
    report = _write_split(parsed, parsed.items, out_dir, _target(settings, settings.split or "train"))
    return report, parsed.unlabelled


def import_export_held_out(
    export: Path, out_dir: Path, settings: LabelStudioImportSettings | None = None
) -> tuple[list[ImportReport], int]:
    """`import_export` into train and val: `settings.val_fraction` of the images held out (`hold_out_groups`:
    an image and its template, and images sharing a template, stay on one side). Returns the reports of the
    splits written (train, then val) and the number of tasks left out unlabelled."""
    settings = settings or LabelStudioImportSettings()
    parsed = _parsed_export(Path(export), settings)
    train, val = hold_out_groups(parsed.items, settings.val_fraction)
    reports = [_write_split(parsed, train, out_dir, _target(settings, "train"))]
    if val:  # the dataset's data.yaml now fixes the classes (the export's, all of them, or the given ones)
        target = _target(settings, "val", classes=None)
        reports.append(_write_split(parsed, val, out_dir, target, notes=False))
    return reports, parsed.unlabelled


def _target(settings: LabelStudioImportSettings, split: str, **changes: Any) -> YoloWrite:
    """How `write_yolo` writes `split` of an import with `settings` (`changes`: other YoloWrite fields)."""
    values = {
        "split": split,
        "classes": settings.classes,
        "unknown": settings.unknown,
        "existing": settings.existing,
        "link": settings.link,
    }
    return YoloWrite(**{**values, **changes})


def _parsed_export(export: Path, settings: LabelStudioImportSettings) -> _Parsed:
    roots = [Path(p) for p in settings.images] if settings.images else [export.parent]
    parsed = _parse(export, read_export(export), roots, settings.image_key)
    if parsed.missing and not settings.skip_missing:
        listed = "\n  ".join(parsed.missing[:_LISTED])
        more = f"\n  (and {len(parsed.missing) - _LISTED} more)" if len(parsed.missing) > _LISTED else ""
        raise DatasetError(
            f"{export}: {len(parsed.missing)} task image(s) not found:\n  {listed}{more}\n"
            "Pass --images DIR (the folder Label Studio serves local files from, or its media folder for "
            "uploads), or --skip-missing to import the rest"
        )
    return parsed


def _write_split(
    parsed: _Parsed, items: list[LabelledImage], out_dir: Path, target: YoloWrite, notes: bool = True
) -> ImportReport:
    """`write_yolo` of `items` as `target` says, the export's classes its source classes; `notes`: the export's
    missing images and warnings on the report."""
    report = write_yolo(items, out_dir, dataclasses.replace(target, source_classes=parsed.classes))
    if notes:
        report.skipped_images.extend(parsed.missing)
        report.warnings[:0] = parsed.warnings
    return report


def _parse(export: Path, tasks: list[dict[str, Any]], roots: list[Path], image_key: str | None) -> _Parsed:
    items, classes, missing, warnings = [], [], [], []
    unlabelled = 0
    for position, task in enumerate(tasks):
        origin = f"task {task['id']}" if "id" in task else f"task [{position}]"
        annotation = _chosen_annotation(export, task, origin, warnings)
        if annotation is None:
            unlabelled += 1
            continue
        url = _image_url(export, task, origin, image_key)
        _refuse_climbing(export, origin, image_key or "image", url)
        image = resolve_task_image(url, roots, task["data"].get(OUR_IMAGE_KEY))
        if image is None:
            missing.append(f"{origin}: image {url!r} not found ({_looked_for(url, roots)})")
            continue
        template = _task_template(export, task, origin, roots, image, warnings)
        companions = _task_companions(export, task, origin, roots, image, warnings)
        width, height = _image_size(image, origin)
        boxes, names = [], []
        for index, region in enumerate(annotation.get("result") or []):
            at = f"{origin}: result[{index}]"
            if not isinstance(region, dict):
                raise DatasetError(f"{export}: {at}: expected an object")
            if region.get("type") != "rectanglelabels":
                warnings.append(f"{at}: a {region.get('type')!r} region is not a box; left out")
                continue
            box, name = _region_box(export, region, at, width, height, warnings)
            if box is not None and name is not None:
                boxes.append(box)
                names.append(name)
                if name not in classes:
                    classes.append(name)
        items.append(
            LabelledImage(
                image,
                _destination_name(url, image),
                boxes,
                names,
                origin,
                width,
                height,
                template,
                companions,
            )
        )
    return _Parsed(items, classes, unlabelled, missing, warnings)


def _refuse_climbing(export: Path, origin: str, key: str, url: str) -> None:
    """The importers' rule (`formats.leaves_folder`) on the path a task's URL gives: a local-files path, a
    plain or file:// path, an upload path; an absolute one or one that climbs with `..` is refused."""
    relative, _ = _url_path(url)
    parsed = urlparse(url)
    paths = [relative] if relative else []
    if "/data/upload/" in parsed.path:
        paths.append(unquote(parsed.path).split("/data/upload/", 1)[1])
    elif parsed.scheme in ("", "file") and not relative:
        paths.append(unquote(parsed.path))
    if parsed.scheme == "file" or any(leaves_folder(path) for path in paths):
        raise DatasetError(
            f"{export}: {origin}: data.{key} {url!r} leads out of the images folder (an absolute path, "
            "file:// or '..'); refused: name files below --images"
        )


def _task_template(
    export: Path,
    task: dict[str, Any],
    origin: str,
    roots: list[Path],
    image: Path,
    warnings: list[str],
    keys: tuple[str, str, str] = (TEMPLATE_KEY, OUR_TEMPLATE_KEY, "template"),
) -> Path | None:
    """The file `data.template` names (or another plane's, `keys`: its URL field, our path field, what it is),
    None when the task has none or it is missing: its path below the roots, then the path our export stored,
    then its file name below the roots, never the tested image itself (a template often has the image's name)."""
    key, our_key, what = keys
    url = task["data"].get(key)
    if not isinstance(url, str) or not url:
        return None
    _refuse_climbing(export, origin, key, url)
    relative, _ = _url_path(url)
    candidates = [root / relative for root in roots] if relative and not Path(relative).is_absolute() else []
    ours = task["data"].get(our_key)
    candidates += [Path(ours)] if isinstance(ours, str) else []
    found = (c for c in candidates if below(c, roots) and c.is_file())
    template = next(found, None) or resolve_task_image(url, roots)
    if template is not None and template.resolve() == image.resolve():
        template = None
    if template is None:
        warnings.append(
            f"{origin}: {what} {url!r} not found ({_looked_for(url, roots)}); imported without it"
        )
    return template


def _task_companions(
    export: Path, task: dict[str, Any], origin: str, roots: list[Path], image: Path, warnings: list[str]
) -> dict[str, Path]:
    """The companion captures a task carries (`data.companion_NAME`), found like its template, in task order."""
    found = {}
    for key in task["data"]:
        if not (isinstance(key, str) and key.startswith(COMPANION_KEY)):
            continue
        name = check_companion_name(key[len(COMPANION_KEY) :], f"{export}: {origin}: data.{key}")
        keys = (key, OUR_COMPANION_KEY + name, f"companion {name!r}")
        path = _task_template(export, task, origin, roots, image, warnings, keys)
        if path is not None:
            found[name] = path
    return found


def _chosen_annotation(
    export: Path, task: dict[str, Any], origin: str, warnings: list[str]
) -> dict[str, Any] | None:
    """The ground-truth annotation, else the latest one that was not cancelled (skipped); None: unlabelled."""
    annotations = (
        task.get("annotations", task.get("completions")) or []
    )  # 'completions': before Label Studio 1.0
    if not isinstance(annotations, list):
        raise DatasetError(f"{export}: {origin}: 'annotations' must be a list")
    kept = [a for a in annotations if isinstance(a, dict) and not a.get("was_cancelled")]
    if not kept:
        return None
    if len(kept) > 1:
        warnings.append(f"{origin}: {len(kept)} annotations; took the ground truth or the latest")
    truth = [a for a in kept if a.get("ground_truth")]
    pool = truth or kept
    return max(
        enumerate(pool),
        key=lambda pair: (str(pair[1].get("updated_at") or pair[1].get("created_at") or ""), pair[0]),
    )[1]


def _image_url(export: Path, task: dict[str, Any], origin: str, image_key: str | None) -> str:
    data = task["data"]
    if image_key:
        value = data.get(image_key)
    else:
        value = data.get("image")
        if not isinstance(value, str):
            value = next(
                (
                    v
                    for k, v in data.items()
                    if isinstance(v, str) and _may_be_image(k) and _looks_like_image(v)
                ),
                None,
            )
    if not isinstance(value, str) or not value:
        key = image_key or "image"
        raise DatasetError(
            f"{export}: {origin}: no image in data.{key} (pass --image-key for another data field)"
        )
    return value


def _may_be_image(key: str) -> bool:
    """A task data field that may hold the tested image (not a template, companion or one of our paths)."""
    return key not in _NOT_IMAGES and not key.startswith((COMPANION_KEY, OUR_COMPANION_KEY))


def _looks_like_image(value: str) -> bool:
    return PurePosixPath(urlparse(value).path).suffix.lower() in IMAGE_SUFFIXES or "?d=" in value


def _url_path(url: str) -> tuple[str | None, str]:
    """(path below the local-files root when the URL is a local-files one, the file name to fall back on)."""
    parsed = urlparse(url)
    if parsed.path.endswith("/data/local-files/") or parsed.path.endswith("/data/local-files"):
        values = parse_qs(parsed.query).get("d")
        relative = values[0] if values else ""  # parse_qs has decoded it
        return relative.lstrip("/"), PurePosixPath(relative).name
    name = PurePosixPath(unquote(parsed.path)).name
    if "/data/upload/" in parsed.path:
        return None, name
    if parsed.scheme in ("", "file"):
        return unquote(parsed.path), name
    return None, name


def resolve_task_image(url: str, roots: list[Path], ours: Any = None) -> Path | None:
    """The file a task's image URL names, looked for below `roots`; `ours`: the path our export stored (used
    when it lies below a root). A file outside every root is never returned."""
    relative, name = _url_path(url)
    candidates: list[Path] = []
    if relative:
        path = Path(relative)
        candidates += [path] if path.is_absolute() else [root / path for root in roots]
    for root in roots:
        candidates.append(root / name)
        if _UPLOAD_PREFIX.match(name):
            candidates.append(root / _UPLOAD_PREFIX.sub("", name))
    if "/data/upload/" in url:  # Label Studio's media folder keeps upload/<project>/<name>
        tail = Path(*PurePosixPath(urlparse(url).path).parts[-3:])
        candidates += [root / tail for root in roots] + [root / "media" / tail for root in roots]
    if isinstance(ours, str):
        candidates.append(Path(ours))
    found = (path for path in candidates if below(path, roots) and path.is_file())  # never outside the roots
    return next(found, None)


def _looked_for(url: str, roots: list[Path]) -> str:
    relative, name = _url_path(url)
    what = " and ".join(dict.fromkeys(x for x in (relative, name) if x))
    return f"looked for {what} under {', '.join(str(root) for root in roots)}"


def _destination_name(url: str, image: Path) -> PurePosixPath:
    """The image's file name in our dataset (an upload's 8-hex prefix dropped)."""
    _, name = _url_path(url)
    name = _UPLOAD_PREFIX.sub("", name) if "/data/upload/" in url else name
    return PurePosixPath(name or image.name)


def _image_size(image: Path, origin: str) -> tuple[int, int]:
    try:
        return read_image_size(image)
    except ImageReadError as error:
        raise DatasetError(f"{origin}: {error}") from None


def _region_box(
    export: Path, region: dict[str, Any], at: str, width: int, height: int, warnings: list[str]
) -> tuple[tuple[float, float, float, float] | None, str | None]:
    value = region.get("value")
    if not isinstance(value, dict):
        raise DatasetError(f"{export}: {at}: 'value' must be an object")
    numbers = {}
    for key in ("x", "y", "width", "height"):
        if not _number(value.get(key)):
            raise DatasetError(
                f"{export}: {at}: value.{key} must be a number (percent), got {value.get(key)!r}"
            )
        numbers[key] = float(value[key])
    labels = value.get("rectanglelabels")
    if not isinstance(labels, list) or not labels or not all(isinstance(label, str) for label in labels):
        warnings.append(f"{at}: a box without a label (value.rectanglelabels {labels!r}); left out")
        return None, None
    if len(labels) > 1:
        warnings.append(f"{at}: {len(labels)} labels {labels}; took {labels[0]!r}")
    stated = (region.get("original_width"), region.get("original_height"))
    if all(_number(v) for v in stated) and abs(stated[0] * height - stated[1] * width) > max(
        stated[0], stated[1]
    ):
        warnings.append(
            f"{at}: original size {stated[0]}x{stated[1]} is not the shape of the image ({width}x{height}); "
            "converted with the image's size"
        )
    x, y = numbers["x"] / 100 * width, numbers["y"] / 100 * height
    box_w, box_h = numbers["width"] / 100 * width, numbers["height"] / 100 * height
    rotation = value.get("rotation", 0)
    if _number(rotation) and rotation % 360:
        return _rotated_about_corner(x, y, box_w, box_h, float(rotation)), labels[0]
    return (x, y, x + box_w, y + box_h), labels[0]


def _rotated_about_corner(
    x: float, y: float, w: float, h: float, degrees: float
) -> tuple[float, float, float, float]:
    """Axis-aligned envelope of the box turned clockwise (y down) by `degrees` about its top-left corner."""
    angle = math.radians(degrees)
    cos, sin = math.cos(angle), math.sin(angle)
    corners = [
        (x + dx * cos - dy * sin, y + dx * sin + dy * cos) for dx, dy in ((0, 0), (w, 0), (0, h), (w, h))
    ]
    xs, ys = [c[0] for c in corners], [c[1] for c in corners]
    return min(xs), min(ys), max(xs), max(ys)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)

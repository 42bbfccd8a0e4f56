"""Write labelled images coming from a labelling tool into our YOLO dataset, and our datasets out as COCO json.

`write_yolo` is the one place an import touches the target folder. It plans first and writes after, so a refused
import writes nothing: classes not in the target's data.yaml stop it (or are added, or their boxes skipped), a
label file that already holds other boxes is never overwritten silently (refuse, merge, or replace on request),
and an image of the same name with other content is never replaced. Every file is written atomically (a temp
file in the same folder, then `os.replace`), so an interrupted import leaves whole files only.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import yaml

from defectdet.data.formats import check_box, load_dataset
from defectdet.data.formats.label_settings import CocoExportSettings, Existing, Unknown
from defectdet.data.formats.yolo import _class_names, _read_config, label_line, label_path_for
from defectdet.data.imageio import read_image_size
from defectdet.data.sample import Problem, Sample
from defectdet.errors import DatasetError, ImageReadError

UNKNOWN_CHOICES = ("error", "add", "skip")
EXISTING_CHOICES = ("refuse", "merge", "replace")
MERGE_TOLERANCE_PX = 1.0  # a new box within this of an existing box of the same class is the same box
_LISTED = 10  # problems named in one message
_FILE_MODE = 0o644


@dataclass
class LabelledImage:
    """One image and its boxes as a labelling tool gave them: xyxy pixels of the image, class names."""

    source: Path
    name: PurePosixPath  # where it goes below the split's image folder (suffix included)
    boxes: list[tuple[float, float, float, float]]
    classes: list[str]
    origin: str  # how the tool names it, for messages: "task 12", "images[3] (id 4)"
    width: int | None = None
    height: int | None = None
    template: Path | None = None  # its defect-free template, copied to the split's template folder
    # its aligned companion captures by name, each copied to that companion's folder of the split
    companions: dict[str, Path] = field(default_factory=dict)


@dataclass
class ImportReport:
    """What an import wrote (and what it left alone or dropped)."""

    out_dir: Path
    data_yaml: Path
    split: str
    class_names: list[str]
    images_copied: int = 0
    images_present: int = 0  # the same file was already there
    labels_written: int = 0  # new label files
    labels_merged: int = 0
    labels_replaced: int = 0
    labels_unchanged: int = 0
    boxes: int = 0
    added_classes: list[str] = field(default_factory=list)
    skipped_boxes: int = 0  # of unknown classes, with unknown="skip"
    # "origin: reason" of images left out (missing, with skip_missing)
    skipped_images: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    templates: int = 0  # templates copied
    companions: int = 0  # companion captures copied


@dataclass(frozen=True)
class YoloWrite:
    """Where and how `write_yolo` writes: into `split`; the class names are the target data.yaml's, else
    `classes`, else `source_classes` (the tool's own list) and then the order the items name them in.
    `unknown` decides about classes outside a given list (error, add them, skip their boxes); `existing` about a
    label file that already holds other boxes (refuse, merge, replace); `link` symlinks images instead of copying
    them; `origin_kind` names what an item is in messages ("task", "image")."""

    split: str = "train"
    classes: list[str] | None = None
    source_classes: list[str] | None = None
    unknown: Unknown = "error"
    existing: Existing = "refuse"
    link: bool = False
    origin_kind: str = "task"


def write_yolo(items: list[LabelledImage], out_dir: Path, target: YoloWrite | None = None) -> ImportReport:
    """Write `items` into the YOLO dataset `out_dir` (made when absent) as `target` says (default: `YoloWrite()`)."""
    target = target or YoloWrite()
    _check_policies(target.unknown, target.existing)
    out_dir = Path(out_dir)
    yaml_path = out_dir / "data.yaml"
    config, target_names = _target_dataset(out_dir, yaml_path, target.classes)
    names = list(target_names if target_names is not None else target.classes or [])
    report = ImportReport(out_dir, yaml_path, target.split, names)
    if target_names is not None or target.classes is not None:  # a fixed list: other classes are 'unknown'
        where = str(yaml_path) if target_names is not None else "--classes"
        _resolve_unknown(items, names, target.unknown, where, report)
    else:
        for name in [*(target.source_classes or []), *(c for item in items for c in item.classes)]:
            if name not in names:
                names.append(name)
    image_dir, root = _split_folder(out_dir, config, target.split, yaml_path)
    plans = _plan(items, names, image_dir, target, report)
    template_dir, templates_entry = _plane_folder(config.get("templates"), target.split, root, "templates")
    templates = _plan_planes(plans, image_dir, template_dir, lambda item: item.template, "template")
    companions, companion_entries = _plan_companions(plans, image_dir, config, target.split, root)
    for plan in plans:
        _write_image(plan, target.link, report)
        _write_labels(plan, report)
    for source, destination in templates + companions:
        _copy_into(source, destination, target.link)
    report.templates, report.companions = len(templates), len(companions)
    new_templates = templates_entry is not None and any(plan.item.template is not None for plan in plans)
    changed = not yaml_path.is_file() or report.added_classes or target.split not in config
    if changed or new_templates or companion_entries:
        config = dict(config) or {"path": "."}
        if target.split not in config:
            config[target.split] = image_dir.relative_to(root).as_posix()
        planes = (templates_entry if new_templates else None, companion_entries)
        _write_config(yaml_path, config, names, planes)
    report.class_names = names
    return report


def _target_dataset(
    out_dir: Path, yaml_path: Path, classes: list[str] | None
) -> tuple[dict[str, Any], list[str] | None]:
    """(the target's data.yaml content, its class names), ({}, None) for a new dataset; given `classes` must be
    the target's."""
    if yaml_path.is_file():
        _, config = _read_config(yaml_path)
        target_names = _class_names(yaml_path, config)
        if classes is not None and list(classes) != target_names:
            raise DatasetError(
                f"--classes {','.join(classes)} differ from {yaml_path} names {','.join(target_names)}; "
                "leave --classes out to import into that dataset, or import into another folder"
            )
        return config, target_names
    if (out_dir / "data.yml").is_file():
        raise DatasetError(f"{out_dir / 'data.yml'}: rename it data.yaml to import into this dataset")
    return {}, None


def _resolve_unknown(
    items: list[LabelledImage], names: list[str], unknown: Unknown, where: str, report: ImportReport
) -> None:
    """Classes the items name outside the fixed list `names` (from `where`): an error, or (`unknown="add"`)
    appended to `names`; with "skip" their boxes are dropped when planned."""
    unknown_found = _unknown_classes(items, names)
    if unknown_found and unknown == "error":
        listed = "; ".join(f"{origin}: class {name!r}" for origin, name in unknown_found[:_LISTED])
        more = f" (and {len(unknown_found) - _LISTED} more)" if len(unknown_found) > _LISTED else ""
        raise DatasetError(
            f"classes not in {where} ({', '.join(names) or 'none'}): {listed}{more}. "
            "Pass --add-classes to append them to the class list, or --skip-unknown to drop those boxes"
        )
    if unknown == "add":
        for _, name in unknown_found:
            if name not in names:
                names.append(name)
                report.added_classes.append(name)


def _check_policies(unknown: str, existing: str) -> None:
    if unknown not in UNKNOWN_CHOICES:
        raise DatasetError(
            f"unknown-classes policy {unknown!r}: expected one of {', '.join(UNKNOWN_CHOICES)}"
        )
    if existing not in EXISTING_CHOICES:
        raise DatasetError(
            f"existing-labels policy {existing!r}: expected one of {', '.join(EXISTING_CHOICES)}"
        )


def _write_config(
    yaml_path: Path, config: dict[str, Any], names: list[str], planes: tuple[Any, dict[str, Any]]
) -> None:
    """data.yaml with `names` (in the form it had) and, when given, the `templates` entry and the `companions`
    entries to add or change (`planes`)."""
    templates, companions = planes
    if templates is not None:
        config["templates"] = templates
    if companions:
        config["companions"] = {**(config.get("companions") or {}), **companions}
    config["names"] = names if not isinstance(config.get("names"), dict) else dict(enumerate(names))
    config.pop("nc", None)
    atomic_write_text(yaml_path, yaml.safe_dump(config, sort_keys=False, allow_unicode=True))


def _plane_folder(entry: Any, split: str, root: Path, default: str) -> tuple[Path, Any]:
    """Where the split's templates (or one companion's captures) go, given their data.yaml entry, and the
    entry to write (None: it is there); `default` names the folder below the root, then the split."""
    if isinstance(entry, str) and entry:
        return (Path(entry) if Path(entry).is_absolute() else root / entry), None
    folder = f"{default}/{split}"
    if isinstance(entry, dict):
        if entry.get(split):
            named = Path(str(entry[split]))
            return (named if named.is_absolute() else root / named), None
        return root / folder, {**entry, split: folder}
    return root / folder, {split: folder}


def _plan_companions(
    plans: list[_Plan], image_dir: Path, config: dict[str, Any], split: str, root: Path
) -> tuple[list[tuple[Path, Path]], dict[str, Any]]:
    """(companion, destination) copies of every companion capture the planned images carry, each below its
    companion's folder (`companions/NAME/SPLIT` unless data.yaml names one), and the data.yaml `companions`
    entries to add or change, in the order the images first name them."""
    declared = config.get("companions") if isinstance(config.get("companions"), dict) else {}
    names = list(dict.fromkeys(name for plan in plans for name in plan.item.companions))
    copies, entries = [], {}
    for name in names:
        folder, entry = _plane_folder(declared.get(name), split, root, f"companions/{name}")
        copies += _plan_planes(plans, image_dir, folder, lambda item, n=name: item.companions.get(n), name)
        if entry is not None:
            entries[name] = entry
    return copies, entries


def _plan_planes(
    plans: list[_Plan],
    image_dir: Path,
    folder: Path,
    plane: Callable[[LabelledImage], Path | None],
    what: str,
) -> list[tuple[Path, Path]]:
    """(file, destination) for the planned images that have this plane (a template or a companion capture):
    the image's name below `folder`, the file's own suffix. Another file already there stops the import."""
    copies, conflicts = [], []
    for plan in plans:
        source = plane(plan.item)
        if source is None:
            continue
        relative = plan.image.relative_to(image_dir)
        destination = (folder / relative).with_suffix(source.suffix.lower())
        if destination.exists() and not (_same_file(source, destination) or _same_bytes(source, destination)):
            conflicts.append(f"{plan.item.origin}: {destination} already holds another {what} file")
            continue
        if not destination.exists():
            copies.append((source, destination))
    if conflicts:
        listed = "\n  ".join(conflicts[:_LISTED])
        raise DatasetError(
            f"nothing imported: {len(conflicts)} {what} file(s) would overwrite files:\n  {listed}"
        )
    return copies


def _copy_into(source: Path, destination: Path, link: bool) -> None:
    destination.parent.mkdir(parents=True, exist_ok=True)
    temp = _temp_path(destination)
    try:
        if link:
            os.symlink(source.resolve(), temp)
        else:
            shutil.copyfile(source, temp)
        os.replace(temp, destination)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise


def hold_out_groups(
    items: list[LabelledImage], fraction: float
) -> tuple[list[LabelledImage], list[LabelledImage]]:
    """(train, val): about `fraction` of the images held out for validation, by a hash of their group's name
    (stable across runs and machines). An image and its template are one group, and images sharing a template
    stay together; from two groups on, at least one is held out and at least one trains."""
    if not 0 <= fraction < 1:
        raise DatasetError(f"--val-fraction must be in [0, 1), got {fraction}")

    def group(item: LabelledImage) -> str:
        return (item.template or item.source).name

    def bucket(name: str) -> float:
        return int(hashlib.sha1(name.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF

    groups = sorted({group(item) for item in items}, key=bucket)
    held = {name for name in groups if bucket(name) < fraction}
    if fraction > 0 and not held and len(groups) > 1:
        held = {groups[0]}
    if len(held) == len(groups) > 1:  # and at least one trains
        held.discard(groups[-1])
    return [i for i in items if group(i) not in held], [i for i in items if group(i) in held]


@dataclass
class _Plan:
    item: LabelledImage
    image: Path  # destination
    label: Path
    lines: list[str]
    action: str  # "write" | "merge" | "replace" | "unchanged"
    copy: bool  # False when the destination already is this image


def _unknown_classes(items: list[LabelledImage], names: list[str]) -> list[tuple[str, str]]:
    found = []
    for item in items:
        for name in dict.fromkeys(item.classes):
            if name not in names:
                found.append((item.origin, name))
    return found


def _split_folder(out_dir: Path, config: dict[str, Any], split: str, yaml_path: Path) -> tuple[Path, Path]:
    """The split's image folder and the dataset root (data.yaml's `path`)."""
    root = Path(str(config.get("path") or "."))
    root = root if root.is_absolute() else out_dir / root
    spec = config.get(split)
    if not spec:
        return root / "images" / split, root
    if not isinstance(spec, str):
        raise DatasetError(
            f"{yaml_path}: field '{split}' is a list; import into a split that is one folder (--split)"
        )
    folder = Path(spec) if Path(spec).is_absolute() else root / spec
    if folder.suffix.lower() == ".txt":
        raise DatasetError(
            f"{yaml_path}: field '{split}' is an image list ({spec}); import into a split that is a folder (--split)"
        )
    return folder, root


def _plan(
    items: list[LabelledImage], names: list[str], image_dir: Path, target: YoloWrite, report: ImportReport
) -> list[_Plan]:
    """What to write for each item (in `image_dir`, classes `names`), or a DatasetError naming every item that
    would overwrite another image or (as `target.existing` says) other labels."""
    plans: dict[Path, _Plan] = {}  # by destination: two tasks of one image keep the later one
    taken: dict[PurePosixPath, Path] = {}
    conflicts: list[str] = []
    for item in items:
        plan = _plan_item(item, names, image_dir, target.existing, report, taken)
        if isinstance(plan, str):
            conflicts.append(plan)
            continue
        if plan.image in plans:
            report.warnings.append(
                f"{item.origin} labels the same image as {plans[plan.image].item.origin}; kept {item.origin}'s boxes"
            )
        plans[plan.image] = plan
    if conflicts:
        listed = "\n  ".join(conflicts[:_LISTED])
        more = f"\n  (and {len(conflicts) - _LISTED} more)" if len(conflicts) > _LISTED else ""
        raise DatasetError(
            f"nothing imported: {len(conflicts)} {target.origin_kind}(s) would overwrite files in "
            f"{image_dir.parent.parent}:\n  {listed}{more}"
        )
    return list(plans.values())


def _plan_item(
    item: LabelledImage,
    names: list[str],
    image_dir: Path,
    existing: Existing,
    report: ImportReport,
    taken: dict[PurePosixPath, Path],
) -> _Plan | str:
    """The plan of one item, or the conflict that stops it."""
    width, height = item.width, item.height
    if width is None or height is None:
        try:
            width, height = read_image_size(item.source)
        except ImageReadError as error:
            raise DatasetError(f"{item.origin}: {error}") from None
    inside = _below(item.source, image_dir)
    name = inside if inside is not None else _free_name(item, taken)
    destination = image_dir / Path(*name.parts)
    lines = _label_lines(item, names, width, height, report)
    copy = True
    if destination.exists():
        if _same_file(item.source, destination):
            copy = False
        elif not _same_bytes(item.source, destination):
            return (
                f"{item.origin}: {destination} already holds another image of that name "
                f"(from {item.source}); import into another --split or folder"
            )
    label = label_path_for(destination)
    action, lines = _label_action(item, label, lines, existing, (width, height))
    if action == "conflict":
        return lines[0]
    return _Plan(item, destination, label, lines, action, copy)


def _label_lines(
    item: LabelledImage, names: list[str], width: int, height: int, report: ImportReport
) -> list[str]:
    """The item's YOLO label lines: boxes of classes outside `names` skipped, bad boxes checked (warnings)."""
    lines = []
    for box, class_name in zip(item.boxes, item.classes, strict=True):
        if class_name not in names:
            report.skipped_boxes += 1
            continue
        problems: list[Problem] = []
        checked = check_box(box, width, height, problems, item.origin)
        report.warnings.extend(f"{item.origin}: {p.message}" for p in problems)
        if checked is not None:
            lines.append(label_line(names.index(class_name), checked, width, height))
    return lines


def _label_action(
    item: LabelledImage, label: Path, lines: list[str], existing: Existing, size: tuple[int, int]
) -> tuple[str, list[str]]:
    """(write | unchanged | merge | replace, the lines to write) against the label file already there, or
    ("conflict", [why]) when `existing` refuses it."""
    if not label.is_file():
        return "write", lines
    old = [line.strip() for line in label.read_text(encoding="utf-8").splitlines() if line.strip()]
    if old == lines:
        return "unchanged", lines
    if existing == "refuse":
        return "conflict", [
            f"{item.origin}: {label} already holds {len(old)} box(es) that differ from the "
            f"{len(lines)} imported; pass --existing merge (keep both) or --existing replace"
        ]
    if existing == "merge":
        merged = _merge(old, lines, *size)
        return ("unchanged" if merged == old else "merge"), merged
    return "replace", lines


def _below(path: Path, folder: Path) -> PurePosixPath | None:
    """`path` relative to `folder` when it already lies there (an import in place), else None."""
    try:
        return PurePosixPath(path.resolve().relative_to(folder.resolve()).as_posix())
    except (ValueError, OSError):
        return None


def _free_name(item: LabelledImage, taken: dict[PurePosixPath, Path]) -> PurePosixPath:
    """The item's name, or name_2, name_3 ... when another source already took it in this import."""
    name, index = item.name, 1
    while name in taken and not _same_file(taken[name], item.source):
        index += 1
        name = item.name.with_name(f"{item.name.stem}_{index}{item.name.suffix}")
    taken[name] = item.source
    return name


def _merge(old: list[str], new: list[str], width: int, height: int) -> list[str]:
    """`old` lines, then each `new` line that is not already there (same class, corners within 1 px)."""
    merged = list(old)
    known = [_parse_line(line, width, height) for line in old]
    for line in new:
        parsed = _parse_line(line, width, height)
        if parsed is None or not any(_same_box(parsed, other) for other in known if other is not None):
            merged.append(line)
            known.append(parsed)
    return merged


def _parse_line(line: str, width: int, height: int) -> tuple[int, float, float, float, float] | None:
    try:
        class_id, cx, cy, w, h = (float(value) for value in line.split())
    except ValueError:
        return None  # an unparsable old line is kept as it is, never compared
    return (
        int(class_id),
        (cx - w / 2) * width,
        (cy - h / 2) * height,
        (cx + w / 2) * width,
        (cy + h / 2) * height,
    )


def _same_box(a: tuple, b: tuple) -> bool:
    return a[0] == b[0] and all(abs(p - q) <= MERGE_TOLERANCE_PX for p, q in zip(a[1:], b[1:], strict=True))


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve() or os.path.samefile(a, b)
    except OSError:
        return False


def _same_bytes(a: Path, b: Path) -> bool:
    try:
        if a.stat().st_size != b.stat().st_size:
            return False
        return _digest(a) == _digest(b)
    except OSError:
        return False


def _digest(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _write_image(plan: _Plan, link: bool, report: ImportReport) -> None:
    if not plan.copy or plan.image.exists():
        report.images_present += 1
        return
    _copy_into(plan.item.source, plan.image, link)
    report.images_copied += 1


def _write_labels(plan: _Plan, report: ImportReport) -> None:
    report.boxes += len(plan.lines)
    if plan.action == "unchanged":
        report.labels_unchanged += 1
        return
    atomic_write_text(plan.label, "".join(line + "\n" for line in plan.lines))
    if plan.action == "merge":
        report.labels_merged += 1
    elif plan.action == "replace":
        report.labels_replaced += 1
    else:
        report.labels_written += 1


def _temp_path(path: Path) -> Path:
    handle, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(handle)
    os.unlink(name)  # os.symlink and copyfile want to create it themselves
    return Path(name)


def atomic_write_text(path: Path, text: str) -> None:
    """Write `text` to `path` through a temp file in the same folder and `os.replace` (flushed, fsynced)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as stream:
            stream.write(text)
            stream.flush()
            os.fsync(stream.fileno())
        os.chmod(
            name, _FILE_MODE
        )  # mkstemp makes it 0600: a dataset file is read by others (a trainer, a tool)
        os.replace(name, path)
    except BaseException:
        Path(name).unlink(missing_ok=True)
        raise


# ---------------------------------------------------------------- our dataset -> COCO json


@dataclass
class CocoExport:
    """What `export_coco` wrote."""

    path: Path
    images: int
    annotations: int
    categories: list[str]
    image_root: Path
    warnings: list[str]
    companions: int = 0  # companion captures named in the images' `companions` fields


@dataclass(frozen=True)
class CocoImage:
    """One image for `coco_document`: its file name as the json names it, size, xyxy boxes and class ids."""

    file_name: str
    width: int
    height: int
    boxes: Sequence[Sequence[float]]
    class_ids: Sequence[int]
    template_file_name: str | None = None  # its template, as the json names it (read back by our COCO reader)
    companions: Mapping[str, str] = field(default_factory=dict)  # companion name -> file name, as file_name


def coco_document(
    entries: Sequence[CocoImage], class_names: Sequence[str], description: str
) -> dict[str, Any]:
    """COCO detection json (image and box ids from 1, category id = class id + 1, as CVAT numbers them)."""
    images, annotations = [], []
    for image_id, entry in enumerate(entries, start=1):
        images.append(
            {"id": image_id, "file_name": entry.file_name, "width": entry.width, "height": entry.height}
        )
        if entry.template_file_name is not None:
            images[-1]["template_file_name"] = entry.template_file_name
        if entry.companions:
            images[-1]["companions"] = dict(entry.companions)
        for box, class_id in zip(entry.boxes, entry.class_ids, strict=True):
            annotations.append(_coco_annotation(len(annotations) + 1, image_id, box, class_id))
    return {
        "info": {"description": description},
        "licenses": [],
        "categories": [
            {"id": index + 1, "name": name, "supercategory": ""} for index, name in enumerate(class_names)
        ],
        "images": images,
        "annotations": annotations,
    }


def _coco_annotation(
    annotation_id: int, image_id: int, box: Sequence[float], class_id: int
) -> dict[str, Any]:
    """One COCO box annotation of an xyxy `box` (category id = class id + 1)."""
    x1, y1, x2, y2 = box
    width_px, height_px = x2 - x1, y2 - y1
    return {
        "id": annotation_id,
        "image_id": image_id,
        "category_id": int(class_id) + 1,
        "bbox": [round(x1, 3), round(y1, 3), round(width_px, 3), round(height_px, 3)],
        "area": round(width_px * height_px, 3),
        "iscrowd": 0,
        "segmentation": [],
    }


def export_coco(data: Path, out: Path, settings: CocoExportSettings | None = None) -> CocoExport:
    """Write one split of any dataset we read as COCO detection json (category ids 1..K, as CVAT numbers them),
    as `settings` say (default: `CocoExportSettings()`, the train split).

    `file_name`s are relative to `settings.image_root` (default: the folder holding all the split's images), the
    name a labelling tool matches against the images it already holds.
    """
    settings = settings or CocoExportSettings()
    split, image_root = settings.split, settings.image_root
    dataset = load_dataset(data, split, settings.format)
    errors = [problem for problem in dataset.problems if problem.severity == "error"]
    if errors:
        listed = "\n  ".join(str(problem) for problem in errors[:_LISTED])
        raise DatasetError(
            f"{data} ({split}): {len(errors)} error(s); fix them (defectdet check) before exporting:\n  {listed}"
        )
    warnings = [str(problem) for problem in dataset.problems]
    paths = [sample.image_path.absolute() for sample in dataset.samples]
    if image_root is None:
        image_root = Path(os.path.commonpath([str(p.parent) for p in paths])) if paths else Path(data).parent
    image_root = Path(image_root).absolute()
    entries = [
        _coco_image(sample, path, image_root) for sample, path in zip(dataset.samples, paths, strict=True)
    ]
    document = coco_document(entries, dataset.class_names, f"{data} ({split}), exported by defectdet")
    images, annotations = document["images"], document["annotations"]
    atomic_write_text(Path(out), json.dumps(document, indent=1))
    companions = sum(len(entry.companions) for entry in entries)
    return CocoExport(
        Path(out), len(images), len(annotations), dataset.class_names, image_root, warnings, companions
    )


def _coco_image(sample: Sample, path: Path, image_root: Path) -> CocoImage:
    """A sample at `path` as a COCO image with file names relative to `image_root`."""
    width, height = sample.width, sample.height
    if width is None or height is None:
        try:
            width, height = read_image_size(path)
        except ImageReadError as error:
            raise DatasetError(str(error)) from None
    template = sample.template_path
    return CocoImage(
        file_name=Path(os.path.relpath(path, image_root)).as_posix(),
        width=width,
        height=height,
        boxes=sample.boxes.tolist(),
        class_ids=sample.classes.tolist(),
        template_file_name=None if template is None else _relative_name(template, image_root),
        companions={name: _relative_name(p, image_root) for name, p in sample.companion_paths.items()},
    )


def _relative_name(path: Path, root: Path) -> str:
    """`path` as a COCO file name relative to `root` (forward slashes)."""
    return Path(os.path.relpath(path.absolute(), root)).as_posix()

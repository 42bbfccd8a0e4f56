"""Pascal VOC: `Annotations/*.xml` + `JPEGImages/` (+ optional `ImageSets/Main/{split}.txt`),
or a flat folder of .xml files beside their images.

Class names come from `labels.txt` / `classes.txt` at the root when present, else the sorted
union of object names over all annotation files (so ids agree between splits). VOC boxes are
1-based inclusive pixels: (xmin - 1, ymin - 1, xmax, ymax) is the same area in 0-based xyxy.
Without ImageSets there is one split, 'all', returned for any requested split name.
"""

from __future__ import annotations

import logging
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from defectdet.data.formats import check_box, order_splits
from defectdet.data.sample import DatasetSplit, Problem, Sample
from defectdet.errors import DatasetError

logger = logging.getLogger(__name__)

ALL_SPLIT = "all"
CLASS_LIST_FILES = ("labels.txt", "classes.txt")


@dataclass
class _Annotation:
    xml_path: Path
    file_name: str = ""
    width: int | None = None
    height: int | None = None
    objects: list[tuple[str, tuple[float, float, float, float]]] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)


def splits(path: Path) -> list[str]:
    image_sets = path / "ImageSets" / "Main"
    names = [p.stem for p in image_sets.glob("*.txt") if "_" not in p.stem] if image_sets.is_dir() else []
    return order_splits(names) if names else [ALL_SPLIT]


def load(path: Path, split: str) -> DatasetSplit:
    annotation_folder = path / "Annotations" if (path / "Annotations").is_dir() else path
    xml_files = sorted(annotation_folder.glob("*.xml"))
    if not xml_files:
        raise DatasetError(f"{path}: no VOC annotation files (Annotations/*.xml or *.xml)")
    problems: list[Problem] = []
    selected = _select(path, annotation_folder, split, problems)
    if selected is None:
        selected, split = xml_files, ALL_SPLIT
    annotations = {
        xml_path: _parse(xml_path) for xml_path in (xml_files if not _class_list(path) else selected)
    }
    class_names = _class_list(path) or sorted({name for a in annotations.values() for name, _ in a.objects})
    class_index = {name: index for index, name in enumerate(class_names)}
    samples = []
    for xml_path in selected:
        annotation = annotations.get(xml_path) or _parse(xml_path)
        problems.extend(annotation.problems)
        if annotation.problems and not annotation.file_name:
            continue  # unparseable
        sample = _to_sample(path, annotation, class_index, problems)
        if sample is not None:
            samples.append(sample)
    return DatasetSplit(samples, class_names, "voc", split, path, problems)


def _select(path: Path, annotation_folder: Path, split: str, problems: list[Problem]) -> list[Path] | None:
    image_sets = path / "ImageSets" / "Main"
    list_file = image_sets / f"{split}.txt"
    if not list_file.is_file():
        if image_sets.is_dir() and any(p for p in image_sets.glob("*.txt") if "_" not in p.stem):
            raise DatasetError(f"{path}: no ImageSets/Main/{split}.txt; available: {', '.join(splits(path))}")
        if split != ALL_SPLIT:
            logger.warning("%s: no ImageSets/Main; split %r is every annotation file", path, split)
        return None
    selected = []
    for line_number, line in enumerate(list_file.read_text(encoding="utf-8").splitlines(), start=1):
        fields = line.split()
        if not fields:
            continue
        xml_path = annotation_folder / f"{fields[0]}.xml"
        if xml_path.is_file():
            selected.append(xml_path)
        else:
            problems.append(
                Problem("error", str(list_file), f"annotation {xml_path.name} not found", line_number)
            )
    return selected


def _class_list(path: Path) -> list[str]:
    for name in CLASS_LIST_FILES:
        if (path / name).is_file():
            return [
                line.strip()
                for line in (path / name).read_text(encoding="utf-8").splitlines()
                if line.strip()
            ]
    return []


def _parse(xml_path: Path) -> _Annotation:
    annotation = _Annotation(xml_path)
    where = str(xml_path)
    try:
        root = ElementTree.parse(xml_path).getroot()
    except ElementTree.ParseError as error:
        line = error.position[0] if getattr(error, "position", None) else 0
        annotation.problems.append(Problem("error", where, f"malformed XML ({error})", line))
        return annotation
    except OSError as error:
        annotation.problems.append(Problem("error", where, f"cannot read annotation ({error})"))
        return annotation
    annotation.file_name = (root.findtext("filename") or "").strip() or xml_path.stem + ".jpg"
    try:
        annotation.width = int(float(root.findtext("size/width") or 0)) or None
        annotation.height = int(float(root.findtext("size/height") or 0)) or None
    except ValueError:
        annotation.problems.append(Problem("warning", where, "size/width or size/height is not a number"))
    for position, element in enumerate(root.iter("object"), start=1):
        name = (element.findtext("name") or "").strip()
        try:
            coordinates = [
                float(element.findtext(f"bndbox/{key}") or "nan") for key in ("xmin", "ymin", "xmax", "ymax")
            ]
        except ValueError:
            coordinates = [float("nan")]
        if not name or any(value != value for value in coordinates):  # NaN check
            annotation.problems.append(
                Problem(
                    "error", where, f"object {position}: needs <name> and numeric bndbox xmin/ymin/xmax/ymax"
                )
            )
            continue
        xmin, ymin, xmax, ymax = coordinates
        annotation.objects.append((name, (xmin - 1.0, ymin - 1.0, xmax, ymax)))
    return annotation


def _to_sample(
    root: Path, annotation: _Annotation, class_index: dict[str, int], problems: list[Problem]
) -> Sample | None:
    where = str(annotation.xml_path)
    image_path = _find_image(root, annotation)
    if image_path is None:
        problems.append(Problem("error", where, f"image {annotation.file_name!r} not found"))
        return None
    boxes, classes = [], []
    for position, (name, box) in enumerate(annotation.objects, start=1):
        if name not in class_index:
            problems.append(
                Problem("error", where, f"object {position}: class {name!r} is not in the class list")
            )
            continue
        # VOC's 1-based xmin of 0 (seen from some tools) becomes -1: clip, it is within tolerance.
        checked = check_box(
            box, annotation.width, annotation.height, problems, where, what=f"object {position} ({name})"
        )
        if checked is not None:
            boxes.append(checked)
            classes.append(class_index[name])
    return Sample(
        image_path,
        np.asarray(boxes, np.float32).reshape(-1, 4),
        np.asarray(classes, np.int64),
        source=where,
        image_id=annotation.xml_path.stem,
        width=annotation.width,
        height=annotation.height,
    )


def _find_image(root: Path, annotation: _Annotation) -> Path | None:
    name = annotation.file_name
    candidates = [root / "JPEGImages" / name, annotation.xml_path.parent / name]
    stem = annotation.xml_path.stem
    candidates += [root / "JPEGImages" / f"{stem}{suffix}" for suffix in (".jpg", ".png", ".jpeg", ".bmp")]
    candidates += [
        annotation.xml_path.parent / f"{stem}{suffix}" for suffix in (".jpg", ".png", ".jpeg", ".bmp")
    ]
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    return None

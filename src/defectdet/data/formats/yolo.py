"""YOLO `data.yaml` datasets: normalized `cls cx cy w h` label files beside an images/labels tree.

A split is a folder of images, a list of folders, or a .txt list of image paths. Labels live
at the image path with its last `images` folder replaced by `labels` and the suffix `.txt`
(or beside the image when there is no `images` folder). A missing label file means a clean image.
Optional `templates: {split: folder}` (or one folder for all splits) holds each image's
defect-free template under the same file name. Optional `companions: {name: folder}` (or
`{name: {split: folder}}`) names aligned extra captures of each image (another lighting, focus or band),
found the same way or by their capture tag (`part_L1.png` -> `part_L2.png`, `data.companions`), so one folder
may hold both lightings; their declared order is the order of the model's input planes. A listed image that is
another image's companion capture is read with that image only.
"""

from __future__ import annotations

import glob
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from defectdet.data.companions import leave_out_companion_images, same_path, tagged_capture
from defectdet.data.formats import IMAGE_SUFFIXES, check_box, list_images, order_splits
from defectdet.data.imageio import read_image_size, read_text_file
from defectdet.data.sample import DatasetSplit, Problem, Sample, check_companion_name, missing_companions
from defectdet.errors import DatasetError, ImageReadError, describe_failure

SPLIT_KEYS = ("train", "val", "test")
_NOT_LABELS = frozenset({"classes.txt", "data.txt"})


def splits(path: Path) -> list[str]:
    _, config = _read_config(path)
    return order_splits([key for key in SPLIT_KEYS if config.get(key)])


def label_line(class_id: int, box: Sequence[float], width: int, height: int) -> str:
    """One YOLO label line (no newline): ``class cx cy w h``, normalised to the image size, 6 decimals."""
    x1, y1, x2, y2 = box
    return (
        f"{class_id} {(x1 + x2) / 2 / width:.6f} {(y1 + y2) / 2 / height:.6f} "
        f"{(x2 - x1) / width:.6f} {(y2 - y1) / height:.6f}"
    )


def load(path: Path, split: str) -> DatasetSplit:
    yaml_path, config = _read_config(path)
    root = _resolve_root(yaml_path, config)
    class_names = _class_names(yaml_path, config)
    spec = config.get(split)
    if not spec:
        raise DatasetError(f"{yaml_path}: no '{split}' split; available: {', '.join(splits(path)) or 'none'}")
    problems: list[Problem] = []
    entries = _split_images(yaml_path, root, split, spec, problems)  # (image, folder it came from or None)
    template_folder = _template_folder(root, config.get("templates"), split)
    companion_folders = _companion_folders(yaml_path, root, config.get("companions"), split)
    samples: list[Sample] = []
    unpaired: list[tuple[Sample, Problem]] = []  # a companion not found, reported unless the image is one
    label_folders: dict[Path, Path] = {}
    for image_path, base in entries:
        label_path = label_path_for(image_path)
        if base is not None:
            label_folders.setdefault(label_path_for(base / "x.jpg").parent, base)
        sample = _read_sample(image_path, label_path, len(class_names), problems)
        if sample is None:
            continue
        sample.image_id = _image_id(image_path, base, root)
        if template_folder is not None:
            sample.template_path = _find_template(template_folder, image_path, base, problems)
        for name, folder in companion_folders.items():
            found, looked = _find_companion(folder, image_path, base, name)
            if found is not None:
                sample.companion_paths[name] = found
            else:
                unpaired.append((sample, Problem("warning", str(image_path), f"companion '{name}' {looked}")))
        samples.append(sample)
    _report_orphan_labels(label_folders, {image for image, _ in entries}, problems)
    samples, left_out = leave_out_companion_images(samples, str(yaml_path), split)
    kept = {id(sample) for sample in samples}
    problems += [problem for sample, problem in unpaired if id(sample) in kept] + left_out
    dataset = DatasetSplit(samples, class_names, "yolo", split, root, problems, list(companion_folders))
    problems.extend(missing_companions(dataset, str(yaml_path)))
    return dataset


def label_path_for(image_path: Path) -> Path:
    """`.../images/a/b.jpg` -> `.../labels/a/b.txt` (last `images` part); beside the image otherwise."""
    parts = list(image_path.parts)
    for index in range(len(parts) - 2, -1, -1):
        if parts[index] == "images":
            parts[index] = "labels"
            return Path(*parts).with_suffix(".txt")
    return image_path.with_suffix(".txt")


def _read_config(path: Path) -> tuple[Path, dict[str, Any]]:
    yaml_path = path
    if path.is_dir():
        yaml_path = path / "data.yaml" if (path / "data.yaml").is_file() else path / "data.yml"
    try:
        config = yaml.safe_load(yaml_path.read_text(encoding="utf-8"))
    except FileNotFoundError as error:
        raise DatasetError(f"{yaml_path}: data.yaml not found") from error
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f"{yaml_path}:{mark.line + 1}" if mark is not None else str(yaml_path)
        raise DatasetError(f"{where}: invalid YAML ({getattr(error, 'problem', error)})") from error
    if not isinstance(config, dict):
        raise DatasetError(f"{yaml_path}: expected a mapping with keys path, train, val, names")
    return yaml_path, config


def _resolve_root(yaml_path: Path, config: dict[str, Any]) -> Path:
    root = config.get("path")
    if not root:
        return yaml_path.parent
    root_path = Path(str(root)).expanduser()
    return root_path if root_path.is_absolute() else yaml_path.parent / root_path


def _class_names(yaml_path: Path, config: dict[str, Any]) -> list[str]:
    names = config.get("names")
    if isinstance(names, list):
        return [str(name) for name in names]
    if isinstance(names, dict):
        try:
            by_id = {int(key): str(value) for key, value in names.items()}
        except (TypeError, ValueError) as error:
            raise DatasetError(f"{yaml_path}: field 'names': keys must be integer class ids") from error
        if sorted(by_id) != list(range(len(by_id))):
            raise DatasetError(
                f"{yaml_path}: field 'names': class ids must be 0..{len(by_id) - 1} without gaps"
            )
        return [by_id[index] for index in range(len(by_id))]
    if isinstance(config.get("nc"), int):
        return [str(index) for index in range(config["nc"])]
    raise DatasetError(
        f"{yaml_path}: field 'names' missing (a list of class names or an {{id: name}} mapping)"
    )


def _split_images(
    yaml_path: Path, root: Path, split: str, spec: Any, problems: list[Problem]
) -> list[tuple[Path, Path | None]]:
    entries: list[tuple[Path, Path | None]] = []
    for item in spec if isinstance(spec, list) else [spec]:
        location = Path(str(item)).expanduser()
        location = location if location.is_absolute() else root / location
        if location.is_dir():
            entries.extend((image, location) for image in list_images(location, problems))
        elif location.is_file() and location.suffix.lower() == ".txt":
            entries.extend((image, None) for image in _read_image_list(location, root, problems))
        elif location.is_file() and location.suffix.lower() in IMAGE_SUFFIXES:
            entries.append((location, None))
        else:
            raise DatasetError(
                f"{yaml_path}: field '{split}': {location} is not an image folder or a .txt list"
            )
    return entries


# Characters that cannot stand inside one line of an image list: C0 controls, DEL and what str.splitlines breaks at.
_LIST_BREAKERS = frozenset([*map(chr, range(32)), "\x7f", "\x85", "\u2028", "\u2029"])


def fits_image_list(name: str) -> bool:
    """True when `name` can be one line of an image list (no line break or other control character)."""
    return not _LIST_BREAKERS.intersection(name)


def _read_image_list(list_path: Path, root: Path, problems: list[Problem]) -> list[Path]:
    images = []
    # lines end at "\n" only: a form feed or U+2028 inside a name is not a line break here
    for line_number, line in enumerate(list_path.read_text(encoding="utf-8").split("\n"), start=1):
        name = line.strip()
        if not name:
            continue
        candidate = Path(name).expanduser()
        if not candidate.is_absolute():
            beside_list = list_path.parent / candidate
            candidate = (
                beside_list if beside_list.exists() or not (root / candidate).exists() else root / candidate
            )
        if candidate.is_file():
            images.append(candidate)
        else:
            problems.append(
                Problem("error", str(list_path), f"listed image {candidate} not found", line_number)
            )
    return images


def _read_sample(
    image_path: Path, label_path: Path, num_classes: int, problems: list[Problem]
) -> Sample | None:
    try:
        lines = read_text_file(label_path).splitlines()  # a FIFO is refused, not waited on
    except FileNotFoundError:
        lines = []  # no label file: an image without defects
    except OSError as error:
        problems.append(Problem("error", str(label_path), f"cannot read label file ({error})"))
        return None
    source = str(label_path) if lines else ""
    if not any(line.strip() for line in lines):
        return Sample(image_path, np.zeros((0, 4), np.float32), np.zeros(0, np.int64), source=source)
    try:
        width, height = read_image_size(image_path)
    except ImageReadError as error:
        problems.append(Problem("error", str(image_path), str(error).removeprefix(f"{image_path}: ")))
        return None
    except Exception as error:  # noqa: BLE001 - a header reader crash is this file's error, not the dataset's
        problems.append(
            Problem("error", str(image_path), f"cannot read the image header ({describe_failure(error)})")
        )
        return None
    boxes, classes = [], []
    for line_number, line in enumerate(lines, start=1):
        parsed = _label_box(line, line_number, source, num_classes, (width, height), problems)
        if parsed is not None:
            boxes.append(parsed[0])
            classes.append(parsed[1])
    return Sample(
        image_path,
        np.asarray(boxes, np.float32).reshape(-1, 4),
        np.asarray(classes, np.int64),
        source=source,
        width=width,
        height=height,
    )


def _label_box(
    line: str,
    line_number: int,
    source: str,
    num_classes: int,
    size: tuple[int, int],
    problems: list[Problem],
) -> tuple[tuple[float, float, float, float], int] | None:
    """(checked xyxy pixel box, class id) of one label line; None for a blank or bad line (a problem named)."""
    fields = line.split()
    if not fields:
        return None
    if len(fields) != 5:
        problems.append(
            Problem("error", source, f"expected 'class cx cy w h' (5 fields), got {len(fields)}", line_number)
        )
        return None
    try:
        class_value = float(fields[0])
        center_x, center_y, box_width, box_height = (float(value) for value in fields[1:])
    except ValueError:
        problems.append(Problem("error", source, f"non-numeric field in {line.strip()!r}", line_number))
        return None
    if class_value != int(class_value) or not 0 <= class_value < num_classes:
        problems.append(
            Problem("error", source, f"class id {fields[0]} out of range 0..{num_classes - 1}", line_number)
        )
        return None
    width, height = size
    box = (
        (center_x - box_width / 2) * width,
        (center_y - box_height / 2) * height,
        (center_x + box_width / 2) * width,
        (center_y + box_height / 2) * height,
    )
    checked = check_box(box, width, height, problems, source, line_number)
    return None if checked is None else (checked, int(class_value))


def _image_id(image_path: Path, base: Path | None, root: Path) -> str:
    for anchor in (base, root):
        if anchor is not None:
            try:
                return image_path.relative_to(anchor).with_suffix("").as_posix()
            except ValueError:
                continue
    return image_path.stem


def _template_folder(root: Path, templates: Any, split: str) -> Path | None:
    if not templates:
        return None
    entry = templates.get(split) if isinstance(templates, dict) else templates
    if not entry:
        return None
    folder = Path(str(entry)).expanduser()
    return folder if folder.is_absolute() else root / folder


def _companion_folders(yaml_path: Path, root: Path, companions: Any, split: str) -> dict[str, Path]:
    """{name: folder} of the companions declared for `split`, in declared order."""
    if not companions:
        return {}
    if not isinstance(companions, dict):
        raise DatasetError(
            f"{yaml_path}: field 'companions' must map a companion name to a folder (or to {{split: folder}})"
        )
    folders = {}
    for name, entry in companions.items():
        check_companion_name(name, f"{yaml_path}: field 'companions'")
        if isinstance(entry, dict):
            entry = entry.get(split)
        elif not isinstance(entry, str):
            raise DatasetError(
                f"{yaml_path}: field 'companions.{name}' must be a folder or a {{split: folder}} mapping"
            )
        folder = _template_folder(root, entry, split)
        if folder is not None:
            folders[name] = folder
    return folders


def _find_template(
    folder: Path, image_path: Path, base: Path | None, problems: list[Problem], what: str = "template"
) -> Path | None:
    """The file in `folder` at the image's path below its split folder, else of its name, else of its stem."""
    candidates = []
    if base is not None:
        candidates.append(folder / image_path.relative_to(base))
    candidates.append(folder / image_path.name)
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    for candidate in sorted(
        candidates[-1].parent.glob(f"{glob.escape(image_path.stem)}.*")
    ):  # saved in another format
        if candidate.suffix.lower() in IMAGE_SUFFIXES and candidate.is_file():
            return candidate
    problems.append(Problem("warning", str(image_path), f"{what} not found (looked for {candidates[0]})"))
    return None


def _find_companion(folder: Path, image_path: Path, base: Path | None, name: str) -> tuple[Path | None, str]:
    """(the companion capture `name` of the image in `folder`, what was looked for): the file at the image's
    path below its split folder, of its name or stem, never the image itself; else by capture tag."""
    exact = [folder / image_path.relative_to(base)] if base is not None else []
    exact.append(folder / image_path.name)
    if not same_path(
        exact[-1].parent, image_path.parent
    ):  # in the image's own folder `a.bmp` is another image
        stems = sorted(exact[-1].parent.glob(f"{glob.escape(image_path.stem)}.*"))
        for candidate in exact + [path for path in stems if path.suffix.lower() in IMAGE_SUFFIXES]:
            if candidate.is_file():
                return candidate, ""
    found = tagged_capture(image_path, name, exact[0].parent)
    return found, f"not found (looked for {exact[0]}, and for the name tagged {name})"


def _report_orphan_labels(
    label_folders: dict[Path, Path], images: set[Path], problems: list[Problem]
) -> None:
    """Label files in a split's labels folder whose image does not exist."""
    stems = {image.with_suffix("") for image in images}
    for label_folder, image_folder in label_folders.items():
        if not label_folder.is_dir():
            continue
        for label in sorted(label_folder.rglob("*.txt")):
            if label.name in _NOT_LABELS:
                continue
            image_stem = image_folder / label.relative_to(label_folder).with_suffix("")
            if image_stem not in stems:
                problems.append(Problem("error", str(label), "label file without an image"))

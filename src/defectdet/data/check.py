"""`defectdet check DATA`: read every split, decode every image, and report counts and problems.

Errors (unreadable image, class out of range, box outside the image or without area, label
without image, malformed line) make `CheckReport.has_errors` true; warnings (duplicates, tiny
boxes, missing templates or companions, a companion of another size than its image) do not.
"""

from __future__ import annotations

import hashlib
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from defectdet.data.formats import available_splits, detect_format, load_dataset
from defectdet.data.imageio import decode_image, read_file_bytes, read_image_size
from defectdet.data.sample import DatasetSplit, Problem
from defectdet.errors import DefectDetError, ImageReadError, describe_failure

MAX_LISTED_PROBLEMS = 50


@dataclass
class SplitStats:
    """Counts for one split; sizes are (width, height) of its readable tested images."""

    name: str
    images: int = 0
    images_without_boxes: int = 0
    boxes_per_class: list[int] = field(default_factory=list)
    templates_found: int = 0
    templates_missing: int = 0
    companions_found: dict[str, int] = field(default_factory=dict)  # per declared companion name
    companions_missing: dict[str, int] = field(default_factory=dict)
    sizes: list[tuple[int, int]] = field(default_factory=list)

    def size_summary(self) -> dict[str, tuple[int, int, int]]:
        """{'width': (min, median, max), 'height': (...)} over readable images (empty when none)."""
        if not self.sizes:
            return {}
        array = np.asarray(self.sizes)  # (N, 2) width, height
        return {
            axis: (int(array[:, i].min()), int(np.median(array[:, i])), int(array[:, i].max()))
            for i, axis in enumerate(("width", "height"))
        }


@dataclass
class CheckReport:
    path: Path
    format: str
    class_names: list[str]
    splits: list[SplitStats]
    problems: list[Problem]
    seconds: float = 0.0

    @property
    def errors(self) -> list[Problem]:
        return [problem for problem in self.problems if problem.severity == "error"]

    @property
    def warnings(self) -> list[Problem]:
        return [problem for problem in self.problems if problem.severity == "warning"]

    @property
    def has_errors(self) -> bool:
        return bool(self.errors)


@dataclass(frozen=True)
class _ImageResult:
    size: tuple[int, int] | None
    digest: str | None
    error: str | None


def check_dataset(
    path: str | Path, format: str | None = None, deep: bool = True, workers: int | None = None
) -> CheckReport:
    """Check every available split of the dataset at `path`.

    `deep` decodes every image fully (catches truncation); otherwise only headers are read.
    Each file is read once even when it appears in several splits (DeepPCB's trainval/train/val).
    """
    start = time.perf_counter()
    path = Path(path)
    format_name = format or detect_format(path)
    datasets = [load_dataset(path, split, format_name) for split in available_splits(path, format_name)]
    class_names = datasets[0].class_names if datasets else []
    images = {sample.image_path for dataset in datasets for sample in dataset.samples}
    templates = {s.template_path for d in datasets for s in d.samples if s.template_path is not None}
    templates |= {path for d in datasets for s in d.samples for path in s.companion_paths.values()}
    results = _inspect_images(sorted(images | templates), deep, workers)
    problems: list[Problem] = []
    for dataset in datasets:
        problems.extend(dataset.problems)
    for image_path in sorted(images | templates):
        error = results[image_path].error
        if error is not None:
            problems.append(Problem("error", str(image_path), error))
    stats = []
    for dataset in datasets:
        stats.append(_split_stats(dataset, results, problems))
        problems.extend(_duplicates(dataset, results))
    problems.extend(_shared_between_splits(datasets, results))
    unique = list(dict.fromkeys(problems))  # a problem met by several splits is listed once
    unique.sort(key=lambda problem: problem.severity != "error")
    return CheckReport(path, format_name, class_names, stats, unique, time.perf_counter() - start)


def _inspect_images(paths: list[Path], deep: bool, workers: int | None) -> dict[Path, _ImageResult]:
    inspect = _decode_one if deep else _header_one
    with ThreadPoolExecutor(max_workers=workers or 4) as pool:  # cv2.imdecode releases the GIL
        return dict(zip(paths, pool.map(inspect, paths), strict=True))


def _decode_one(path: Path) -> _ImageResult:
    try:
        data = read_file_bytes(path)  # regular files only: a FIFO would block
    except ImageReadError as error:
        return _ImageResult(None, None, str(error).removeprefix(f"{path}: "))
    digest = hashlib.blake2b(data, digest_size=16).hexdigest()
    try:
        image = decode_image(data, path, channels=1)
    except ImageReadError as error:
        return _ImageResult(None, digest, str(error).removeprefix(f"{path}: "))
    except Exception as error:  # noqa: BLE001 - a decoder crash on one malformed file must not stop the check
        return _ImageResult(None, digest, f"cannot decode image ({describe_failure(error)})")
    return _ImageResult((image.shape[1], image.shape[0]), digest, None)


def _header_one(path: Path) -> _ImageResult:
    try:
        return _ImageResult(read_image_size(path), None, None)
    except ImageReadError as error:
        return _ImageResult(None, None, str(error).removeprefix(f"{path}: "))
    except Exception as error:  # noqa: BLE001 - as in _decode_one
        return _ImageResult(None, None, f"cannot decode image ({describe_failure(error)})")


def _split_stats(
    dataset: DatasetSplit, results: dict[Path, _ImageResult], problems: list[Problem]
) -> SplitStats:
    stats = SplitStats(dataset.split, boxes_per_class=[0] * dataset.num_classes)
    for name in dataset.companion_names:
        stats.companions_found[name] = sum(1 for sample in dataset.samples if name in sample.companion_paths)
        stats.companions_missing[name] = len(dataset.samples) - stats.companions_found[name]
    for sample in dataset.samples:
        stats.images += 1
        if len(sample.classes) == 0:
            stats.images_without_boxes += 1
        for class_id in sample.classes.tolist():
            if 0 <= class_id < dataset.num_classes:
                stats.boxes_per_class[class_id] += 1
        if sample.template_path is not None:
            stats.templates_found += 1
        size = results[sample.image_path].size
        if size is None:
            continue
        stats.sizes.append(size)
        _compare_size(sample, size, problems)
        _compare_companion_sizes(sample, size, results, problems)
    if dataset.has_templates:
        stats.templates_missing = stats.images - stats.templates_found
    else:
        stats.templates_missing = sum(
            1 for p in dataset.problems if "template" in p.message and p.severity == "warning"
        )
    return stats


def _compare_size(sample, size: tuple[int, int], problems: list[Problem]) -> None:
    """Boxes must fit the image as decoded; a label-stated size should match it."""
    width, height = size
    if sample.width is not None and sample.height is not None and (sample.width, sample.height) != size:
        problems.append(
            Problem(
                "warning",
                sample.source or str(sample.image_path),
                f"{sample.image_path.name}: label says {sample.width}x{sample.height}, image is {width}x{height}",
            )
        )
    if len(sample.boxes):
        tolerance = 1.0
        outside = (
            (sample.boxes[:, 0] < -tolerance)
            | (sample.boxes[:, 1] < -tolerance)
            | (sample.boxes[:, 2] > width + tolerance)
            | (sample.boxes[:, 3] > height + tolerance)
        )
        for index in np.flatnonzero(outside).tolist():
            box = ", ".join(f"{value:.4g}" for value in sample.boxes[index].tolist())
            problems.append(
                Problem(
                    "error",
                    sample.source or str(sample.image_path),
                    f"{sample.image_path.name}: box ({box}) is outside the {width}x{height} image",
                )
            )


def _compare_companion_sizes(
    sample, size: tuple[int, int], results: dict[Path, _ImageResult], problems: list[Problem]
) -> None:
    """A companion should be its image's size (training resizes it to the image, inference refuses it) and
    another capture than the image (the same bytes add nothing: a companion folder pointing at the images)."""
    image_digest = results[sample.image_path].digest
    for name, path in sample.companion_paths.items():
        if image_digest is not None and results[path].digest == image_digest:
            problems.append(
                Problem("warning", str(path), f"companion '{name}' is the same file content as its image")
            )
        companion_size = results[path].size
        if companion_size is not None and companion_size != size:
            problems.append(
                Problem(
                    "warning",
                    str(path),
                    f"companion '{name}' is {companion_size[0]}x{companion_size[1]} but its image "
                    f"{sample.image_path.name} is {size[0]}x{size[1]}",
                )
            )


def _duplicates(dataset: DatasetSplit, results: dict[Path, _ImageResult]) -> list[Problem]:
    first_by_digest: dict[str, Path] = {}
    problems = []
    for sample in dataset.samples:
        digest = results[sample.image_path].digest
        if digest is None:
            continue
        first = first_by_digest.setdefault(digest, sample.image_path)
        if first != sample.image_path:
            problems.append(Problem("warning", str(sample.image_path), f"identical content to {first}"))
    return problems


def _trains_on(split: str) -> bool:
    return "train" in split.lower()


def _evaluates_on(split: str) -> bool:
    name = split.lower()
    return ("val" in name or "test" in name) and "train" not in name


def _shared_between_splits(datasets: list[DatasetSplit], results: dict[Path, _ImageResult]) -> list[Problem]:
    """A warning per (training, validation/test) pair of splits that share images, the same file or the same
    content: measured on images it trained on, a model looks better than it is on the line."""
    problems = []
    for train in (d for d in datasets if _trains_on(d.split)):
        paths = {sample.image_path.resolve() for sample in train.samples}
        digests = {results[s.image_path].digest for s in train.samples} - {None}
        for held in (d for d in datasets if _evaluates_on(d.split)):
            if held.split.lower() in train.split.lower():  # DeepPCB's trainval holds val by definition
                continue
            shared = [
                sample.image_path
                for sample in held.samples
                if sample.image_path.resolve() in paths or results[sample.image_path].digest in digests
            ]
            if shared:
                problems.append(
                    Problem(
                        "warning",
                        str(held.root),
                        f"{len(shared)} of {len(held.samples)} images of split '{held.split}' are also in "
                        f"split '{train.split}' (same file or same content, e.g. {shared[0].name}): validation "
                        "on training images overstates the model; hold images out",
                    )
                )
    return problems


def render_check_report(report: CheckReport, console: Console) -> None:
    """Print counts per split and class, image size stats, and the problems table."""
    counts = Table(title=f"{report.path} ({report.format})")
    counts.add_column("")
    for split in report.splits:
        counts.add_column(split.name, justify="right")
    counts.add_row("images", *[str(s.images) for s in report.splits])
    counts.add_row("images without boxes", *[str(s.images_without_boxes) for s in report.splits])
    for class_id, name in enumerate(report.class_names):
        counts.add_row(
            f"boxes: {name}",
            *[
                str(s.boxes_per_class[class_id]) if class_id < len(s.boxes_per_class) else "-"
                for s in report.splits
            ],
        )
    counts.add_row("boxes: total", *[str(sum(s.boxes_per_class)) for s in report.splits])
    counts.add_row("templates found", *[str(s.templates_found) for s in report.splits])
    counts.add_row("templates missing", *[str(s.templates_missing) for s in report.splits])
    for name in dict.fromkeys(name for split in report.splits for name in split.companions_found):
        for kind in ("found", "missing"):
            counts.add_row(
                f"companion {name} {kind}",
                *[str(getattr(s, f"companions_{kind}").get(name, "-")) for s in report.splits],
            )
    console.print(counts)

    sizes = Table(title="image size (min / median / max)")
    for column in ("split", "width", "height"):
        sizes.add_column(column, justify="right" if column != "split" else "left")
    for split in report.splits:
        summary = split.size_summary()
        sizes.add_row(
            split.name,
            *[" / ".join(map(str, summary[axis])) if summary else "-" for axis in ("width", "height")],
        )
    console.print(sizes)

    if report.problems:
        table = Table(title=f"problems: {len(report.errors)} errors, {len(report.warnings)} warnings")
        table.add_column("severity")
        table.add_column("file:line", overflow="fold")
        table.add_column("message", overflow="fold")
        for problem in report.problems[:MAX_LISTED_PROBLEMS]:
            style = "red" if problem.severity == "error" else "yellow"
            where = _display_path(problem.path, report.path)
            where = f"{where}:{problem.line}" if problem.line else where
            table.add_row(f"[{style}]{problem.severity}[/{style}]", where, problem.message)
        if len(report.problems) > MAX_LISTED_PROBLEMS:
            table.add_row("", f"... and {len(report.problems) - MAX_LISTED_PROBLEMS} more", "")
        console.print(table)
    verdict = "[red]FAILED[/red]" if report.has_errors else "[green]OK[/green]"
    console.print(
        f"{verdict}: {len(report.errors)} errors, {len(report.warnings)} warnings; checked in {report.seconds:.1f} s"
    )


def run_check(path: str | Path, format: str | None = None, console: Console | None = None) -> int:
    """Check, print, and return the exit code: 1 on errors (or an unreadable dataset), else 0."""
    console = console or Console()
    try:
        with console.status(f"checking {path} ..."):
            report = check_dataset(path, format=format)
    except DefectDetError as error:
        console.print(f"[red]error:[/red] {error}")
        return 1
    render_check_report(report, console)
    return 1 if report.has_errors else 0


def _display_path(path: str, root: Path) -> str:
    base = root if root.is_dir() else root.parent
    try:
        return Path(path).relative_to(base).as_posix()
    except ValueError:
        return path

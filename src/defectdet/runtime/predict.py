"""`predict_source`: run a bundle over a file, folder or glob; write annotated images, predictions.jsonl and
YOLO label files. An unreadable file is listed and skipped; the run goes on. How it runs: `PredictSettings`
(`runtime.predict_settings`)."""

from __future__ import annotations

import glob
import json
import logging
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from defectdet.compat import Surface, with_keywords
from defectdet.data.companions import tagged_capture
from defectdet.data.formats.yolo import label_line
from defectdet.data.imageio import IMAGE_SUFFIXES
from defectdet.errors import InputError, describe_failure
from defectdet.runtime.bundle import check_companion_names
from defectdet.runtime.predict_settings import PredictSettings
from defectdet.runtime.predictor import Detection, PredictionResult, Predictor

logger = logging.getLogger(__name__)

_PALETTE = [
    (230, 25, 75),
    (60, 180, 75),
    (255, 160, 0),
    (0, 130, 200),
    (145, 30, 180),
    (70, 240, 240),
    (240, 50, 230),
    (210, 245, 60),
    (0, 128, 128),
    (170, 110, 40),
]


@dataclass
class PredictSummary:
    """What a `predict` run did: counts, the files that failed and where the outputs are."""

    images: int = 0
    defective: int = 0
    detections: int = 0
    failed: list[tuple[str, str]] = field(default_factory=list)
    out_dir: Path | None = None
    templates_skipped: int = 0  # inputs that are another input's template (DeepPCB ID_temp beside ID_test)
    mean_total_ms: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "images": self.images,
            "defective": self.defective,
            "detections": self.detections,
            "failed": [{"file": name, "error": error} for name, error in self.failed],
            "out_dir": str(self.out_dir) if self.out_dir else None,
            "templates_skipped": self.templates_skipped,
            "mean_total_ms": self.mean_total_ms,
        }


def list_sources(source: str | Path) -> list[Path]:
    """A file, a folder (its images, sorted, not recursive) or a glob pattern -> image paths."""
    text = str(source)
    path = Path(text)
    # Everything named like an image is kept, file or not: a folder, FIFO or symlink loop named *.jpg then
    # fails to read with its reason and is listed, instead of vanishing from the run.
    if path.is_dir():
        found = sorted(p for p in path.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
    elif path.exists() or path.is_symlink():
        found = [path]
    elif any(char in text for char in "*?["):
        found = sorted(
            Path(p)
            for p in glob.glob(text, recursive=True)
            if Path(p).is_file() or Path(p).suffix.lower() in IMAGE_SUFFIXES
        )
    else:
        raise InputError(f"{source}: no such file, folder or glob match")
    if not found:
        raise InputError(f"{source}: no images found (looked for {', '.join(sorted(IMAGE_SUFFIXES))})")
    return found


def find_template(image: Path, templates: Path | None, relative: Path | None = None) -> Path | None:
    """The template of ``image`` in ``templates``: the file at the image's ``relative`` path (a template tree
    that mirrors the inputs'), else the file of the same name, else the same stem with any image suffix, else
    DeepPCB's pairing (``ID_test.jpg`` -> ``ID_temp.jpg``, so one folder can hold both). When ``templates`` is
    the image's own folder only DeepPCB's pairing applies (``a.bmp`` beside ``a.png`` is another board)."""
    if templates is None:
        return None
    if _resolved(templates) == _resolved(image.parent):
        return deeppcb_partner(image, templates)
    for exact in ([templates / relative] if relative is not None else []) + [templates / image.name]:
        if exact.is_file() and _resolved(exact) != _resolved(image):
            return exact
    for candidate in sorted(templates.glob(f"{glob.escape(image.stem)}.*")):
        if candidate.suffix.lower() in IMAGE_SUFFIXES and _resolved(candidate) != _resolved(image):
            return candidate
    return deeppcb_partner(image, templates)


def deeppcb_partner(image: Path, folder: Path) -> Path | None:
    """DeepPCB's template of ``ID_test.<ext>`` in ``folder``: ``ID_temp.<ext>``, else ``ID_temp`` with any image
    suffix; None for other names."""
    if not image.stem.endswith("_test"):
        return None
    stem = image.stem[: -len("_test")] + "_temp"
    same = folder / f"{stem}{image.suffix}"
    if same.is_file():
        return same
    for candidate in sorted(folder.glob(f"{glob.escape(stem)}.*")):
        if candidate.suffix.lower() in IMAGE_SUFFIXES and candidate.is_file():
            return candidate
    return None


def pair_template(image: Path, templates: Path | None, relative: Path | None = None) -> Path | None:
    """The template of ``image``: from ``templates`` (`find_template`), else DeepPCB's ``ID_temp`` beside it,
    else, without ``templates``, the one its dataset folder holds (`dataset_template`)."""
    found = find_template(image, templates, relative) or deeppcb_partner(image, image.parent)
    return found or (dataset_template(image) if templates is None else None)


def dataset_template(image: Path) -> Path | None:
    """The template a dataset folder holds for ``image``, where `train` found it: for ``ROOT/images/SPLIT/name``
    the same name (or stem) in ``ROOT/templates/SPLIT/``, else in ``ROOT/templates/``; None outside such a tree."""
    for ancestor in list(image.parents)[:3]:
        if ancestor.name == "images":
            tree = ancestor.parent / "templates"
            for folder in (tree / image.parent.relative_to(ancestor), tree):
                found = find_template(image, folder) if folder.is_dir() else None
                if found is not None:
                    return found
            return None
    return None


def parse_companions(values: Sequence[str] | None) -> dict[str, Path]:
    """``["L2=captures/L2", ...]`` (`predict --companion NAME=DIR`) -> {name: folder}; InputError naming the
    option for a malformed value, a bad or repeated name, or a folder that is not one."""
    folders: dict[str, Path] = {}
    for value in values or ():
        name, equals, folder = value.partition("=")
        name = name.strip()
        if not equals or not name or not folder:
            raise InputError(f"--companion {value!r}: expected NAME=DIR (e.g. L2=captures/L2)")
        try:
            check_companion_names([*folders, name], "--companion")
        except ValueError as error:
            raise InputError(str(error)) from None
        if not Path(folder).is_dir():
            raise InputError(f"--companion {name}={folder}: not a folder")
        folders[name] = Path(folder)
    return folders


def check_companion_folders(folders: Mapping[str, Path], takes: Sequence[str], model: str | Path) -> None:
    """Every companion capture the model takes has a folder, and no folder names one it does not take."""
    for name in folders:
        if name not in takes:
            listed = ", ".join(takes) or "none"
            raise InputError(
                f"--companion {name}: {model} takes no such capture; its companions are: {listed}"
            )
    for name in takes:
        if name not in folders:
            raise InputError(
                f"{model} also takes the aligned capture {name!r}: pass --companion {name}=DIR, the folder of "
                "those captures (same file names as the images)"
            )


def companion_files(
    image: Path, folders: Mapping[str, Path], relative: Path | None = None
) -> dict[str, Path]:
    """Each companion capture of ``image``: the file at its relative path, of its name or stem in that
    companion's folder (`find_template`), else the file whose name carries the capture's name as its tag (image
    ``part_L1.png`` -> ``part_L2.*``, image ``part.png`` -> ``part_L2.*``, so both captures may share one
    folder); InputError naming the image and the companion when one is missing."""
    found = {}
    for name, folder in folders.items():
        path = find_template(image, folder, relative) or tagged_capture(image, name, folder)
        if path is None:
            raise InputError(
                f"{image}: no companion {name!r} in {folder} (looked for the same name, and for the name "
                f"tagged {name})"
            )
        found[name] = path
    return found


def companion_inputs(images: list[Path], folders: Mapping[str, Path]) -> set[Path]:
    """The inputs that are another input's companion capture (``part_L2.png`` beside ``part_L1.png`` in one
    folder): they are read with their image, never predicted on their own."""
    by_resolved = {_resolved(image): image for image in images}
    found: set[Path] = set()
    for image in images:
        if image in found:
            continue
        try:
            files = companion_files(image, folders)
        except (InputError, OSError):
            continue  # predicting it reports why
        found.update(by_resolved[key] for key in map(_resolved, files.values()) if key in by_resolved)
    return found


def template_inputs(
    images: list[Path], templates: Path | None, names: dict[Path, Path] | None = None
) -> set[Path]:
    """The inputs that are another input's template (DeepPCB's ``ID_temp.jpg`` beside ``ID_test.jpg``, or a
    --templates folder the source also covers): they are paired, never predicted as boards."""
    by_resolved = {_resolved(image): image for image in images}
    found = set()
    for image in images:
        relative = names[image].with_name(image.name) if names else None
        try:
            template = pair_template(image, templates, relative)
        except OSError:
            continue  # an unreadable entry: predicting it reports why
        if template is not None and _resolved(template) != _resolved(image):
            partner = by_resolved.get(_resolved(template))
            if partner is not None:
                found.add(partner)
    return found


def _resolved(path: Path) -> Path:
    """``path`` resolved, or made absolute when it cannot be (a symlink loop)."""
    try:
        return path.resolve()
    except (OSError, RuntimeError):
        return Path(os.path.normpath(path.absolute()))


def output_names(images: list[Path]) -> dict[Path, Path]:
    """Each input's output name, without suffix, relative to the output folders: its path below the inputs'
    common folder (so ``line1/board.png`` and ``line2/board.png`` never write the same file); inputs that share
    a stem in one folder (``a.png``, ``a.bmp``) keep their suffix in the name (``a.png``, ``a.bmp``)."""
    absolute = {image: Path(os.path.normpath(image.absolute())) for image in images}
    root = Path(os.path.commonpath([str(path.parent) for path in absolute.values()])) if images else Path()
    relative = {image: path.relative_to(root) for image, path in absolute.items()}
    stems: dict[Path, int] = {}
    for path in relative.values():
        stems[path.with_suffix("")] = stems.get(path.with_suffix(""), 0) + 1
    return {
        image: path.with_suffix("") if stems[path.with_suffix("")] == 1 else path
        for image, path in relative.items()
    }


def yolo_lines(detections: list[Detection], width: int, height: int) -> list[str]:
    """Detections as YOLO label lines: ``class cx cy w h`` normalised to the image size."""
    return [label_line(detection.class_id, detection.box, width, height) for detection in detections]


def draw_detections(image: np.ndarray, result: PredictionResult) -> np.ndarray:
    """The image (gray or RGB uint8) as BGR with boxes, labels and the verdict drawn."""
    canvas = (
        cv2.cvtColor(image, cv2.COLOR_GRAY2BGR) if image.ndim == 2 else cv2.cvtColor(image, cv2.COLOR_RGB2BGR)
    )
    thickness = max(1, round(max(canvas.shape[:2]) / 400))
    scale = max(0.4, max(canvas.shape[:2]) / 1400)
    for detection in result.detections:
        red, green, blue = _PALETTE[detection.class_id % len(_PALETTE)]
        color = (blue, green, red)
        x1, y1, x2, y2 = (round(value) for value in detection.box)
        cv2.rectangle(canvas, (x1, y1), (x2, y2), color, thickness)
        label = f"{detection.class_name} {detection.score:.2f}"
        (text_w, text_h), _ = cv2.getTextSize(label, cv2.FONT_HERSHEY_SIMPLEX, scale, 1)
        top = max(0, y1 - text_h - 4)
        cv2.rectangle(canvas, (x1, top), (x1 + text_w + 2, top + text_h + 4), color, -1)
        cv2.putText(
            canvas,
            label,
            (x1 + 1, top + text_h + 1),
            cv2.FONT_HERSHEY_SIMPLEX,
            scale,
            (0, 0, 0),
            1,
            cv2.LINE_AA,
        )
    verdict_color = (40, 40, 220) if result.defective else (60, 170, 60)
    origin = (6, int(28 * scale) + 6)
    text = result.verdict.upper()
    font = cv2.FONT_HERSHEY_SIMPLEX
    cv2.putText(canvas, text, origin, font, scale * 1.2, verdict_color, max(1, thickness), cv2.LINE_AA)
    return canvas


def iterate_predictions(
    predictor: Predictor,
    images: list[Path],
    templates: Path | None,
    threshold: float | None,
    names: dict[Path, Path] | None = None,
    companions: Mapping[str, Path] | None = None,
) -> Iterator[tuple[Path, np.ndarray | None, PredictionResult | None, str | None]]:
    """(path, decoded image, result, error) per image. Every failure is caught per file (a decoder may raise
    NotImplementedError, TypeError, ... on a malformed file), so one bad file never stops the batch.
    ``companions``: the folder of each companion capture the model takes."""
    for path in images:
        try:
            relative = names[path].with_name(path.name) if names else None
            template_path = pair_template(path, templates, relative)
            if predictor.metadata.template and template_path is None:
                where = (
                    f"in {templates}" if templates else "in a dataset's templates/ (or pass --templates DIR)"
                )
                raise InputError(
                    f"{path}: no template of the same name {where}, and no DeepPCB ID_temp beside an ID_test"
                )
            planes = predictor.load_planes(
                path,
                template_path if predictor.metadata.template else None,
                companion_files(path, companions or {}, relative),
            )
            image = planes.image
            result = predictor.predict(
                image, planes.template, threshold=threshold, companions=planes.companions
            )
        except Exception as error:  # noqa: BLE001 - per file: listed, counted, and the run goes on
            yield path, None, None, _failure(path, error)
            continue
        yield path, image, result, None


def _jsonl_line(
    path: Path,
    labels: Path,
    out_dir: Path,
    result: PredictionResult,
    predictor: Predictor,
    templates: Path | None,
    name: Path,
    companions: Mapping[str, Path] | None = None,
) -> str:
    """One line of predictions.jsonl: the file, its label file, the result and, for a model with templates, the
    template it was paired with (the labelling tools take the pair along: export-labelstudio), for a model
    with companion captures, the file of each."""
    record = {"file": str(path), "labels": labels.relative_to(out_dir).as_posix(), **result.to_dict()}
    relative = name.with_name(path.name)
    template = pair_template(path, templates, relative) if predictor.metadata.template else None
    if template is not None:
        record["template"] = str(template)
    if companions:
        files = companion_files(path, companions, relative)
        record["companions"] = {plane: str(file) for plane, file in files.items()}
    return json.dumps(record) + "\n"


def _failure(path: Path, error: BaseException) -> str:
    """A per-file failure as one line that names the file."""
    text = describe_failure(error)
    return text if str(path) in text else f"{path}: {text}"


def _template_folder(templates: str | Path | None) -> Path | None:
    template_dir = Path(templates) if templates else None
    if template_dir is not None and not template_dir.is_dir():
        raise InputError(f"--templates {template_dir}: not a folder")
    return template_dir


def predict_source(
    model: str | Path,
    source: str | Path,
    out: str | Path,
    settings: PredictSettings | None = None,
    **keywords: Any,
) -> PredictSummary:
    """Predict every image of ``source`` with ``model`` (a bundle; `defectdet.export.resolve.resolve_bundle`
    exports a checkpoint) into ``out``. `settings` is a `PredictSettings`; its fields may also be given as
    keywords, which apply over it: ``threshold``, ``tiles`` and ``repeat_check`` override the bundle's;
    ``companions``: name -> folder of each aligned capture the bundle takes (`parse_companions` reads
    ``--companion NAME=DIR``); each image's capture is the file of its name there."""
    from rich.progress import Progress

    settings = with_keywords(PredictSettings, settings, keywords, "predict_source", Surface.PREDICT_SOURCE)
    predictor = Predictor(
        _bundle_path(model),
        threads=settings.threads,
        tiles=settings.tiles,
        repeat_check=settings.repeat_check,
    )
    if settings.flip_views is not None:
        check_bundle_views(model, predictor.metadata.flip_views, settings.flip_views)
    companion_dirs = {name: Path(folder) for name, folder in (settings.companions or {}).items()}
    check_companion_folders(companion_dirs, predictor.metadata.companions, model)
    template_dir = _template_folder(settings.templates)
    images, skipped = _inputs(source, template_dir, companion_dirs)
    summary = PredictSummary(out_dir=Path(out), templates_skipped=len(skipped))
    outputs = _Outputs(Path(out), predictor, summary, output_names(images), template_dir, companion_dirs)
    outputs.make_folders(settings.save_images)
    with (
        (outputs.out_dir / "predictions.jsonl").open("w", encoding="utf-8") as jsonl,
        Progress(disable=not settings.progress) as bar,
    ):
        task = bar.add_task("predicting", total=len(images))
        answers = iterate_predictions(
            predictor, images, template_dir, settings.threshold, outputs.names, companion_dirs
        )
        for path, image, result, error in answers:
            bar.advance(task)
            jsonl.write(outputs.add(path, image, result, error))
    return outputs.finish()


def check_bundle_views(bundle: str | Path, exported: str, flip_views: str) -> None:
    """InputError when `bundle`'s graph was exported with views (`exported`) other than `flip_views`."""
    if exported != flip_views:
        raise InputError(
            f"--flip-views {flip_views}: {bundle} was exported with flip views {exported!r} (they are part of "
            f"its graph); export its checkpoint again with `defectdet export --flip-views {flip_views}`, or "
            "predict with the checkpoint and --flip-views"
        )


@dataclass
class _Outputs:
    """What a `predict_source` run writes for each image (its label file, annotated PNG and predictions.jsonl
    line) and counts in its summary."""

    out_dir: Path
    predictor: Predictor
    summary: PredictSummary
    names: dict[Path, Path]  # each input's output name (`output_names`)
    templates: Path | None
    companions: dict[str, Path]
    images_dir: Path | None = None
    totals: list[float] = field(default_factory=list)  # each image's end-to-end milliseconds

    def make_folders(self, save_images: bool) -> None:
        (self.out_dir / "labels").mkdir(parents=True, exist_ok=True)
        if save_images:
            self.images_dir = self.out_dir / "images"
            self.images_dir.mkdir(exist_ok=True)

    def add(
        self, path: Path, image: np.ndarray | None, result: PredictionResult | None, error: str | None
    ) -> str:
        """Write one image's outputs and count it; returns its predictions.jsonl line. A file that failed, to
        read or to write, is listed in the summary and the run goes on."""
        if result is None or image is None:
            return self._failed(path, str(error))
        name = self.names[path]
        label_path = self.out_dir / "labels" / name.with_name(name.name + ".txt")
        try:
            _write_outputs(image, result, label_path, self.images_dir, name)
        except Exception as error:  # noqa: BLE001 - as for decoding: this file fails, the run goes on
            return self._failed(path, _failure(path, error))
        self.summary.images += 1
        self.summary.defective += result.defective
        self.summary.detections += len(result.detections)
        self.totals.append(result.timings["total"])
        return _jsonl_line(
            path, label_path, self.out_dir, result, self.predictor, self.templates, name, self.companions
        )

    def _failed(self, path: Path, message: str) -> str:
        logger.warning("skipping %s: %s", path, message)
        self.summary.failed.append((str(path), message))
        return json.dumps({"file": str(path), "error": message}) + "\n"

    def finish(self) -> PredictSummary:
        """The summary, with classes.txt written beside the outputs."""
        names = self.predictor.metadata.class_names
        (self.out_dir / "classes.txt").write_text("".join(f"{name}\n" for name in names))
        self.summary.mean_total_ms = round(float(np.mean(self.totals)), 3) if self.totals else None
        return self.summary


def _inputs(
    source: str | Path, template_dir: Path | None, companions: Mapping[str, Path]
) -> tuple[list[Path], set[Path]]:
    """The images of ``source`` to predict, and the inputs left out as another input's template; inputs that
    are another input's companion capture are left out too."""
    images = list_sources(source)
    skipped = template_inputs(images, template_dir, output_names(images))
    if skipped:
        logger.info(
            "%d template(s) among the inputs are paired with their boards, not predicted", len(skipped)
        )
        images = [image for image in images if image not in skipped]
        if not images:
            raise InputError(f"{source}: holds only templates ({len(skipped)}), no boards to predict")
    captures = companion_inputs(images, companions) if companions else set()
    if captures:
        logger.info("%d companion capture(s) among the inputs are read with their images", len(captures))
        images = [image for image in images if image not in captures]
    return images, skipped


def _write_outputs(
    image: np.ndarray, result: PredictionResult, label_path: Path, images_dir: Path | None, name: Path
) -> None:
    """One image's YOLO label file and, with `images_dir`, its annotated PNG."""
    width, height = result.image_size
    label_path.parent.mkdir(parents=True, exist_ok=True)
    label_path.write_text(
        "".join(line + "\n" for line in yolo_lines(result.detections, width, height)), encoding="utf-8"
    )
    if images_dir is not None:
        drawn = images_dir / name.with_name(name.name + ".png")
        drawn.parent.mkdir(parents=True, exist_ok=True)
        if not cv2.imwrite(str(drawn), draw_detections(image, result)):
            raise OSError(f"cannot write {drawn}")


def _bundle_path(model: str | Path) -> Path:
    """``model`` when it is a bundle (.onnx); a checkpoint needs torch to export, which this module never imports."""
    model = Path(model)
    if model.suffix.lower() == ".onnx":
        return model
    raise InputError(
        f"{model}: not a bundle (.onnx); export it first (`defectdet export`, or "
        "`defectdet.export.resolve.resolve_bundle`), or run `defectdet predict`, which does that for you"
    )

"""`compare_models`: should NEW replace OLD on the line? Both run through the torch-free runtime on the same held-out
images, each at its own stored operating threshold, scored by our evaluator; a verdict by a stated rule.

OLD and NEW are bundles (.onnx) or training checkpoints (.pt, exported first through `resolve_bundle`, as
`defectdet predict` does). Per model: mAP@0.5 and mAP@0.5:0.95 (`evaluation.coco`), escapes (defective images
judged clean, missed defects), false calls (the split's defect-free images, plus clean boards: a folder of them
and/or recaptures of the split's templates, `data.recapture.make_clean_boards`), per-class AP50, and the end-to-end
latency of `Predictor.predict` (same process, the two models interleaved per image, who goes first alternating).
The images where the models disagree at their thresholds are listed and drawn side by side.

Lives in `export` (layer 6) because a checkpoint must be exported first; everything else it uses is the runtime,
the evaluation and data. The rendering of its result is `export.compare_view`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from defectdet.data.sample import DatasetSplit, Sample
from defectdet.errors import DatasetError, InputError
from defectdet.evaluation.coco import coco_metrics
from defectdet.evaluation.operating_point import (
    box_iou,
    image_verdicts,
    match_detections,
    pooled_at_threshold,
)
from defectdet.evaluation.types import ImageRecord
from defectdet.runtime.bundle import BundleMetadata, read_metadata
from defectdet.runtime.predictor import PredictionResult, Predictor

ROLES = ("old", "new")
LABELS = {"old": "OLD", "new": "NEW"}
PROMOTE, KEEP = "promote", "keep OLD"
EXIT_PROMOTE, EXIT_KEEP = 0, 1
IOU = 0.5  # a box "agrees" with the other model's box, or finds a defect, at IoU >= 0.5
EPSILON = 1e-9  # equal is not worse: float noise never decides a verdict
RULE = (
    "promote NEW only if, each model at its own stored threshold: NEW's escape rate (defective images judged "
    "clean) <= OLD's + tol_escape, NEW's missed-defect rate <= OLD's + tol_escape, NEW's mAP@0.5 >= OLD's - tol_map, "
    "and NEW's false-call rate (defect-free images and clean boards flagged) <= OLD's + tol_false_call; a criterion "
    "that cannot be measured (no defect-free image: pass --clean DIR or --clean-auto) keeps OLD. Equal is not worse."
)


@dataclass(frozen=True)
class Tolerances:
    """How much worse than OLD NEW may be, in absolute rate (escape, false call) or mAP points (map50)."""

    escape: float = 0.005
    map50: float = 0.01
    false_call: float = 0.01

    def __post_init__(self) -> None:
        for name in ("escape", "map50", "false_call"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise InputError(f"tolerance {name} must be within [0, 1], got {value}")


# ------------------------------------------------------------------------------------------- what may be compared
def check_comparable(old: BundleMetadata, new: BundleMetadata, old_path: Path, new_path: Path) -> str:
    """Raise InputError naming every difference that makes the two models incomparable on the same images
    (input layout, channels, class lists that are not one list reordered or extended by NEW); return how the
    classes are matched."""
    problems = []
    if old.template != new.template:
        problems.append(
            f"layout: OLD {'compares each image with its template' if old.template else 'sees the image alone'} "
            f"(template={str(old.template).lower()}), NEW "
            f"{'compares each image with its template' if new.template else 'sees the image alone'} "
            f"(template={str(new.template).lower()})"
        )
    if old.channels != new.channels:
        problems.append(f"channels: OLD takes {_channels(old.channels)}, NEW takes {_channels(new.channels)}")
    for role, meta in (("OLD", old), ("NEW", new)):
        repeated = sorted({name for name in meta.class_names if meta.class_names.count(name) > 1})
        if repeated:
            problems.append(
                f"classes: {role} names {repeated} more than once, so they cannot be matched by name"
            )
    only_old = [name for name in old.class_names if name not in new.class_names]
    only_new = [name for name in new.class_names if name not in old.class_names]
    if only_old:
        problems.append(
            f"classes: only OLD detects {only_old}"
            + (f", only NEW detects {only_new}" if only_new else "")
            + " (NEW may list OLD's classes in another order or add classes; they are matched by name)"
        )
    if problems:
        raise InputError(
            f"OLD {old_path} and NEW {new_path} cannot be compared on the same images: " + "; ".join(problems)
        )
    if only_new:
        return f"NEW adds {only_new} to OLD's classes; classes are matched by name (OLD cannot detect the new ones)"
    if old.class_names != new.class_names:
        return "same classes in another order; matched by name"
    return "identical class lists"


def _channels(channels: int) -> str:
    return f"{channels} channel{'s' if channels > 1 else ''} ({'gray' if channels == 1 else 'RGB'})"


def class_space(dataset: DatasetSplit, metas: dict[str, BundleMetadata], paths: dict[str, Path]) -> list[str]:
    """The evaluation's class list: the dataset's classes, then any class a model detects that the dataset does
    not label (its detections can only be false). A model that shares no class name with the dataset is refused."""
    names = list(dataset.class_names)
    for role in ROLES:
        model_names = metas[role].class_names
        if not set(model_names) & set(names):
            raise InputError(
                f"{LABELS[role]} {paths[role]} detects {model_names} but {dataset.root} split {dataset.split!r} "
                f"labels {names}: no class in common to match by name"
            )
        names += [name for name in model_names if name not in names]
    return names


# ------------------------------------------------------------------------------------------- images
def held_out_split(data: str | Path, split: str, format: str | None) -> tuple[DatasetSplit, str]:
    """`split` of `data`; when the dataset has no separate split (the reader gives the training images again),
    the trainer's fixed file-name-hash hold-out of them (`data.holdout`), so the comparison never scores
    training images. Returns the split and a note saying which images these are."""
    from defectdet.data.formats import load_dataset
    from defectdet.data.holdout import hold_out, same_images

    dataset = load_dataset(data, split, format=format)
    note = f"split {split!r} of {data} ({len(dataset.samples)} images)"
    if split != "train":
        try:
            train = load_dataset(data, "train", format=format)
        except DatasetError:
            return dataset, note
        if same_images(train, dataset):
            dataset = hold_out(train)[1]
            note = (
                f"{data} has no separate {split!r} split: the training's file-name-hash hold-out "
                f"({len(dataset.samples)} images)"
            )
    return dataset, note


def clean_folder(folder: Path, templates: Path | None, template: bool) -> list[Sample]:
    """The images of a folder of defect-free boards as samples without defects; with a template model each is
    paired as `defectdet predict` pairs (`--clean-templates` folder by name, or DeepPCB's ID_temp beside it)."""
    from defectdet.runtime.predict import list_sources, output_names, pair_template, template_inputs

    if not folder.is_dir():
        raise InputError(f"--clean {folder}: not a folder")
    if templates is not None and not templates.is_dir():
        raise InputError(f"--clean-templates {templates}: not a folder")
    images = list_sources(folder)
    skipped = template_inputs(images, templates) if template else set()
    samples = []
    for image, name in output_names([image for image in images if image not in skipped]).items():
        template_path = pair_template(image, templates) if template else None
        if template and template_path is None:
            raise InputError(
                f"{image}: the models compare each board with its template and this clean board has none "
                "(pass --clean-templates DIR with a template of the same name)"
            )
        samples.append(
            Sample(
                image_path=image,
                boxes=np.zeros((0, 4), np.float32),
                classes=np.zeros((0,), np.int64),
                template_path=template_path,
                source=f"clean board from {folder}",
                image_id=f"clean/{name.as_posix()}",
            )
        )
    if not samples:
        raise InputError(f"--clean {folder}: holds only templates, no clean board")
    return samples


def auto_clean_boards(dataset: DatasetSplit, out_dir: Path, channels: int, seed: int) -> list[Sample]:
    """One recapture (default nuisances: exposure, noise, JPEG, small shift and rotation) of each template of the
    split, as `bench/peers.py` and `defectdet val --clean-templates` make them."""
    from defectdet.data.recapture import RecaptureConfig, make_clean_boards

    if not dataset.has_templates:
        raise InputError(
            f"--clean-auto recaptures the split's templates and {dataset.root} split {dataset.split!r} has none; "
            "pass a folder of defect-free boards with --clean DIR"
        )
    return make_clean_boards(dataset, out_dir, RecaptureConfig(), channels=channels, seed=seed)


# ------------------------------------------------------------------------------------------- running
def run_interleaved(
    predictors: dict[str, Predictor], samples: Sequence[Sample], progress: bool = False
) -> tuple[dict[str, list[PredictionResult]], dict[str, list[float]]]:
    """Every sample through both predictors, in one process: per image OLD then NEW, then NEW then OLD on the
    next one (so neither always meets a warm cache), after one untimed warm-up call each. Each call is
    `Predictor.predict` on the file paths: decode, registration, letterbox, model, NMS, boxes to original pixels,
    at the bundle's own threshold, with every detection down to its score floor kept for mAP."""
    from rich.progress import Progress

    results: dict[str, list[PredictionResult]] = {role: [] for role in ROLES}
    latency: dict[str, list[float]] = {role: [] for role in ROLES}

    def call(role: str, sample: Sample) -> PredictionResult:
        predictor = predictors[role]
        template = sample.template_path if predictor.metadata.template else None
        return predictor.predict(sample.image_path, template, min_score=0.0)

    if samples:
        for role in ROLES:
            call(role, samples[0])
    with Progress(disable=not progress, transient=True) as bar:
        task = bar.add_task("comparing", total=len(samples))
        for index, sample in enumerate(samples):
            for role in ROLES if index % 2 == 0 else ROLES[::-1]:
                started = time.perf_counter()
                result = call(role, sample)
                latency[role].append((time.perf_counter() - started) * 1e3)
                results[role].append(result)
            bar.advance(task)
    return results, latency


def to_record(sample: Sample, result: PredictionResult, class_ids: dict[str, int]) -> ImageRecord:
    """A prediction as an `ImageRecord` in the comparison's class space (`class_ids`: name -> id)."""
    width, height = result.image_size
    detections = result.detections
    return ImageRecord(
        image_id=sample.image_id,
        width=width,
        height=height,
        gt_boxes=sample.boxes,
        gt_classes=sample.classes,
        det_boxes=np.array([d.box for d in detections], np.float32).reshape(-1, 4),
        det_scores=np.array([d.score for d in detections], np.float32),
        det_classes=np.array([class_ids[d.class_name] for d in detections], np.int64),
        image_path=str(sample.image_path),
    )


# ------------------------------------------------------------------------------------------- scoring
def _rate(count: int, total: int) -> float | None:
    return count / total if total else None


def score_model(
    split_records: Sequence[ImageRecord],
    board_records: Sequence[ImageRecord],
    class_names: Sequence[str],
    threshold: float,
    latency_ms: Sequence[float],
) -> dict[str, Any]:
    """mAP (on the split), escapes and false calls at `threshold`, per-class AP50 and latency percentiles."""
    coco = coco_metrics(split_records, class_names)
    verdicts = image_verdicts(split_records, threshold)
    at = pooled_at_threshold(match_detections(split_records, len(class_names), IOU), threshold)
    defects = at["true_positives"] + at["false_negatives"]
    boards_flagged = sum(record.max_score >= threshold for record in board_records)
    clean_images = verdicts["clean_images"] + len(board_records)
    false_calls = verdicts["false_calls"] + boards_flagged
    labelled = {name for record in split_records for name in (class_names[c] for c in record.gt_classes)}
    return {
        "mAP50": coco["mAP50"],
        "mAP50_95": coco["mAP50_95"],
        "escapes": {
            "defective_images": verdicts["defective_images"],
            "escaped_images": verdicts["escapes"],
            "escape_rate": verdicts["escape_rate"],
            "defects": defects,
            "missed_defects": at["false_negatives"],
            "missed_defect_rate": _rate(at["false_negatives"], defects),
        },
        "false_calls": {
            "split_clean_images": verdicts["clean_images"],
            "split_false_calls": verdicts["false_calls"],
            "clean_boards": len(board_records),
            "clean_board_false_calls": boards_flagged,
            "clean_images": clean_images,
            "false_calls": false_calls,
            "false_call_rate": _rate(false_calls, clean_images),
        },
        "class_AP50": {name: coco["class_AP50"].get(name) for name in class_names if name in labelled},
        "latency_ms": {
            "images": len(latency_ms),
            "p50": round(float(np.percentile(latency_ms, 50)), 3) if len(latency_ms) else None,
            "p95": round(float(np.percentile(latency_ms, 95)), 3) if len(latency_ms) else None,
        },
    }


def disagreement(
    old: ImageRecord, new: ImageRecord, thresholds: tuple[float, float], class_names
) -> str | None:
    """Why the two models' calls on one image differ at their thresholds, or None when they agree: one flags it
    and the other does not, or their boxes differ (paired class-agnostically, highest IoU first, IoU >= 0.5;
    an unpaired box, or a pair of different classes)."""
    old_kept, new_kept = old.det_scores >= thresholds[0], new.det_scores >= thresholds[1]
    if old_kept.any() != new_kept.any():
        return "OLD flags it, NEW calls it clean" if old_kept.any() else "NEW flags it, OLD calls it clean"
    if not old_kept.any():
        return None
    old_boxes, new_boxes = old.det_boxes[old_kept], new.det_boxes[new_kept]
    old_classes, new_classes = old.det_classes[old_kept], new.det_classes[new_kept]
    ious = box_iou(old_boxes, new_boxes)
    old_used, new_used = np.zeros(len(old_boxes), bool), np.zeros(len(new_boxes), bool)
    changed = []
    rows, cols = np.nonzero(ious >= IOU)
    for pair in np.argsort(-ious[rows, cols], kind="stable"):
        row, col = rows[pair], cols[pair]
        if old_used[row] or new_used[col]:
            continue
        old_used[row] = new_used[col] = True
        if old_classes[row] != new_classes[col]:
            changed.append(f"{class_names[old_classes[row]]} -> {class_names[new_classes[col]]}")
    parts = []
    if (~old_used).any():
        parts.append(f"{int((~old_used).sum())} box(es) only OLD finds")
    if (~new_used).any():
        parts.append(f"{int((~new_used).sum())} box(es) only NEW finds")
    if changed:
        parts.append(f"{len(changed)} box(es) of another class ({', '.join(changed)})")
    return "both flag it; " + "; ".join(parts) if parts else None


def _calls(record: ImageRecord, threshold: float, class_names: Sequence[str]) -> dict[str, Any]:
    kept = record.det_scores >= threshold
    return {
        "verdict": "defective" if kept.any() else "clean",
        "detections": [
            {
                "class_name": class_names[int(c)],
                "score": round(float(s), 4),
                "box": [round(float(v), 1) for v in b],
            }
            for b, s, c in zip(
                record.det_boxes[kept], record.det_scores[kept], record.det_classes[kept], strict=True
            )
        ],
    }


# ------------------------------------------------------------------------------------------- verdict
def decide(old: dict[str, Any], new: dict[str, Any], tolerances: Tolerances) -> dict[str, Any]:
    """The promotion rule (`RULE`) applied to two `score_model` results."""
    checks = [
        _check("escape rate", old["escapes"]["escape_rate"], new["escapes"]["escape_rate"], tolerances.escape,
               lower_is_better=True, missing="the split has no defective image"),
        _check("missed-defect rate", old["escapes"]["missed_defect_rate"], new["escapes"]["missed_defect_rate"],
               tolerances.escape, lower_is_better=True, missing="the split has no labelled defect"),
        _check("mAP@0.5", old["mAP50"], new["mAP50"], tolerances.map50, lower_is_better=False,
               missing="the split has no labelled defect"),
        _check("false-call rate", old["false_calls"]["false_call_rate"], new["false_calls"]["false_call_rate"],
               tolerances.false_call, lower_is_better=True,
               missing="no defect-free image in the split and no clean board: pass --clean DIR or --clean-auto"),
    ]  # fmt: skip
    failed = [check for check in checks if not check["passed"]]
    decision = PROMOTE if not failed else KEEP
    return {
        "decision": decision,
        "exit_code": EXIT_PROMOTE if decision == PROMOTE else EXIT_KEEP,
        "rule": RULE,
        "tolerances": {
            "escape": tolerances.escape,
            "map50": tolerances.map50,
            "false_call": tolerances.false_call,
        },
        "checks": checks,
        "reasons": [check["reason"] for check in (failed or checks)],
    }


def _check(
    name: str, old: float | None, new: float | None, tolerance: float, *, lower_is_better: bool, missing: str
) -> dict[str, Any]:
    if old is None or new is None:
        return {"name": name, "old": old, "new": new, "limit": None, "passed": False,
                "reason": f"{name} not measured: {missing}"}  # fmt: skip
    limit = old + tolerance if lower_is_better else old - tolerance
    passed = new <= limit + EPSILON if lower_is_better else new >= limit - EPSILON
    relation = ("<=" if lower_is_better else ">=") if passed else (">" if lower_is_better else "<")
    word = "within" if passed else "worse than"
    reason = (
        f"{name}: NEW {new:.4f} {relation} {limit:.4f} (OLD {old:.4f} {'+' if lower_is_better else '-'} "
        f"tolerance {tolerance:g}): {word} the limit"
    )
    return {"name": name, "old": old, "new": new, "limit": limit, "passed": passed, "reason": reason}


# ------------------------------------------------------------------------------------------- the command
def compare_models(
    old: str | Path,
    new: str | Path,
    data: str | Path,
    *,
    split: str = "val",
    format: str | None = None,
    clean: str | Path | None = None,
    clean_templates: str | Path | None = None,
    clean_auto: bool = False,
    out: str | Path = Path("runs/compare"),
    threads: int | None = None,
    tolerances: Tolerances | None = None,
    max_grid: int = 12,
    seed: int = 0,
    progress: bool = False,
) -> dict[str, Any]:
    """Compare OLD and NEW on `split` of `data` (see the module docstring); writes `out/compare.json` and, when
    they disagree anywhere, `out/disagreements.png` (at most `max_grid` rows); returns the JSON document."""
    from defectdet.evaluation.plots import plot_comparison_grid
    from defectdet.evaluation.report import to_jsonable
    from defectdet.export.resolve import resolve_bundle

    tolerances = tolerances or Tolerances()
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    given = {"old": Path(old), "new": Path(new)}
    bundles = {role: resolve_bundle(given[role], out_dir / f"{role}_export") for role in ROLES}
    metas = {role: read_metadata(bundles[role]) for role in ROLES}
    class_note = check_comparable(metas["old"], metas["new"], given["old"], given["new"])
    dataset, images_note = held_out_split(data, split, format)
    if not dataset.samples:
        raise DatasetError(f"{data} split {split!r} has no image to compare on")
    if metas["old"].template and not all(sample.template_path for sample in dataset.samples):
        missing = next(sample for sample in dataset.samples if sample.template_path is None)
        raise InputError(
            f"the models compare each image with its template but {missing.image_path} has none; give the split "
            "templates (data.yaml `templates:`)"
        )
    names = class_space(dataset, metas, given)
    boards: list[Sample] = []
    if clean is not None:
        boards += clean_folder(
            Path(clean), Path(clean_templates) if clean_templates else None, metas["old"].template
        )
    if clean_auto:
        boards += auto_clean_boards(dataset, out_dir / "clean_boards", metas["old"].channels, seed)

    predictors = {role: Predictor(bundles[role], threads=threads) for role in ROLES}
    samples = [*dataset.samples, *boards]
    results, latency = run_interleaved(predictors, samples, progress)
    class_ids = {name: index for index, name in enumerate(names)}
    records = {
        role: [to_record(s, r, class_ids) for s, r in zip(samples, results[role], strict=True)]
        for role in ROLES
    }
    count = len(dataset.samples)
    thresholds = (metas["old"].thresholds.score, metas["new"].thresholds.score)
    scores = {
        role: score_model(records[role][:count], records[role][count:], names, threshold, latency[role])
        for role, threshold in zip(ROLES, thresholds, strict=True)
    }
    if scores["old"]["escapes"]["defective_images"] == 0:
        raise DatasetError(
            f"{data} split {split!r} has no defective image: escapes and mAP cannot be compared on it"
        )

    disagreements = []
    for index, (old_record, new_record) in enumerate(zip(records["old"], records["new"], strict=True)):
        reason = disagreement(old_record, new_record, thresholds, names)
        if reason is not None:
            disagreements.append((index, reason))
    disagreements.sort(key=lambda item: (not item[1].startswith(("OLD flags", "NEW flags")), item[0]))
    grid = None
    if disagreements:
        grid = plot_comparison_grid(
            [(records["old"][i], records["new"][i], reason) for i, reason in disagreements[:max_grid]],
            names,
            out_dir / "disagreements.png",
            thresholds,
        )
    elif (out_dir / "disagreements.png").exists():
        (out_dir / "disagreements.png").unlink()  # an earlier run's grid would describe other models

    document = {
        "description": "defectdet compare: OLD vs NEW on the same held-out images, each at its own stored "
        "threshold, through the torch-free runtime, scored by defectdet's evaluator",
        "data": str(data),
        "images": images_note,
        "split_images": count,
        "clean_boards": {
            "folder": str(clean) if clean is not None else None,
            "recaptured_from_templates": clean_auto,
            "count": len(boards),
        },
        "classes": {"evaluated": names, "matching": class_note},
        "models": {
            role: {
                "given": str(given[role]),
                "bundle": str(bundles[role]),
                "exported_from_checkpoint": bundles[role] != given[role],
                "preset": metas[role].preset,
                "class_names": metas[role].class_names,
                "input_size": metas[role].input_size,
                "channels": metas[role].channels,
                "template": metas[role].template,
                "precision": metas[role].precision,
                "threshold": {
                    "value": metas[role].thresholds.score,
                    "source": f"bundle metadata thresholds.score ({_source(metas[role])})",
                },
                **scores[role],
            }
            for role in ROLES
        },
        "latency": "milliseconds per image end to end through Predictor.predict (decode of the files, "
        "registration, letterbox, model, NMS, boxes to original pixels), both models in one process, "
        f"interleaved per image (first model alternating), {predictors['old'].threads} onnxruntime thread(s) each, "
        "one untimed warm-up call each",
        "disagreements": [
            {
                "image_id": records["old"][i].image_id,
                "image": records["old"][i].image_path,
                "clean_board": i >= count,
                "reason": reason,
                "old": _calls(records["old"][i], thresholds[0], names),
                "new": _calls(records["new"][i], thresholds[1], names),
            }
            for i, reason in disagreements
        ],
        "disagreements_png": str(grid) if grid else None,
        "verdict": decide(scores["old"], scores["new"], tolerances),
    }
    document = to_jsonable(document)
    (out_dir / "compare.json").write_text(json.dumps(document, indent=1), encoding="utf-8")
    document["json"] = str(out_dir / "compare.json")
    return document


def _source(meta: BundleMetadata) -> str:
    source = meta.thresholds.score_source
    if source == "default":
        return "the default: no threshold was measured when it was exported"
    return source

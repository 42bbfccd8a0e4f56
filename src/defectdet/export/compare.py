"""`compare_models`: should NEW replace OLD on the line? Both run through the torch-free runtime on the same held-out
images, each at its own stored operating threshold, scored by our evaluator; a verdict by a stated rule.

OLD and NEW are bundles (.onnx) or training checkpoints (.pt, exported first through `resolve_bundle`, as
`defectdet predict` does). Per model: mAP@0.5 and mAP@0.5:0.95 (`evaluation.coco`), escapes (defective images
judged clean, missed defects), false calls (the split's defect-free images, plus clean boards: a folder of them
and/or recaptures of the split's templates, `data.recapture.make_clean_boards`), per-class AP50, and the end-to-end
latency of `Predictor.predict` (same process, the two models interleaved per image, who goes first alternating).
The images where the models disagree at their thresholds are listed and drawn side by side.

Lives in `export` (layer 6) because a checkpoint must be exported first; everything else it uses is the runtime,
the evaluation and data. Which models and images may be compared is `export.compare_inputs`, the measurements
and the rule `export.compare_score`, the terminal view `export.compare_view`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from defectdet.compat import with_keywords
from defectdet.data.sample import DatasetSplit, Sample
from defectdet.errors import DatasetError, InputError
from defectdet.evaluation.types import ImageRecord
from defectdet.export.compare_inputs import (
    AGNOSTIC_CLASS,
    ROLES,
    agnostic_split,
    auto_clean_boards,
    check_comparable,
    class_agnostic,
    class_space,
    clean_folder,
    held_out_split,
)
from defectdet.export.compare_score import (
    KEEP,
    PROMOTE,
    RULE,
    Tolerances,
    decide,
    disagreement,
    run_interleaved,
    score_model,
    to_record,
)
from defectdet.export.compare_settings import CompareSettings, tolerance_keywords
from defectdet.runtime.bundle import BundleMetadata, file_sha256, read_metadata
from defectdet.runtime.predictor import Predictor

__all__ = ["KEEP", "PROMOTE", "RULE", "CompareSettings", "Tolerances", "compare_models"]


@dataclass
class _Models:
    """The two models as given, the bundles they run as, their metadata and how their classes are matched."""

    given: dict[str, Path]
    bundles: dict[str, Path]
    metas: dict[str, BundleMetadata]
    class_note: str

    @property
    def thresholds(self) -> tuple[float, float]:
        return self.metas["old"].thresholds.threshold, self.metas["new"].thresholds.threshold


def _models(old: str | Path, new: str | Path, out_dir: Path) -> _Models:
    """Bundles as they are, checkpoints exported into `out_dir/<role>_export` first; refused when incomparable."""
    from defectdet.export.resolve import resolve_bundle

    given = {"old": Path(old), "new": Path(new)}
    bundles = {role: resolve_bundle(given[role], out_dir / f"{role}_export") for role in ROLES}
    metas = {role: read_metadata(bundles[role]) for role in ROLES}
    return _Models(
        given, bundles, metas, check_comparable(metas["old"], metas["new"], given["old"], given["new"])
    )


def _split(data: str | Path, split: str, format: str | None, template: bool) -> tuple[DatasetSplit, str]:
    """The held-out split, checked: images, at least one defect, and a template for each with a template model."""
    dataset, note = held_out_split(data, split, format)
    if not dataset.samples:
        raise DatasetError(f"{data} split {split!r} has no image to compare on")
    if not any(len(sample.boxes) for sample in dataset.samples):
        raise DatasetError(
            f"{data} split {split!r} has no defective image: escapes and mAP cannot be compared on it"
        )
    if template and not all(sample.template_path for sample in dataset.samples):
        missing = next(sample for sample in dataset.samples if sample.template_path is None)
        raise InputError(
            f"the models compare each image with its template but {missing.image_path} has none; give the split "
            "templates (data.yaml `templates:`)"
        )
    return dataset, note


def _boards(
    dataset: DatasetSplit, meta: BundleMetadata, settings: CompareSettings, out_dir: Path
) -> list[Sample]:
    """The clean boards: the settings' folder of them, and recaptures of the split's templates."""
    boards: list[Sample] = []
    if settings.clean is not None:
        templates = Path(settings.clean_templates) if settings.clean_templates else None
        boards += clean_folder(Path(settings.clean), templates, meta.template)
    if settings.clean_auto:
        boards += auto_clean_boards(dataset, out_dir / "clean_boards", meta.channels, settings.seed)
    return boards


def _disagreements(
    records: dict[str, list[ImageRecord]], thresholds: tuple[float, float], names: list[str]
) -> list[tuple[int, str]]:
    """(image index, reason) of every image the models call differently; verdict flips first."""
    found = []
    for index, (old_record, new_record) in enumerate(zip(records["old"], records["new"], strict=True)):
        reason = disagreement(old_record, new_record, thresholds, names)
        if reason is not None:
            found.append((index, reason))
    return sorted(found, key=lambda item: (not item[1].startswith(("OLD flags", "NEW flags")), item[0]))


def _draw(
    records: dict[str, list[ImageRecord]],
    found: list[tuple[int, str]],
    names: list[str],
    thresholds: tuple[float, float],
    out_dir: Path,
    max_grid: int,
) -> Path | None:
    """`out_dir/disagreements.png` (at most `max_grid` rows), or None (and no stale grid) when they agree."""
    from defectdet.evaluation.plots import plot_comparison_grid

    path = out_dir / "disagreements.png"
    if not found:
        path.unlink(missing_ok=True)  # an earlier run's grid would describe other models
        return None
    pairs = [(records["old"][i], records["new"][i], reason) for i, reason in found[:max_grid]]
    return plot_comparison_grid(pairs, names, path, thresholds)


def compare_models(
    old: str | Path,
    new: str | Path,
    data: str | Path,
    settings: CompareSettings | None = None,
    **keywords: Any,
) -> dict[str, Any]:
    """Compare OLD and NEW on `settings.split` of `data` (see the module docstring); writes `out/compare.json`
    and, when they disagree anywhere, `out/disagreements.png` (at most `max_grid` rows); returns the JSON
    document (plus its path under "json"). `settings` is a `CompareSettings`; its fields may also be given as
    keywords, which apply over it (`split`, `clean`, `clean_auto`, `out`, `threads`, `tolerances`, ...)."""
    from defectdet.evaluation.report import to_jsonable

    settings = with_keywords(CompareSettings, settings, tolerance_keywords(keywords), "compare_models")
    tolerances = settings.tolerances  # checked before any model loads
    out_dir = Path(settings.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    models = _models(old, new, out_dir)
    dataset, images_note = _split(data, settings.split, settings.format, models.metas["old"].template)
    agnostic = class_agnostic(models.metas["old"], models.metas["new"])
    dataset, names, class_ids = _class_space(dataset, models, agnostic)
    boards = _boards(dataset, models.metas["old"], settings, out_dir)
    predictors = {role: Predictor(models.bundles[role], threads=settings.threads) for role in ROLES}
    samples = [*dataset.samples, *boards]
    results, latency = run_interleaved(predictors, samples, settings.progress)
    records = {
        role: [to_record(s, r, class_ids) for s, r in zip(samples, results[role], strict=True)]
        for role in ROLES
    }
    count, thresholds = len(dataset.samples), models.thresholds
    scores = {
        role: score_model(records[role][:count], records[role][count:], names, threshold, latency[role])
        for role, threshold in zip(ROLES, thresholds, strict=True)
    }
    found = _disagreements(records, thresholds, names)
    grid = _draw(records, found, names, thresholds, out_dir, settings.max_grid)
    run = _Run(models, names, agnostic, count, len(boards), records, scores, found, predictors["old"].threads)
    document = _document(data, images_note, settings, run, grid)
    document["verdict"] = decide(scores["old"], scores["new"], tolerances)
    document = to_jsonable(document)
    (out_dir / "compare.json").write_text(json.dumps(document, indent=1), encoding="utf-8")
    document["json"] = str(out_dir / "compare.json")
    return document


def _class_space(
    dataset: DatasetSplit, models: _Models, agnostic: bool
) -> tuple[DatasetSplit, list[str], dict[str, int]]:
    """(the split, the class names evaluated, each model class name -> its id there): the classes matched by
    name, or one class for all when either model is good-parts-only (`class_agnostic`)."""
    if agnostic:
        # every class of either model is the one class
        class_ids = {name: 0 for role in ROLES for name in models.metas[role].class_names}
        return agnostic_split(dataset), [AGNOSTIC_CLASS], class_ids
    names = class_space(dataset, models.metas, models.given)
    return dataset, names, {name: index for index, name in enumerate(names)}


@dataclass
class _Run:
    """What one comparison measured: the split's images first (`count`), then the clean boards."""

    models: _Models
    names: list[str]
    agnostic: bool
    count: int
    boards: int
    records: dict[str, list[ImageRecord]]
    scores: dict[str, dict[str, Any]]
    found: list[tuple[int, str]]
    threads: int


def _document(
    data: str | Path, images_note: str, settings: CompareSettings, run: _Run, grid: Path | None
) -> dict[str, Any]:
    """compare.json without its verdict."""
    models, thresholds = run.models, run.models.thresholds
    return {
        "description": "defectdet compare: OLD vs NEW on the same held-out images, each at its own stored "
        "threshold, through the torch-free runtime, scored by defectdet's evaluator",
        "data": str(data),
        "images": images_note,
        "split_images": run.count,
        "clean_boards": {
            "folder": str(settings.clean) if settings.clean is not None else None,
            "recaptured_from_templates": settings.clean_auto,
            "count": run.boards,
        },
        "classes": {"evaluated": run.names, "matching": models.class_note, "class_agnostic": run.agnostic},
        "models": {role: _model_entry(models, role, run.scores[role]) for role in ROLES},
        "latency": "milliseconds per image end to end through Predictor.predict (decode of the files, "
        "registration, letterbox, model, NMS, boxes to original pixels), both models in one process, "
        f"interleaved per image (first model alternating), {run.threads} onnxruntime thread(s) each, "
        "one untimed warm-up call each",
        "disagreements": [
            _disagreement_entry(run.records, i, reason, run.count, thresholds, run.names)
            for i, reason in run.found
        ],
        "disagreements_png": str(grid) if grid else None,
    }


def _model_entry(models: _Models, role: str, score: dict[str, Any]) -> dict[str, Any]:
    meta = models.metas[role]
    return {
        "given": str(models.given[role]),
        "bundle": str(models.bundles[role]),
        "sha256": file_sha256(Path(models.bundles[role])),  # `serve` finds this verdict by the pair's hashes
        "exported_from_checkpoint": models.bundles[role] != models.given[role],
        "preset": meta.preset,
        "class_names": meta.class_names,
        "input_size": meta.input_size,
        "channels": meta.channels,
        "template": meta.template,
        "precision": meta.precision,
        "threshold": {
            "value": meta.thresholds.threshold,
            "source": f"bundle metadata thresholds.threshold ({_source(meta)})",
        },
        **score,
    }


def _disagreement_entry(
    records: dict[str, list[ImageRecord]],
    index: int,
    reason: str,
    count: int,
    thresholds: tuple[float, float],
    names: list[str],
) -> dict[str, Any]:
    old, new = records["old"][index], records["new"][index]
    return {
        "image_id": old.image_id,
        "image": old.image_path,
        "clean_board": index >= count,
        "reason": reason,
        "old": _calls(old, thresholds[0], names),
        "new": _calls(new, thresholds[1], names),
    }


def _calls(record: ImageRecord, threshold: float, class_names: list[str]) -> dict[str, Any]:
    """One model's verdict and detections at its threshold, for the JSON."""
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


def _source(meta: BundleMetadata) -> str:
    source = meta.thresholds.threshold_source
    if source == "default":
        return "the default: no threshold was measured when it was exported"
    return source


def compare(
    old: str | Path,
    new: str | Path,
    data: str | Path,
    settings: CompareSettings | None = None,
    **keywords: Any,
) -> dict[str, Any]:
    """Should NEW replace OLD on the line? Both models (bundles, or checkpoints exported first) run on the same
    held-out images, each at its own stored threshold; what `defectdet compare` runs. Returns the comparison
    document (also written to `out/compare.json`): per model mAP, escapes, false calls and latency, the images
    where they disagree, and `verdict` with `decision` "promote" or "keep".

    `settings` is a `CompareSettings`; its fields may also be given as keywords: `split` (default "val"),
    `clean` (a folder of defect-free boards), `clean_auto`, `out`, `threads`, `tolerances`, ...

    Example:
        ```python
        from defectdet import compare

        document = compare("models/line3.onnx", "runs/line3-new/best.pt", "data/line3/data.yaml")
        print(document["verdict"]["decision"])
        ```
    """
    return compare_models(old, new, data, settings, **keywords)

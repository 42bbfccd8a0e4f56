"""`validate(checkpoint_or_bundle, data)`: score a trained model on a dataset split, timing every stage.

Prediction is `engine.predict.predict_records`, the same function the trainer's per-epoch evaluation calls:
each image is read here (so the report can say where the time goes: decode, register, preprocess, model,
postprocess) and compared against the ground truth in original pixels straight from the label files.
The operating threshold is given, chosen on another split, or taken from the bundle, and the report says
which (`metrics["threshold"]`); clean boards are realistic recaptures of the templates (`data.recapture`).
"""

from __future__ import annotations

import csv
import dataclasses
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

from defectdet.data.recapture import RecaptureConfig, make_clean_boards
from defectdet.data.sample import DatasetSplit, Sample
from defectdet.engine.checkpoint import load_detector
from defectdet.engine.predict import predict_records, registration_summary
from defectdet.engine.validate_settings import ValidateSettings
from defectdet.errors import ConfigError, DatasetError
from defectdet.evaluation.threshold import (
    ThresholdChoice,
    board_rates,
    threshold_for_escape,
    threshold_for_f1,
)
from defectdet.evaluation.types import ImageRecord
from defectdet.model.flip_average import with_flip_views
from defectdet.runtime.bundle import BundleMetadata
from defectdet.runtime.spec import ModelSpec

logger = logging.getLogger(__name__)


def model_spec(
    state: dict[str, Any],
    metadata: BundleMetadata | None,
    source: str | Path,
    *,
    input_size: int | None = None,
    register_pairs: bool | None = None,
    tiles: bool | None = None,
    repeat_check: bool | None = None,
    merge_fragments: bool | None = None,
) -> ModelSpec:
    """The model's settings as `val` runs it: the bundle's (`metadata`) or the checkpoint's (`state`), then the
    caller's explicit `input_size`, `register_pairs`, `tiles`, `repeat_check` and `merge_fragments` (None: as the
    model was trained or exported)."""
    if metadata is not None:
        spec = ModelSpec.from_bundle(metadata)
    else:
        spec = ModelSpec.from_checkpoint(state, source)
    update: dict[str, Any] = {}
    if input_size:
        update["input_size"] = int(input_size)
    if register_pairs is not None:
        update["registration"] = spec.template and bool(register_pairs)
    if tiles is not None:
        update["tiles"] = bool(tiles)
    spec = spec.model_copy(update=update).with_repeat_check(repeat_check, source)
    return spec.with_merge_fragments(merge_fragments)


def write_registrations(records: Sequence[ImageRecord], path: Path) -> None:
    """One row per registered pair: image_id, dx, dy, angle_deg, response, correlation, applied, ms."""
    fields = ("dx", "dy", "angle_deg", "response", "correlation", "applied", "ms")
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(("image_id", *fields))
        for record in records:
            if record.registration is not None:
                writer.writerow((record.image_id, *(record.registration[name] for name in fields)))


def validate(
    checkpoint: str | Path,
    data: str | Path,
    settings: ValidateSettings | None = None,
    *,
    console: Console | None = None,
    **overrides: Any,
) -> dict[str, Any]:
    """Evaluate `checkpoint` (or a bundle) on a split of `data`; what `defectdet val` runs. `settings` is a
    `ValidateSettings`; its fields may also be given as keywords, which apply over it (`split`, `threshold`,
    `threshold_from`, `clean_templates`, `out`, ...). Writes metrics.json, plots and report.html into
    `settings.out`. Returns the metrics, with `report` (the page's path) and `skipped_images`.

    Example:
        ```python
        from defectdet import validate

        metrics = validate("runs/synth/best.pt", "data/synth/data.yaml", split="val", out="runs/val")
        print(metrics["mAP50"], metrics["report"])
        ```

    Prediction is `engine.predict.predict_records`, the path the trainer's evaluation runs. Images are read in
    this process (no loader workers) so the per-stage timings are real.
    """
    from defectdet.evaluation.timing import StageTimer

    settings = ValidateSettings.merged(settings, overrides)
    settings.check()
    if settings.threads:
        torch.set_num_threads(settings.threads)
    run = _ValidationRun.load(checkpoint, data, settings)
    choice = _threshold_choice(run, settings)
    recapture = settings.clean_nuisance if settings.clean_nuisance is not None else RecaptureConfig()
    samples = list(run.dataset.samples) + _clean_boards(run, settings, recapture)
    timer = StageTimer()
    records, skipped = run.predict(samples, timer=timer, progress=console is not None)
    if not records:
        raise ConfigError(
            f"no image of {data} split {settings.split!r} could be read ({len(skipped)} skipped)"
        )
    metrics = _score(run, settings, records, skipped, choice, recapture, timer)
    metrics["clean_boards"] = (
        {
            "count": len(samples) - len(run.dataset.samples),
            "nuisances": recapture.model_dump(mode="json"),
            "seed": settings.seed,
        }
        if settings.clean_templates
        else None
    )
    return _written(metrics, run, skipped, console)


def _clean_boards(
    run: _ValidationRun, settings: ValidateSettings, recapture: RecaptureConfig
) -> list[Sample]:
    """The clean boards scored beside the split: realistic recaptures of its templates (none unless
    `clean_templates`)."""
    if not settings.clean_templates:
        return []
    return make_clean_boards(
        run.dataset,
        run.out_dir / "clean_boards",
        recapture,
        channels=run.spec.channels,
        seed=settings.seed,
    )


def _written(
    metrics: dict[str, Any], run: _ValidationRun, skipped: list[str], console: Console | None
) -> dict[str, Any]:
    """`metrics` as JSON values, written to the run's metrics.json; returned with the report's path and the
    skipped images, and summed up on `console`."""
    from defectdet.evaluation.report import to_jsonable

    metrics = to_jsonable(metrics)
    (run.out_dir / "metrics.json").write_text(json.dumps(metrics, indent=2), encoding="utf-8")
    metrics["report"] = str(run.out_dir / "report.html")
    metrics["skipped_images"] = skipped
    if console is not None:
        print_summary(console, metrics)
    return metrics


@dataclass
class _ValidationRun:
    """The loaded model, its settings (`spec`, with the caller's overrides), the split, the output folder."""

    checkpoint: str | Path
    data: str | Path
    model: Any
    metadata: BundleMetadata | None
    spec: ModelSpec
    dataset: DatasetSplit
    class_names: list[str]
    out_dir: Path
    batch: int

    @classmethod
    def load(cls, checkpoint: str | Path, data: str | Path, settings: ValidateSettings) -> _ValidationRun:
        from defectdet.engine.bundle_model import is_bundle, load_bundle_model

        bundle = is_bundle(checkpoint)
        model, state = (
            load_bundle_model(checkpoint, settings.threads) if bundle else load_detector(checkpoint)
        )
        metadata = getattr(model, "metadata", None)
        if settings.threshold_from == "bundle" and metadata is None:
            raise ConfigError(f"--threshold-from bundle: {checkpoint} is a checkpoint, not a bundle (.onnx)")
        spec = model_spec(
            state,
            metadata,
            checkpoint,
            input_size=settings.input_size,
            register_pairs=settings.register_pairs,
            tiles=settings.tiles,
            repeat_check=settings.repeat_check,
            merge_fragments=settings.merge_fragments,
        )
        model, spec = _with_flip_views(
            model, spec, settings.flip_views, checkpoint, bundle, (state or {}).get("config")
        )
        split = settings.split
        trained = (state or {}).get("config") or (metadata.train_config if metadata is not None else {})
        dataset = _scored_split(data, split, settings.format, trained)
        class_names = list(spec.class_names or dataset.class_names)
        if len(class_names) != len(dataset.class_names):
            raise ConfigError(
                f"{checkpoint} predicts {len(class_names)} classes {class_names} but {data} split {split!r} "
                f"has {len(dataset.class_names)} {dataset.class_names}"
            )
        _check_templates(dataset, spec.template, checkpoint)
        dataset = _with_companions(dataset, spec.companions, checkpoint)
        out_dir = Path(settings.out) if settings.out else default_out_dir(checkpoint)
        out_dir.mkdir(parents=True, exist_ok=True)
        return cls(checkpoint, data, model, metadata, spec, dataset, class_names, out_dir, settings.batch)

    def predict(self, samples, timer=None, progress=False) -> tuple[list[ImageRecord], list[str]]:
        return predict_records(
            self.model, samples, self.spec, batch_size=self.batch, timer=timer, progress=progress
        )


def _score(
    run: _ValidationRun,
    settings: ValidateSettings,
    records: list[ImageRecord],
    skipped: list[str],
    choice: ThresholdChoice | None,
    recapture: RecaptureConfig,
    timer: Any,
) -> dict[str, Any]:
    """evaluate_records (metrics, plots, report) plus the threshold's source, board rates, registration."""
    from defectdet.evaluation.report import EvaluationOutputs, evaluate_records, protocol_for

    spec, split = run.spec, settings.split
    protocol = protocol_for(settings.protocol, run.dataset.format)
    deeppcb_dir = run.out_dir / "deeppcb_results" if protocol in ("deeppcb", "both") else None
    threshold_note = (
        f"{choice.threshold:.4g} ({choice.rule}: {choice.source})"
        if choice is not None
        else "best F1 of these very records (optimistic: give --threshold-from SPLIT or --threshold)"
    )
    metrics = evaluate_records(
        records,
        run.class_names,
        run.out_dir,
        protocol,
        target_recall=settings.target_recall,
        threshold=None if choice is None else choice.threshold,
        timing=timer.summary(),
        outputs=EvaluationOutputs(
            deeppcb_results_dir=deeppcb_dir,
            title=f"defectdet val: {Path(run.checkpoint).name} on {Path(run.data).name} [{split}]",
            settings=_report_settings(run, settings, len(skipped), recapture, threshold_note),
            threshold_source=None if choice is None else _threshold_words(choice.to_dict()),
        ),
    )
    threshold = float(metrics["headline"]["threshold"])
    metrics["threshold"] = (
        choice.to_dict()
        if choice is not None
        else ThresholdChoice(threshold, "best_f1", "the reported records themselves (optimistic)").to_dict()
    )
    metrics["headline"]["threshold_source"] = threshold_note
    metrics["data_format"] = run.dataset.format  # the console shows DeepPCB's figures only on DeepPCB data
    metrics["boards"] = board_rates(records, threshold)
    metrics["registration"] = registration_summary(records)
    metrics["tiles"] = spec.tiles  # native-resolution tiles of large images joined the whole-image pass
    metrics["flip_views"] = spec.flip_views
    metrics["repeat_check"] = spec.repeat_check
    metrics["merge_fragments"] = list(spec.merge_fragments)
    if metrics["registration"] is not None:
        write_registrations(records, run.out_dir / "registration.csv")
    return metrics


def _report_settings(
    run: _ValidationRun,
    settings: ValidateSettings,
    skipped: int,
    recapture: RecaptureConfig,
    threshold_note: str,
) -> dict[str, Any]:
    """The settings table of the report page: what was scored, how, and at which threshold."""
    spec = run.spec
    return {
        "checkpoint": str(run.checkpoint),
        "data": str(run.data),
        "split": settings.split,
        "input size": spec.input_size,
        "batch": settings.batch,
        "threads": torch.get_num_threads(),
        "operating threshold": threshold_note,
        "pair registration": spec.registration and spec.template,
        "tiles": spec.tiles,
        "flip views": spec.flip_views,
        "repeat check": spec.repeat_check,
        "fragments merged": ", ".join(spec.merge_fragments) or "none",
        "clean boards": _clean_note(settings.clean_templates, recapture, settings.seed),
        "skipped_images": skipped,
    }


def _with_flip_views(
    model: Any, spec: ModelSpec, views: str | None, checkpoint: str | Path, bundle: bool, config: Any
) -> tuple[Any, ModelSpec]:
    """The model run with `views` test-time flips (None: as it is): a checkpoint's detector wrapped
    (`model.flip_average.with_flip_views`), a bundle as exported (its graph holds its views)."""
    if views is None or views == spec.flip_views:
        return model, spec
    if bundle:
        raise ConfigError(
            f"--flip-views {views}: {checkpoint} was exported with flip views {spec.flip_views!r}; "
            f"export it again with `defectdet export --flip-views {views}` or validate the checkpoint"
        )
    return with_flip_views(model, views, config, checkpoint), spec.model_copy(update={"flip_views": views})


def _check_templates(dataset: DatasetSplit, use_template: bool, checkpoint: str | Path) -> None:
    if use_template and not all(s.template_path is not None for s in dataset.samples):
        missing = next(s for s in dataset.samples if s.template_path is None)
        raise ConfigError(
            f"{checkpoint} was trained with templates but {missing.image_path} has none; "
            "give the split templates (data.yaml `templates:`) or use a model trained without them"
        )


def _with_companions(
    dataset: DatasetSplit, companions: Sequence[str], checkpoint: str | Path
) -> DatasetSplit:
    """The split's samples that have every companion capture the model reads (the others left out with a
    warning, as training leaves them out); ConfigError when no image has one of them."""
    for name in companions:
        if not any(name in sample.companion_paths for sample in dataset.samples):
            declared = ", ".join(dataset.companion_names) or "none"
            raise ConfigError(
                f"{checkpoint} also reads the companion capture {name!r}, but no image of split "
                f"{dataset.split!r} has one (its companions: {declared}); declare it in the data.yaml "
                "`companions:` or use a model trained without it"
            )
    kept = [s for s in dataset.samples if all(name in s.companion_paths for name in companions)]
    if len(kept) < len(dataset.samples):
        logger.warning(
            "leaving out %d of %d images of split %r without every companion (%s)",
            len(dataset.samples) - len(kept),
            len(dataset.samples),
            dataset.split,
            ", ".join(companions),
        )
        dataset = dataclasses.replace(dataset, samples=kept)
    return dataset


def _scored_split(data: str | Path, split: str, format: str | None, trained: dict[str, Any]) -> DatasetSplit:
    """`split` of `data`; when the model was trained on `data` and the dataset has no separate `split` (the
    reader gives the training images again), the trainer's grouped hold-out of them: scoring (and choosing a
    threshold on) the images the model trained on would flatter it."""
    from defectdet.data.formats import load_dataset
    from defectdet.data.holdout import hold_out, same_images

    dataset = load_dataset(data, split, format=format)
    train_split = str(trained.get("train_split") or "train")
    trained_on = trained.get("data")
    if split == train_split or not trained_on or Path(str(trained_on)).resolve() != Path(str(data)).resolve():
        return dataset
    try:
        train = load_dataset(data, train_split, format=format)
    except DatasetError:
        return dataset
    if not same_images(train, dataset):
        return dataset
    held = hold_out(train)[1]
    logger.warning(
        "%s has no separate %r split and the model trained on it: scoring the training's grouped hold-out "
        "(%d of %d images)",
        data,
        split,
        len(held.samples),
        len(dataset.samples),
    )
    return held


def _threshold_choice(run: _ValidationRun, settings: ValidateSettings) -> ThresholdChoice | None:
    """The operating threshold from --threshold, --threshold-from SPLIT / bundle, or None (best F1 on the records)."""
    from defectdet.data.formats import load_dataset

    threshold_from, checkpoint, data = settings.threshold_from, run.checkpoint, run.data
    if settings.threshold is not None:
        return ThresholdChoice(float(settings.threshold), "given", "--threshold")
    if threshold_from is None:
        return None
    if threshold_from == "bundle":
        stored = run.metadata.thresholds
        return ThresholdChoice(
            float(stored.threshold),
            "bundle",
            f"{checkpoint} thresholds.threshold ({stored.threshold_source})",
        )
    calibration = load_dataset(data, threshold_from, format=settings.format)
    _check_templates(calibration, run.spec.template, checkpoint)
    calibration = _with_companions(calibration, run.spec.companions, checkpoint)
    records, _ = run.predict(list(calibration.samples))
    source = f"split {threshold_from!r} of {data}"
    try:
        if settings.threshold_rule == "f1":
            return threshold_for_f1(records, len(run.class_names), source=source)
        return threshold_for_escape(records, settings.target_escape, source=source)
    except ValueError as error:
        raise ConfigError(f"--threshold-from {threshold_from}: {error}") from None


def _clean_note(clean_templates: bool, recapture: RecaptureConfig, seed: int) -> str:
    if not clean_templates:
        return "none"
    if recapture == RecaptureConfig.none():
        return "templates as their own tested images (no nuisance)"
    return f"recaptured templates, seed {seed}: {recapture.model_dump(mode='json')}"


def default_out_dir(checkpoint: str | Path) -> Path:
    """Where `val` writes without --out: runs/val/<run folder>-<checkpoint stem>, so the best.pt of two runs never
    share a folder (runs/line3/best.pt -> runs/val/line3-best); a file in the current folder: runs/val/<stem>."""
    path = Path(checkpoint)
    folder = path.parent.name
    return Path("runs/val") / (f"{folder}-{path.stem}" if folder else path.stem)


def print_summary(console: Console, metrics: dict[str, Any]) -> None:
    """The evaluation in a quality engineer's words: the table (`summary_table`), how the threshold was chosen,
    and what to add when false calls could not be measured."""
    console.print(summary_table(metrics))
    words = _threshold_words(metrics.get("threshold") or {})
    if words:
        console.print(f"operating threshold: {words}")
    if _board_counts(metrics)["clean_boards"] == 0:
        console.print(
            "false calls need defect-free images: add some to the split, or pass --clean-templates when the "
            "images have templates"
        )


def summary_table(metrics: dict[str, Any]) -> Table:
    """The headline figures of an evaluation, each named in words: mAP, the DeepPCB protocol's figures (only on
    DeepPCB data), the operating threshold with precision and recall, escapes and false calls as counts of
    images (false calls "not measured" without defect-free images), the recall-target threshold and speed."""
    headline = metrics.get("headline", {})
    table = Table(title="evaluation", show_header=True)
    table.add_column("figure")
    table.add_column("value", justify="right")
    rows = [("mAP@0.5 (1 is perfect)", headline.get("mAP50")), ("mAP@0.5:0.95", headline.get("mAP50_95"))]
    if metrics.get("data_format") == "deeppcb":
        rows += [
            ("DeepPCB mAP", headline.get("deeppcb_mAP")),
            ("DeepPCB F-score, best threshold", headline.get("deeppcb_F")),
            ("DeepPCB F-score at the threshold", headline.get("deeppcb_F_at_threshold")),
        ]
    rows += [
        ("operating threshold", headline.get("threshold")),
        ("precision (boxes that are defects)", headline.get("precision")),
        ("recall (defects found)", headline.get("recall")),
        ("F1", headline.get("f1")),
        *_board_rows(metrics),
        (f"threshold for {_recall_target(metrics)} recall", headline.get("target_recall_threshold")),
    ]
    if headline.get("images_per_second") is not None:
        rows.append(("speed", f"{headline['images_per_second']:.1f} images/s"))
    for name, value in rows:
        if value is not None:
            table.add_row(name, f"{value:.4f}" if isinstance(value, float) else str(value))
    return table


def _board_counts(metrics: dict[str, Any]) -> dict[str, int]:
    """Defective and defect-free images and their escapes and false calls at the operating threshold."""
    boards = metrics.get("boards") or {}
    chosen = (metrics.get("operating_point") or {}).get("chosen") or {}
    return {
        "defective_boards": int(boards.get("defective_boards", chosen.get("defective_images", 0)) or 0),
        "escapes": int(boards.get("escapes", chosen.get("escapes", 0)) or 0),
        "clean_boards": int(boards.get("clean_boards", chosen.get("clean_images", 0)) or 0),
        "false_calls": int(boards.get("false_calls", chosen.get("false_calls", 0)) or 0),
    }


def _board_rows(metrics: dict[str, Any]) -> list[tuple[str, str | None]]:
    counts = _board_counts(metrics)
    defective, clean = counts["defective_boards"], counts["clean_boards"]
    escapes = (
        f"{counts['escapes']} of {defective} defective images ({counts['escapes'] / defective:.1%})"
        if defective
        else "not measured (no defective images)"
    )
    false_calls = (
        f"{counts['false_calls']} of {clean} defect-free images ({counts['false_calls'] / clean:.1%})"
        if clean
        else "not measured (no defect-free images)"
    )
    return [("escapes", escapes), ("false calls", false_calls)]


def _threshold_words(choice: dict[str, Any]) -> str | None:
    """How the operating threshold was chosen (`ThresholdChoice.to_dict()`), in words."""
    rule, source = choice.get("rule"), choice.get("source")
    if rule == "escape":
        target = choice.get("target_escape")
        share = f"{target:.0%}" if isinstance(target, float) else "the target share"
        return f"the highest at which at most {share} of the defective images of {source} escape"
    if rule == "f1":
        return f"the best box F1 on {source}"
    if rule == "given":
        return "given with --threshold"
    if rule == "bundle":
        return f"stored in the bundle ({source})"
    if rule == "best_f1":
        return (
            "the best F1 on these same images, an optimistic choice: choose it on another split with "
            "--threshold-from SPLIT"
        )
    return None


def _recall_target(metrics: dict[str, Any]) -> str:
    target = (metrics.get("operating_point") or {}).get("target_recall")
    return f"{target:.0%}" if isinstance(target, float) else "the target"

"""`validate(checkpoint, data)`: score a trained checkpoint on a dataset split, timing every stage.

Unlike the per-epoch evaluation inside training, this path reads each image itself so it can report
where the time goes (decode, preprocess, model, postprocess), and it compares against the ground
truth in original pixels straight from the label files (no letterbox round trip).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import torch
from rich.console import Console
from rich.table import Table

from defectdet.data.dataset import to_input_tensor
from defectdet.data.imageio import read_image, read_pair
from defectdet.data.letterbox import LetterboxTransform, boxes_from_letterbox, letterbox_image
from defectdet.data.sample import DatasetSplit, Sample
from defectdet.diagnostics.state_dict import load_state_dict_checked
from defectdet.engine.checkpoint import load_checkpoint
from defectdet.errors import CheckpointError, ConfigError, ImageReadError

logger = logging.getLogger(__name__)

PROTOCOLS = ("coco", "deeppcb", "both")


def load_detector(
    checkpoint_path: str | Path, use_ema: bool = True
) -> tuple[torch.nn.Module, dict[str, Any]]:
    """Rebuild the detector stored in a training checkpoint (EMA weights when present) in eval mode."""
    from defectdet.model import detector_from_config

    checkpoint = load_checkpoint(checkpoint_path)
    model_config = checkpoint.get("model_config")
    if not isinstance(model_config, dict):
        raise CheckpointError(
            f"{checkpoint_path}: no 'model_config' in the checkpoint, so the detector cannot be rebuilt; "
            "was it written by `defectdet train`?"
        )
    model = detector_from_config(model_config)
    key = "ema" if use_ema and checkpoint.get("ema") is not None else "model"
    weights = checkpoint[key]
    if key == "ema" and isinstance(weights, dict) and "module" in weights:
        weights = weights["module"]
    load_state_dict_checked(model, weights, source=f"{checkpoint_path} '{key}'")
    model.eval()
    return model, checkpoint


def add_clean_templates(split: DatasetSplit) -> DatasetSplit:
    """Append each template as a clean board (tested = template, no boxes) for the false-call rate."""
    clean = [
        Sample(
            image_path=sample.template_path,
            boxes=np.zeros((0, 4), np.float32),
            classes=np.zeros((0,), np.int64),
            template_path=sample.template_path,
            source=str(sample.template_path),
            image_id=f"{sample.image_id}_temp",
        )
        for sample in split.samples
        if sample.template_path is not None
    ]
    if not clean:
        raise ConfigError(
            f"--clean-templates: the {split.split!r} split of {split.root} has no template images"
        )
    return DatasetSplit(
        samples=[*split.samples, *clean],
        class_names=split.class_names,
        format=split.format,
        split=split.split,
        root=split.root,
        problems=split.problems,
    )


def _batches(samples: Sequence[Sample], size: int) -> Iterator[Sequence[Sample]]:
    for start in range(0, len(samples), size):
        yield samples[start : start + size]


def predict_records(
    model: torch.nn.Module,
    samples: Sequence[Sample],
    *,
    imgsz: int,
    channels: int,
    use_template: bool,
    batch_size: int = 8,
    score_threshold: float = 0.001,
    iou_threshold: float = 0.6,
    max_detections: int = 300,
    timer: Any = None,
    progress: bool = True,
) -> tuple[list, list[str]]:
    """Predict every sample; returns (ImageRecords in original pixels, paths skipped as unreadable)."""
    from rich.progress import Progress

    from defectdet.evaluation.timing import StageTimer
    from defectdet.evaluation.types import ImageRecord
    from defectdet.model.postprocess import postprocess

    timer = timer or StageTimer()
    records: list = []
    skipped: list[str] = []
    with Progress(disable=not progress, transient=True) as bar, torch.inference_mode():
        task = bar.add_task("evaluating", total=len(samples))
        for chunk in _batches(samples, batch_size):
            tensors: list[torch.Tensor] = []
            kept: list[tuple[Sample, LetterboxTransform]] = []
            for sample in chunk:
                try:
                    with timer.stage("decode"):
                        if use_template:  # one intensity mapping for the pair
                            image, template = read_pair(sample.image_path, sample.template_path, channels)
                        else:
                            image, template = read_image(sample.image_path, channels=channels), None
                except (ImageReadError, cv2.error, OSError) as error:
                    logger.warning("skipping %s: %s", sample.image_path, error)
                    skipped.append(str(sample.image_path))
                    continue
                with timer.stage("preprocess"):
                    canvas, transform = letterbox_image(image, imgsz)
                    if template is not None:
                        if template.shape[:2] != image.shape[:2]:
                            template = cv2.resize(template, (image.shape[1], image.shape[0]))
                        template, _ = letterbox_image(template, imgsz)
                    tensors.append(to_input_tensor(canvas, template))
                kept.append((sample, transform))
            bar.advance(task, len(chunk))
            if not tensors:
                continue
            with timer.stage("model"):
                predictions = model(torch.stack(tensors)).float().numpy()  # (B, A, 4 + K)
            with timer.stage("postprocess"):
                detections = postprocess(predictions, score_threshold, iou_threshold, max_detections)
                for (sample, transform), found in zip(kept, detections, strict=True):
                    records.append(
                        ImageRecord(
                            image_id=sample.image_id,
                            width=transform.original_width,
                            height=transform.original_height,
                            gt_boxes=sample.boxes,
                            gt_classes=sample.classes,
                            det_boxes=boxes_from_letterbox(found.boxes, transform),
                            det_scores=found.scores,
                            det_classes=found.classes,
                            image_path=str(sample.image_path),
                        )
                    )
            timer.add_images(len(kept))
    return records, skipped


def validate(
    checkpoint: str | Path,
    data: str | Path,
    *,
    split: str = "val",
    protocol: str = "both",
    out: str | Path | None = None,
    conf_threshold: float | None = None,
    target_recall: float = 0.99,
    clean_templates: bool = False,
    batch: int = 8,
    format: str | None = None,
    imgsz: int | None = None,
    threads: int | None = None,
    console: Console | None = None,
) -> dict[str, Any]:
    """Evaluate `checkpoint` on `split` of `data`; writes metrics.json, plots and report.html into `out`.

    Images are read in this process (no loader workers) so the per-stage timings are real.
    """
    from defectdet.data.formats import load_dataset
    from defectdet.evaluation.report import evaluate_records
    from defectdet.evaluation.timing import StageTimer

    if protocol not in PROTOCOLS:
        raise ConfigError(f"--protocol must be one of {', '.join(PROTOCOLS)}, got {protocol!r}")
    if threads:
        torch.set_num_threads(threads)
    from defectdet.engine.bundle_model import is_bundle, load_bundle_model

    model, state = load_bundle_model(checkpoint, threads) if is_bundle(checkpoint) else load_detector(checkpoint)
    config = state.get("config") or {}
    dataset = load_dataset(data, split, format=format)
    class_names = list(state.get("class_names") or dataset.class_names)
    if len(class_names) != len(dataset.class_names):
        raise ConfigError(
            f"{checkpoint} predicts {len(class_names)} classes {class_names} but {data} split {split!r} "
            f"has {len(dataset.class_names)} {dataset.class_names}"
        )
    use_template = bool(model.template)
    if use_template and not all(s.template_path is not None for s in dataset.samples):
        missing = next(s for s in dataset.samples if s.template_path is None)
        raise ConfigError(
            f"{checkpoint} was trained with templates but {missing.image_path} has none; "
            "give the split templates (data.yaml `templates:`) or use a model trained without them"
        )
    if clean_templates:
        dataset = add_clean_templates(dataset)
    channels = model.in_channels // (2 if use_template else 1)
    size = imgsz or int(config.get("imgsz", 640))
    out_dir = Path(out) if out else Path("runs/val") / Path(checkpoint).stem
    out_dir.mkdir(parents=True, exist_ok=True)

    timer = StageTimer()
    records, skipped = predict_records(
        model,
        dataset.samples,
        imgsz=size,
        channels=channels,
        use_template=use_template,
        batch_size=batch,
        score_threshold=float(config.get("score_threshold", 0.001)),
        iou_threshold=float(config.get("nms_iou_threshold", 0.6)),
        max_detections=int(config.get("max_detections", 300)),
        timer=timer,
        progress=console is not None,
    )
    if not records:
        raise ConfigError(f"no image of {data} split {split!r} could be read ({len(skipped)} skipped)")
    deeppcb_dir = out_dir / "deeppcb_results" if protocol in ("deeppcb", "both") else None
    metrics = evaluate_records(
        records,
        class_names,
        out_dir,
        protocol,
        target_recall=target_recall,
        conf_threshold=conf_threshold,
        timing=timer.summary(),
        deeppcb_results_dir=deeppcb_dir,
        title=f"defectdet val: {Path(checkpoint).name} on {Path(data).name} [{split}]",
        settings={
            "checkpoint": str(checkpoint),
            "data": str(data),
            "split": split,
            "imgsz": size,
            "batch": batch,
            "threads": torch.get_num_threads(),
            "clean_templates": clean_templates,
            "skipped_images": len(skipped),
        },
    )
    metrics["report"] = str(out_dir / "report.html")
    metrics["skipped_images"] = skipped
    if console is not None:
        console.print(summary_table(metrics))
    return metrics


def summary_table(metrics: dict[str, Any]) -> Table:
    """The headline numbers of an evaluation as a rich table."""
    headline = metrics.get("headline", {})
    table = Table(title="evaluation", show_header=True)
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key, value in headline.items():
        if isinstance(value, float):
            table.add_row(key, f"{value:.4f}")
        elif value is not None and not isinstance(value, (dict, list)):
            table.add_row(key, str(value))
    return table

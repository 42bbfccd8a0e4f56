"""Evaluation plots (matplotlib, Agg backend chosen inside each function). Each returns the PNG path."""

from __future__ import annotations

import csv
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from defectdet.compat import with_keywords
from defectdet.evaluation.operating_point import ClassCurve, OperatingPointResult, box_iou, match_detections
from defectdet.evaluation.types import ImageRecord

GT_COLOR = "#00c853"  # green: ground truth
PRED_COLOR = "#ff1744"  # red: predictions
_DPI = 110


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(figure, out_path: str | Path) -> Path:
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out_path, dpi=_DPI, bbox_inches="tight")
    _pyplot().close(figure)
    return out_path


def _envelope(precision: np.ndarray) -> np.ndarray:
    """Interpolated precision: the best precision at any recall at least as high."""
    return np.maximum.accumulate(precision[::-1])[::-1] if len(precision) else precision


def plot_pr_curves(
    class_curves: Sequence[ClassCurve],
    class_names: Sequence[str],
    out_path: str | Path,
    match_iou: float = 0.5,
) -> Path:
    """Interpolated precision-recall curve per class and their mean over classes (bold)."""
    plt = _pyplot()
    figure, axes = plt.subplots(figsize=(7.5, 6))
    recall_grid = np.linspace(0, 1, 101)
    sampled = []
    for name, curve in zip(class_names, class_curves, strict=True):
        if curve.ap is None:
            continue
        precision = _envelope(curve.precision)
        recall = np.concatenate([[0.0], curve.recall])
        precision = np.concatenate([[precision[0] if len(precision) else 0.0], precision])
        axes.step(
            recall,
            precision,
            where="post",
            linewidth=1.2,
            label=f"{name}  AP {curve.ap:.3f} (n={curve.num_gt})",
        )
        # precision at each recall level = best precision reachable at recall >= level (0 beyond max recall)
        index = np.searchsorted(curve.recall, recall_grid, side="left")
        padded = np.concatenate([_envelope(curve.precision), [0.0]])
        sampled.append(padded[np.minimum(index, len(padded) - 1)])
    if sampled:
        mean_ap = np.mean([curve.ap for curve in class_curves if curve.ap is not None])
        axes.plot(
            recall_grid,
            np.mean(sampled, axis=0),
            color="black",
            linewidth=2.8,
            label=f"all classes  mAP {mean_ap:.3f}",
        )
    else:
        axes.text(0.5, 0.5, "no ground truth", ha="center", va="center", transform=axes.transAxes)
    axes.set_xlim(0, 1.0)
    axes.set_ylim(0, 1.02)
    axes.set_xlabel("Recall")
    axes.set_ylabel("Precision")
    axes.set_title(f"Precision-recall per class (IoU >= {match_iou:g}, all-point interpolated)")
    axes.grid(alpha=0.3)
    axes.legend(loc="lower left", fontsize=9, framealpha=0.9)
    return _save(figure, out_path)


def plot_threshold_curves(result: OperatingPointResult, out_path: str | Path) -> Path:
    """Box-level P/R/F1 and image-level escape/false-call rates against the confidence threshold."""
    plt = _pyplot()
    curves, summary = result.curves, result.summary
    thresholds = curves["thresholds"]
    figure, (top, bottom) = plt.subplots(
        2, 1, figsize=(8, 7.5), sharex=True, gridspec_kw={"height_ratios": [3, 2]}
    )
    top.plot(thresholds, curves["precision"], label="precision", color="#1f77b4", linewidth=1.8)
    top.plot(thresholds, curves["recall"], label="recall", color="#ff7f0e", linewidth=1.8)
    top.plot(thresholds, curves["f1"], label="F1", color="#2ca02c", linewidth=2.4)
    bottom.plot(
        thresholds,
        curves["escape_rate"],
        label="escape rate (defective image called clean)",
        color="#d62728",
        linewidth=1.8,
    )
    bottom.plot(
        thresholds,
        curves["false_call_rate"],
        label="false-call rate (clean image called defective)",
        color="#9467bd",
        linewidth=1.8,
    )
    marks = [("chosen", summary["chosen"], "black", "-")]
    target = summary["target_recall_point"]
    if target.get("reachable"):
        marks.append((f"recall >= {summary['target_recall']:g}", target, "#7f7f7f", "--"))
    for label, point, color, style in marks:
        threshold = point["threshold"]
        for axes in (top, bottom):
            axes.axvline(threshold, color=color, linestyle=style, linewidth=1.2)
        f1 = point.get("f1")
        text = f"{label}: threshold {threshold:.3f}" + (f", F1 {f1:.3f}" if f1 is not None else "")
        top.plot([], [], color=color, linestyle=style, label=text)
    if not target.get("reachable"):
        top.plot([], [], color="none", label=f"recall {summary['target_recall']:g}: not reachable")
    top.set_ylim(0, 1.02)
    top.set_ylabel("box-level value")
    top.set_title(f"Operating point (IoU >= {summary['iou_threshold']:g}, same class)")
    top.grid(alpha=0.3)
    top.legend(loc="lower left", fontsize=9, framealpha=0.9)
    bottom.set_ylim(-0.02, 1.02)
    bottom.set_xlim(0, 1)
    bottom.set_xlabel("confidence threshold (detections with score >= threshold are kept)")
    bottom.set_ylabel("image-level rate")
    bottom.grid(alpha=0.3)
    bottom.legend(loc="upper left", fontsize=9, framealpha=0.9)
    figure.tight_layout()
    return _save(figure, out_path)


def plot_confusion_matrix(
    matrix: np.ndarray,
    class_names: Sequence[str],
    out_path: str | Path,
    threshold: float,
    match_iou: float = 0.5,
) -> Path:
    """Counts and row-normalized (share of each true class) side by side, with a background row/column."""
    plt = _pyplot()
    labels = [*class_names, "background"]
    size = len(labels)
    row_totals = matrix.sum(axis=1, keepdims=True)
    normalized = np.divide(matrix, row_totals, out=np.zeros(matrix.shape, dtype=float), where=row_totals > 0)
    side = max(4.5, 0.75 * size + 2)
    figure, panels = plt.subplots(1, 2, figsize=(2 * side + 1, side))
    for axes, values, title, formatter in (
        (panels[0], matrix, "counts", lambda value: f"{int(value)}"),
        (panels[1], normalized, "share of true class (row-normalized)", lambda value: f"{value:.2f}"),
    ):
        image = axes.imshow(values, cmap="Blues", vmin=0, vmax=max(float(values.max()), 1e-9))
        limit = float(values.max()) or 1.0
        for row in range(size):
            for col in range(size):
                if row == size - 1 and col == size - 1:
                    axes.text(col, row, "-", ha="center", va="center", color="gray")
                    continue
                value = values[row, col]
                if value == 0:
                    continue
                axes.text(
                    col,
                    row,
                    formatter(value),
                    ha="center",
                    va="center",
                    fontsize=9,
                    color="white" if value > 0.6 * limit else "black",
                )
        axes.set_xticks(range(size), labels, rotation=40, ha="right")
        axes.set_yticks(range(size), labels)
        axes.set_xlabel("predicted")
        axes.set_ylabel("true")
        axes.set_title(title)
        figure.colorbar(image, ax=axes, fraction=0.046, pad=0.04)
    figure.suptitle(
        f"Confusion matrix at threshold {threshold:.3f}, IoU >= {match_iou:g} "
        "(background column = missed, background row = false alarm)",
        fontsize=11,
    )
    figure.tight_layout()
    return _save(figure, out_path)


def _read_with_cv2(record: ImageRecord) -> np.ndarray | None:
    if not record.image_path:
        return None
    import cv2

    image = cv2.imread(record.image_path, cv2.IMREAD_COLOR)
    return None if image is None else cv2.cvtColor(image, cv2.COLOR_BGR2RGB)


def _misses_and_false_alarms(
    record: ImageRecord, num_classes: int, threshold: float, match_iou: float
) -> tuple[int, int]:
    """Same-class greedy matching (as the operating point uses) restricted to detections >= threshold."""
    match = match_detections([record], num_classes, match_iou)
    kept = match.scores >= threshold
    hits = int(match.true_positive[kept].sum())
    return len(record.gt_boxes) - hits, int(kept.sum()) - hits


def _class_name(class_names: Sequence[str], class_id: int) -> str:
    return class_names[class_id] if 0 <= class_id < len(class_names) else str(class_id)


def _labelled_box(axes, box: np.ndarray, text: str | None, color: str, below: bool, **line: Any) -> None:
    """One box outline in `color` with `text` (if any) on a `color` tag above its top edge (`below`: under its
    bottom)."""
    from matplotlib.patches import Rectangle

    axes.add_patch(
        Rectangle((box[0], box[1]), box[2] - box[0], box[3] - box[1], fill=False, edgecolor=color, **line)
    )
    if text is None:
        return
    axes.text(
        box[0],
        box[3] + 2 if below else box[1] - 2,
        text,
        color="black" if below else "white",
        fontsize=8,
        va="top" if below else "bottom",
        bbox={"facecolor": color, "edgecolor": "none", "pad": 1.0, "alpha": 0.85},
    )


def _draw_record(
    axes,
    record: ImageRecord,
    load: Callable[[ImageRecord], np.ndarray | None],
    class_names: Sequence[str],
    threshold: float,
    match_iou: float,
) -> int:
    """Draw one record on `axes`: the image, ground truth (green, dashed; a missed one named under its box) and
    the predictions >= threshold (red, class + score). Returns how many predictions were drawn."""
    image = load(record)
    if image is None:
        image = np.full((max(record.height, 1), max(record.width, 1)), 128, dtype=np.uint8)
    axes.imshow(image, cmap="gray" if image.ndim == 2 else None, vmin=0, vmax=255)
    axes.axis("on")  # a thin frame: binarized boards are mostly white
    axes.set_xticks([])
    axes.set_yticks([])
    for spine in axes.spines.values():
        spine.set_edgecolor("#9e9e9e")
    kept = record.det_scores >= threshold
    same_class = record.gt_classes[:, None] == record.det_classes[kept][None, :]
    found = ((box_iou(record.gt_boxes, record.det_boxes[kept]) >= match_iou) & same_class).any(axis=1)
    for box, class_id, was_found in zip(record.gt_boxes, record.gt_classes, found, strict=True):
        missed = None if was_found else f"missed {_class_name(class_names, class_id)}"  # only a miss is named
        _labelled_box(axes, box, missed, GT_COLOR, below=True, linewidth=1.6, linestyle="--")
    for box, score, class_id in zip(
        record.det_boxes[kept], record.det_scores[kept], record.det_classes[kept], strict=True
    ):
        text = f"{_class_name(class_names, class_id)} {score:.2f}"
        _labelled_box(axes, box, text, PRED_COLOR, below=False, linewidth=1.4)
    return int(kept.sum())


@dataclass(frozen=True)
class GridLayout:
    """Which images `plot_prediction_grid` shows and how: at most `max_images`, in `columns`; with
    `worst_first` those with the most misses + false alarms, else the first ones."""

    max_images: int = 6
    columns: int = 2
    worst_first: bool = True


def plot_prediction_grid(
    records: Sequence[ImageRecord],
    class_names: Sequence[str],
    out_path: str | Path,
    threshold: float,
    load_image: Callable[[ImageRecord], np.ndarray | None] | None = None,
    layout: GridLayout | None = None,
    match_iou: float = 0.5,
    **layout_fields: Any,
) -> Path:
    """Images with ground truth (green, dashed) and predictions >= threshold (red, class + score).

    `layout` (a `GridLayout`; its fields may also be given as keywords, `max_images=4`) picks the images:
    with `worst_first` the images with the most misses + false alarms are shown (title says so);
    `load_image(record)` returns an HxW or HxWx3 uint8 array, default reads `record.image_path` with cv2.
    Images that cannot be loaded are drawn on a gray canvas of the record's size.
    """
    plt = _pyplot()

    layout = with_keywords(GridLayout, layout, layout_fields, "plot_prediction_grid")
    max_images, columns, worst_first = layout.max_images, layout.columns, layout.worst_first
    load = load_image or _read_with_cv2
    errors = {
        id(record): _misses_and_false_alarms(record, len(class_names), threshold, match_iou)
        for record in records
    }
    chosen = list(records)
    if worst_first:
        chosen.sort(key=lambda record: -sum(errors[id(record)]))
    chosen = chosen[:max_images]
    count = max(len(chosen), 1)
    columns = min(columns, count)
    rows = math.ceil(count / columns)
    figure, panels = plt.subplots(rows, columns, figsize=(5.8 * columns, 6.0 * rows), squeeze=False)
    for axes in panels.flat:
        axes.axis("off")
    for axes, record in zip(panels.flat, chosen, strict=False):
        missed, false_alarms = errors[id(record)]
        kept = _draw_record(axes, record, load, class_names, threshold, match_iou)
        axes.set_title(
            f"{record.image_id}\n{len(record.gt_boxes)} gt, {kept} pred: "
            f"{missed} missed, {false_alarms} false",
            fontsize=10,
        )
    selection = "images with the most errors" if worst_first else "first images"
    _legend_and_title(figure, f"Validation predictions at threshold {threshold:.3f} ({selection})")
    return _save(figure, out_path)


def plot_comparison_grid(
    pairs: Sequence[tuple[ImageRecord, ImageRecord, str]],
    class_names: Sequence[str],
    out_path: str | Path,
    thresholds: tuple[float, float],
    labels: tuple[str, str] = ("OLD", "NEW"),
    load_image: Callable[[ImageRecord], np.ndarray | None] | None = None,
    match_iou: float = 0.5,
) -> Path:
    """One row per image, the two models side by side: (left record, right record, why they are shown).

    Each panel is drawn as `plot_prediction_grid` draws one (ground truth green and dashed, that model's
    predictions >= its own threshold in red) and titled with the model, its verdict and its errors."""
    plt = _pyplot()

    if not pairs:
        raise ValueError("plot_comparison_grid: no image to draw")
    load = load_image or _read_with_cv2
    rows = len(pairs)
    figure, panels = plt.subplots(rows, 2, figsize=(5.8 * 2, 6.3 * rows), squeeze=False)
    for row, (left, right, reason) in zip(panels, pairs, strict=True):
        for axes, record, label, threshold in zip(row, (left, right), labels, thresholds, strict=True):
            missed, false_alarms = _misses_and_false_alarms(record, len(class_names), threshold, match_iou)
            kept = _draw_record(axes, record, load, class_names, threshold, match_iou)
            flagged = "defective" if kept else "clean"
            axes.set_title(
                f"{label} (threshold {threshold:.3f}): {record.image_id}\n{flagged}, {len(record.gt_boxes)} gt, "
                f"{kept} pred: {missed} missed, {false_alarms} false",
                fontsize=10,
                pad=14,  # above the labels of boxes at the top edge
            )
        row[0].text(
            0.0, -0.02, reason, transform=row[0].transAxes, fontsize=9, va="top", ha="left", color="#37474f"
        )
    _legend_and_title(figure, f"Where {labels[0]} and {labels[1]} disagree, each at its own threshold")
    return _save(figure, out_path)


def plot_loss_curves(metrics_csv: str | Path, out_path: str | Path) -> Path:
    """Losses (columns containing 'loss'; ones starting with 'val' dashed) and the other numeric
    columns (validation metrics; lr/time left out) against `epoch`, from the trainer's `metrics.csv`."""
    plt = _pyplot()
    with open(metrics_csv, newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    columns = list(rows[0].keys()) if rows else []

    def column(name: str) -> np.ndarray:
        values = []
        for row in rows:
            try:
                values.append(float(row.get(name) or "nan"))
            except ValueError:
                values.append(float("nan"))
        return np.array(values)

    epochs = column("epoch") if "epoch" in columns else np.arange(1, len(rows) + 1, dtype=float)
    numeric = [name for name in columns if name != "epoch" and np.isfinite(column(name)).any()]
    losses = [name for name in numeric if "loss" in name.lower()]
    others = [
        name
        for name in numeric
        if name not in losses and name.lower() not in ("lr", "learning_rate", "time", "seconds")
    ]
    figure, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    for name in losses:
        values = column(name)
        finite = np.isfinite(values)
        style = "--" if name.lower().startswith("val") else "-"
        left.plot(epochs[finite], values[finite], style, marker="o", markersize=3, label=name)
    left.set_title("losses (validation dashed)")
    left.set_xlabel("epoch")
    left.set_ylabel("loss")
    if losses and np.nanmax([np.nanmax(column(name)) for name in losses]) > 0:
        positive = all(np.nanmin(column(name)) > 0 for name in losses)
        if positive and np.nanmax([np.nanmax(column(n)) / np.nanmin(column(n)) for n in losses]) > 20:
            left.set_yscale("log")
    for name in others:
        values = column(name)
        right.plot(
            epochs[np.isfinite(values)], values[np.isfinite(values)], marker="o", markersize=3, label=name
        )
    right.set_title("validation metrics")
    right.set_xlabel("epoch")
    right.set_ylabel("value")
    for axes, names in ((left, losses), (right, others)):
        axes.grid(alpha=0.3)
        if names:
            axes.legend(fontsize=9)
        else:
            axes.text(0.5, 0.5, "no data", ha="center", va="center", transform=axes.transAxes)
    figure.tight_layout()
    return _save(figure, out_path)


def _legend_and_title(figure, title: str) -> None:
    """The ground-truth / prediction legend and the title above a grid of image panels."""
    from matplotlib.patches import Rectangle

    figure.legend(
        handles=[
            Rectangle((0, 0), 1, 1, fill=False, edgecolor=GT_COLOR, linestyle="--", label="ground truth"),
            Rectangle((0, 0), 1, 1, fill=False, edgecolor=PRED_COLOR, label="prediction (class score)"),
        ],
        loc="upper center",
        ncol=2,
        bbox_to_anchor=(0.5, 0.985),
        fontsize=10,
        frameon=False,
    )
    figure.suptitle(title, y=0.998)
    figure.tight_layout(rect=(0, 0, 1, 1 - 0.45 / figure.get_figheight()))

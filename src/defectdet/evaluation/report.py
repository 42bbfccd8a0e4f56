"""`evaluate_records` (the one call trainer and `defectdet val` make) and the self-contained report.html."""

from __future__ import annotations

import base64
import dataclasses
import datetime
import html
import json
import logging
import math
import string
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import numpy as np

from defectdet.compat import Surface, current_keywords
from defectdet.evaluation.coco import coco_metrics
from defectdet.evaluation.deeppcb import deeppcb_metrics, write_deeppcb_results
from defectdet.evaluation.operating_point import OperatingPointResult, confusion_matrix, operating_points
from defectdet.evaluation.timing import StageTimer
from defectdet.evaluation.types import ImageRecord

logger = logging.getLogger(__name__)

Protocol = Literal["coco", "deeppcb", "both"]


def protocol_for(requested: str | None, data_format: str | None) -> str:
    """The protocol asked for, else (None) COCO's, plus DeepPCB's own on DeepPCB data only: its figures mean
    nothing to a user of other data."""
    if requested is not None:
        return requested
    return "both" if data_format == "deeppcb" else "coco"


PLOT_CAPTIONS = {
    "pr_curve": "Precision-recall per class at IoU 0.5; the bold line is the mean over classes.",
    "threshold_curves": "Box-level precision/recall/F1 and image-level escape/false-call rates against the "
    "confidence threshold; vertical lines mark the chosen and the target-recall thresholds.",
    "confusion_matrix": "Class confusions at the chosen threshold (IoU 0.5). Background column: missed defects; "
    "background row: false alarms.",
    "val_predictions": "Ground truth (green, dashed) and predictions (red) on the images with the most errors.",
    "loss": "Training losses and validation metrics per epoch (from metrics.csv).",
}


def to_jsonable(value):
    """Recursively turn NumPy scalars/arrays into Python values and non-finite floats into None."""
    if isinstance(value, Mapping):
        return {str(key): to_jsonable(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(item) for item in value]
    if isinstance(value, np.ndarray):
        return to_jsonable(value.tolist())
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, Path):
        return str(value)
    return value


@dataclass(frozen=True)
class EvaluationOutputs:
    """What `evaluate_records` writes beside metrics.json. `plots=False` skips the PNGs and the report
    (cheap per-epoch validation); `load_image(record)` reads an image for the prediction grid (default: its
    `image_path`, with OpenCV); `metrics_csv` gives the loss curves (default `out_dir/metrics.csv`, when that
    file exists); `deeppcb_results_dir` receives DeepPCB-format result files; `title` and `settings` head the
    report."""

    plots: bool = True
    load_image: Callable[[ImageRecord], np.ndarray | None] | None = None
    metrics_csv: str | Path | None = None
    deeppcb_results_dir: str | Path | None = None
    title: str = "defectdet evaluation"
    settings: Mapping | None = None
    # how a given `threshold` was chosen, in words ("the best box F1 on split 'val' of ..."); the report's
    # threshold card and metrics.json's chosen point say it (`chosen_by`)
    threshold_source: str | None = None


def evaluate_records(
    records: Sequence[ImageRecord],
    class_names: Sequence[str],
    out_dir: str | Path,
    protocol: Protocol = "both",
    target_recall: float = 0.99,
    threshold: float | None = None,
    timing: StageTimer | Mapping | None = None,
    *,
    outputs: EvaluationOutputs | None = None,
    **keywords: Any,
) -> dict:
    """Run COCO and/or DeepPCB metrics and the operating-point analysis; write `metrics.json`,
    the plots and `report.html` into `out_dir`; return the metrics dict.

    The operating threshold is `threshold` when given, else the best-F1 threshold at IoU 0.5. `outputs` (an
    `EvaluationOutputs`; its fields may also be given as keywords, `plots=False`) says what else is written.
    """
    fields = {field.name for field in dataclasses.fields(EvaluationOutputs)}
    outputs = dataclasses.replace(
        outputs or EvaluationOutputs(), **{key: value for key, value in keywords.items() if key in fields}
    )
    renamed = {key: value for key, value in keywords.items() if key not in fields}
    if renamed:  # keywords retired for one name per concept
        threshold = current_keywords(renamed, Surface.EVALUATE)["threshold"]
    if protocol not in ("coco", "deeppcb", "both"):
        raise ValueError(f"protocol must be 'coco', 'deeppcb' or 'both', got {protocol!r}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    class_names = list(class_names)

    operating = operating_points(records, class_names, 0.5, target_recall, threshold)
    if threshold is not None and outputs.threshold_source:
        operating.summary["chosen"]["chosen_by"] = outputs.threshold_source
    metrics = _metrics(records, class_names, protocol, operating, timing, outputs.deeppcb_results_dir)
    (out_dir / "metrics.json").write_text(json.dumps(metrics, indent=2), encoding="utf-8")

    if outputs.plots:
        chosen_threshold = operating.summary["chosen"]["threshold"]
        plot_paths = _write_plots(records, class_names, out_dir, operating, chosen_threshold, outputs)
        write_report(out_dir, metrics, plot_paths, outputs.title, dict(outputs.settings or {}))
    return metrics


def _metrics(
    records: Sequence[ImageRecord],
    class_names: list[str],
    protocol: Protocol,
    operating: OperatingPointResult,
    timing: StageTimer | Mapping | None,
    deeppcb_results_dir: str | Path | None,
) -> dict:
    """The metrics dict, as JSON values: counts, the protocol's figures (DeepPCB's result files written when
    `deeppcb_results_dir` is given), the operating points, timing, per-class rows and the headline."""
    chosen_threshold = operating.summary["chosen"]["threshold"]
    metrics: dict = {
        "num_images": len(records),
        "num_clean_images": sum(record.is_clean for record in records),
        "num_gt": int(sum(len(record.gt_boxes) for record in records)),
        "num_detections": int(sum(len(record.det_scores) for record in records)),
        "class_names": class_names,
        "protocol": protocol,
    }
    if protocol in ("coco", "both"):
        metrics["coco"] = coco_metrics(records, class_names)
    if protocol in ("deeppcb", "both"):
        metrics["deeppcb"] = deeppcb_metrics(records, class_names, 0.33, chosen_threshold)
        if deeppcb_results_dir is not None:
            write_deeppcb_results(records, deeppcb_results_dir, class_names)
    metrics["operating_point"] = operating.summary
    if isinstance(timing, StageTimer):
        metrics["timing"] = timing.summary()
    else:
        metrics["timing"] = dict(timing) if timing else None
    metrics["per_class"] = _per_class_rows(metrics, class_names)
    metrics["headline"] = _headline(metrics)
    return to_jsonable(metrics)


def _write_plots(
    records: Sequence[ImageRecord],
    class_names: list[str],
    out_dir: Path,
    operating: OperatingPointResult,
    threshold: float,
    outputs: EvaluationOutputs,
) -> dict[str, Path]:
    from defectdet.evaluation import plots as plotting

    paths: dict[str, Path] = {}
    jobs = {
        "pr_curve": lambda path: plotting.plot_pr_curves(operating.class_curves, class_names, path),
        "threshold_curves": lambda path: plotting.plot_threshold_curves(operating, path),
        "confusion_matrix": lambda path: plotting.plot_confusion_matrix(
            confusion_matrix(records, len(class_names), threshold), class_names, path, threshold
        ),
        "val_predictions": lambda path: plotting.plot_prediction_grid(
            records, class_names, path, threshold, load_image=outputs.load_image
        ),
    }
    csv_path = Path(outputs.metrics_csv) if outputs.metrics_csv else out_dir / "metrics.csv"
    if csv_path.is_file():
        jobs["loss"] = lambda path: plotting.plot_loss_curves(csv_path, path)
    for name, job in jobs.items():
        try:
            paths[name] = job(out_dir / f"{name}.png")
        except Exception:  # a broken plot must not lose the metrics already computed
            logger.exception("could not draw %s", name)
    return paths


def _per_class_rows(metrics: dict, class_names: list[str]) -> list[dict]:
    rows = []
    for index, name in enumerate(class_names):
        op_row = metrics["operating_point"]["per_class"][index]
        row = {"class": name, "gt": op_row["gt"], "detections": op_row["detections"]}
        if "coco" in metrics:
            row["AP50"] = metrics["coco"]["class_AP50"].get(name)
            row["AP50_95"] = metrics["coco"]["class_AP50_95"].get(name)
        if "deeppcb" in metrics:
            row["deeppcb_AP"] = metrics["deeppcb"]["class_ap"].get(name)
        row["precision"] = op_row["precision"]
        row["recall"] = op_row["recall"]
        rows.append(row)
    return rows


def _headline(metrics: dict) -> dict:
    chosen = metrics["operating_point"]["chosen"]
    target = metrics["operating_point"]["target_recall_point"]
    coco = metrics.get("coco", {})
    deeppcb = metrics.get("deeppcb", {})
    timing = metrics.get("timing") or {}
    return {
        "mAP50": coco.get("mAP50"),
        "mAP50_95": coco.get("mAP50_95"),
        "deeppcb_mAP": deeppcb.get("mAP"),
        "deeppcb_F": (deeppcb.get("best") or {}).get("f_score"),
        "deeppcb_F_at_threshold": (deeppcb.get("at_threshold") or {}).get("f_score"),
        "threshold": chosen["threshold"],
        "precision": chosen["precision"],
        "recall": chosen["recall"],
        "f1": chosen["f1"],
        "escape_rate": chosen["escape_rate"],
        "false_call_rate": chosen["false_call_rate"],
        "target_recall_threshold": target.get("threshold"),
        "images_per_second": timing.get("images_per_second"),
    }


# ---------------------------------------------------------------------------------------- HTML


def _fmt(value, percent: bool = False, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (int, np.integer)) and not percent:
        return f"{int(value):,}"
    if percent:
        return f"{100 * float(value):.{max(digits - 2, 1)}f}%"
    return f"{float(value):.{digits}f}"


def _card(label: str, value: str, note: str = "", tone: str = "") -> str:
    return (
        f'<div class="card {tone}"><div class="label">{html.escape(label)}</div>'
        f'<div class="value{" text" if len(value) > 12 else ""}">{html.escape(value)}</div><div class="note">{html.escape(note)}</div></div>'
    )


def _image_data_uri(path: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(Path(path).read_bytes()).decode("ascii")


# the report's definition of DeepPCB's figures, shown only where they are (DeepPCB data or --protocol)
DEEPPCB_DEFINITION = (
    "<dt>DeepPCB mAP / F-score</dt><dd>A detection is correct when IoU &gt; 0.33 with an unmatched ground truth "
    "of the same class (greedy by score); AP is the all-point interpolated area under the PR curve; "
    "F = 2PR/(P+R) pooled over classes.</dd>\n"
)


def write_report(
    out_dir: str | Path, metrics: dict, plots: Mapping[str, Path], title: str, settings: Mapping
) -> Path:
    """Write `out_dir/report.html`: headline numbers, per-class table, settings and the plots embedded
    as base64 PNGs, inline CSS, no external resources. The page is `templates/report.html` (a
    `string.Template`); the pieces filled into it are built here, escaped."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    coco = metrics.get("coco")
    settings_rows = "".join(
        f"<tr><td>{html.escape(str(key))}</td><td style='text-align:left'>{html.escape(str(value))}</td></tr>"
        for key, value in settings.items()
    )
    size_rows = ""
    if coco:
        size_rows = (
            f"<p class='sub'>COCO AP by object size: small {_fmt(coco.get('AP_small'))}, "
            f"medium {_fmt(coco.get('AP_medium'))}, large {_fmt(coco.get('AP_large'))}, "
            f"mAP@0.75 {_fmt(coco.get('mAP75'))}.</p>"
        )
    summary_line = (
        f"{metrics.get('num_images', 0)} images ({metrics.get('num_clean_images', 0)} clean), "
        f"{metrics.get('num_gt', 0)} ground-truth boxes, {metrics.get('num_detections', 0)} detections. "
        f"Generated {datetime.datetime.now().strftime('%Y-%m-%d %H:%M')}."
    )
    document = _report_template().substitute(
        title=html.escape(title),
        summary=html.escape(summary_line),
        cards="".join(_metric_cards(metrics)),
        per_class=_per_class_table(metrics.get("per_class", [])),
        size_rows=size_rows,
        figures="".join(_figures(plots)) or '<p class="muted">no plots</p>',
        settings=f"<table>{settings_rows}</table>" if settings_rows else '<p class="muted">none recorded</p>',
        deeppcb_definition=DEEPPCB_DEFINITION if "deeppcb" in metrics else "",
    )
    path = out_dir / "report.html"
    path.write_text(document, encoding="utf-8")
    return path


def _report_template() -> string.Template:
    text = resources.files("defectdet.evaluation").joinpath("templates/report.html").read_text("utf-8")
    return string.Template(text)


def _metric_cards(metrics: dict) -> list[str]:
    """The headline cards: COCO and DeepPCB numbers, the operating point, recall target, throughput."""
    operating = metrics.get("operating_point", {})
    chosen = operating.get("chosen", {})
    coco = metrics.get("coco")
    deeppcb = metrics.get("deeppcb")
    timing = metrics.get("timing") or {}
    cards = []
    if coco:
        cards.append(_card("mAP@0.5 (COCO)", _fmt(coco.get("mAP50")), "pycocotools, 101-point"))
        cards.append(_card("mAP@0.5:0.95", _fmt(coco.get("mAP50_95")), f"AR@100 {_fmt(coco.get('AR100'))}"))
    if deeppcb:
        best = deeppcb.get("best", {})
        cards.append(_card("DeepPCB mAP", _fmt(deeppcb.get("mAP")), "IoU > 0.33, all-point AP"))
        cards.append(
            _card(
                "DeepPCB F-score",
                _fmt(best.get("f_score")),
                f"best at threshold {_fmt(best.get('threshold'))}; "
                f"at chosen {_fmt(deeppcb.get('at_threshold', {}).get('f_score'))}",
            )
        )
    cards += _operating_cards(operating, chosen)
    if timing.get("images_per_second"):
        stages = ", ".join(
            f"{name} {_fmt(ms, digits=1)}" for name, ms in (timing.get("ms_per_image") or {}).items()
        )
        cards.append(_card("throughput", f"{timing['images_per_second']:.1f} img/s", f"ms/image: {stages}"))
    return cards


def _operating_cards(operating: dict, chosen: dict) -> list[str]:
    """Threshold, precision/recall, escape and false-call rates at the chosen threshold, and the
    threshold that reaches the target recall (or that none does)."""
    target = operating.get("target_recall_point", {})
    escape = chosen.get("escape_rate")
    false_call = chosen.get("false_call_rate")
    cards = [
        _card(
            "operating threshold",
            _fmt(chosen.get("threshold")),
            chosen.get("chosen_by") or ("given" if chosen.get("source") == "given" else "max F1 at IoU 0.5"),
        ),
        _card(
            "precision / recall",
            f"{_fmt(chosen.get('precision'))} / {_fmt(chosen.get('recall'))}",
            f"F1 {_fmt(chosen.get('f1'))}, {chosen.get('false_positives', 0)} false alarms, "
            f"{chosen.get('false_negatives', 0)} misses",
        ),
        _card(
            "escape rate",
            _fmt(escape, percent=True),
            f"{chosen.get('escapes', 0)} of {chosen.get('defective_images', 0)} defective images called clean",
            "bad" if escape else "good" if escape == 0 else "",
        ),
        _card(
            "false-call rate",
            _fmt(false_call, percent=True),
            f"{chosen.get('false_calls', 0)} of {chosen.get('clean_images', 0)} clean images flagged"
            if false_call is not None
            else "no clean images in the set",
            "bad" if false_call else "good" if false_call == 0 else "",
        ),
    ]
    if target.get("reachable"):
        cards.append(
            _card(
                f"threshold for recall ≥ {operating.get('target_recall', 0):g}",
                _fmt(target.get("threshold")),
                f"precision {_fmt(target.get('precision'))}, false-call "
                f"{_fmt(target.get('false_call_rate'), percent=True)}",
            )
        )
    else:
        cards.append(
            _card(
                f"recall ≥ {operating.get('target_recall', 0):g}",
                "not reachable",
                f"max recall {_fmt(target.get('max_recall'))}",
                "bad",
            )
        )
    return cards


_PER_CLASS_HEADERS = {
    "class": "class",
    "gt": "gt boxes",
    "detections": "detections",
    "AP50": "AP@0.5",
    "AP50_95": "AP@0.5:0.95",
    "deeppcb_AP": "DeepPCB AP",
    "precision": "precision @thr",
    "recall": "recall @thr",
}


def _per_class_table(per_class: list[dict]) -> str:
    columns = [key for key in _PER_CLASS_HEADERS if per_class and key in per_class[0]]
    table = ["<table><tr>" + "".join(f"<th>{_PER_CLASS_HEADERS[key]}</th>" for key in columns) + "</tr>"]
    for row in per_class:
        cells = [html.escape(str(row[key])) if key == "class" else _fmt(row[key]) for key in columns]
        table.append("<tr>" + "".join(f"<td>{cell}</td>" for cell in cells) + "</tr>")
    table.append("</table>")
    return "".join(table)


def _figures(plots: Mapping[str, Path]) -> list[str]:
    figures = []
    for name, path in plots.items():
        caption = PLOT_CAPTIONS.get(name, name)
        wide = "" if name in ("pr_curve", "threshold_curves") else ' class="wide"'
        figures.append(
            f'<figure{wide}><img alt="{html.escape(name)}" src="{_image_data_uri(Path(path))}">'
            f"<figcaption>{html.escape(caption)}</figcaption></figure>"
        )
    return figures

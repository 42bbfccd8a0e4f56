"""Synthetic -> real transfer: what a model trained ONLY on synthetic boards scores on DeepPCB's held-out groups.

    .venv/bin/python -m bench.synth_to_deeppcb [--checkpoint runs/demo_check/run/best.pt]
                                               [--data ../shared/datasets/deeppcb] [--name synth_to_deeppcb]

A transfer check: no DeepPCB image is trained on, here or in the checkpoint (`make demo` /
`defectdet demo --out runs/demo_check` trains on `defectdet synth` boards with templates, classes open, short,
mousebite, spur, copper, pin-hole, missing-hole). What it measures:

1. The checkpoint runs on every tested/template pair of the held-out DeepPCB board groups
   (`load_dataset(root, "val")`, whole groups held out, as bench/train_deeppcb.py and bench/peers.py use) through
   the product's one prediction path (`engine.predict.predict_records` via `peers.ours_records`: registration,
   letterbox, model, NMS, boxes in original pixels) at the checkpoint's own imgsz, channels and post-processing.
2. Predicted classes are mapped to DeepPCB classes BY NAME; detections of classes DeepPCB lacks (missing-hole)
   are dropped and counted. Scored by OUR evaluator (`evaluate_records`: COCO mAP via pycocotools and the
   DeepPCB protocol), as bench/peers.py scores models.
3. Class-agnostic: the same records with every ground-truth box and every detection (dropped classes included)
   relabelled "defect" - does the model find real defects even when it names them wrong? Also with the merged
   detections re-run through the product's NMS class-agnostically (class-aware NMS leaves overlapping boxes of
   different classes, which become duplicates once merged).
4. What the model calls each real defect: the confusion matrix (IoU 0.5, class-agnostic pairing) at the
   class-agnostic best-F1 threshold, DeepPCB truth rows against the checkpoint's classes.
5. How the boxes fit (class-agnostic): true box sizes, and each true box's best-IoU detection at the best-F1
   threshold (IoU, detected/true width and height), on DeepPCB and on the synthetic val split.
6. Self-check of the code path: the checkpoint re-scored on its own synthetic val split (when the data it was
   trained from is still on disk), to compare with the mAP its training reported.

Writes bench/results/<--name>.json (bench/common.write_result) and prints a table; the evaluator's own
metrics.json files go under --out.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from bench import common, peers
from defectdet.data.formats import load_dataset
from defectdet.data.formats.deeppcb import group_of
from defectdet.engine.checkpoint import load_checkpoint
from defectdet.evaluation.operating_point import box_iou, confusion_matrix
from defectdet.evaluation.report import evaluate_records
from defectdet.evaluation.types import ImageRecord
from defectdet.postprocess import PostprocessSettings, postprocess

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
DEFAULT_CHECKPOINT = ROOT / "runs" / "demo_check" / "run" / "best.pt"
AGNOSTIC = ["defect"]


# ------------------------------------------------------------------------------------------------ mapping
def normalize(name: str) -> str:
    return name.strip().lower().replace("_", "-").replace(" ", "-")


def class_mapping(source: Sequence[str], target: Sequence[str]) -> dict[int, int]:
    """{checkpoint class id: DeepPCB class id} for the names both sides have."""
    index = {normalize(name): position for position, name in enumerate(target)}
    return {i: index[normalize(name)] for i, name in enumerate(source) if normalize(name) in index}


def map_records(
    records: Sequence[ImageRecord], mapping: dict[int, int]
) -> tuple[list[ImageRecord], dict[int, int]]:
    """Detections relabelled into the target classes; those of unmapped classes dropped ({class: count})."""
    out, dropped = [], {}
    for record in records:
        targets = np.array([mapping.get(int(c), -1) for c in record.det_classes], np.int64)
        keep = targets >= 0
        for cls in record.det_classes[~keep]:
            dropped[int(cls)] = dropped.get(int(cls), 0) + 1
        out.append(
            replace(
                record,
                det_boxes=record.det_boxes[keep],
                det_scores=record.det_scores[keep],
                det_classes=targets[keep],
            )
        )
    return out, dropped


def agnostic_records(
    records: Sequence[ImageRecord], settings: PostprocessSettings | None = None
) -> list[ImageRecord]:
    """Every ground truth and detection relabelled class 0; with `settings`, the merged detections go through
    the product's NMS again, class-agnostically."""
    out = []
    for record in records:
        boxes, scores = record.det_boxes, record.det_scores
        if settings is not None and len(scores):
            found = postprocess(
                np.concatenate([boxes, scores[:, None]], 1)[None],
                settings.score_floor,
                settings.nms_iou,
                settings.max_detections,
                class_agnostic=True,
            )[0]
            boxes, scores = found.boxes, found.scores
        out.append(
            replace(
                record,
                gt_classes=np.zeros(len(record.gt_classes), np.int64),
                det_boxes=boxes,
                det_scores=scores,
                det_classes=np.zeros(len(scores), np.int64),
            )
        )
    return out


def truth_in_source_classes(records: Sequence[ImageRecord], mapping: dict[int, int]) -> list[ImageRecord]:
    """Ground truth relabelled into the checkpoint's classes (the inverse of `mapping`), detections as predicted."""
    inverse = {target: source for source, target in mapping.items()}
    return [
        replace(record, gt_classes=np.array([inverse[int(c)] for c in record.gt_classes], np.int64))
        for record in records
    ]


# ------------------------------------------------------------------------------------------------ scoring
def summarize(metrics: dict) -> dict:
    headline = metrics["headline"]
    return {
        "mAP50": headline["mAP50"],
        "mAP50_95": headline["mAP50_95"],
        "deeppcb_mAP": headline["deeppcb_mAP"],
        "deeppcb_F": headline["deeppcb_F"],
        "best_f1_threshold": headline["threshold"],
        "precision": headline["precision"],
        "recall": headline["recall"],
        "f1": headline["f1"],
        "num_gt": metrics["num_gt"],
        "num_detections": metrics["num_detections"],
    }


def score(records: Sequence[ImageRecord], class_names: Sequence[str], out: Path, title: str) -> dict:
    return evaluate_records(records, class_names, out, "both", plots=False, title=title)


def training_report(checkpoint: Path, state: dict) -> dict:
    """What the checkpoint says about its own training and synthetic validation."""
    config = state.get("config") or {}
    report = {
        "config": config,
        "model_config": state.get("model_config"),
        "class_names": state.get("class_names"),
        "epoch": state.get("epoch"),
        "step": state.get("step"),
        "elapsed_seconds": (state.get("train_state") or {}).get("elapsed_seconds"),
        "synthetic_val_best": state.get("best_metrics"),
        "synthetic_val_at_save": state.get("metrics"),
    }
    run_metrics = checkpoint.parent / "metrics.json"
    if run_metrics.is_file():
        headline = (json.loads(run_metrics.read_text()).get("validation") or {}).get("headline")
        if headline:
            report["synthetic_val_final_headline"] = {
                key: headline.get(key) for key in ("mAP50", "mAP50_95", "deeppcb_F", "threshold")
            }
    return report


def self_check(checkpoint: Path, state: dict, out: Path) -> dict | None:
    """The checkpoint on its own synthetic val split, through the same code path and evaluator."""
    config = state.get("config") or {}
    data = config.get("data")
    if not data:
        return None
    path = Path(data) if Path(data).is_absolute() else ROOT / data
    if not path.exists():
        logging.info("self-check skipped: training data %s not found", path)
        return None
    split = load_dataset(path, config.get("val_split") or "val", config.get("format"))
    _, _, records = peers.ours_records(checkpoint, split.samples)
    metrics = score(records, split.class_names, out, "synthetic val (self-check)")
    found = summarize(metrics)
    fit = box_fit(records, metrics["headline"]["threshold"])
    return {"data": str(path), "images": len(records), **found, "box_fit": fit}


def confusion(records: Sequence[ImageRecord], names: Sequence[str], truth: Sequence[str], threshold) -> dict:
    """{DeepPCB truth class: {predicted class or 'missed': count}} plus the false alarms per predicted class."""
    if threshold is None:
        return {}
    matrix = confusion_matrix(records, len(names), float(threshold))
    columns = [*names, "missed"]
    by_name = {normalize(name): i for i, name in enumerate(names)}
    rows = {
        name: {column: int(matrix[by_name[normalize(name)], j]) for j, column in enumerate(columns)}
        for name in truth
    }
    rows["false alarm"] = {name: int(matrix[len(names), j]) for j, name in enumerate(names)}
    return {"threshold": float(threshold), "iou": 0.5, "rows_truth_columns_predicted": rows}


def box_fit(records: Sequence[ImageRecord], threshold) -> dict:
    """How the boxes fit, class-agnostically: ground-truth size percentiles and, for each ground truth, its
    best-IoU detection at score >= `threshold` (IoU >= 0.1): IoU and detected/true width and height."""

    def percentiles(values) -> list[float] | None:
        return [round(float(v), 3) for v in np.percentile(values, (25, 50, 75))] if len(values) else None

    sizes = np.concatenate([r.gt_boxes for r in records]) if records else np.zeros((0, 4), np.float32)
    ious, width_ratio, height_ratio = [], [], []
    for record in records:
        detections = record.det_boxes[record.det_scores >= (threshold if threshold is not None else np.inf)]
        if not len(record.gt_boxes) or not len(detections):
            continue
        overlap = box_iou(record.gt_boxes, detections)
        for index, truth in enumerate(record.gt_boxes):
            best = int(overlap[index].argmax())
            if overlap[index, best] < 0.1:
                continue
            found = detections[best]
            ious.append(overlap[index, best])
            width_ratio.append((found[2] - found[0]) / max(truth[2] - truth[0], 1e-6))
            height_ratio.append((found[3] - found[1]) / max(truth[3] - truth[1], 1e-6))
    return {
        "threshold": threshold,
        "gt_width_px_p25_50_75": percentiles(sizes[:, 2] - sizes[:, 0]),
        "gt_height_px_p25_50_75": percentiles(sizes[:, 3] - sizes[:, 1]),
        "gt_found": len(ious),
        "gt_total": len(sizes),
        "iou_p25_50_75": percentiles(ious),
        "det_over_gt_width_p25_50_75": percentiles(width_ratio),
        "det_over_gt_height_p25_50_75": percentiles(height_ratio),
    }


# ------------------------------------------------------------------------------------------------ main
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", type=Path, default=DEFAULT_CHECKPOINT)
    parser.add_argument("--data", type=Path, default=peers.DEFAULT_DATA)
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "synth_to_deeppcb")
    parser.add_argument("--name", default="synth_to_deeppcb", help="bench/results/<name>.json")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--no-self-check", action="store_true", help="skip re-scoring the synthetic val split"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    if not args.checkpoint.is_file():
        print(
            f"checkpoint {args.checkpoint} not found: train one on synthetic boards with `make demo` "
            "(writes runs/demo/run/best.pt) or `defectdet demo --out runs/demo_check`, or pass --checkpoint",
            file=sys.stderr,
        )
        return 2
    if not (args.data / "trainval.txt").is_file():
        print(f"DeepPCB not found at {args.data} (needs trainval.txt); pass --data", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    load_before = common.machine_info().get("load_average")

    state = load_checkpoint(args.checkpoint)
    trained = training_report(args.checkpoint, state)
    source_names = list(state.get("class_names") or [])
    val_split = load_dataset(args.data, "val")
    target_names = list(val_split.class_names)
    mapping = class_mapping(source_names, target_names)
    if not mapping:
        print(f"no class of the checkpoint {source_names} is a DeepPCB class {target_names}", file=sys.stderr)
        return 2
    unmatched_truth = [name for i, name in enumerate(target_names) if i not in mapping.values()]

    # 1. the one prediction path, at the checkpoint's own imgsz / channels / post-processing
    model, config, raw = peers.ours_records(args.checkpoint, val_split.samples)
    settings = PostprocessSettings.from_config(config)

    # 2. by-name mapping, our evaluator
    mapped, dropped = map_records(raw, mapping)
    metrics = score(mapped, target_names, args.out / "by_name", "synthetic-only model on DeepPCB")
    by_name = summarize(metrics)

    # 3. class-agnostic, every detection kept (plain relabel, and with a class-agnostic NMS of the merged boxes)
    agnostic = score(agnostic_records(raw), AGNOSTIC, args.out / "agnostic", "class-agnostic")
    agnostic_nms = score(
        agnostic_records(raw, settings), AGNOSTIC, args.out / "agnostic_nms", "class-agnostic, agnostic NMS"
    )

    # 4. what the model calls the real defects (only when every DeepPCB class has a checkpoint class)
    called = (
        confusion(
            truth_in_source_classes(raw, mapping),
            source_names,
            target_names,
            agnostic["headline"]["threshold"],
        )
        if not unmatched_truth
        else {}
    )

    # 5./6. the same path on the model's own synthetic val split
    synthetic = None if args.no_self_check else self_check(args.checkpoint, state, args.out / "synthetic_val")

    predicted_counts = {
        name: int(sum(int((r.det_classes == i).sum()) for r in raw)) for i, name in enumerate(source_names)
    }
    per_class = [
        {key: row.get(key) for key in ("class", "gt", "detections", "AP50", "AP50_95", "deeppcb_AP", "precision", "recall")}
        for row in metrics["per_class"]
    ]  # fmt: skip
    payload = {
        "description": "transfer check: a model trained only on synthetic boards (no DeepPCB image trained on) "
        "scored on DeepPCB's held-out board groups by defectdet's evaluator",
        "command": "python -m bench.synth_to_deeppcb " + " ".join(argv if argv is not None else sys.argv[1:]),
        "shared_machine_load_before": load_before,
        "seconds": round(time.perf_counter() - started, 1),
        "checkpoint": str(args.checkpoint),
        "training": trained,
        "inference": {
            "path": "engine.predict.predict_records (via bench/peers.ours_records)",
            "imgsz": int(config.get("input_size") or config.get("imgsz") or 640),
            "channels": model.in_channels // (2 if model.template else 1),
            "template": bool(model.template),
            "register_pairs": True,  # peers.ours_records: predict_records' default
            "register_pairs_in_training_config": config.get("register_pairs"),
            "postprocess": {
                "score_threshold": settings.score_floor,
                "nms_iou": settings.nms_iou,
                "max_detections": settings.max_detections,
            },
        },
        "data": {
            "root": str(args.data),
            "split": "val (load_dataset(root, 'val'): whole board groups held out)",
            "held_out_pairs": len(val_split.samples),
            "held_out_groups": sorted({group_of(s) for s in val_split.samples}),
            "gt_boxes": metrics["num_gt"],
            "class_names": target_names,
        },
        "class_mapping": {source_names[s]: target_names[t] for s, t in mapping.items()},
        "unmapped_checkpoint_classes": [n for i, n in enumerate(source_names) if i not in mapping],
        "deeppcb_classes_without_checkpoint_class": unmatched_truth,
        "detections_raw_per_predicted_class": predicted_counts,
        "detections_dropped": {source_names[c]: n for c, n in sorted(dropped.items())},
        "detections_dropped_total": int(sum(dropped.values())),
        "by_name": by_name,
        "per_class": per_class,
        "class_agnostic": summarize(agnostic),
        "class_agnostic_nms": summarize(agnostic_nms),
        "what_the_model_calls_real_defects": called,
        "box_fit_class_agnostic": box_fit(raw, agnostic["headline"]["threshold"]),
        "synthetic_val_rescored": synthetic,
        "metrics_json": {
            "by_name": str(args.out / "by_name" / "metrics.json"),
            "class_agnostic": str(args.out / "agnostic" / "metrics.json"),
            "class_agnostic_nms": str(args.out / "agnostic_nms" / "metrics.json"),
        },
    }
    path = common.write_result(args.name, payload)
    print_summary(payload)
    print(f"wrote {path}")
    return 0


def print_summary(payload: dict) -> None:
    from rich.console import Console

    console = None if sys.stdout.isatty() else Console(width=160)
    rows = []
    for label, key in (
        ("DeepPCB, classes by name", "by_name"),
        ("DeepPCB, class-agnostic", "class_agnostic"),
        ("DeepPCB, class-agnostic + agnostic NMS", "class_agnostic_nms"),
        ("synthetic val (self-check)", "synthetic_val_rescored"),
    ):
        found = payload.get(key)
        if found:
            rows.append(
                [
                    label,
                    found["mAP50"],
                    found["mAP50_95"],
                    found["deeppcb_F"],
                    found["precision"],
                    found["recall"],
                ]
            )
    best = payload["training"].get("synthetic_val_best") or {}
    if best:
        rows.append(
            ["synthetic val (its training report)", best.get("mAP50"), best.get("mAP50_95"), None, None, None]
        )
    data = payload["data"]
    common.print_table(
        f"{payload['checkpoint']} (synthetic boards only) on DeepPCB held-out groups {data['held_out_groups']}, "
        f"{data['held_out_pairs']} pairs; {payload['detections_dropped_total']} detections of classes DeepPCB "
        f"lacks dropped",
        ["scored on", "mAP@0.5", "mAP@.5:.95", "DeepPCB F", "P @best F1", "R @best F1"],
        [["-" if v is None else v for v in row] for row in rows],
        console=console,
    )
    common.print_table(
        "per DeepPCB class (by-name mapping)",
        ["class", "gt", "detections", "AP50", "AP50_95", "DeepPCB AP", "P", "R"],
        [
            [
                "-" if row[k] is None else row[k]
                for k in ("class", "gt", "detections", "AP50", "AP50_95", "deeppcb_AP", "precision", "recall")
            ]
            for row in payload["per_class"]
        ],  # fmt: skip
        console=console,
    )


if __name__ == "__main__":
    raise SystemExit(main())

"""The DeepPCB benchmark protocol (Tang et al. 2019) and its result-file format.

A detection is correct when its IoU with a not-yet-matched ground truth of the same class is
*greater than* 0.33 (greedy in descending score). Per-class AP is the area under the PR curve with
all-point (VOC 2010+) interpolation; mAP is their mean over classes that have ground truth.
Precision/recall/F-score = 2PR/(P+R) are pooled over all classes (as the dataset's script does)
at a given score threshold and at the threshold that maximizes F.

The dataset's own ICDAR-derived script sums precision at each correct detection instead of
interpolating, so its AP can be slightly lower than ours on the same detections.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from defectdet.data.sample import id_path
from defectdet.evaluation.operating_point import (
    class_pr_curves,
    match_detections,
    pooled_at_threshold,
    pooled_cut_points,
)
from defectdet.evaluation.types import ImageRecord

DEEPPCB_CLASS_NAMES = ("open", "short", "mousebite", "spur", "copper", "pin-hole")
# spellings other datasets/configs use for the same defects -> the names the DeepPCB script expects
_DEEPPCB_ALIASES = {
    "open": "open",
    "short": "short",
    "mousebite": "mousebite",
    "mouse_bite": "mousebite",
    "mouse-bite": "mousebite",
    "spur": "spur",
    "copper": "copper",
    "spurious_copper": "copper",
    "spurious-copper": "copper",
    "spurious copper": "copper",
    "pin-hole": "pin-hole",
    "pin_hole": "pin-hole",
    "pinhole": "pin-hole",
    "pin hole": "pin-hole",
}


def deeppcb_metrics(
    records: Sequence[ImageRecord],
    class_names: Sequence[str],
    match_iou: float = 0.33,
    threshold: float = 0.5,
) -> dict:
    """DeepPCB mAP, per-class AP and pooled P/R/F at `threshold` and at the best threshold.

    Classes without ground truth get AP None and are left out of the mean.
    """
    num_classes = len(class_names)
    match = match_detections(records, num_classes, match_iou, strict=True)
    curves = class_pr_curves(match, num_classes)
    class_ap = {name: curve.ap for name, curve in zip(class_names, curves, strict=True)}
    valid = [ap for ap in class_ap.values() if ap is not None]

    cuts = pooled_cut_points(match)
    if len(cuts.thresholds):
        best = pooled_at_threshold(match, cuts.best_f1_threshold)
    else:
        best = {
            "threshold": None,
            "precision": None,
            "recall": None,
            "f1": 0.0 if match.gt_counts.sum() else None,
        }
    at_given = pooled_at_threshold(match, threshold)
    return {
        "protocol": f"DeepPCB (IoU > {match_iou}, same class, greedy by score; AP all-point interpolated)",
        "iou_threshold": match_iou,
        "mAP": float(np.mean(valid)) if valid else None,
        "class_ap": class_ap,
        "at_threshold": _rename_f(at_given),
        "best": _rename_f(best),
        "class_gt": {name: int(count) for name, count in zip(class_names, match.gt_counts, strict=True)},
    }


def _rename_f(values: dict) -> dict:
    renamed = dict(values)
    renamed["f_score"] = renamed.pop("f1", None)
    return renamed


def deeppcb_type_name(class_name: str) -> str:
    """The DeepPCB result-file type for a class name, or the class name itself for other datasets."""
    return _DEEPPCB_ALIASES.get(class_name.strip().lower(), class_name)


def write_deeppcb_results(
    records: Sequence[ImageRecord], out_dir: str | Path, class_names: Sequence[str]
) -> list[Path]:
    """Write one `ID.txt` per image (an id with sub-folders, `images/a`, in those sub-folders) with lines `x1,y1,x2,y2,confidence,type` (no spaces).

    Coordinates are rounded to integers (the DeepPCB/ICDAR script parses integers), clipped to the
    image, confidence has 6 decimals. Images without detections still get an (empty) file, which
    the script needs to count their ground truth as missed rather than reject the submission.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for record in records:
        lines = []
        order = np.argsort(-record.det_scores, kind="stable")
        for index in order:
            x1, y1, x2, y2 = np.rint(record.det_boxes[index]).astype(np.int64)
            x1, x2 = np.clip([x1, x2], 0, record.width)
            y1, y2 = np.clip([y1, y2], 0, record.height)
            class_id = int(record.det_classes[index])
            name = class_names[class_id] if 0 <= class_id < len(class_names) else str(class_id)
            lines.append(
                f"{x1},{y1},{x2},{y2},{float(record.det_scores[index]):.6f},{deeppcb_type_name(name)}"
            )
        path = out_dir / id_path(record.image_id, ".txt")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(lines) + ("\n" if lines else ""), encoding="utf-8")
        written.append(path)
    return written


def read_deeppcb_results(path: str | Path) -> list[tuple[int, int, int, int, float, str]]:
    """Parse a result file written by `write_deeppcb_results` (for round-trip checks and tools)."""
    rows = []
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        fields = line.split(",")
        if len(fields) != 6:
            raise ValueError(f"{path}:{number}: expected 6 comma-separated fields, got {len(fields)}")
        x1, y1, x2, y2 = (int(value) for value in fields[:4])
        rows.append((x1, y1, x2, y2, float(fields[4]), fields[5]))
    return rows

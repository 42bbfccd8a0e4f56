"""How much of a template-free model's loss on DeepPCB's held-out groups only a golden template can remove.

    python -m bench.template_oracle RUN/last.pt [--data ../shared/datasets/deeppcb] [--min-changed 6]

A defect is a change from the golden template. A model without templates has to tell it from the board's own
features (drill holes, copper islands, etch marks of the design) by their look alone. This bench scores the
checkpoint (a model trained without templates) on the held-out pairs twice with pycocotools: as it answers, and
after dropping every detection whose box covers no change from the pair's template (an oracle only a template
gives). The gap between the two is the share of the loss that sits on unchanged design: what more training,
a larger model or more augmentation of the training groups cannot remove, because the same pixels are
defect-free in the template. The oracle is checked on the ground truth: the share of labelled defects whose box
shows a change is reported (it should be 1.0; a lower figure would make the oracle drop true detections).

"Change" is the binarised tested image against the binarised template, opened with a 3x3 square so that
one-pixel edge jitter of the scan does not count; a box shows a change when at least `--min-changed` pixels
inside it (grown by 2 px) differ. Give it the run's `last.pt` (the weights the ladder scores): `best.pt` was
picked on these same held-out groups, so its figures are biased upwards. Writes
`bench/results/template_oracle_<checkpoint's run folder>.json`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import cv2
import numpy as np

from bench.common import limit_threads, print_table, write_result
from bench.train_deeppcb import DEFAULT_DATA
from defectdet.data.formats import load_dataset
from defectdet.data.sample import Sample
from defectdet.evaluation.coco import coco_metrics
from defectdet.evaluation.types import ImageRecord

GROW_PIXELS = 2


def change_mask(tested_path: Path, template_path: Path) -> np.ndarray:
    """(H, W) bool: pixels where the binarised tested image differs from its template, edge jitter removed."""
    tested = cv2.imread(str(tested_path), cv2.IMREAD_GRAYSCALE)
    template = cv2.imread(str(template_path), cv2.IMREAD_GRAYSCALE)
    if tested is None or template is None:
        raise SystemExit(f"cannot read the pair {tested_path} / {template_path}")
    if tested.shape != template.shape:
        template = cv2.resize(template, tested.shape[::-1], interpolation=cv2.INTER_NEAREST)
    difference = ((tested > 127) != (template > 127)).astype(np.uint8)
    return cv2.morphologyEx(difference, cv2.MORPH_OPEN, np.ones((3, 3), np.uint8)) > 0


def changed_pixels(mask: np.ndarray, box: np.ndarray) -> int:
    """Changed pixels inside `box` (xyxy) grown by GROW_PIXELS, clipped to the image."""
    height, width = mask.shape
    x0, y0 = (max(0, int(np.floor(value)) - GROW_PIXELS) for value in box[:2])
    x1 = min(width, int(np.ceil(box[2])) + GROW_PIXELS)
    y1 = min(height, int(np.ceil(box[3])) + GROW_PIXELS)
    return int(mask[y0:y1, x0:x1].sum())


def keep_changed(record: ImageRecord, mask: np.ndarray, min_changed: int) -> ImageRecord:
    """`record` without the detections whose box covers fewer than `min_changed` changed pixels."""
    keep = np.array([changed_pixels(mask, box) >= min_changed for box in record.det_boxes], bool).reshape(-1)
    return ImageRecord(
        image_id=record.image_id,
        width=record.width,
        height=record.height,
        gt_boxes=record.gt_boxes,
        gt_classes=record.gt_classes,
        det_boxes=record.det_boxes[keep],
        det_scores=record.det_scores[keep],
        det_classes=record.det_classes[keep],
    )


def predict_records(checkpoint: Path, samples: list[Sample], threads: int) -> tuple[list[ImageRecord], list]:
    """Held-out records as the checkpoint's bundle answers them (every detection down to score 0 kept)."""
    from rich.progress import track

    from defectdet.export.compare_score import to_record
    from defectdet.export.exporter import export_bundle
    from defectdet.runtime.predictor import Predictor

    bundle = checkpoint.with_suffix(".onnx")
    if not bundle.is_file():
        export_bundle(checkpoint, bundle)
    predictor = Predictor(bundle, threads=threads)
    if predictor.metadata.template:
        raise SystemExit(f"{checkpoint}: this model reads templates; the oracle is for models without them")
    class_ids = {name: index for index, name in enumerate(predictor.metadata.class_names)}
    records = [
        to_record(sample, predictor.predict(sample.image_path, score_floor=0.0), class_ids)
        for sample in track(samples, description="predicting held-out pairs")
    ]
    return records, list(predictor.metadata.class_names)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("checkpoint", type=Path, help="last.pt of a run trained without templates")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--split", default="val", help="the held-out split of the DeepPCB reader")
    parser.add_argument("--min-changed", type=int, default=6)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    limit_threads(args.threads)
    if not args.checkpoint.is_file():
        parser.error(f"no checkpoint at {args.checkpoint}")
    samples = [s for s in load_dataset(args.data, args.split, format="deeppcb").samples if s.template_path]
    records, class_names = predict_records(args.checkpoint, samples, args.threads)
    masks = [change_mask(sample.image_path, sample.template_path) for sample in samples]
    oracle = [
        keep_changed(record, mask, args.min_changed) for record, mask in zip(records, masks, strict=True)
    ]
    gt_changed = [
        changed_pixels(mask, box) >= args.min_changed
        for record, mask in zip(records, masks, strict=True)
        for box in record.gt_boxes
    ]
    dropped = sum(len(a.det_boxes) - len(b.det_boxes) for a, b in zip(records, oracle, strict=True))
    as_is, with_oracle = coco_metrics(records, class_names), coco_metrics(oracle, class_names)
    rows = [
        ["all (mAP@0.5)", as_is["mAP50"], with_oracle["mAP50"]],
        *[[name, as_is["class_AP50"][name], with_oracle["class_AP50"][name]] for name in class_names],
    ]
    print_table(
        "held-out AP50: as the model answers vs. detections on unchanged design dropped",
        ["", "as is", "template oracle"],
        rows,
    )
    gt_share = sum(gt_changed) / max(1, len(gt_changed))
    print(f"labelled defects whose box shows a change: {gt_share:.3f} of {len(gt_changed)}")
    write_result(
        f"template_oracle_{args.checkpoint.parent.name}",
        {
            "command": " ".join(["python -m bench.template_oracle", *sys.argv[1:]]),
            "checkpoint": str(args.checkpoint),
            "split": args.split,
            "pairs": len(samples),
            "min_changed_pixels": args.min_changed,
            "ground_truth_boxes_with_change": gt_share,
            "ground_truth_boxes": len(gt_changed),
            "detections_dropped": dropped,
            "detections": sum(len(record.det_boxes) for record in records),
            "as_is": {
                "mAP50": as_is["mAP50"],
                "mAP50_95": as_is["mAP50_95"],
                "class_AP50": as_is["class_AP50"],
            },
            "template_oracle": {
                "mAP50": with_oracle["mAP50"],
                "mAP50_95": with_oracle["mAP50_95"],
                "class_AP50": with_oracle["class_AP50"],
            },
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What the repeat check buys and costs: one template-free checkpoint scored with the check off and on.

    python -m bench.repeat_check RUN/last.pt --data DATA [--split val] [--format F] [--flip-views none,lr+ud]
        [--threads 2]
    python -m bench.repeat_check --labels-only --data DATA [--split train] [--tag T]

For every view set of `--flip-views` the checkpoint is exported to a bundle (`defectdet export --flip-views`),
and the bundle is scored with `defectdet val` on `--split` twice, `--no-repeat-check` and `--repeat-check`
(pycocotools mAP@0.5, per class; no operating threshold involved), and timed end to end with `Predictor.predict`
at the bundle's operating threshold (the check then looks at the detections a user gets). Two safety figures
need no model: the share of the split's labelled defects the check would call repeated design (each labelled
box checked as if it were a detection; it should be near 0), and, on pairs that carry a golden template
(DeepPCB), how many of the detections the check dropped cover a change from the template (a true defect
dropped) against how many sat on unchanged design (`bench/template_oracle.py`'s change mask). Give the run's
`last.pt`. Writes `bench/results/repeat_check_<checkpoint's run folder>[_<tag>].json`; `--labels-only` (no
checkpoint) only the labelled-defect figure, for any dataset (other industries, gray or colour), to
`bench/results/repeat_check_labels_<data folder>_<split>[_<tag>].json`.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import limit_threads, print_table, write_result
from bench.flip_views import latency_ms
from bench.template_oracle import change_mask, changed_pixels
from defectdet.data.formats import load_dataset
from defectdet.data.imageio import read_image
from defectdet.data.sample import Sample
from defectdet.engine.bundle_model import load_bundle_model
from defectdet.engine.predict import predict_records
from defectdet.engine.validate import validate
from defectdet.export.exporter import export_bundle
from defectdet.runtime.repeat_check import CHECK_FLOOR, as_gray, repeat_evidence, repeated_mask


def labelled_boxes_called_repeated(samples: list[Sample], class_names: list[str]) -> dict:
    """Per class: the share of labelled defects whose box the check calls repeated design."""
    called: dict[str, list[bool]] = {name: [] for name in class_names}
    for sample in samples:
        gray = as_gray(read_image(sample.image_path))
        shrunk: dict = {}  # the image's shrunk copies, shared by its boxes as `repeated_mask` shares them
        for box, class_id in zip(sample.boxes, sample.classes, strict=True):
            called[class_names[int(class_id)]].append(repeat_evidence(gray, box, shrunk).repeated)
    everything = [flag for flags in called.values() for flag in flags]
    return {
        "boxes": len(everything),
        "share_called_repeated": float(np.mean(everything)) if everything else 0.0,
        "by_class": {name: float(np.mean(flags)) if flags else None for name, flags in called.items()},
    }


def dropped_against_template(bundle: Path, samples: list[Sample], threads: int) -> dict | None:
    """On pairs with golden templates: of the detections (score >= the check's floor) the check drops, how many
    cover a change from the template (a true defect lost) and how many sit on unchanged design."""
    paired = [sample for sample in samples if sample.template_path is not None]
    if not paired:
        return None
    model, _ = load_bundle_model(bundle, threads)
    from defectdet.runtime.spec import ModelSpec

    spec = ModelSpec.from_bundle(model.metadata).with_repeat_check(False)
    records, _ = predict_records(model, paired, spec)
    on_change = on_design = kept = 0
    for sample, record in zip(paired, records, strict=True):
        dropped = repeated_mask(read_image(sample.image_path), record.det_boxes, record.det_scores)
        mask = change_mask(sample.image_path, sample.template_path)
        for box in record.det_boxes[dropped]:
            if changed_pixels(mask, box) >= 6:
                on_change += 1
            else:
                on_design += 1
        kept += int((record.det_scores >= CHECK_FLOOR).sum() - dropped.sum())
    return {"dropped_on_change": on_change, "dropped_on_unchanged_design": on_design, "checked_kept": kept}


def labels_only(dataset: Any, args: argparse.Namespace) -> int:
    """The labelled-defect figure alone: no model, any dataset."""
    labelled = labelled_boxes_called_repeated(dataset.samples, dataset.class_names)
    print_table(
        f"labelled defects the repeat check calls repeated design: {args.data} [{args.split}]",
        ["class", "share"],
        [["all", labelled["share_called_repeated"]], *labelled["by_class"].items()],
    )
    folder = args.data.parent.name if args.data.is_file() else args.data.name  # data.yaml: its folder
    name = f"repeat_check_labels_{folder}_{args.split}" + (f"_{args.tag}" if args.tag else "")
    path = write_result(
        name,
        {
            "command": " ".join(["python -m bench.repeat_check", *sys.argv[1:]]),
            "data": str(args.data),
            "split": args.split,
            "images": len(dataset.samples),
            "labelled_defects": labelled,
        },
    )
    print(f"wrote {path}")
    return 0


def score(bundle: Path, args: argparse.Namespace, folder: Path, repeat_check: bool) -> dict:
    metrics = validate(
        bundle, args.data, split=args.split, format=args.format, protocol="coco", out=folder,
        threads=args.threads, repeat_check=repeat_check,
    )  # fmt: skip
    return {
        "mAP50": metrics["coco"]["mAP50"],
        "mAP50_95": metrics["coco"]["mAP50_95"],
        "class_AP50": metrics["coco"]["class_AP50"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("checkpoint", type=Path, nargs="?", help="a template-free run's last.pt")
    parser.add_argument("--labels-only", action="store_true", help="only the labelled-defect figure")
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--split", default="val")
    parser.add_argument("--format", default=None, help="dataset format (default: detected)")
    parser.add_argument("--flip-views", default="none", help="comma-separated view sets to export with")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--timed", type=int, default=60, help="images timed end to end")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--tag", default="", help="appended to the result file's name")
    args = parser.parse_args()
    limit_threads(args.threads)
    dataset = load_dataset(args.data, args.split, format=args.format)
    if args.labels_only:
        return labels_only(dataset, args)
    if args.checkpoint is None or not args.checkpoint.is_file():
        parser.error(f"no checkpoint at {args.checkpoint}")
    timed = dataset.samples[: args.timed]
    images = [sample.image_path for sample in timed]
    arms, rows = {}, []
    with tempfile.TemporaryDirectory() as folder:
        for views in args.flip_views.split(","):
            bundle = Path(folder) / f"{views}.onnx"
            export_bundle(args.checkpoint, bundle, data=args.data, split=args.split, flip_views=views)
            arm = {}
            for repeat_check in (False, True):
                key = "repeat_check" if repeat_check else "plain"
                arm[key] = score(bundle, args, Path(folder) / f"val_{views}_{key}", repeat_check)
                arm[key]["latency_ms"] = latency_ms(
                    bundle, images, [None] * len(images), args.warmup, args.threads, repeat_check=repeat_check
                )
                rows.append([views, key, arm[key]["mAP50"], arm[key]["latency_ms"]["p50"],
                             *arm[key]["class_AP50"].values()])  # fmt: skip
            arm["gain_mAP50"] = arm["repeat_check"]["mAP50"] - arm["plain"]["mAP50"]
            arm["dropped"] = dropped_against_template(bundle, dataset.samples, args.threads)
            arms[views] = arm
    names = list(next(iter(arms.values()))["plain"]["class_AP50"])
    print_table(
        f"repeat check: {args.checkpoint} on {args.data} [{args.split}]",
        ["views", "check", "mAP50", "p50 ms", *names],
        rows,
    )
    labelled = labelled_boxes_called_repeated(dataset.samples, dataset.class_names)
    print(f"labelled defects the check calls repeated: {labelled['share_called_repeated']:.3f} of "
          f"{labelled['boxes']}")  # fmt: skip
    for views, arm in arms.items():
        print(f"{views}: dropped detections against the template: {arm['dropped']}")
    path = write_result(
        f"repeat_check_{args.checkpoint.parent.name}" + (f"_{args.tag}" if args.tag else ""),
        {
            "command": " ".join(["python -m bench.repeat_check", *sys.argv[1:]]),
            "checkpoint": str(args.checkpoint),
            "data": str(args.data),
            "split": args.split,
            "threads": args.threads,
            "arms": arms,
            "labelled_defects": labelled,
        },
    )
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

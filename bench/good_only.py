"""A good-parts-only model on DeepPCB: fitted on defect-free templates alone, scored on held-out board groups.

    python -m bench.good_only --minutes 2            # -> bench/results/good_only_deeppcb_2min.json

DeepPCB (../shared/datasets/deeppcb) pairs every tested board image (with defects) with a defect-free template
of the same place. The model is fitted (`defectdet.anomaly.fit_good_only`, the `defectdet fit` command) on the
templates of the training board groups only, under a time budget; the split is the one `bench/realdata.py` and
`train` use (`data.formats.deeppcb`: the highest-numbered groups held out). On the held-out groups it is scored
through the torch-free runtime:

- image AUROC: the image score (the largest calibrated cell score) of each tested image (all defective) against
  each held-out template (all good), ties counted half; computed with NumPy;
- false-call rate: the share of held-out templates the bundle's own threshold flags (the threshold was chosen
  on held-out templates of the training groups at the target rate);
- escape rate: the share of tested images it does not flag;
- box AP@0.5, class-agnostic (COCO, pycocotools): every DeepPCB box as one class "defect", the bundle's boxes
  at a low score floor (`--ap-floor`) and at its threshold (the boxes an operator sees);
- model latency: the graph's run time per image at the bundle's input size, on this shared machine.

Exits 0 without writing anything when ../shared is absent. A run from a tree with uncommitted code is refused
unless `--allow-dirty` (then the file lists it).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import limit_threads, print_table, uncommitted_code, write_result

SHARED = Path(__file__).resolve().parents[2] / "shared" / "datasets"
WORK = Path("runs/bench_good_only")
PUBLISHED_CONTEXT = (
    "PatchCore (Roth et al., 2022) reports 0.99 image AUROC on MVTec AD, fitted on a GPU: other data, "
    "not comparable figure for figure"
)


def auroc(positives: np.ndarray, negatives: np.ndarray) -> float | None:
    """P(positive score > negative score) + half the ties: the area under the ROC curve."""
    positives, negatives = np.asarray(positives, np.float64), np.asarray(negatives, np.float64)
    if not len(positives) or not len(negatives):
        return None
    order = np.sort(negatives)
    below = np.searchsorted(order, positives, side="left")
    ties = np.searchsorted(order, positives, side="right") - below
    return float((below + 0.5 * ties).sum() / (len(positives) * len(negatives)))


def deeppcb_images(root: Path) -> dict[str, Any]:
    """Training groups' templates (to fit on), held-out groups' tested images with their boxes and templates."""
    from defectdet.data.formats import load_dataset

    train, held = load_dataset(root, "train").samples, load_dataset(root, "val").samples
    return {
        "fit": [sample.template_path for sample in train if sample.template_path is not None],
        "defective": [(sample.image_path, sample.boxes) for sample in held],
        "good": [sample.template_path for sample in held if sample.template_path is not None],
        "groups": {
            "fit": sorted({_group(sample) for sample in train}),
            "held_out": sorted({_group(sample) for sample in held}),
        },
    }


def _group(sample: Any) -> str:
    from defectdet.data.formats.deeppcb import group_of

    return group_of(sample)


def score_images(
    bundle: Path, images: list[tuple[Path, np.ndarray | None]], ap_floor: float, tag: str
) -> dict[str, Any]:
    """Per image: the image score, the verdict at the bundle's threshold, ImageRecords at `ap_floor` and at the
    threshold, the graph's run time."""
    from defectdet.evaluation.types import ImageRecord
    from defectdet.runtime import pipeline
    from defectdet.runtime.predictor import Predictor

    predictor = Predictor(bundle)
    threshold = predictor.metadata.thresholds.threshold
    settings = predictor.spec.postprocess
    scores, model_ms = [], []
    records: dict[str, list[ImageRecord]] = {"floor": [], "threshold": []}
    for index, (path, boxes) in enumerate(images):
        prepared = predictor.prepare(predictor.load(path), None)
        started = time.perf_counter()
        predictions, _ = predictor.run(prepared.inputs)
        model_ms.append((time.perf_counter() - started) * 1e3)
        scores.append(float(predictions[0, :, 4].max()))
        truth = np.zeros((0, 4), np.float32) if boxes is None else boxes
        size = (prepared.transform.original_width, prepared.transform.original_height)
        for key, floor in (("floor", ap_floor), ("threshold", threshold)):
            found = pipeline.finish(
                predictions, prepared, dataclasses.replace(settings, score_floor=floor)
            )
            records[key].append(
                ImageRecord(
                    f"{tag}{index}",
                    *size,
                    truth,
                    np.zeros(len(truth)),
                    found.boxes,
                    found.scores,
                    found.classes,
                )
            )
    return {"scores": np.array(scores), "records": records, "model_ms": model_ms, "threshold": threshold}


def box_ap50(records: list[Any]) -> float | None:
    from defectdet.evaluation.coco import coco_metrics

    return coco_metrics(records, ["defect"])["mAP50"]


def run(args: argparse.Namespace) -> Path | None:
    from defectdet.anomaly import FitSettings, fit_good_only

    root = args.shared / "deeppcb"
    if not root.is_dir():
        print(f"skipped: {root} is absent")
        return None
    dirty = uncommitted_code()
    if dirty and not args.allow_dirty:
        raise SystemExit(f"uncommitted code {dirty}: commit first, or pass --allow-dirty")
    data = deeppcb_images(root)
    settings = FitSettings(
        minutes=args.minutes, input_size=args.input_size, false_call_rate=args.false_call_rate, seed=args.seed
    )
    fitted = fit_good_only(data["fit"], args.work / "model.onnx", settings)
    if args.limit:  # a quick look: the first images of each kind only
        data["defective"], data["good"] = data["defective"][: args.limit], data["good"][: args.limit]
    defective = score_images(fitted.bundle, data["defective"], args.ap_floor, "tested")
    good = score_images(fitted.bundle, [(path, None) for path in data["good"]], args.ap_floor, "template")
    threshold = defective["threshold"]
    payload = _payload(args, data, fitted, defective, good, threshold)
    path = write_result(f"good_only_deeppcb_{args.minutes:g}min", payload)
    _print(payload)
    return path


def _payload(
    args: argparse.Namespace, data: dict, fitted: Any, defective: dict, good: dict, threshold: float
) -> dict[str, Any]:
    calibration = fitted.calibration
    latency = defective["model_ms"] + good["model_ms"]
    return {
        "dataset": "DeepPCB (trainval half): templates of the training board groups as the good images",
        "minutes": args.minutes,
        "seed": args.seed,
        "groups": data["groups"],
        "fit": {
            "images_available": len(data["fit"]),
            "fit_images": fitted.fit_images,
            "heldout_images": fitted.heldout_images,
            "memory_vectors": fitted.memory_vectors,
            "input_size": fitted.metadata.input_size,
            "timings_s": fitted.timings,
            "threshold_chosen_on": fitted.metadata.thresholds.threshold_source,
            "false_call_rate_target": calibration.target_rate,
            "heldout_false_call_rate_fit_groups": calibration.false_call_rate,
        },
        "evaluated_on": {
            "defective": f"{len(data['defective'])} tested images of the held-out groups (every one has defects)",
            "good": f"{len(data['good'])} templates of the held-out groups",
        },
        "image_auroc": auroc(defective["scores"], good["scores"]),
        "threshold": threshold,
        "false_call_rate": float((good["scores"] >= threshold).mean()),
        "escape_rate": float((defective["scores"] < threshold).mean()),
        "box_AP50_class_agnostic": {
            f"score_floor_{args.ap_floor:g}": box_ap50(
                defective["records"]["floor"] + good["records"]["floor"]
            ),
            "at_threshold": box_ap50(defective["records"]["threshold"] + good["records"]["threshold"]),
        },
        "model_ms": {"p50": statistics.median(latency), "mean": statistics.fmean(latency)},
        "context": PUBLISHED_CONTEXT,
        "note": "a shared machine (other work ran beside it; see environment.machine.load_average)",
    }


def _print(payload: dict[str, Any]) -> None:
    ap = payload["box_AP50_class_agnostic"]
    rows = [
        ["image AUROC", payload["image_auroc"]],
        ["false-call rate (held-out groups)", payload["false_call_rate"]],
        ["escape rate (held-out groups)", payload["escape_rate"]],
        *[[f"box AP@0.5 ({key})", value] for key, value in ap.items()],
        [
            "fit images / memory vectors",
            f"{payload['fit']['fit_images']} / {payload['fit']['memory_vectors']}",
        ],
        ["model ms p50", payload["model_ms"]["p50"]],
    ]
    print_table(f"good parts only, DeepPCB, {payload['minutes']:g} min", ["figure", "value"], rows)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--minutes", type=float, default=2.0, help="fitting time budget")
    parser.add_argument("--input-size", type=int, default=640, help="DeepPCB images are 640 x 640")
    parser.add_argument("--false-call-rate", type=float, default=0.01)
    parser.add_argument(
        "--ap-floor", type=float, default=0.05, help="score floor of the boxes AP is measured on"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None, help="torch threads while fitting")
    parser.add_argument("--shared", type=Path, default=SHARED, help="the folder holding deeppcb/")
    parser.add_argument("--work", type=Path, default=WORK)
    parser.add_argument("--limit", type=int, default=None, help="score only this many images of each kind")
    parser.add_argument("--allow-dirty", action="store_true")
    args = parser.parse_args()
    limit_threads(args.threads)
    path = run(args)
    if path is not None:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

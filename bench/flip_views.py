"""What test-time flips buy and cost: one checkpoint exported with each `--flip-views`, scored and timed.

    python -m bench.flip_views RUN/last.pt --data DATA [--split val] [--format yolo] [--threads 2]

For every view set (none, lr, lr+ud) the checkpoint is exported to a bundle (`defectdet export --flip-views`),
the bundle is scored with `defectdet val` on `--split` (pycocotools mAP@0.5, per class; mAP needs no operating
threshold) and `Predictor.predict` is timed end to end (decode, letterbox, the graph, NMS) on the split's
first `--timed` images after `--warmup` calls. Everything is the product's own path: what a user who exports
with the option gets. Give the run's `last.pt`: `best.pt` was picked on a validation split, perhaps this one.
Writes `bench/results/flip_views_<checkpoint's run folder>.json`.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.common import limit_threads, print_table, write_result
from defectdet.data.formats import load_dataset
from defectdet.engine.validate import validate
from defectdet.export.exporter import export_bundle
from defectdet.model.flip_average import FLIP_VIEWS
from defectdet.runtime.predictor import Predictor


def latency_ms(
    bundle: Path,
    images: list[Path],
    templates: list[Path | None],
    warmup: int,
    threads: int,
    repeat_check: bool | None = None,
) -> dict:
    """p50 / p95 of `Predictor.predict` in milliseconds over `images` (with their templates when it reads them);
    `repeat_check` as `Predictor` takes it (None: as the bundle was exported)."""
    predictor = Predictor(bundle, threads=threads, repeat_check=repeat_check)
    use_template = predictor.metadata.template
    calls = [
        (image, template if use_template else None) for image, template in zip(images, templates, strict=True)
    ]
    for image, template in calls[:warmup]:
        predictor.predict(image, template)
    times = []
    for image, template in calls:
        start = time.perf_counter()
        predictor.predict(image, template)
        times.append((time.perf_counter() - start) * 1000)
    return {
        "p50": float(np.percentile(times, 50)),
        "p95": float(np.percentile(times, 95)),
        "calls": len(times),
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("checkpoint", type=Path, help="a run's last.pt")
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--split", default="val")
    parser.add_argument("--format", default=None, help="dataset format (default: detected)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--timed", type=int, default=60, help="images timed end to end")
    parser.add_argument("--warmup", type=int, default=10)
    args = parser.parse_args()
    limit_threads(args.threads)
    if not args.checkpoint.is_file():
        parser.error(f"no checkpoint at {args.checkpoint}")
    samples = load_dataset(args.data, args.split, format=args.format).samples[: args.timed]
    images, templates = [s.image_path for s in samples], [s.template_path for s in samples]
    arms = {}
    with tempfile.TemporaryDirectory() as folder:
        for views in FLIP_VIEWS:
            bundle = export_bundle(
                args.checkpoint,
                Path(folder) / f"{views}.onnx",
                data=args.data,
                split=args.split,
                flip_views=views,
            ).bundle
            metrics = validate(
                bundle, args.data, split=args.split, format=args.format, protocol="coco",
                out=Path(folder) / f"val_{views}", threads=args.threads,
            )  # fmt: skip
            arms[views] = {
                "mAP50": metrics["coco"]["mAP50"],
                "mAP50_95": metrics["coco"]["mAP50_95"],
                "class_AP50": metrics["coco"]["class_AP50"],
                "latency_ms": latency_ms(bundle, images, templates, args.warmup, args.threads),
            }
    names = list(arms["none"]["class_AP50"])
    print_table(
        f"test-time flips: {args.checkpoint} on {args.data} [{args.split}]",
        ["views", "mAP50", "p50 ms", *names],
        [
            [views, arm["mAP50"], arm["latency_ms"]["p50"], *(arm["class_AP50"][name] for name in names)]
            for views, arm in arms.items()
        ],
    )
    path = write_result(
        f"flip_views_{args.checkpoint.parent.name}",
        {
            "command": " ".join(["python -m bench.flip_views", *sys.argv[1:]]),
            "checkpoint": str(args.checkpoint),
            "data": str(args.data),
            "split": args.split,
            "threads": args.threads,
            "arms": arms,
            "gain_mAP50": {views: arm["mAP50"] - arms["none"]["mAP50"] for views, arm in arms.items()},
        },
    )
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

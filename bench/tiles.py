"""What tiled inference buys and costs: held-out mAP with and without tiles, and the bundle's latency per image.

    python -m bench.tiles [--checkpoint runs/bench_surface/run_10min/last.pt]
                          [--data runs/bench_surface/data/data.yaml] [--split val] [--threads 2]

One checkpoint, scored twice by `engine.validate.validate` on the same split (`tiles=False` / `tiles=True`),
then exported once and timed with the torch-free `Predictor` on every image of the split, tiles off and on:
end-to-end milliseconds (decode to detections) for the images tiling leaves alone and for those it tiles
(long side over 1.5x the letterbox), with the number of tiles. Writes bench/results/tiles.json.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from bench.common import print_table, summarize, write_result
from defectdet.data.formats import load_dataset
from defectdet.data.imageio import read_image_size
from defectdet.data.tiling import TILE_TRIGGER
from defectdet.engine.validate import validate
from defectdet.export.exporter import export_bundle
from defectdet.runtime.predictor import Predictor


def time_predictor(bundle: Path, paths: list[Path], tiles: bool, threads: int) -> list[tuple[float, int]]:
    """(total ms, tiles run) per image, after one warm-up call."""
    predictor = Predictor(bundle, threads=threads, tiles=tiles)
    predictor.predict(paths[0])
    timings = []
    for path in paths:
        started = time.perf_counter()
        result = predictor.predict(path)
        timings.append(((time.perf_counter() - started) * 1e3, result.tiles))
    return timings


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--checkpoint", type=Path, default=Path("runs/bench_surface/run_10min/last.pt"))
    parser.add_argument("--data", type=Path, default=Path("runs/bench_surface/data/data.yaml"))
    parser.add_argument("--split", default="val")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("runs/bench_tiles"))
    args = parser.parse_args()

    scores = {}
    for tiles in (False, True):
        metrics = validate(
            args.checkpoint,
            args.data,
            split=args.split,
            protocol="coco",
            out=args.out / f"val_tiles_{tiles}",
            tiles=tiles,
        )
        scores[f"tiles_{'on' if tiles else 'off'}"] = {
            "mAP50": metrics["headline"]["mAP50"],
            "mAP50_95": metrics["headline"]["mAP50_95"],
            "class_AP50": metrics["coco"]["class_AP50"],
        }
    bundle = export_bundle(args.checkpoint, args.out / "model.onnx").bundle
    predictor = Predictor(bundle)
    size = predictor.metadata.input_size
    if predictor.metadata.template:
        print("this bench times bundles without a template", file=sys.stderr)
        return 2
    paths = [sample.image_path for sample in load_dataset(args.data, args.split).samples]
    tiled = np.array([max(read_image_size(path)) > TILE_TRIGGER * size for path in paths])
    latency = {}
    for tiles in (False, True):
        timings = time_predictor(bundle, paths, tiles, args.threads)
        ms = np.array([t for t, _ in timings])
        counts = np.array([n for _, n in timings])
        latency[f"tiles_{'on' if tiles else 'off'}"] = {
            "untiled_images_ms": summarize(ms[~tiled].tolist()) if (~tiled).any() else None,
            "tiled_images_ms": summarize(ms[tiled].tolist()) if tiled.any() else None,
            "tiles_per_tiled_image": summarize(counts[tiled].tolist()) if tiled.any() else None,
        }
    rows = []
    for key in ("tiles_off", "tiles_on"):
        rows.append(
            [
                key,
                round(scores[key]["mAP50"], 3),
                round(scores[key]["mAP50_95"], 3),
                (latency[key]["untiled_images_ms"] or {}).get("p50"),
                (latency[key]["tiled_images_ms"] or {}).get("p50"),
                (latency[key]["tiled_images_ms"] or {}).get("p90"),
            ]
        )
    print_table(
        f"tiled inference on {args.data} ({args.split}: {len(paths)} images, {int(tiled.sum())} over "
        f"{TILE_TRIGGER:g}x the {size} px letterbox)",
        [
            "inference",
            "mAP@0.5",
            "mAP@0.5:0.95",
            "p50 ms other images",
            "p50 ms large images",
            "p90 ms large",
        ],
        rows,
    )
    path = write_result(
        "tiles",
        {
            "settings": {
                "checkpoint": str(args.checkpoint),
                "data": str(args.data),
                "split": args.split,
                "threads": args.threads,
                "input_size": size,
                "images": len(paths),
                "tiled_images": int(tiled.sum()),
            },
            "held_out": scores,
            "latency": latency,
        },
    )
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

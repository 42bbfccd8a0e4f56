"""Side by side with a YOLOv8n on the surface family: same machine, same split, same minutes, same evaluator.

    .venv/bin/python -m bench.peers_surface [--minutes 10] [--models yolov8n.yaml] [--yolo-imgsz 640]

The data is bench/train_surface.py's (`defectdet synth --kind surface`, 600 images, seed 0; 128-2048 px,
half colour, no template; 20% held out as `val`). In one run, one after the other:
1. ours: `TrainConfig(data=..., time_minutes=...)` and nothing else (the settings the data chose), scored on
   `val` by `engine.validate.validate` (tiles as chosen);
2. each peer: bench/peers_yolo.py in `.venv-peers` (Ultralytics is AGPL-3.0 and lives only there, see
   bench/peers.py) trains it from its yaml, no pretrained weights, for the same minutes at `--yolo-imgsz`
   (their default 640), CPU, their defaults otherwise, and predicts `val` at conf 0.001;
3. the peers' predictions are scored by OUR evaluator (`evaluate_records`, COCO protocol via pycocotools) on the
   same `val` images and boxes.
Writes bench/results/<--name>.json and prints one table with each model's mAP as a ratio to ours.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path
from types import SimpleNamespace

from bench import common, peers, train_surface
from defectdet.data.formats import load_dataset
from defectdet.engine.checkpoint import load_detector
from defectdet.engine.config import TrainConfig
from defectdet.engine.trainer import train
from defectdet.engine.validate import validate
from defectdet.evaluation.report import evaluate_records
from defectdet.model import model_info

BENCH = Path(__file__).resolve().parent


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--minutes", type=float, default=10.0, help="wall-clock training budget per model")
    parser.add_argument("--models", nargs="+", default=["yolov8n.yaml"])
    parser.add_argument("--yolo-imgsz", type=int, default=640, help="the peers' input size (their default)")
    parser.add_argument("--images", type=int, default=600)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--peers-python", type=Path, default=peers.DEFAULT_PEERS_PYTHON)
    parser.add_argument("--out", type=Path, default=peers.ROOT / "runs" / "peers_surface")
    parser.add_argument("--name", default="peers_surface", help="bench/results/<name>.json")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    load_before = peers.start_run(args)

    data_yaml = train_surface.make_dataset(args.out / "data", args.images, args.seed).resolve()
    val = load_dataset(data_yaml, "val")
    class_names = list(val.class_names)
    peer_yaml = args.out / "data_abs.yaml"  # their loader resolves `path` against its own datasets folder
    peer_yaml.write_text(
        json.dumps(
            {
                "path": str(data_yaml.parent),
                "train": "images/train",
                "val": "images/val",
                "names": class_names,
            }
        )
    )
    images_json = args.out / "predict_images.json"
    images_json.write_text(
        json.dumps([{"id": s.image_id, "path": str(s.image_path.resolve())} for s in val.samples])
    )

    print(
        f"[peers_surface] ours: training {args.minutes:g} min with the settings the data chooses", flush=True
    )
    config = TrainConfig(
        data=data_yaml, time_minutes=args.minutes, out=args.out / "ours", seed=args.seed, progress=False
    )
    started = time.perf_counter()
    result = train(config)
    ours_seconds = time.perf_counter() - started
    checkpoint = result.last_checkpoint  # the final weights: best.pt is picked on the held-out split itself
    held_out = validate(checkpoint, data_yaml, split="val", protocol="coco", out=args.out / "ours_val")
    model, state = load_detector(checkpoint)
    chosen = state.get("config") or {}
    info = model_info(model, int(chosen.get("imgsz") or 640))
    rows = [
        {
            "model": "defectdet nano (default settings)",
            "input_px": chosen.get("imgsz"),
            "tiles": chosen.get("tiles"),
            "params": int(info["params"]),
            "train_minutes": round(ours_seconds / 60, 2),
            "epochs_done": result.state.epoch,
            "mAP50": held_out["headline"]["mAP50"],
            "mAP50_95": held_out["headline"]["mAP50_95"],
            "class_AP50": held_out["coco"]["class_AP50"],
        }
    ]
    peer_args = SimpleNamespace(
        peers_python=args.peers_python, minutes=args.minutes, out=args.out, imgsz=args.yolo_imgsz,
        threads=args.threads, seed=args.seed,
    )  # fmt: skip
    for model_yaml in args.models:
        document = peers.run_peer(model_yaml, peer_args, peer_yaml, images_json)
        records = peers.peer_records(val.samples, document["predictions"])
        name = document["model"]
        metrics = evaluate_records(
            records, class_names, args.out / name, "coco", plots=False, title=f"{name} on surfaces"
        )
        rows.append(
            {
                "model": name,
                "input_px": args.yolo_imgsz,
                "tiles": False,
                "params": document["params"],
                "train_minutes": round(document["train_seconds"] / 60, 2),
                "epochs_done": document["epochs_done"],
                "mAP50": metrics["headline"]["mAP50"],
                "mAP50_95": metrics["headline"]["mAP50_95"],
                "class_AP50": metrics["coco"]["class_AP50"],
                "versions": document["versions"],
                "train_settings": document["train_settings"],
            }
        )
    ours_map = rows[0]["mAP50"] or 0.0
    for row in rows:
        row["mAP50_ratio_to_ours"] = (row["mAP50"] or 0.0) / ours_map if ours_map else None
    common.print_table(
        f"surfaces, {args.minutes:g} min per model on this CPU, held-out val ({len(val.samples)} images), our evaluator",
        ["model", "input px", "params", "train min", "epochs", "mAP@0.5", "mAP@.5:.95", "x ours"],
        [
            [
                r["model"],
                r["input_px"],
                r["params"],
                r["train_minutes"],
                r["epochs_done"],
                r["mAP50"],
                r["mAP50_95"],
                r["mAP50_ratio_to_ours"],
            ]
            for r in rows
        ],
    )
    path = common.write_result(
        args.name,
        {
            "settings": {
                "minutes": args.minutes,
                "images": args.images,
                "seed": args.seed,
                "threads": args.threads,
                "val_images": len(val.samples),
                "ours_settings_chosen": state.get("settings_chosen"),
                "load_average_before": load_before,
            },
            "rows": rows,
        },
    )
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

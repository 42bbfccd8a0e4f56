"""Child of bench/peers.py: train, predict with and export one Ultralytics YOLO model. Runs ONLY in `.venv-peers`.

    .venv-peers/bin/python bench/peers_yolo.py --model yolo11n.yaml --data runs/peers/yolo/data.yaml \
        --minutes 20 --images runs/peers/predict_images.json --out runs/peers/yolo11n --result yolo11n.json

Ultralytics is AGPL-3.0. It is installed only in the separate `.venv-peers` (`make bench-peers`), is never
imported by defectdet, its tests or any other bench script, and none of its code is copied into this repository:
this script only calls its public Python API (`YOLO(...).train/predict/export`) in a child process, and the
parent (bench/peers.py, in our own venv) reads back plain JSON.

Offline by construction: the model is built from its yaml (`pretrained=False`, no weights exist to download),
`amp=False` (so no AMP-check model is fetched), `plots=False` (no font download), `YOLO_OFFLINE=1` (their
connectivity check answers False), `YOLO_AUTOINSTALL=False` (no pip install behind our back) and a private
`YOLO_CONFIG_DIR` with `sync=False` (no analytics). These are set before `ultralytics` is imported.

Writes `--result`: versions, settings, params, GFLOPs (theirs and counted like ours, torch's FlopCounterMode,
2 FLOPs per multiply-add), train seconds, epochs done, their own final val metrics, the ONNX path, and per
image id: boxes xyxy in original pixels, scores, classes (conf >= --conf, their default NMS IoU 0.7).
"""

from __future__ import annotations

import argparse
import csv
import importlib.metadata
import json
import os
import platform
import sys
import time
from pathlib import Path

PACKAGES = (
    "ultralytics",
    "torch",
    "torchvision",
    "numpy",
    "opencv-python",
    "onnx",
    "onnxslim",
    "onnxruntime",
)


def offline_environment(config_dir: Path, threads: int) -> None:
    config_dir.mkdir(parents=True, exist_ok=True)
    os.environ["YOLO_OFFLINE"] = "1"
    os.environ["YOLO_AUTOINSTALL"] = "False"
    os.environ["YOLO_CONFIG_DIR"] = str(config_dir.resolve())
    os.environ["YOLO_VERBOSE"] = os.environ.get("YOLO_VERBOSE", "True")
    os.environ["OMP_NUM_THREADS"] = str(threads)  # ultralytics sets 1 when unset
    os.environ.setdefault("MPLBACKEND", "Agg")


def offline_gpu_patches() -> None:
    """On a GPU machine with no network: their AMP check would fetch a checkpoint to compare against
    (skipped: AMP is on, as their default on CUDA), and polars (about 170 MB, too large to carry there)
    only reads results.csv back into the checkpoint's metadata, which this bench reads itself."""
    from ultralytics.engine import trainer

    trainer.check_amp = lambda model: True
    try:
        import polars  # noqa: F401
    except ImportError:
        trainer.BaseTrainer.read_results_csv = lambda self: {}


def predict_multichannel(model, path: str, args: argparse.Namespace) -> dict:
    """One image of any channel count through their LetterBox (square, as their exported graphs run), the
    model and their NMS (conf >= --conf, IoU 0.7, 300 boxes), boxes scaled back to the original pixels as their
    predictor does."""
    import cv2
    import torch
    from ultralytics.data.augment import LetterBox
    from ultralytics.utils import nms, ops
    from ultralytics.utils.patches import imread

    image = imread(path, cv2.IMREAD_UNCHANGED)
    image = image[..., None] if image.ndim == 2 else image
    boxed = LetterBox((args.imgsz, args.imgsz), auto=False, stride=32)(image=image)
    boxed = boxed[..., None] if boxed.ndim == 2 else boxed
    tensor = torch.from_numpy(boxed.transpose(2, 0, 1).copy())[None].float().div(255).to(args.device)
    model = model.to(args.device).eval()
    with torch.no_grad():
        output = model(tensor)
    found = nms.non_max_suppression(output, args.conf, 0.7, max_det=300)[0]
    found[:, :4] = ops.scale_boxes(tensor.shape[2:], found[:, :4], image.shape[:2])
    found = found.cpu().numpy()
    return {
        "boxes": found[:, :4].round(2).tolist(),
        "scores": found[:, 4].round(5).tolist(),
        "classes": found[:, 5].astype(int).tolist(),
        "orig_shape": list(image.shape[:2]),
    }


def versions() -> dict[str, str | None]:
    found: dict[str, str | None] = {"python": platform.python_version()}
    for package in PACKAGES:
        try:
            found[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            found[package] = None
    return found


def input_channels(module) -> int:
    """The channels the model takes: 3, or 2 with a stacked template (its first convolution's input)."""
    import torch

    return next(m for m in module.modules() if isinstance(m, torch.nn.Conv2d)).in_channels


def counted_gflops(module, imgsz: int) -> float:
    """FLOPs of one eval forward at batch 1, imgsz x imgsz, counted like defectdet's model_info."""
    import copy

    import torch
    from torch.utils.flop_counter import FlopCounterMode

    model = copy.deepcopy(module).float().eval()
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(torch.zeros(1, input_channels(model), imgsz, imgsz))
    return counter.get_total_flops() / 1e9


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a model yaml: yolo11n.yaml, yolov8n.yaml")
    parser.add_argument("--data", type=Path, required=True, help="YOLO data.yaml written by bench/peers.py")
    parser.add_argument(
        "--minutes", type=float, default=20.0, help="wall-clock training budget (their time=)"
    )
    parser.add_argument("--images", type=Path, required=True, help='JSON list of {"id", "path"} to predict')
    parser.add_argument("--out", type=Path, required=True, help="their run folder")
    parser.add_argument("--result", type=Path, required=True, help="JSON written here")
    parser.add_argument("--imgsz", type=int, default=640)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--workers", type=int, default=0, help="their CPU trainer forces 0 anyway")
    parser.add_argument("--conf", type=float, default=0.001)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--device", default="cpu", help="cpu, or cuda for the GPU row (AMP on, their 8 loader workers)"
    )
    parser.add_argument("--no-export", action="store_true", help="skip the ONNX export (no onnxslim there)")
    args = parser.parse_args()
    offline_environment(args.out / "ultralytics_config", args.threads)

    import torch
    from ultralytics import YOLO, settings
    from ultralytics.utils.torch_utils import get_flops

    settings.update({"sync": False, "tensorboard": False, "runs_dir": str(args.out.resolve())})
    torch.set_num_threads(args.threads)
    on_gpu = args.device != "cpu"
    if on_gpu:
        offline_gpu_patches()

    name = Path(args.model).stem
    model = YOLO(args.model)  # architecture from yaml, random init
    train_settings = {
        "data": str(args.data.resolve()),
        "time": args.minutes / 60.0,  # hours; overrides epochs (re-estimated after the first epoch)
        "epochs": 100,  # their default; `time` decides
        "imgsz": args.imgsz,
        "device": args.device,
        "workers": 8 if on_gpu else args.workers,  # 8: their default; their CPU trainer forces 0
        "amp": on_gpu,
        "pretrained": False,
        "plots": False,
        "seed": args.seed,
        "project": str(args.out.resolve()),
        "name": "train",
        "exist_ok": True,
        "verbose": True,
    }
    started = time.perf_counter()
    model.train(**train_settings)
    train_seconds = time.perf_counter() - started
    trainer = model.trainer
    run_dir = Path(trainer.save_dir)
    best = run_dir / "weights" / "best.pt"
    if not best.is_file():
        best = run_dir / "weights" / "last.pt"
    rows: list[dict[str, str]] = []
    if (run_dir / "results.csv").is_file():
        with open(run_dir / "results.csv", newline="") as handle:
            rows = [
                {key.strip(): value.strip() for key, value in row.items()} for row in csv.DictReader(handle)
            ]
    their_val = {
        key: float(value) for key, value in (trainer.metrics or {}).items() if isinstance(value, (int, float))
    }

    trained = YOLO(str(best))
    fused = trained.model
    params = sum(p.numel() for p in fused.parameters())
    gflops_theirs = float(get_flops(fused, args.imgsz))
    gflops_counted = counted_gflops(fused, args.imgsz)

    images = json.loads(args.images.read_text())
    predictions: dict[str, dict] = {}
    started = time.perf_counter()
    paths = [item["path"] for item in images]
    ids = {str(Path(item["path"])): item["id"] for item in images}
    if input_channels(fused) == 3:
        for result in trained.predict(
            source=paths,
            imgsz=args.imgsz,
            conf=args.conf,
            device=args.device,
            stream=True,
            verbose=False,
            max_det=300,
        ):
            boxes = result.boxes
            predictions[ids[str(Path(result.path))]] = {
                "boxes": boxes.xyxy.cpu().numpy().round(2).tolist(),
                "scores": boxes.conf.cpu().numpy().round(5).tolist(),
                "classes": boxes.cls.cpu().numpy().astype(int).tolist(),
                "orig_shape": list(result.orig_shape),
            }
    else:  # their predict() loads 3 channels whatever the model takes: their letterbox, model and NMS by hand
        for path in paths:
            predictions[ids[str(Path(path))]] = predict_multichannel(fused, path, args)
    predict_seconds = time.perf_counter() - started

    onnx_path = (
        None
        if args.no_export
        else Path(trained.export(format="onnx", imgsz=args.imgsz, batch=1, device="cpu"))
    )
    document = {
        "model": name,
        "yaml": args.model,
        "versions": versions(),
        "train_settings": train_settings,
        "their_defaults_otherwise": True,
        "run_dir": str(run_dir),
        "weights": str(best),
        "params": int(params),
        "gflops_theirs": round(gflops_theirs, 4),
        "gflops_counted": round(gflops_counted, 4),
        "train_seconds": round(train_seconds, 1),
        "epochs_done": int(float(rows[-1]["epoch"])) if rows else 0,
        "epochs_planned_at_end": int(getattr(trainer, "epochs", 0) or 0),
        "batch": int(trainer.batch_size),
        "their_final_val": their_val,
        "results_csv": rows,
        "predict_seconds": round(predict_seconds, 1),
        "predict_conf": args.conf,
        "predict_nms_iou": 0.7,
        "onnx": str(onnx_path.resolve()) if onnx_path else None,
        "predictions": predictions,
    }
    args.result.parent.mkdir(parents=True, exist_ok=True)
    args.result.write_text(json.dumps(document))
    print(f"wrote {args.result}: {len(predictions)} images predicted, onnx {onnx_path}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

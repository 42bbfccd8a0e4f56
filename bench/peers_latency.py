"""Latency at matched input sizes, ours and YOLO in one process (issue 20 item 3).

    .venv/bin/python bench/peers_latency.py [--sizes 224,352,640] [--threads 1] [--runs 100]
        [--ours-checkpoint runs/bench_scaling/scaling_surface_nano_60min/best.pt]
        [--yolo-onnx runs/peers_ladder/peers_surface_yolo11n_352px_10min/yolo11n/train/weights/best.onnx]

1. Model only, at each size: our nano (3 channels, no template, the graph `defectdet export` writes) and
   YOLO11n / YOLOv8n (the ONNX their exporter writes from the yaml, in `.venv-peers`), random weights (weights do
   not change a graph's cost), batch 1, ONNX Runtime fp32, `--threads` threads, interleaved call by call.
2. End to end at 352 px on the surface family's held-out images, trained models on both sides: ours =
   `Predictor.predict` on the file bytes (decode, letterbox, model, NMS, boxes to original pixels); YOLO = the
   same stages with our code around their graph (bench/peers.py `peer_end_to_end`, score 0.25, IoU 0.7).
Writes bench/results/peers_latency.json; ratios are YOLO / ours (above 1: ours is faster).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
import common  # noqa: E402
import latency  # noqa: E402
import peers  # noqa: E402

OUT = Path("runs/peers_latency")
EXPORT = """
import sys
from pathlib import Path
from ultralytics import YOLO
model, size, out = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])
path = Path(YOLO(model).export(format="onnx", imgsz=size, batch=1, device="cpu"))
out.write_bytes(path.read_bytes())
"""


def yolo_graph(model: str, size: int) -> Path:
    """Their exporter's ONNX of `model` (random weights) at `size`, made in .venv-peers."""
    out = OUT / f"{model}_{size}.onnx"
    if not out.is_file():
        (OUT / "export").mkdir(parents=True, exist_ok=True)
        env = {
            "YOLO_OFFLINE": "1",
            "YOLO_AUTOINSTALL": "False",
            "YOLO_CONFIG_DIR": str((OUT / "cfg").resolve()),
        }
        subprocess.run(
            [str(peers.DEFAULT_PEERS_PYTHON), "-c", EXPORT, f"{model}.yaml", str(size), str(out.resolve())],
            cwd=OUT / "export", env={**os.environ, **env}, check=True, capture_output=True,
        )  # fmt: skip
    return out


def ours_graph(size: int) -> Path:
    import torch

    from defectdet.model import build_model

    torch.manual_seed(0)
    model = build_model("nano", num_classes=6, in_channels=3, template=False).eval()
    return latency.make_bundle(model, OUT / f"nano_{size}.onnx", size, 3, 6)


def model_only(paths: dict[str, Path], size: int, threads: int, runs: int) -> dict[str, dict]:
    """p50/p95 ms per graph, the graphs called in turn so that all see the same machine."""
    import onnxruntime

    from defectdet.runtime.predictor import session_options

    sessions = {
        name: onnxruntime.InferenceSession(
            str(path), session_options(threads), providers=["CPUExecutionProvider"]
        )
        for name, path in paths.items()
    }
    batch = np.random.default_rng(0).random((1, 3, size, size), dtype=np.float32)
    times: dict[str, list[float]] = {name: [] for name in sessions}
    for index in range(runs + 10):
        for name, session in sessions.items():
            started = time.perf_counter()
            session.run(None, {session.get_inputs()[0].name: batch})
            if index >= 10:
                times[name].append((time.perf_counter() - started) * 1e3)
    return {
        name: {
            "p50_ms": round(float(np.percentile(v, 50)), 2),
            "p95_ms": round(float(np.percentile(v, 95)), 2),
        }
        for name, v in times.items()
    }


def end_to_end(checkpoint: Path, yolo_onnx: Path, threads: int, runs: int) -> dict[str, dict]:
    import train_surface

    from defectdet.data.formats import load_dataset
    from defectdet.export.exporter import export_bundle
    from defectdet.runtime.predictor import Predictor

    data = train_surface.make_dataset(Path("runs/bench_surface/data"), 600, 0)
    samples = load_dataset(data, "val").samples[:32]
    pairs = [(s.image_path.read_bytes(), None) for s in samples]
    bundle = export_bundle(checkpoint, OUT / "ours_surface.onnx", force=True).bundle
    predictor = Predictor(bundle, threads=threads)
    size = predictor.metadata.input_size
    ours = latency.end_to_end(predictor, pairs, 10, runs)
    timing = SimpleNamespace(threads=threads, imgsz=size, warmup=10, runs=runs)
    theirs = peers.peer_end_to_end(yolo_onnx, pairs, timing)
    return {"imgsz": size, "images": len(samples), "ours": ours, "yolo11n": theirs}


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="224,352,640")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--ours-checkpoint", type=Path, default=None)
    parser.add_argument("--yolo-onnx", type=Path, default=None)
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    rows, table = [], []
    for size in (int(value) for value in args.sizes.split(",")):
        paths = {
            "defectdet nano": ours_graph(size),
            **{m: yolo_graph(m, size) for m in ("yolo11n", "yolov8n")},
        }
        found = model_only(paths, size, args.threads, args.runs)
        base = found["defectdet nano"]["p50_ms"]
        for name, value in found.items():
            rows.append(
                {"imgsz": size, "model": name, **value, "p50_ratio_to_ours": round(value["p50_ms"] / base, 2)}
            )
            table.append([size, name, value["p50_ms"], value["p95_ms"], round(value["p50_ms"] / base, 2)])
    common.print_table(
        "model only, ONNX Runtime fp32, batch 1", ["px", "model", "p50 ms", "p95 ms", "x ours"], table
    )
    e2e = None
    if args.ours_checkpoint and args.yolo_onnx:
        e2e = end_to_end(args.ours_checkpoint, args.yolo_onnx, args.threads, args.runs)
        ratio = e2e["yolo11n"]["e2e_total_p50_ms"] / e2e["ours"]["e2e_total_p50_ms"]
        e2e["yolo11n_over_ours_p50"] = round(ratio, 2)
        common.print_table(
            f"end to end at {e2e['imgsz']} px, surface held-out images",
            ["model", "p50 ms", "p95 ms"],
            [
                [name, e2e[name]["e2e_total_p50_ms"], e2e[name]["e2e_total_p95_ms"]]
                for name in ("ours", "yolo11n")
            ],
        )
    common.write_result(
        "peers_latency",
        {
            "command": "python bench/peers_latency.py " + " ".join(sys.argv[1:]),
            "settings": {"threads": args.threads, "runs": args.runs, "sizes": args.sizes},
            "model_only": rows,
            "end_to_end": e2e,
            "ours_checkpoint": str(args.ours_checkpoint) if args.ours_checkpoint else None,
            "yolo_onnx": str(args.yolo_onnx) if args.yolo_onnx else None,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

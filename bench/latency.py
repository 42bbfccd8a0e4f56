"""Latency of every model preset at 640x640, batch 1, on CPU: eager torch and ONNX Runtime.

Usage: ``python bench/latency.py [--threads 2] [--imgsz 640] [--runs 50] [--presets nano tiny]``
Writes ``bench/results/latency.json`` (see ``common.write_result``).

Reports p50/p95 milliseconds after warm-up, parameters and GFLOPs (FLOPs, not MACs)
for the DeepPCB setting (gray + template: 2 input channels, 6 classes).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/common.py
import common  # noqa: E402  (bench/common.py: machine info, JSON writing, rich table)

from defectdet.model import PRESETS, build_model, model_info  # noqa: E402
from defectdet.model.onnx_export import export_onnx  # noqa: E402


def percentiles(call: Callable[[], object], warmup: int, runs: int) -> tuple[float, float]:
    for _ in range(warmup):
        call()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        call()
        times.append((time.perf_counter() - start) * 1e3)
    times.sort()
    return statistics.median(times), times[min(len(times) - 1, int(round(0.95 * (len(times) - 1))))]


def bench_preset(
    preset: str, imgsz: int, threads: int, runs: int, warmup: int, channels: int, template: bool, classes: int
) -> dict[str, object]:
    import onnxruntime

    torch.manual_seed(0)
    model = build_model(preset, classes, channels, template).eval()
    info = model_info(model, imgsz)
    images = torch.rand(1, channels, imgsz, imgsz)
    with torch.inference_mode():
        eager_p50, eager_p95 = percentiles(lambda: model(images), warmup, runs)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / f"{preset}.onnx"
        export_onnx(model, path, channels, imgsz)
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
        session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        feed = {"images": images.numpy()}
        ort_p50, ort_p95 = percentiles(lambda: session.run(None, feed), warmup, runs)
    return {
        "preset": preset,
        "params": info["params"],
        "gflops": round(float(info["gflops"]), 4),
        "torch_p50_ms": round(eager_p50, 2),
        "torch_p95_ms": round(eager_p95, 2),
        "ort_p50_ms": round(ort_p50, 2),
        "ort_p95_ms": round(ort_p95, 2),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--imgsz", type=int, default=640)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--channels", type=int, default=2, help="2 = gray + template (DeepPCB)")
    parser.add_argument("--classes", type=int, default=6)
    parser.add_argument("--presets", nargs="*", default=list(PRESETS))
    parser.add_argument("--out-dir", type=Path, default=common.RESULTS_DIR)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    template = args.channels in (2, 6)
    rows = [
        bench_preset(
            preset, args.imgsz, args.threads, args.runs, args.warmup, args.channels, template, args.classes
        )
        for preset in args.presets
    ]
    settings = {key: value for key, value in vars(args).items() if key != "out_dir"}
    path = common.write_result("latency", {"settings": settings, "results": rows}, args.out_dir)
    columns = list(rows[0]) if rows else []
    common.print_table(
        f"model latency {args.imgsz}x{args.imgsz}, batch 1, {args.threads} threads (ms)",
        columns,
        [[row[column] for column in columns] for row in rows],
    )
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Latency per preset at 640x640, batch 1, on the CPU: every way to run the model, and end to end.

Usage: ``python -m bench.latency [--threads 2] [--runs 50] [--presets nano tiny small] [--no-compile]
[--data ../shared/datasets/deeppcb] [--peer yolo11n.onnx ...] [--rss-calls 1000]``
Writes ``bench/results/latency.json``.

Per preset (untrained weights at seed 0; latency does not depend on the values), model only: eager torch,
``torch.compile``, TorchScript (trace + freeze + optimize_for_inference), ONNX Runtime fp32 and int8 (static
QDQ calibrated on images of ``--data``). End to end with the torch-free ``Predictor`` on real JPEG pairs from
``--data`` (decode of the pair + letterbox + model + NMS + box mapping), split by stage. The Predictor's RSS
after ``--rss-calls`` calls is measured in a child process where torch cannot be imported.
Peer ONNX files (``--peer``) are timed model-only with the same harness and thread count.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from bench import common
from defectdet.export.exporter import export_onnx_graph, fold_batchnorm
from defectdet.model import PRESETS, build_model, model_info
from defectdet.runtime.bundle import BundleMetadata, write_metadata
from defectdet.runtime.predictor import Predictor

DEFAULT_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "datasets" / "deeppcb"


def percentiles(call: Callable[[], object], warmup: int, runs: int) -> tuple[float, float]:
    for _ in range(warmup):
        call()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        call()
        times.append((time.perf_counter() - start) * 1e3)
    times.sort()
    return statistics.median(times), times[min(len(times) - 1, round(0.95 * (len(times) - 1)))]


def make_bundle(model: torch.nn.Module, path: Path, imgsz: int, channels: int, classes: int) -> Path:
    export_onnx_graph(fold_batchnorm(copy.deepcopy(model)), path, channels, imgsz)
    write_metadata(
        path,
        BundleMetadata(
            defectdet_version="bench", created="bench", preset=path.stem, class_names=[str(i) for i in range(classes)],
            input_size=imgsz, channels=channels // 2 if channels in (2, 6) else channels, template=channels in (2, 6),
        ),
    )  # fmt: skip
    return path


def real_pairs(data: Path | None, count: int) -> list[tuple[bytes, bytes]]:
    """JPEG bytes of (tested, template) pairs from a DeepPCB-style dataset, or synthesized 640 px boards."""
    from defectdet.data.formats import load_dataset

    if data is not None and data.exists():
        samples = load_dataset(data, "val").samples[:count]
    else:
        from defectdet.data.synth import synthesize_dataset

        folder = Path(tempfile.mkdtemp())
        yaml_path = synthesize_dataset(
            folder, boards=count, seed=0, template=True, min_size=640, max_size=640
        )
        samples = load_dataset(yaml_path, "train").samples[:count]
    return [(Path(s.image_path).read_bytes(), Path(s.template_path).read_bytes()) for s in samples]


def end_to_end(
    predictor: Predictor, pairs: list[tuple[bytes, bytes]], warmup: int, runs: int
) -> dict[str, float]:
    for index in range(warmup):
        predictor.predict(*pairs[index % len(pairs)])
    stages: dict[str, list[float]] = {}
    for index in range(runs):
        result = predictor.predict(*pairs[index % len(pairs)])
        for stage, value in result.timings.items():
            stages.setdefault(stage, []).append(value)
    out = {}
    for stage, values in stages.items():
        values.sort()
        out[f"e2e_{stage}_p50_ms"] = round(statistics.median(values), 2)
    total = stages["total"]
    out["e2e_total_p95_ms"] = round(total[min(len(total) - 1, round(0.95 * (len(total) - 1)))], 2)
    return out


RSS_CHILD = """
import sys, json
class BlockTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError("blocked")
sys.meta_path.insert(0, BlockTorch())
from defectdet.runtime.predictor import Predictor

def rss_mb():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS"):
            return int(line.split()[1]) / 1024

bundle, pairs_file, calls, threads = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
pairs = json.load(open(pairs_file))
pairs = [(open(a, "rb").read(), open(b, "rb").read()) for a, b in pairs]
predictor = Predictor(bundle, threads=threads)
predictor.predict(*pairs[0])
after_first = rss_mb()
trace = []
for index in range(calls):
    predictor.predict(*pairs[index % len(pairs)])
    if index % 100 == 99:
        trace.append(round(rss_mb(), 1))
print(json.dumps({"rss_after_first_call_mb": round(after_first, 1), "rss_after_calls_mb": round(rss_mb(), 1),
                  "rss_trace_mb": trace, "torch_imported": "torch" in sys.modules}))
"""


def rss_in_child(
    bundle: Path, pairs: list[tuple[bytes, bytes]], calls: int, threads: int
) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as folder:
        files = []
        for index, (image, template) in enumerate(pairs):
            a, b = Path(folder) / f"{index}_test.jpg", Path(folder) / f"{index}_temp.jpg"
            a.write_bytes(image), b.write_bytes(template)
            files.append((str(a), str(b)))
        listing = Path(folder) / "pairs.json"
        listing.write_text(json.dumps(files))
        done = subprocess.run(
            [sys.executable, "-c", RSS_CHILD, str(bundle), str(listing), str(calls), str(threads)],
            capture_output=True, text=True, timeout=1800, check=True,
        )  # fmt: skip
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["rss_growth_mb"] = round(result["rss_after_calls_mb"] - result["rss_after_first_call_mb"], 1)
    result["calls"] = calls
    return result


def bench_preset(
    preset: str, args: argparse.Namespace, pairs: list[tuple[bytes, bytes]], folder: Path
) -> dict:
    from defectdet.export.quantize import quantize_onnx

    torch.manual_seed(0)
    channels, size = args.channels, args.imgsz
    model = build_model(preset, args.classes, channels, channels in (2, 6)).eval()
    info = model_info(model, size)
    images = torch.rand(1, channels, size, size)
    row: dict[str, object] = {
        "preset": preset,
        "params": info["params"],
        "gflops": round(float(info["gflops"]), 4),
    }
    with torch.inference_mode():
        row["eager_p50_ms"], row["eager_p95_ms"] = (
            round(v, 2) for v in percentiles(lambda: model(images), args.warmup, args.runs)
        )
        folded = fold_batchnorm(copy.deepcopy(model))
        traced = torch.jit.optimize_for_inference(torch.jit.freeze(torch.jit.trace(folded, images)))
        row["torchscript_p50_ms"], row["torchscript_p95_ms"] = (
            round(v, 2) for v in percentiles(lambda: traced(images), args.warmup, args.runs)
        )
        if args.compile:
            compiled = torch.compile(folded)
            start = time.perf_counter()
            compiled(images)
            row["compile_seconds"] = round(time.perf_counter() - start, 1)
            row["compile_p50_ms"], row["compile_p95_ms"] = (
                round(v, 2) for v in percentiles(lambda: compiled(images), args.warmup, args.runs)
            )
    bundle = make_bundle(model, folder / f"{preset}.onnx", size, channels, args.classes)
    predictor = Predictor(bundle, threads=args.threads)
    batch = images.numpy()
    row["ort_fp32_p50_ms"], row["ort_fp32_p95_ms"] = (
        round(v, 2) for v in percentiles(lambda: predictor.run(batch), args.warmup, args.runs)
    )
    openvino = openvino_p50(bundle, batch, args)
    if openvino is not None:
        row["openvino_fp32_p50_ms"], row["openvino_fp32_p95_ms"] = openvino
    if args.data is not None and args.data.exists():
        int8 = quantize_onnx(
            bundle, folder / f"{preset}.int8.onnx", args.data, "train", args.calibration_images
        )
        quantized = Predictor(int8, threads=args.threads)
        row["ort_int8_p50_ms"], row["ort_int8_p95_ms"] = (
            round(v, 2) for v in percentiles(lambda: quantized.run(batch), args.warmup, args.runs)
        )
        row["int8_speedup"] = round(row["ort_fp32_p50_ms"] / row["ort_int8_p50_ms"], 3)
    row.update(end_to_end(predictor, pairs, args.warmup, args.runs))
    if preset in args.rss_presets:
        row.update(
            {
                f"rss_{key}": value
                for key, value in rss_in_child(bundle, pairs, args.rss_calls, args.threads).items()
            }
        )
    return row


def openvino_p50(bundle: Path, batch: np.ndarray, args: argparse.Namespace) -> tuple[float, float] | None:
    """OpenVINO's CPU runtime on the same ONNX file, when the `openvino` package is installed (not a
    dependency: measured to decide whether it is worth offering as a Predictor backend)."""
    try:
        import openvino
    except ImportError:
        return None
    core = openvino.Core()
    compiled = core.compile_model(
        str(bundle), "CPU", {"INFERENCE_NUM_THREADS": args.threads, "PERFORMANCE_HINT": "LATENCY"}
    )
    request = compiled.create_infer_request()
    p50, p95 = percentiles(lambda: request.infer({0: batch}), args.warmup, args.runs)
    return round(p50, 2), round(p95, 2)


def bench_peer(path: Path, args: argparse.Namespace) -> dict:
    import onnxruntime

    from defectdet.runtime.predictor import session_options

    session = onnxruntime.InferenceSession(
        str(path), session_options(args.threads), providers=["CPUExecutionProvider"]
    )
    spec = session.get_inputs()[0]
    shape = [
        dim if isinstance(dim, int) else (1 if index == 0 else args.imgsz)
        for index, dim in enumerate(spec.shape)
    ]
    feed = {spec.name: np.random.default_rng(0).random(shape, dtype=np.float32)}
    p50, p95 = percentiles(lambda: session.run(None, feed), args.warmup, args.runs)
    return {
        "peer": path.name,
        "input_shape": shape,
        "ort_fp32_p50_ms": round(p50, 2),
        "ort_fp32_p95_ms": round(p95, 2),
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
    parser.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument(
        "--data", type=Path, default=DEFAULT_DATA, help="JPEG pairs + int8 calibration images"
    )
    parser.add_argument("--calibration-images", type=int, default=32)
    parser.add_argument("--peer", type=Path, nargs="*", default=[])
    parser.add_argument("--rss-calls", type=int, default=1000)
    parser.add_argument("--rss-presets", nargs="*", default=["nano"])
    parser.add_argument("--out-dir", type=Path, default=common.RESULTS_DIR)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    pairs = real_pairs(args.data, 16)
    with tempfile.TemporaryDirectory() as folder:
        rows = [bench_preset(preset, args, pairs, Path(folder)) for preset in args.presets]
    peers = [bench_peer(path, args) for path in args.peer]
    settings = {
        key: str(value) if isinstance(value, Path) else value
        for key, value in vars(args).items()
        if key != "out_dir"
    }
    path = common.write_result(
        "latency", {"settings": settings, "results": rows, "peers": peers}, args.out_dir
    )
    columns = ["preset", "eager_p50_ms", "compile_p50_ms", "torchscript_p50_ms", "ort_fp32_p50_ms", "ort_int8_p50_ms",
               "openvino_fp32_p50_ms",
               "e2e_decode_p50_ms", "e2e_letterbox_p50_ms", "e2e_model_p50_ms", "e2e_postprocess_p50_ms", "e2e_total_p50_ms"]  # fmt: skip
    headers = [column.replace("_p50_ms", "").replace("e2e_", "e2e ") for column in columns]
    common.print_table(
        f"latency {args.imgsz}x{args.imgsz}, batch 1, {args.threads} threads (ms, p50)",
        headers,
        [[row.get(column, "-") for column in columns] for row in rows],
    )
    for row in rows:
        if "rss_rss_after_calls_mb" in row:
            print(f"{row['preset']}: Predictor RSS {row['rss_rss_after_first_call_mb']} MB after the first call, "
                  f"{row['rss_rss_after_calls_mb']} MB after {row['rss_calls']} calls; torch imported: {row['rss_torch_imported']}")  # fmt: skip
    for peer in peers:
        print(f"peer {peer['peer']}: ORT p50 {peer['ort_fp32_p50_ms']} ms")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Latency at matched input sizes, ours and YOLO in one process (issue 20 item 3).

    .venv/bin/python -m bench.peers_latency [--sizes 224,352,640] [--threads 1] [--runs 100]
        [--ours-presets nano,lite0] [--yolo-models yolo11n,yolov8n,yolo26n] [--out-dir bench/results]
        [--ours-checkpoint runs/bench_scaling/scaling_surface_nano_60min/best.pt]
        [--yolo-onnx runs/peers_ladder/peers_surface_yolo11n_352px_10min/yolo11n/train/weights/best.onnx]

1. Model only, at each size: each of our `--ours-presets` (3 channels, no template, the graph `defectdet export`
   writes: BatchNorm folded, no flip views) and each of `--yolo-models` (the ONNX their exporter writes from the
   yaml, in `.venv-peers`; default YOLO11n, YOLOv8n and YOLO26n when the installed ultralytics knows
   `yolo26n.yaml`; their exporter's defaults, which for YOLO26n too write the raw head with NMS left outside the
   graph, like ours), random weights (weights do not change a graph's cost), batch 1, ONNX Runtime fp32,
   `--threads` threads, all graphs of a size interleaved call by call. Graphs are kept in runs/peers_latency.
2. End to end at 352 px on the surface family's held-out images, trained models on both sides: ours =
   `Predictor.predict` on the file bytes (decode, letterbox, model, NMS, boxes to original pixels); YOLO = the
   same stages with our code around their graph (bench/peers.py `peer_end_to_end`, score 0.25, IoU 0.7).
Writes <out-dir>/peers_latency.json (default bench/results); ratios are model / defectdet nano (the first of
`--ours-presets` without nano; above 1: that model is slower).
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

from bench import common, latency, peers

BENCH = Path(__file__).resolve().parent
OUT = Path("runs/peers_latency")
OURS_PRESETS = "nano,lite0"
YOLO_MODELS = ("yolo11n", "yolov8n")
NEWER_YOLO = ("yolo26n",)  # measured by default when the installed ultralytics knows its yaml
EXPORT = """
import sys
from pathlib import Path
from ultralytics import YOLO
model, size, out = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])
path = Path(YOLO(model).export(format="onnx", imgsz=size, batch=1, device="cpu"))
out.write_bytes(path.read_bytes())
"""
KNOWN = """
import sys
from ultralytics.nn.tasks import yaml_model_load
for name in sys.argv[1:]:
    try:
        yaml_model_load(name + ".yaml")
        print(name)
    except FileNotFoundError:
        pass
"""


def peers_env() -> dict[str, str]:
    """Ultralytics kept offline, its settings under runs/peers_latency."""
    return {
        **os.environ,
        "YOLO_OFFLINE": "1",
        "YOLO_AUTOINSTALL": "False",
        "YOLO_CONFIG_DIR": str((OUT / "cfg").resolve()),
    }


def run_peers(args: list[str], cwd: Path) -> str:
    """`args` run by .venv-peers' python; its stdout, or SystemExit with the end of its stderr."""
    python = peers.DEFAULT_PEERS_PYTHON
    if not Path(python).is_file():
        raise SystemExit(f"{python} not found: make .venv-peers/.installed")
    cwd.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        [str(python), *args], cwd=cwd, env=peers_env(), capture_output=True, text=True
    )  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"{python} {args[0][:40]!r}... failed:\n{done.stderr[-3000:]}")
    return done.stdout


def known_yolo(models: tuple[str, ...]) -> list[str]:
    """Those of `models` whose `<model>.yaml` the installed ultralytics resolves (no file is downloaded)."""
    found = run_peers(["-c", KNOWN, *models], OUT / "export").split()
    return [model for model in models if model in found]


def yolo_models(option: str | None) -> list[str]:
    """`--yolo-models`, default YOLO_MODELS plus those of NEWER_YOLO the installed ultralytics knows; a named
    model it does not know is refused before anything is timed."""
    if option is None:
        newer = known_yolo(NEWER_YOLO)
        for model in sorted(set(NEWER_YOLO) - set(newer)):
            print(f"{model}: the ultralytics in .venv-peers has no {model}.yaml; not measured")
        return [*YOLO_MODELS, *newer]
    wanted = [model.strip() for model in option.split(",") if model.strip()]
    unknown = sorted(set(wanted) - set(known_yolo(tuple(wanted))))
    if unknown:
        raise SystemExit(f"--yolo-models: the ultralytics in .venv-peers knows no yaml for {unknown}")
    return wanted


def yolo_graph(model: str, size: int) -> Path:
    """Their exporter's ONNX of `model` (random weights) at `size`, made in .venv-peers."""
    out = OUT / f"{model}_{size}.onnx"
    if not out.is_file():
        run_peers(["-c", EXPORT, f"{model}.yaml", str(size), str(out.resolve())], OUT / "export")
    return out


def ours_graph(preset: str, size: int) -> Path:
    """Our `preset` at `size` as `defectdet export` writes it for a 3-channel model without a template: the
    BatchNorm-folded graph (latency.make_bundle), random weights at seed 0."""
    import torch

    from defectdet.model import build_model

    torch.manual_seed(0)
    model = build_model(preset, num_classes=6, in_channels=3, template=False).eval()
    return latency.make_bundle(model, OUT / f"{preset}_{size}.onnx", size, 3, 6)


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


def model_only_rows(ours: list[str], models: list[str], args: argparse.Namespace) -> list[dict]:
    """At each of `--sizes`: our presets and the YOLO models timed together, one row each, with its p50 over
    `ratio_to(ours)`'s; the table printed."""
    base_name = ratio_to(ours)
    rows, table = [], []
    for size in (int(value) for value in args.sizes.split(",")):
        paths = {
            **{f"defectdet {preset}": ours_graph(preset, size) for preset in ours},
            **{model: yolo_graph(model, size) for model in models},
        }
        found = model_only(paths, size, args.threads, args.runs)
        base = found[base_name]["p50_ms"]
        for name, value in found.items():
            ratio = round(value["p50_ms"] / base, 2)
            rows.append({"imgsz": size, "model": name, **value, "p50_ratio_to_ours": ratio})
            table.append([size, name, value["p50_ms"], value["p95_ms"], ratio])
    common.print_table(
        f"model only, ONNX Runtime fp32, batch 1, {args.threads} threads",
        ["px", "model", "p50 ms", "p95 ms", f"x {base_name}"],
        table,
    )
    return rows


def ratio_to(ours: list[str]) -> str:
    """The model the ratios divide by: defectdet nano when measured, else the first of ours."""
    return "defectdet nano" if "nano" in ours else f"defectdet {ours[0]}"


def end_to_end(checkpoint: Path, yolo_onnx: Path, threads: int, runs: int) -> dict[str, dict]:
    from bench import train_surface
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
    parser.add_argument("--tag", default="", help="appended to the result's name (peers_latency_TAG)")
    parser.add_argument("--sizes", default="224,352,640")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--ours-presets", default=OURS_PRESETS, help="our presets, comma-separated")
    parser.add_argument(
        "--yolo-models",
        default=None,
        help=f"YOLO yaml names, comma-separated (default {','.join(YOLO_MODELS + NEWER_YOLO)}, "
        f"{'/'.join(NEWER_YOLO)} only when the installed ultralytics knows it)",
    )
    parser.add_argument("--ours-checkpoint", type=Path, default=None)
    parser.add_argument("--yolo-onnx", type=Path, default=None)
    parser.add_argument("--out-dir", type=Path, default=common.RESULTS_DIR)
    args = parser.parse_args()
    ours = [preset.strip() for preset in args.ours_presets.split(",") if preset.strip()]
    if not ours:
        raise SystemExit("--ours-presets: name at least one preset")
    if args.tag and not args.tag.replace("_", "").isalnum():
        raise SystemExit(f"--tag {args.tag!r}: letters, digits and _ only")
    models = yolo_models(args.yolo_models)
    OUT.mkdir(parents=True, exist_ok=True)
    rows = model_only_rows(ours, models, args)
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
    path = common.write_result(
        "peers_latency" + (f"_{args.tag}" if args.tag else ""),
        {
            "command": "python -m bench.peers_latency " + " ".join(sys.argv[1:]),
            "settings": {
                "threads": args.threads,
                "runs": args.runs,
                "sizes": args.sizes,
                "ours_presets": ",".join(ours),
                "yolo_models": ",".join(models),
                "ratio_to": ratio_to(ours),
            },
            "model_only": rows,
            "end_to_end": e2e,
            "ours_checkpoint": str(args.ours_checkpoint) if args.ours_checkpoint else None,
            "yolo_onnx": str(args.yolo_onnx) if args.yolo_onnx else None,
        },
        args.out_dir,
    )
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

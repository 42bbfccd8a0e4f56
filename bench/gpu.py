"""Training on a GPU against the CPU ladder (issue 19 item 5, issue 20 item 5). The product never needs one.

    python -m bench.gpu --part deeppcb_template --minutes 1 [--data DEEPPCB_DIR]   # on a CUDA machine
    python -m bench.gpu --part surface --minutes 2
    python -m bench.gpu --part yolo_surface --minutes 2 --peers-python python3    # Ultralytics importable there
    python -m bench.gpu --summary                                                  # gpu.json from the parts

Parts (each writes `bench/results/gpu_<part>.json`, so a run stopped by the lease keeps the parts done):
- `deeppcb_template`: nano, the product's defaults (fp16 AMP on CUDA, loader workers from the cores) on
  DeepPCB with templates, validated every 2 epochs on the held-out board groups as the CPU ladder's run was:
  seconds to mAP@0.5 0.95 against the CPU's (`scaling_deeppcb_template_nano_10min.json`).
- `surface`: nano on the surface family (the ladder's data, `bench/train_surface.py`, seed 0): seconds to each
  mAP@0.5 level against the CPU's 10-minute rung (`scaling_surface_nano_10min.json`, whose validation log is
  dense enough to time the levels).
- `yolo_surface`: YOLO11n from its yaml at the matched 352 px, their defaults on CUDA (batch 16, 8 workers,
  AMP), the same `time=` budget and the same held-out images scored by our evaluator (`bench/peers_ladder.py`).
The CPU figures are the ladder's: one thread on one core of this 2-core machine.
`bench/gpu_run.sh` is the command that ran the parts on the lent machine.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from types import SimpleNamespace

from bench import common
from bench.result_schema import read_result

BENCH = Path(__file__).resolve().parent
PARTS = ("deeppcb_template", "surface", "yolo_surface")
CPU_REFERENCE = {
    "deeppcb_template": "scaling_deeppcb_template_nano_10min.json",
    "surface": "scaling_surface_nano_10min.json",  # its curve has 10 points in 10 min; the 60-min run's, in 60
    "yolo_surface": "peers_surface_yolo11n_352px_60min.json",
}
DEEPPCB_TARGET = 0.95


def device_info() -> dict:
    import torch

    if not torch.cuda.is_available():
        return {"cuda": False, "torch": torch.__version__}
    return {
        "cuda": True,
        "name": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "cuda_version": torch.version.cuda,
    }


def seconds_to(curve: list[dict], target: float) -> float | None:
    return next((point["time_s"] for point in curve if point["mAP50"] >= target), None)


def run_deeppcb_template(args: argparse.Namespace, out: Path) -> dict:
    from bench.train_deeppcb import train_and_summarize

    run = train_and_summarize(args.data, args.minutes, "nano", 2, out, 0, template=True)
    return {
        "settings": run["config"].to_dict(),
        "wall_seconds": run["wall_seconds"],
        "time_to": run["time_to"],
        "final": {k: run["final"][k] for k in ("mAP50", "mAP50_95", "steps", "train_images_per_second")},
        "curve": run["curve"],
    }


def run_surface(args: argparse.Namespace, out: Path) -> dict:
    from bench.pretrained import run_arm

    return run_arm("surface", None, args.minutes, out, 0, "nano")


def run_yolo_surface(args: argparse.Namespace, out: Path) -> dict:
    from bench import peers, peers_ladder
    from defectdet.evaluation.report import evaluate_records

    data_yaml, images_json, val = peers_ladder.prepare("surface", out)
    peer_args = SimpleNamespace(
        peers_python=args.peers_python, minutes=args.minutes, out=out / "yolo11n", imgsz=352, threads=8, seed=0,
        peer_options=["--device", args.yolo_device, "--no-export"],
    )  # fmt: skip
    (out / "yolo11n").mkdir(parents=True, exist_ok=True)
    document = peers.run_peer("yolo11n.yaml", peer_args, data_yaml, images_json)
    records = peers.peer_records(val.samples, document["predictions"])
    metrics = evaluate_records(records, list(val.class_names), out / "ours_eval", "coco", plots=False)
    return {
        "model": "yolo11n",
        "imgsz": 352,
        "final": {
            "mAP50": metrics["headline"]["mAP50"],
            "mAP50_95": metrics["headline"]["mAP50_95"],
            "epochs": document["epochs_done"],
            "train_seconds": document["train_seconds"],
        },
        "curve_their_evaluator": peers_ladder.their_curve(document["results_csv"]),
        "train_settings": document["train_settings"],
        "versions_peer": document["versions"],
    }


def run_part(args: argparse.Namespace) -> int:
    import logging

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    out = Path("runs/bench_gpu") / args.part
    runner = {
        "deeppcb_template": run_deeppcb_template,
        "surface": run_surface,
        "yolo_surface": run_yolo_surface,
    }
    body = runner[args.part](args, out)
    name = f"gpu_{args.part}"
    final = body["final"]
    common.print_table(name, ["figure", "value"], [[k, v] for k, v in final.items()])
    command = f"python -m bench.gpu --part {args.part} --minutes {args.minutes:g}"
    document = {
        "command": command,
        "part": args.part,
        "minutes": args.minutes,
        "device": device_info(),
        **body,
    }
    common.write_result(name, document, args.results)
    return 0


def cpu_point(part: str, results: Path) -> dict | None:
    path = results / CPU_REFERENCE[part]
    if not path.is_file():
        return None
    document = read_result(path)
    if part == "yolo_surface":
        final = document["final_ours_evaluator"]
        return {"file": path.name, "mAP50": final["mAP50"], "seconds": final["train_seconds"], "curve": []}
    return {"file": path.name, "mAP50": document["final"]["mAP50"], "seconds": document["wall_seconds"],
            "curve": document["curve"]}  # fmt: skip


REACH = {"deeppcb_template": (0.8, 0.85, 0.9, 0.95), "surface": (0.5, 0.6, 0.65, 0.7)}


def compare(part: str, gpu: dict, cpu: dict | None) -> dict:
    """The GPU run beside the CPU's: seconds to each mAP@0.5 level on both (each run's own validation log,
    startup included), and the CPU/GPU ratio where both got there."""
    row = {
        "gpu_file": f"gpu_{part}.json",
        "gpu_minutes_budget": gpu["minutes"],
        "gpu_mAP50": gpu["final"]["mAP50"],
    }
    if cpu is None:
        return row
    row.update(cpu_file=cpu["file"], cpu_mAP50=cpu["mAP50"], cpu_seconds=round(cpu["seconds"], 1))
    reach = {}
    for level in REACH.get(part, ()):
        cpu_seconds, gpu_seconds = seconds_to(cpu["curve"], level), seconds_to(gpu.get("curve") or [], level)
        ratio = round(cpu_seconds / gpu_seconds, 1) if cpu_seconds and gpu_seconds else None
        reach[f"{level:g}"] = {"cpu_s": cpu_seconds, "gpu_s": gpu_seconds, "cpu_over_gpu": ratio}
    row["seconds_to_mAP50"] = reach
    return row


def summary(results: Path) -> int:
    rows, table = {}, []
    for part in PARTS:
        path = results / f"gpu_{part}.json"
        if not path.is_file():
            continue
        gpu = read_result(path)
        row = rows[part] = compare(part, gpu, cpu_point(part, results))
        row["device"] = gpu["device"].get("name")
        for level, seconds in row.get("seconds_to_mAP50", {}).items():
            table.append([part, level, seconds["cpu_s"], seconds["gpu_s"], seconds["cpu_over_gpu"]])
    columns = ["part", "mAP@0.5 level", "CPU s (1 core)", "GPU s", "CPU / GPU"]
    common.print_table("GPU against the CPU ladder: seconds to each level", columns, table)
    common.write_result("gpu", {"command": "python -m bench.gpu --summary", "parts": rows}, results)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--part", choices=PARTS)
    parser.add_argument("--minutes", type=float, default=1.0, help="training budget on the GPU")
    parser.add_argument("--data", type=Path, default=None, help="DeepPCB folder (default: bench's ../shared)")
    parser.add_argument("--peers-python", default="python3", help="a python that imports ultralytics")
    parser.add_argument("--yolo-device", default="cuda", help="cpu only to try the part out")
    parser.add_argument("--results", type=Path, default=common.RESULTS_DIR)
    parser.add_argument("--summary", action="store_true")
    args = parser.parse_args()
    if args.summary:
        return summary(args.results)
    if args.part is None:
        parser.error("--part or --summary")
    if args.data is None:
        from bench.train_deeppcb import DEFAULT_DATA

        args.data = DEFAULT_DATA
    return run_part(args)


if __name__ == "__main__":
    sys.exit(main())

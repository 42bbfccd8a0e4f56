"""Side by side with Ultralytics YOLO on DeepPCB: same machine, same split, same evaluator, same latency harness.

    make bench-peers                                   # = .venv/bin/python -m bench.peers (20 min per model)
    .venv/bin/python -m bench.peers --minutes 1 --name peers_smoke     # a quick end-to-end check

Runs in OUR venv and orchestrates:
1. Converts OUR DeepPCB split (`load_dataset(root, "train" | "val")`: whole board groups held out) into a YOLO
   folder under `--out` (tested images symlinked, labels in YOLO format). YOLO gets the tested image only:
   it has no input for the defect-free template, which our model compares against.
2. Trains our `--ours-preset` with bench/train_deeppcb.py's `train_and_summarize` for `--minutes`.
3. For each of `--models` runs bench/peers_yolo.py in `.venv-peers` (a separate venv: Ultralytics is AGPL-3.0,
   installed only there, never imported by defectdet, its tests or this script, none of its code copied here):
   trains it from its yaml (no pretrained weights: nothing can be downloaded) for the same `--minutes`, 640 px,
   CPU, their defaults otherwise; predicts the held-out images and the clean boards at conf 0.001; exports ONNX.
4. Scores every model with OUR evaluator (`evaluate_records`: COCO mAP via pycocotools and the DeepPCB protocol)
   on the same held-out images, and the clean-board false-call rate: recaptured defect-free templates
   (`data.recapture.make_clean_boards`, default nuisances, seed 0; ours pairs each with its template) flagged at
   the model's best-F1 threshold on the defective boards.
5. Times the ONNX files back to back with bench/latency.py's harness, 640x640, batch 1, `--threads` threads:
   model only (ONNX Runtime, `percentiles`), and end to end. Ours end to end = `Predictor.predict` (decode of the
   tested+template JPEG pair, registration, letterbox, model, NMS, boxes to original pixels). Peers end to end =
   the same stages written here with our code (decode of the tested JPEG as RGB, our letterbox, ORT, their
   raw (1, 4+K, 8400) cxcywh output decoded + our class-aware NMS at score 0.25 / IoU 0.7, boxes to original
   pixels); their own Python predict pipeline is not what is timed.

Writes `bench/results/<--name>.json` and prints one table. A real run takes about 3 x `--minutes` plus ~10 min.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from bench import common, latency, train_deeppcb
from defectdet.data.formats import load_dataset
from defectdet.data.formats.deeppcb import group_of
from defectdet.data.formats.yolo import label_line
from defectdet.data.imageio import decode_image
from defectdet.data.letterbox import boxes_from_letterbox, letterbox_image
from defectdet.data.recapture import RecaptureConfig, make_clean_boards
from defectdet.data.sample import DatasetSplit, Sample
from defectdet.evaluation.report import evaluate_records
from defectdet.evaluation.types import ImageRecord
from defectdet.model import model_info
from defectdet.postprocess import postprocess

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
DEFAULT_DATA = ROOT.parent / "shared" / "datasets" / "deeppcb"
DEFAULT_PEERS_PYTHON = ROOT / ".venv-peers" / "bin" / "python"
PEER_SCORE, PEER_NMS_IOU = 0.25, 0.7  # end-to-end decoding of the peer output: their predict defaults


# ------------------------------------------------------------------------------------------------ data
def write_yolo_dataset(train: DatasetSplit, val: DatasetSplit, folder: Path, template: bool = False) -> Path:
    """`folder/images/{train,val}/<id>.jpg` (symlinks to the tested images), `labels/.../<id>.txt`
    (class cx cy w h, normalised), `data.yaml`; returns the yaml path. `template`: each image is a two-page
    grayscale TIFF (tested, template) and data.yaml says `channels: 2`, which Ultralytics reads as one
    two-channel input (its imread stacks the pages of a multi-page TIFF)."""
    for split in (train, val):
        images, labels = folder / "images" / split.split, folder / "labels" / split.split
        images.mkdir(parents=True, exist_ok=True)
        labels.mkdir(parents=True, exist_ok=True)
        for sample in split.samples:
            if template:
                write_pair_tiff(sample, images / f"{sample.image_id}.tif")
            else:
                link = images / f"{sample.image_id}{sample.image_path.suffix}"
                if link.is_symlink() or link.exists():
                    link.unlink()
                link.symlink_to(sample.image_path.resolve())
            lines = [
                label_line(int(cls), box, sample.width, sample.height)
                for box, cls in zip(sample.boxes.tolist(), sample.classes.tolist(), strict=True)
            ]
            (labels / f"{sample.image_id}.txt").write_text("\n".join(lines) + ("\n" if lines else ""))
        for cache in folder.glob("labels/*.cache"):
            cache.unlink()
    names = "\n".join(f"  {index}: {name}" for index, name in enumerate(train.class_names))
    yaml_path = folder / "data.yaml"
    channels = "channels: 2\n" if template else ""
    yaml_path.write_text(
        f"path: {folder.resolve()}\ntrain: images/train\nval: images/val\n{channels}names:\n{names}\n"
    )
    return yaml_path


def write_pair_tiff(sample: Sample, path: Path) -> None:
    """The tested image and its template as the two pages of one grayscale TIFF."""
    import cv2

    from defectdet.data.imageio import read_pair

    if not path.is_file():
        tested, template = read_pair(sample.image_path, sample.template_path, channels=1)
        cv2.imwritemulti(str(path), [tested, template])


def clean_boards(val: DatasetSplit, folder: Path, seed: int) -> list[Sample]:
    """One recaptured defect-free board per template of the held-out split (default nuisances)."""
    return make_clean_boards(val, folder, RecaptureConfig(), channels=1, seed=seed)


# ------------------------------------------------------------------------------------------------ scoring
def score(name: str, defective: list[ImageRecord], clean: list[ImageRecord], class_names, out: Path) -> dict:
    """OUR evaluator on the defective held-out boards; false-call rate of the clean boards at the best-F1
    threshold chosen on those defective boards."""
    metrics = evaluate_records(
        defective, class_names, out / name, "both", plots=False, title=f"{name} on DeepPCB"
    )
    headline = metrics["headline"]
    threshold = headline["threshold"]
    flagged = sum(record.max_score >= threshold for record in clean) if threshold is not None else None
    return {
        "mAP50": headline["mAP50"],
        "mAP50_95": headline["mAP50_95"],
        "deeppcb_mAP": headline["deeppcb_mAP"],
        "deeppcb_F": headline["deeppcb_F"],
        "best_f1_threshold": threshold,
        "precision": headline["precision"],
        "recall": headline["recall"],
        "escape_rate": headline["escape_rate"],
        "clean_boards": len(clean),
        "clean_false_calls": flagged,
        "clean_false_call_rate": flagged / len(clean) if clean and flagged is not None else None,
        "metrics_json": str(out / name / "metrics.json"),
    }


def peer_records(samples: list[Sample], predictions: dict[str, dict]) -> list[ImageRecord]:
    records = []
    for sample in samples:
        found = predictions.get(sample.image_id, {"boxes": [], "scores": [], "classes": []})
        height, width = found.get("orig_shape", (sample.height, sample.width))
        records.append(
            ImageRecord(
                image_id=sample.image_id,
                width=width,
                height=height,
                gt_boxes=sample.boxes,
                gt_classes=sample.classes,
                det_boxes=np.asarray(found["boxes"], np.float32).reshape(-1, 4),
                det_scores=found["scores"],
                det_classes=found["classes"],
                image_path=str(sample.image_path),
            )
        )
    return records


def ours_records(checkpoint: Path, samples: list[Sample]) -> tuple[torch.nn.Module, dict, list[ImageRecord]]:
    """Our one prediction path (engine.predict.predict_records, registration as the model was trained) on
    `samples`."""
    from defectdet.engine.checkpoint import load_detector
    from defectdet.engine.predict import predict_records
    from defectdet.runtime.spec import ModelSpec

    model, state = load_detector(checkpoint)
    config = state.get("config") or {}
    spec = ModelSpec.from_checkpoint(state, checkpoint)
    records, skipped = predict_records(model, samples, spec)
    if skipped:
        raise SystemExit(f"unreadable images: {skipped[:3]}")
    return model, config, records


# ------------------------------------------------------------------------------------------------ latency
def stage_p50(stages: dict[str, list[float]]) -> dict[str, float]:
    out = {f"e2e_{stage}_p50_ms": round(statistics.median(values), 2) for stage, values in stages.items()}
    total = sorted(stages["total"])
    out["e2e_total_p95_ms"] = round(total[min(len(total) - 1, round(0.95 * (len(total) - 1)))], 2)
    return out


def peer_end_to_end(
    path: Path, pairs: list[tuple[bytes, bytes]], args: argparse.Namespace
) -> dict[str, float]:
    """decode (tested JPEG, RGB) + our letterbox + ORT + decoding of their raw output + our NMS + box mapping."""
    import onnxruntime

    from defectdet.runtime.predictor import session_options

    session = onnxruntime.InferenceSession(
        str(path), session_options(args.threads), providers=["CPUExecutionProvider"]
    )
    input_name = session.get_inputs()[0].name

    def call(data: bytes) -> dict[str, float]:
        started = time.perf_counter()
        image = decode_image(data, "tested", channels=3)
        decoded = time.perf_counter()
        canvas, transform = letterbox_image(image, args.imgsz, 114)
        tensor = np.multiply(canvas.transpose(2, 0, 1)[None], np.float32(1 / 255), dtype=np.float32)
        prepared = time.perf_counter()
        raw = session.run(None, {input_name: tensor})[0]  # (1, 4 + K, A): cx, cy, w, h, class scores
        ran = time.perf_counter()
        rows = raw.transpose(0, 2, 1)
        cx, cy, w, h = rows[..., 0], rows[..., 1], rows[..., 2], rows[..., 3]
        xyxy = np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], -1)
        found = postprocess(np.concatenate([xyxy, rows[..., 4:]], -1), PEER_SCORE, PEER_NMS_IOU, 300)[0]
        boxes_from_letterbox(found.boxes, transform)
        finished = time.perf_counter()
        return {
            "decode": (decoded - started) * 1e3,
            "letterbox": (prepared - decoded) * 1e3,
            "model": (ran - prepared) * 1e3,
            "postprocess": (finished - ran) * 1e3,
            "total": (finished - started) * 1e3,
        }

    for index in range(args.warmup):
        call(pairs[index % len(pairs)][0])
    stages: dict[str, list[float]] = {}
    for index in range(args.runs):
        for stage, value in call(pairs[index % len(pairs)][0]).items():
            stages.setdefault(stage, []).append(value)
    return stage_p50(stages)


def ours_latency(
    model: torch.nn.Module, config: dict, class_names, pairs, args: argparse.Namespace, folder: Path
) -> dict:
    """Our trained model as a bundle (the graph `defectdet export` writes; pair registration as trained)."""
    import copy

    from defectdet.export.exporter import export_onnx_graph, fold_batchnorm
    from defectdet.runtime.bundle import BundleMetadata, write_metadata
    from defectdet.runtime.predictor import Predictor

    bundle = folder / "ours.onnx"
    template = bool(model.template)
    export_onnx_graph(fold_batchnorm(copy.deepcopy(model)), bundle, model.in_channels, args.imgsz)
    write_metadata(
        bundle,
        BundleMetadata(
            defectdet_version="bench", created="bench", preset=args.ours_preset, class_names=list(class_names),
            input_size=args.imgsz, channels=model.in_channels // (2 if template else 1), template=template,
            registration=template and bool(config.get("register_pairs", True)),
        ),
    )  # fmt: skip
    predictor = Predictor(bundle, threads=args.threads)
    batch = np.random.default_rng(0).random((1, model.in_channels, args.imgsz, args.imgsz), dtype=np.float32)
    p50, p95 = latency.percentiles(lambda: predictor.run(batch), args.warmup, args.runs)
    return {
        "onnx": str(bundle),
        "ort_fp32_p50_ms": round(p50, 2),
        "ort_fp32_p95_ms": round(p95, 2),
        **latency.end_to_end(predictor, pairs, args.warmup, args.runs),
    }


# ------------------------------------------------------------------------------------------------ peers
def run_peer(model_yaml: str, args: argparse.Namespace, data_yaml: Path, images_json: Path) -> dict:
    name = Path(model_yaml).stem
    result = args.out / f"{name}.json"
    command = [
        str(args.peers_python), str(BENCH / "peers_yolo.py"),
        "--model", model_yaml, "--data", str(data_yaml), "--minutes", str(args.minutes),
        "--images", str(images_json), "--out", str(args.out / name), "--result", str(result),
        "--imgsz", str(args.imgsz), "--threads", str(args.threads), "--seed", str(args.seed),
        *getattr(args, "peer_options", []),
    ]  # fmt: skip
    env = {
        **os.environ,
        "YOLO_OFFLINE": "1",
        "YOLO_AUTOINSTALL": "False",
        "OMP_NUM_THREADS": str(args.threads),
    }
    log = args.out / f"{name}.log"
    print(f"[peers] {name}: training {args.minutes:g} min in {args.peers_python} (log: {log})", flush=True)
    with open(log, "w") as handle:
        done = subprocess.run(
            command, stdout=handle, stderr=subprocess.STDOUT, env=env, cwd=ROOT, check=False
        )
    if done.returncode != 0:
        tail = "".join(log.read_text(errors="replace").splitlines(keepends=True)[-30:])
        raise SystemExit(f"{name} failed (exit {done.returncode}); last lines of {log}:\n{tail}")
    return json.loads(result.read_text())


COLUMNS = [
    ("model", "model"), ("params", "params (M)"), ("gflops", "GFLOPs"), ("train_minutes", "train min"),
    ("epochs_done", "epochs"), ("mAP50", "mAP@0.5"), ("mAP50_95", "mAP@.5:.95"), ("deeppcb_F", "DeepPCB F"),
    ("clean_false_call_rate", "clean false calls"), ("ort_fp32_p50_ms", "p50 ms"),
    ("latency_ratio_to_ours", "x ours"), ("e2e_total_p50_ms", "e2e p50 ms"), ("e2e_ratio_to_ours", "e2e x ours"),
]  # fmt: skip


def row_cells(row: dict, show_params, show_number) -> list:
    """One result row as table cells in COLUMNS order ("-" when missing; clean false calls as n/boards)."""
    cells = []
    for key, _ in COLUMNS:
        value = row.get(key)
        if value is None:
            cells.append("-")
        elif key == "params":
            cells.append(show_params(value))
        elif key == "clean_false_call_rate":
            cells.append(f"{row['clean_false_calls']}/{row['clean_boards']}")
        else:
            cells.append(show_number(value))
    return cells


def print_summary(payload: dict) -> None:
    """The one table of a peers result (also `python -m bench.peers --show bench/results/peers.json`)."""
    from rich.console import Console

    settings = payload["settings"]
    table = [
        row_cells(row, lambda value: round(value / 1e6, 3), lambda value: value) for row in payload["results"]
    ]
    common.print_table(
        f"DeepPCB held-out groups {settings['split']['val_groups']}, {settings['minutes']:g} min training each, "
        f"{settings['threads']} threads, no pretrained weights; YOLO sees the tested image only (no template)",
        [title for _, title in COLUMNS],
        table,
        console=None if sys.stdout.isatty() else Console(width=200),
    )


def _markdown_number(value) -> str:
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 10 else f"{value:.1f}"
    return str(value)


def markdown_table(payload: dict, path: Path) -> str:
    """The README's side-by-side table, cell for cell from a peers result file (named in every row)."""
    header = ["params" if key == "params" else title for key, title in COLUMNS] + ["result file"]
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    for row in payload["results"]:
        cells = row_cells(row, lambda value: f"{int(value):,}", _markdown_number)
        lines.append("| " + " | ".join([*cells, f"`bench/results/{path.name}`"]) + " |")
    return "\n".join(lines) + "\n"


def start_run(args: argparse.Namespace) -> list[float] | None:
    """Check the peers' venv (exit 2 with how to make it), resolve and create `args.out`, set torch's threads;
    returns the load average before the run (bench/peers_surface.py shares this)."""
    if not args.peers_python.is_file():
        print(
            f"{args.peers_python} not found: run `make bench-peers` (it creates .venv-peers)", file=sys.stderr
        )
        raise SystemExit(2)
    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(args.threads)
    return common.machine_info().get("load_average")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--minutes", type=float, default=20.0, help="wall-clock training budget per model")
    parser.add_argument("--ours-preset", default="tiny")
    parser.add_argument("--models", nargs="+", default=["yolo11n.yaml", "yolov8n.yaml"])
    parser.add_argument("--peers-python", type=Path, default=DEFAULT_PEERS_PYTHON)
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "peers")
    parser.add_argument("--name", default="peers", help="bench/results/<name>.json")
    parser.add_argument("--imgsz", type=int, default=640)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--val-every", type=int, default=2, help="our trainer validates every N epochs")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--show", type=Path, default=None, help="only print the table of a result file")
    parser.add_argument("--markdown", action="store_true", help="with --show: the table as README markdown")
    args = parser.parse_args(argv)
    if args.show is not None:
        payload = json.loads(args.show.read_text())
        if args.markdown:
            print(markdown_table(payload, args.show), end="")
        else:
            print_summary(payload)
        return 0
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    if not (args.data / "trainval.txt").is_file():
        print(f"DeepPCB not found at {args.data} (needs trainval.txt); pass --data", file=sys.stderr)
        return 2
    started = time.perf_counter()
    load_before = start_run(args)

    train_split, val_split = load_dataset(args.data, "train"), load_dataset(args.data, "val")
    class_names = list(val_split.class_names)
    data_yaml = write_yolo_dataset(train_split, val_split, args.out / "yolo_deeppcb")
    clean = clean_boards(val_split, args.out / "clean_boards", args.seed)
    images_json = args.out / "predict_images.json"
    images_json.write_text(
        json.dumps(
            [{"id": s.image_id, "path": str(s.image_path.resolve())} for s in [*val_split.samples, *clean]]
        )
    )
    split_info = {
        "train_images": len(train_split.samples),
        "val_images": len(val_split.samples),
        "val_groups": sorted({group_of(s) for s in val_split.samples}),
        "train_groups": sorted({group_of(s) for s in train_split.samples}),
        "clean_boards": len(clean),
    }
    print(f"[peers] split {split_info}", flush=True)

    # 1. train everything, one after the other, each for the same wall-clock budget
    print(f"[peers] ours ({args.ours_preset}): training {args.minutes:g} min", flush=True)
    ours_run = train_deeppcb.train_and_summarize(
        args.data, args.minutes, args.ours_preset, args.val_every, args.out / "ours", args.seed
    )
    peer_docs = [run_peer(model, args, data_yaml, images_json) for model in args.models]

    # 2. score everything with our evaluator
    checkpoint = Path(ours_run["result"].run_dir) / "best.pt"
    model, ours_config, defective = ours_records(checkpoint, val_split.samples)
    _, _, clean_records = ours_records(checkpoint, clean)
    info = model_info(model, args.imgsz)
    ours = {
        "model": f"defectdet {args.ours_preset}",
        "input": "tested + template (gray, 2 channels)",
        "pretrained": False,
        "params": int(info["params"]),
        "gflops": round(float(info["gflops"]), 4),
        "train_minutes": round(ours_run["wall_seconds"] / 60, 2),
        "epochs_done": ours_run["final"]["epochs"],
        "checkpoint": str(checkpoint),
        "train_final_from_trainer": ours_run["final"],
        **score("ours", defective, clean_records, class_names, args.out / "eval"),
    }
    rows: list[dict[str, Any]] = [ours]
    for doc in peer_docs:
        by_id = doc["predictions"]
        rows.append(
            {
                "model": doc["model"],
                "input": "tested image only (gray JPEG read as 3-channel), no template",
                "pretrained": False,
                "params": doc["params"],
                "gflops": doc["gflops_counted"],
                "gflops_theirs": doc["gflops_theirs"],
                "train_minutes": round(doc["train_seconds"] / 60, 2),
                "epochs_done": doc["epochs_done"],
                "batch": doc["batch"],
                "checkpoint": doc["weights"],
                "onnx": doc["onnx"],
                "their_final_val": doc["their_final_val"],
                **score(doc["model"], peer_records(val_split.samples, by_id), peer_records(clean, by_id),
                        class_names, args.out / "eval"),
            }
        )  # fmt: skip

    # 3. latency, back to back in this process
    pairs = latency.real_pairs(args.data, 16)
    timing = SimpleNamespace(threads=args.threads, imgsz=args.imgsz, warmup=args.warmup, runs=args.runs)
    rows[0].update(ours_latency(model, ours_config, class_names, pairs, args, args.out))
    for row in rows[1:]:
        peer = latency.bench_peer(Path(row["onnx"]), timing)
        row.update({"ort_fp32_p50_ms": peer["ort_fp32_p50_ms"], "ort_fp32_p95_ms": peer["ort_fp32_p95_ms"]})
        row.update(peer_end_to_end(Path(row["onnx"]), pairs, args))
    for row in rows:
        row["latency_ratio_to_ours"] = round(row["ort_fp32_p50_ms"] / rows[0]["ort_fp32_p50_ms"], 2)
        row["e2e_ratio_to_ours"] = round(row["e2e_total_p50_ms"] / rows[0]["e2e_total_p50_ms"], 2)

    payload = {
        "description": "Ultralytics YOLO vs defectdet on DeepPCB, same machine, same held-out board groups, scored "
        "by defectdet's evaluator, timed by bench/latency.py's harness",
        "command": "python -m bench.peers " + " ".join(argv if argv is not None else sys.argv[1:]),
        "shared_machine_load_before": load_before,
        "seconds": round(time.perf_counter() - started, 1),
        "peer_versions": peer_docs[0]["versions"] if peer_docs else None,
        "settings": {
            "minutes": args.minutes,
            "imgsz": args.imgsz,
            "threads": args.threads,
            "ours_preset": args.ours_preset,
            "ours_val_every": args.val_every,
            "peer_train": peer_docs[0]["train_settings"] if peer_docs else None,
            "peer_predict": {"conf": 0.001, "nms_iou": 0.7, "max_det": 300},
            "peer_pretrained": "none: built from yaml, random init (no weights can be downloaded here)",
            "budget": "train minutes = wall clock of the whole training call, final validation included; YOLO "
            "checks its `time` only after an optimizer step (every 64 images at batch 16) and our trainer after a "
            "step, so both overrun the budget by up to one step plus their last validation",
            "peer_input": "the tested image only, read by their loader as 3-channel; no template",
            "clean_boards": "data.recapture.make_clean_boards(val, RecaptureConfig() defaults, seed); false call = "
            "any detection >= the model's best-F1 threshold on the defective held-out boards",
            "latency": "640x640, batch 1, ONNX Runtime fp32, threads; model only on random input; end to end "
            "on 16 real held-out boards (see the module docstring for the stages of each side)",
            "data": str(args.data),
            "split": split_info,
        },
        "results": rows,
    }
    path = common.write_result(args.name, payload)
    print_summary(payload)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

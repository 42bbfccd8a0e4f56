"""YOLO on the budget ladder: the same data, minutes, core and evaluator as our ladder (bench/scaling.py).

    .venv/bin/python -m bench.peers_ladder --rung surface:yolo11n:352:10     # one run; writes its own JSON
    .venv/bin/python -m bench.peers_ladder --summary                         # curves JSON + one PNG per dataset

A rung is dataset:model:imgsz:minutes. Datasets are the ladder's, with the same held-out images:
- `deeppcb_plain`: DeepPCB, held-out board groups (our `load_dataset` split), tested images only: YOLO has no
  input for the template, and our ladder rung is `--no-template` too, so both sides see the same input;
- `deeppcb_template`: the same split with the template stacked as a second channel for YOLO (a two-page
  grayscale TIFF per board and `channels: 2` in its data.yaml, which Ultralytics accepts); ours with templates;
- `surface`: bench/train_surface.py's surface family (seed 0, 600 images, 128-2048 px, no template).
The input size is the point of the comparison: `matched` rows use the size our settings table chose for that
data (352 for the surface family; DeepPCB's 640 x 640 boards keep 640, which is also YOLO's default), and
`640` rows YOLO's default. YOLO trains from its yaml (no pretrained weights: nothing can be downloaded) in
`.venv-peers` (bench/peers_yolo.py: AGPL-3.0, never imported by defectdet), with its own defaults otherwise
(batch 16, SGD/auto optimizer, mosaic, `time=` budget, its CPU trainer's workers), `--threads` threads.
Its final weights predict the held-out images at conf 0.001 and OUR evaluator scores them (pycocotools COCO
mAP, as for ours). The curve between epochs is its own validation log (results.csv: their evaluator, the
same val images); the final point is ours. Run each rung pinned to one core (`taskset -c N`) with
`--threads 1`, as the ladder's rungs were. Writes `bench/results/peers_<dataset>_<model>_<imgsz>px_<minutes>min.json`.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from types import SimpleNamespace

from bench import common, peers
from bench.result_schema import read_result

BENCH = Path(__file__).resolve().parent
DATASETS = ("deeppcb_plain", "deeppcb_template", "surface")
OURS_COLOURS = {"nano": "tab:blue", "tiny": "tab:green"}  # our presets drawn beside YOLO (the two defaults)
OURS_IMGSZ = {
    "deeppcb_plain": 640,
    "deeppcb_template": 640,
    "surface": 352,
}  # what our settings table chose for this data
REACH = (0.5, 0.6, 0.7, 0.8)


def result_name(dataset: str, model: str, imgsz: int, minutes: float) -> str:
    return f"peers_{dataset}_{model}_{imgsz}px_{minutes:g}min"


def prepare(dataset: str, out: Path) -> tuple[Path, Path, object]:
    """(YOLO data.yaml, JSON list of held-out images to predict, our held-out split)."""
    from defectdet.data.formats import load_dataset

    folder = out / "data" / dataset
    folder.mkdir(parents=True, exist_ok=True)
    yolo_images = None
    if dataset.startswith("deeppcb"):
        train = load_dataset(peers.DEFAULT_DATA, "train")
        val = load_dataset(peers.DEFAULT_DATA, "val")
        template = dataset == "deeppcb_template"
        data_yaml = peers.write_yolo_dataset(train, val, folder, template=template)
        if template:  # YOLO predicts the two-channel TIFFs, not the tested images
            yolo_images = {s.image_id: folder / "images" / "val" / f"{s.image_id}.tif" for s in val.samples}
    else:
        from bench import train_surface

        ours_yaml = train_surface.make_dataset(Path("runs/bench_surface/data"), 600, 0).resolve()
        val = load_dataset(ours_yaml, "val")
        data_yaml = folder / "data.yaml"  # their loader resolves `path` against its own folder: absolute here
        names = list(val.class_names)
        data_yaml.write_text(
            json.dumps(
                {"path": str(ours_yaml.parent), "train": "images/train", "val": "images/val", "names": names}
            )
        )
    images_json = folder / "predict_images.json"
    images_json.write_text(
        json.dumps(
            [
                {
                    "id": s.image_id,
                    "path": str((yolo_images[s.image_id] if yolo_images else s.image_path).resolve()),
                }
                for s in val.samples
            ]
        )
    )
    return data_yaml, images_json, val


def input_size_choice(dataset: str, imgsz: int) -> str:
    if imgsz == OURS_IMGSZ[dataset]:
        return "matched: the size our settings table chose for this data" + (
            " (= their default)" if imgsz == 640 else ""
        )
    return "their default" if imgsz == 640 else "other"


def their_curve(rows: list[dict[str, str]]) -> list[dict[str, float]]:
    """(time_s, mAP50) per epoch from their results.csv (their evaluator on the same val images)."""
    curve = []
    for row in rows:
        value = row.get("metrics/mAP50(B)")
        if value not in (None, "", "nan"):
            curve.append(
                {"epoch": int(float(row["epoch"])), "time_s": float(row["time"]), "mAP50": float(value)}
            )
    return curve


def minutes_to_reach(curve: list[dict[str, float]], threshold: float) -> float | None:
    for point in curve:
        if point["mAP50"] >= threshold:
            return round(point["time_s"] / 60, 2)
    return None


def run_rung(dataset: str, model: str, imgsz: int, minutes: float, threads: int, out: Path) -> Path:
    from defectdet.evaluation.report import evaluate_records

    name = result_name(dataset, model, imgsz, minutes)
    data_yaml, images_json, val = prepare(dataset, out)
    peer_args = SimpleNamespace(
        peers_python=peers.DEFAULT_PEERS_PYTHON, minutes=minutes, out=out / name, imgsz=imgsz,
        threads=threads, seed=0, peer_options=["--no-export"] if dataset == "deeppcb_template" else [],
    )  # fmt: skip
    (out / name).mkdir(parents=True, exist_ok=True)
    document = peers.run_peer(f"{model}.yaml", peer_args, data_yaml, images_json)
    records = peers.peer_records(val.samples, document["predictions"])
    metrics = evaluate_records(records, list(val.class_names), out / name / "ours_eval", "coco", plots=False)
    curve = their_curve(document["results_csv"])
    final = {
        "mAP50": metrics["headline"]["mAP50"],
        "mAP50_95": metrics["headline"]["mAP50_95"],
        "class_AP50": metrics["coco"]["class_AP50"],
        "epochs": document["epochs_done"],
        "train_seconds": document["train_seconds"],
    }
    epochs_note = (
        None
        if document["epochs_done"] >= 10
        else f"only {document['epochs_done']} epochs fit in {minutes:g} min at {imgsz} px on one core"
    )
    common.print_table(name, ["figure", "value"], [[k, v] for k, v in final.items() if k != "class_AP50"])
    return common.write_result(
        name,
        {
            "command": f"python -m bench.peers_ladder --rung {dataset}:{model}:{imgsz}:{minutes:g} --threads {threads}",
            "dataset": dataset,
            "model": model,
            "imgsz": imgsz,
            "input_size_choice": input_size_choice(dataset, imgsz),
            "minutes": minutes,
            "threads": threads,
            "val_images": len(val.samples),
            "final_ours_evaluator": final,
            "epochs_note": epochs_note,
            "curve_their_evaluator": curve,
            "minutes_to_mAP50_their_evaluator": {f"{t:g}": minutes_to_reach(curve, t) for t in REACH},
            "params": document["params"],
            "gflops": document["gflops_counted"],
            "batch": document["batch"],
            "train_settings": document["train_settings"],
            "versions_peers_venv": document["versions"],
        },
    )


def summary() -> int:
    """peers_ladder.json: per dataset, our ladder's final points and curves beside YOLO's; one PNG each."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from bench.scaling import ladder_runs

    results = common.RESULTS_DIR
    document: dict[str, dict] = {}
    ladder = [run for run in ladder_runs() if run["preset"] in OURS_COLOURS]
    for dataset in DATASETS:
        ours = [run for run in ladder if run["dataset"] == dataset]
        theirs = [read_result(p) for p in sorted(results.glob(f"peers_{dataset}_*px_*min.json"))]
        if not theirs:
            continue
        rows = []
        figure, axis = plt.subplots(figsize=(7.5, 4.5))
        for run in sorted(ours, key=lambda r: (r["preset"], r["minutes"])):
            curve, colour = run.get("curve") or [], OURS_COLOURS[run["preset"]]
            axis.plot([p["time_s"] / 60 for p in curve], [p["mAP50"] for p in curve], color=colour, alpha=0.8)
            axis.scatter([run["wall_seconds"] / 60], [run["final"]["mAP50"]], color=colour, zorder=3)
            random = run["ladder"] != run["preset"] or dataset == "deeppcb_template"  # scaling.ladder_runs
            start = "random start" if random else "shipped weights"
            start += ": no template weights ship" if dataset == "deeppcb_template" else ""
            rows.append(
                {
                    "model": f"defectdet {run['preset']} ({start})",
                    "imgsz": OURS_IMGSZ[dataset],
                    "minutes": run["minutes"],
                    "mAP50": run["final"]["mAP50"],
                    "minutes_to_mAP50": {f"{t:g}": minutes_to_reach(curve, t) for t in REACH},
                    "file": f"{run['name']}.json",
                }
            )
        colours = {"yolo11n": "tab:red", "yolov8n": "tab:orange"}
        seen: set[str] = set()
        for run in sorted(theirs, key=lambda r: (r["model"], r["imgsz"], r["minutes"])):
            curve = run["curve_their_evaluator"]
            style = "-" if run["imgsz"] == OURS_IMGSZ[dataset] else "--"
            colour = colours.get(run["model"], "tab:gray")
            label = f"{run['model']} {run['imgsz']} px"
            label, seen = (
                ("_nolegend_" if label in seen else label),
                seen | {label},
            )  # one entry per model + size
            axis.plot(
                [p["time_s"] / 60 for p in curve],
                [p["mAP50"] for p in curve],
                style,
                color=colour,
                label=label,
            )
            final = run["final_ours_evaluator"]
            axis.scatter([final["train_seconds"] / 60], [final["mAP50"]], color=colour, marker="s", zorder=3)
            rows.append(
                {
                    "model": run["model"],
                    "imgsz": run["imgsz"],
                    "minutes": run["minutes"],
                    "epochs": final["epochs"],
                    "mAP50": final["mAP50"],
                    "minutes_to_mAP50": run["minutes_to_mAP50_their_evaluator"],
                    "epochs_note": run["epochs_note"],
                    "file": f"{result_name(dataset, run['model'], run['imgsz'], run['minutes'])}.json",
                }
            )
        for preset in sorted({run["preset"] for run in ours}):
            axis.plot(
                [], [], color=OURS_COLOURS[preset], label=f"defectdet {preset} {OURS_IMGSZ[dataset]} px"
            )
        axis.set_xlabel("training minutes on one core (1 thread)")
        axis.set_ylabel("mAP@0.5 on the held-out images")
        axis.set_title(
            f"{dataset}\nlines: each run's own validation log; markers: final point, our evaluator",
            fontsize=10,
        )
        axis.set_ylim(0, 1)
        axis.grid(alpha=0.3)
        axis.legend(loc="lower right", fontsize=8)
        figure.tight_layout()
        png = results / f"peers_{dataset}.png"
        figure.savefig(png, dpi=110)
        plt.close(figure)
        document[dataset] = {"rows": rows, "png": str(png.relative_to(results.parent.parent))}
        common.print_table(
            f"{dataset}: mAP@0.5 (final, our evaluator)",
            ["model", "px", "min", "mAP@0.5", "min to 0.7"],
            [
                [r["model"], r["imgsz"], r["minutes"], r["mAP50"], r["minutes_to_mAP50"].get("0.7")]
                for r in rows
            ],
        )
    common.write_result(
        "peers_ladder", {"command": "python -m bench.peers_ladder --summary", "datasets": document}
    )
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rung", help="dataset:model:imgsz:minutes, e.g. surface:yolo11n:352:10")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("runs/peers_ladder"))
    parser.add_argument("--summary", action="store_true")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    if args.summary:
        return summary()
    if not args.rung:
        parser.error("give --rung or --summary")
    dataset, model, imgsz, minutes = args.rung.split(":")
    if dataset not in DATASETS:
        parser.error(f"dataset must be one of {DATASETS}")
    if not peers.DEFAULT_PEERS_PYTHON.is_file():
        print(f"{peers.DEFAULT_PEERS_PYTHON} not found: run `make .venv-peers/.installed`", file=sys.stderr)
        return 2
    run_rung(dataset, model, int(imgsz), float(minutes), args.threads, args.out.resolve())
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A new board design on the line: do a few defect-free images of it close the no-template gap?

DeepPCB without templates, a preset (`--preset`, nano unless given), defaults (shipped weights) and a time budget. The model trains on the five
training groups; the held-out groups 77000 and 92000 stand for a board design the line starts making. From
each held-out group `--per-group` pairs (seeded) leave the validation split, and their golden templates, the
defect-free images such a line has of its new design, become `--clean-images`. The other held-out pairs score
both arms, side by side from the same commit:

    python -m bench.new_design --arm control --minutes 10 --threads 1   # no clean images
    python -m bench.new_design --arm clean --minutes 10 --threads 1     # + the templates as clean images
    python -m bench.new_design --summary
    python -m bench.new_design --preset tiny --arm control --minutes 20 --threads 1   # tiny (files new_design_tiny_*)
    python -m bench.new_design --preset tiny --arm clean --minutes 20 --threads 2     # both cores: *_threads-2.json
    python -m bench.new_design --summary --preset tiny --threads 2

This is not the held-out protocol of the ladder (`bench/scaling.py`): the clean arm has seen defect-free images
of the held-out design, which is the point. No tested image of a scored pair, and no template of one, trains.
Writes `bench/results/new_design[_<preset>]_<arm>_<minutes>min.json` and, with --summary,
`new_design[_<preset>].json` (every budget with both arms; no preset tag for nano, whose files came first).
A run with `--threads N` (N > 1) has the whole machine and is not a one-core run's peer: its files end `_threads-N`.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import cv2
import numpy as np
import yaml

from bench.common import RESULTS_DIR, limit_threads, print_table, write_result
from bench.pretrained import preset_tag
from bench.result_schema import read_result
from bench.train_deeppcb import DEFAULT_DATA, train_and_summarize
from defectdet.data.formats import load_dataset

ROOT = Path(__file__).resolve().parents[1]
VIEW = ROOT / "runs/bench_new_design"


def _link(source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        target.symlink_to(source.resolve())
    except FileExistsError:  # the other arm, started beside this one, made it
        pass


def _write_yolo(sample, split: str, view: Path) -> None:
    """The tested image (a link) and its boxes as a YOLO label file."""
    image = view / "images" / split / f"{sample.image_id}{sample.image_path.suffix}"
    _link(sample.image_path, image)
    height, width = cv2.imread(str(sample.image_path), cv2.IMREAD_GRAYSCALE).shape
    lines = []
    for (x0, y0, x1, y1), label in zip(sample.boxes, sample.classes, strict=True):
        lines.append(
            f"{int(label)} {(x0 + x1) / 2 / width:.6f} {(y0 + y1) / 2 / height:.6f} "
            f"{(x1 - x0) / width:.6f} {(y1 - y0) / height:.6f}"
        )
    label_file = view / "labels" / split / f"{sample.image_id}.txt"
    label_file.parent.mkdir(parents=True, exist_ok=True)
    label_file.write_text("\n".join(lines) + ("\n" if lines else ""))


def build_view(data: Path, per_group: int, seed: int, view: Path = VIEW) -> dict:
    """A YOLO dataset of DeepPCB's tested images (train: the training groups; val: the held-out pairs not
    picked) and a folder of the picked pairs' templates; returns what went where."""
    train = load_dataset(data, "train", format="deeppcb")
    val = load_dataset(data, "val", format="deeppcb")
    rng = np.random.default_rng(seed)
    by_group: dict[str, list] = {}
    for sample in val.samples:
        by_group.setdefault(sample.image_path.parent.name, []).append(sample)
    picked = set()
    for _group, samples in sorted(by_group.items()):
        chosen = rng.choice(len(samples), size=min(per_group, len(samples)), replace=False)
        picked.update(samples[int(index)].image_id for index in chosen)
    for sample in train.samples:
        _write_yolo(sample, "train", view)
    clean = view / f"clean_{per_group}"
    for sample in val.samples:
        if sample.image_id in picked:
            _link(sample.template_path, clean / f"{sample.image_id}_temp{sample.template_path.suffix}")
        else:
            _write_yolo(sample, "val", view)
    names = list(train.class_names)
    (view / "data.yaml").write_text(
        yaml.safe_dump({"path": ".", "train": "images/train", "val": "images/val", "names": names})
    )
    return {
        "data": str(view / "data.yaml"),
        "clean_images": str(clean),
        "train_images": len(train.samples),
        "val_images": len(val.samples) - len(picked),
        "clean_templates_per_group": {
            g: sum(s.image_id in picked for s in v) for g, v in sorted(by_group.items())
        },
    }


def threads_tag(threads: int | None) -> str:
    """`_threads-N` for a whole-machine run (N > 1 torch threads), nothing for one core or torch's default."""
    return f"_threads-{threads}" if threads and threads > 1 else ""


def run(
    arm: str, minutes: float, per_group: int, seed: int, threads: int | None, preset: str = "nano"
) -> Path:
    view = build_view(DEFAULT_DATA, per_group, seed)
    overrides = {"clean_images": view["clean_images"]} if arm == "clean" else {}
    name = f"new_design{preset_tag(preset)}_{arm}_{minutes:g}min{threads_tag(threads)}"
    summary = train_and_summarize(
        Path(view["data"]), minutes, preset, 2, Path("runs/bench_new_design_runs") / name, 0,
        template=False, overrides=overrides,
    )  # fmt: skip
    final = summary["final"]
    per_class = (summary["result"].final_metrics.get("coco") or {}).get("class_AP50")
    print_table(name, ["figure", "value"], [[k, v] for k, v in {**final, **(per_class or {})}.items()])
    return write_result(
        name,
        {
            "command": " ".join(["python -m bench.new_design", *sys.argv[1:]]),
            "arm": arm,
            "preset": preset,
            "minutes": minutes,
            "threads": threads,
            "view": view,
            "settings": summary["config"].to_dict(),
            "wall_seconds": summary["wall_seconds"],
            "time_to": summary["time_to"],
            "final": final,
            "held_out_per_class_AP50": per_class,
            "curve": summary["curve"],
        },
    )


def summarize(preset: str = "nano", threads: int | None = None) -> Path:
    """Every budget with both arms of `preset` in bench/results, side by side, into
    new_design[_<preset>][_threads-N].json."""
    prefix, tag = f"new_design{preset_tag(preset)}", threads_tag(threads)
    budgets = {}
    for path in sorted(RESULTS_DIR.glob(f"{prefix}_control_*min{tag}.json")):
        clean = path.with_name(path.name.replace("_control_", "_clean_"))
        if clean.is_file():
            control_doc, clean_doc = read_result(path), read_result(clean)
            budgets[f"{control_doc['minutes']:g}"] = {"control": control_doc, "clean": clean_doc}
    if not budgets:
        raise SystemExit(f"--summary needs both arms of a budget in {RESULTS_DIR}")
    first = next(iter(budgets.values()))["control"]
    classes = list(first["held_out_per_class_AP50"] or {})
    rows = [
        [minutes, arm, round(doc["final"]["mAP50"], 3), doc["view"]["val_images"]]
        + [round((doc["held_out_per_class_AP50"] or {}).get(c, float("nan")), 3) for c in classes]
        for minutes, arms in budgets.items()
        for arm, doc in arms.items()
    ]
    print_table(
        f"a new design, {preset}: control vs clean images", ["min", "arm", "mAP50", "val", *classes], rows
    )
    return write_result(
        prefix + tag,
        {
            "command": "python -m bench.new_design --summary"
            + (f" --preset {preset}" if preset != "nano" else "")
            + (f" --threads {threads}" if tag else ""),
            "preset": preset,
            "threads": threads,
            "budgets": {
                minutes: {
                    "sources": [f"{prefix}_{arm}_{minutes}min{tag}.json" for arm in arms],
                    "clean_images": sum(arms["clean"]["view"]["clean_templates_per_group"].values()),
                    **{
                        arm: {
                            "mAP50": doc["final"]["mAP50"],
                            "per_class_AP50": doc["held_out_per_class_AP50"],
                            "commit": doc["environment"]["git_commit"],
                        }
                        for arm, doc in arms.items()
                    },
                    "gain_mAP50": arms["clean"]["final"]["mAP50"] - arms["control"]["final"]["mAP50"],
                }
                for minutes, arms in budgets.items()
            },
        },
    )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--arm", choices=("control", "clean"))
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument(
        "--per-group", type=int, default=20, help="held-out pairs per group whose templates train"
    )
    parser.add_argument("--seed", type=int, default=0, help="which pairs are picked")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--preset", default="nano", help="model preset (nano, tiny, small, base)")
    parser.add_argument("--summary", action="store_true")
    args = parser.parse_args()
    if args.summary:
        print(f"wrote {summarize(args.preset, args.threads)}")
        return 0
    if args.arm is None:
        parser.error("--arm is required (or --summary)")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    limit_threads(args.threads)
    print(f"wrote {run(args.arm, args.minutes, args.per_group, args.seed, args.threads, args.preset)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

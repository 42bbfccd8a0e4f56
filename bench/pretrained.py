"""Shipped starting weights against random ones: the same budget, data the weights never saw.

    python -m bench.pretrained --dataset surface --init pretrained [--minutes 10] [--threads 1]
    python -m bench.pretrained --dataset surface --init scratch --preset tiny --threads 1   # another preset
    python -m bench.pretrained --summary          # the table of every arm found in bench/results

Datasets (held-out splits never trained on, and never seen by `bench/pretrain.py`):
- `deeppcb_plain`: DeepPCB without its templates, the held-out board groups (`train_deeppcb.py --no-template`);
- `deeppcb_template`: DeepPCB with templates (the product's default there);
- `surface`: the default surface family of `train_surface.py` (seed 0, 600 images, all five materials,
  up to 2048 px), against pretraining on seed 1003, four materials, up to 1024 px.
Each arm is `TrainConfig` defaults plus a time budget; only `pretrained` differs between the two inits.
Each arm writes `bench/results/pretrained_<dataset>_<init>_<minutes>min.json` (its curve included), so a
stopped session loses only the arm in flight. The pretrained arm of the shipped layout is the product's
default run, so `--summary` takes it from the budget ladder's rung (`scaling_<dataset>_nano_<minutes>min.json`,
`bench/scaling.py`) when the arm has no file of its own: one run, not two. Run the two inits of a dataset side by side with
`--threads 1` each, so that both see the same machine.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

from bench.common import RESULTS_DIR, limit_threads, print_table, write_result
from bench.result_schema import read_result

DATASETS = ("deeppcb_plain", "deeppcb_template", "surface")
INITS = ("scratch", "pretrained")


def run_arm(
    dataset: str,
    pretrained: bool | None,
    minutes: float,
    out: Path,
    seed: int = 0,
    preset: str = "nano",
    overrides: dict | None = None,
) -> dict:
    """Train `preset` with defaults and a time budget on `dataset`, score it on the held-out split; returns
    {settings, wall_seconds, time_to, final, curve} (bench/scaling.py calls this too). `pretrained` None:
    the product's default (shipped weights when they exist); `overrides`: other TrainConfig fields."""
    if dataset.startswith("deeppcb"):
        from bench.train_deeppcb import DEFAULT_DATA, train_and_summarize

        template = dataset == "deeppcb_template"
        run = train_and_summarize(
            DEFAULT_DATA,
            minutes,
            preset,
            2,
            out,
            seed,
            template=template,
            pretrained=pretrained,
            overrides=overrides,
        )
        final = run["final"]
        return {
            "settings": run["config"].to_dict(),
            "wall_seconds": run["wall_seconds"],
            "time_to": run["time_to"],
            "final": {"mAP50": final["mAP50"], "mAP50_95": final["mAP50_95"], "steps": final["steps"]},
            "held_out_per_class_AP50": (run["result"].final_metrics.get("coco") or {}).get("class_AP50"),
            "curve": run["curve"],
        }
    from bench.train_surface import make_dataset

    data_yaml = make_dataset(Path("runs/bench_surface/data"), 600, 0)
    return run_on_yaml(data_yaml, pretrained, minutes, out, seed, preset, overrides)


def run_on_yaml(
    data_yaml: Path,
    pretrained: bool | None,
    minutes: float,
    out: Path,
    seed: int = 0,
    preset: str | None = "nano",
    overrides: dict | None = None,
) -> dict:
    """`run_arm` on a YOLO data.yaml with `train` and `val` splits: defaults + a time budget, scored on `val`
    by `engine.validate` from the final weights (`best.pt` is picked on `val` itself, so scoring it would
    flatter the run). `preset` None: the one the data chooses."""
    import csv

    from bench.train_deeppcb import time_to_reach
    from defectdet.engine.config import TrainConfig
    from defectdet.engine.trainer import build_train_data, train
    from defectdet.engine.validate import validate

    config = TrainConfig(
        data=data_yaml,
        preset=preset,
        time_minutes=minutes,
        out=out,
        seed=seed,
        pretrained=pretrained,
        progress=False,
        **(overrides or {}),
    )
    data = build_train_data(config)
    started = time.perf_counter()
    result = train(data.config or config, data=data)
    wall_seconds = time.perf_counter() - started
    held_out = validate(
        result.last_checkpoint, data_yaml, split="val", protocol="coco", out=result.run_dir / "heldout"
    )
    with open(result.run_dir / "metrics.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    headline = held_out.get("headline", {})
    return {
        "settings": (data.config or config).to_dict(),
        "wall_seconds": wall_seconds,
        "time_to": {f"time_to_mAP50_{t:g}_s": time_to_reach(rows, "mAP50", t) for t in (0.5, 0.6, 0.7)},
        "final": {
            "mAP50": headline.get("mAP50"),
            "mAP50_95": headline.get("mAP50_95"),
            "steps": int(rows[-1]["step"]) if rows else 0,
        },
        "held_out_per_class_AP50": (held_out.get("coco") or {}).get("class_AP50"),
        "curve": [
            {"time_s": float(r["time"]), "mAP50": float(r["mAP50"])}
            for r in rows
            if r.get("mAP50") not in (None, "")
        ],
    }


def preset_tag(preset: str) -> str:
    """'' for nano (its files predate other presets' arms), '_<preset>' otherwise."""
    return "" if preset == "nano" else f"_{preset}"


def arm_name(dataset: str, init: str, minutes: float, preset: str = "nano") -> str:
    """`pretrained_<dataset>[_<preset>]_<init>_<minutes>min`."""
    return f"pretrained_{dataset}{preset_tag(preset)}_{init}_{minutes:g}min"


def arm_file(dataset: str, init: str, minutes: float, preset: str = "nano") -> Path:
    """The arm's own file; for the default init of a shipped layout (nano, no template) with no file of
    its own, the budget ladder's rung: `bench/scaling.py` runs exactly that arm (defaults + budget)."""
    path = RESULTS_DIR / f"{arm_name(dataset, init, minutes, preset)}.json"
    if path.is_file() or init != "pretrained" or dataset == "deeppcb_template" or preset != "nano":
        return path
    return RESULTS_DIR / f"scaling_{dataset}_nano_{minutes:g}min.json"


def summary(minutes: float, preset: str = "nano") -> int:
    """One table (and `pretrained_[<preset>_]<minutes>min.json`) from the arms' files: mAP@0.5 by dataset
    and init."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows, table, curves = [], {}, {}
    for dataset in DATASETS:
        arms = {}
        for init in INITS:
            path = arm_file(dataset, init, minutes, preset)
            if path.is_file():
                document = read_result(path)
                curves[(dataset, init)] = document["curve"]
                arms[init] = {
                    "mAP50": document["final"]["mAP50"],
                    "mAP50_95": document["final"]["mAP50_95"],
                    "steps": document["final"]["steps"],
                    "file": path.name,
                }
        if not arms:
            continue
        table[dataset] = arms
        if len(arms) == 2:  # how soon the pretrained run passes the scratch run's best validation score
            target = max(point["mAP50"] for point in curves[(dataset, "scratch")])
            reached = [p["time_s"] for p in curves[(dataset, "pretrained")] if p["mAP50"] >= target]
            arms["pretrained"]["minutes_to_scratch_best"] = round(reached[0] / 60, 2) if reached else None
        cells = [f"{arms[i]['mAP50']:.3f}" if i in arms else "not run" for i in INITS]
        gain = f"{arms['pretrained']['mAP50'] - arms['scratch']['mAP50']:+.3f}" if len(arms) == 2 else "n/a"
        rows.append([dataset, *cells, gain])
    if not table:
        print(f"no pretrained_* arms of {preset} at {minutes:g} min yet", file=sys.stderr)
        return 1
    figure, axes = plt.subplots(1, len(table), figsize=(4.5 * len(table), 3.6), squeeze=False)
    for axis, dataset in zip(axes[0], table, strict=True):
        for init, style in zip(INITS, ("--", "-"), strict=True):
            curve = curves.get((dataset, init), [])
            axis.plot([p["time_s"] / 60 for p in curve], [p["mAP50"] for p in curve], style, label=init)
        axis.set_title(f"{dataset} ({preset})")
        axis.set_xlabel("training minutes (1 thread, two runs side by side)")
        axis.set_ylabel("held-out mAP@0.5")
        axis.set_ylim(0, 1)
        axis.grid(alpha=0.3)
        axis.legend()
    figure.tight_layout()
    name = f"pretrained{preset_tag(preset)}_{minutes:g}min"
    figure.savefig(RESULTS_DIR / f"{name}.png", dpi=100)
    print_table(
        f"{preset}, {minutes:g} min, held-out mAP@0.5",
        ["dataset", "from scratch", "pretrained", "gain"],
        rows,
    )
    write_result(name, {"minutes": minutes, "preset": preset, "arms": table})
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dataset", choices=DATASETS)
    parser.add_argument("--init", choices=INITS)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--preset", default="nano", help="model preset (arms of other presets: own file names)"
    )
    parser.add_argument("--summary", action="store_true")
    parser.add_argument(
        "--weights-dir",
        type=Path,
        default=None,
        help="take <preset>_<layout>.pt from here instead of the package (weights that do not ship, e.g. the "
        "template layout written by bench/pretrain.py --layout template --weights-dir DIR)",
    )
    args = parser.parse_args()
    if args.summary:
        return summary(args.minutes, args.preset)
    if not (args.dataset and args.init):
        parser.error("--dataset and --init are required (or --summary)")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    limit_threads(args.threads)
    if args.weights_dir is not None:
        from defectdet.model import pretrained as pretrained_weights

        pretrained_weights.WEIGHTS_DIR = args.weights_dir.resolve()
    name = arm_name(args.dataset, args.init, args.minutes, args.preset)
    out = Path("runs/bench_pretrained") / name
    body = run_arm(args.dataset, args.init == "pretrained", args.minutes, out, args.seed, args.preset)
    print_table(name, ["figure", "value"], [[k, v] for k, v in {**body["time_to"], **body["final"]}.items()])
    path = write_result(
        name,
        {
            "command": " ".join(["python -m bench.pretrained", *sys.argv[1:]]),
            "dataset": args.dataset,
            "init": args.init,
            "preset": args.preset,
            "threads": args.threads,
            **body,
        },
    )
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

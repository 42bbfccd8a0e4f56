"""Time-to-accuracy on DeepPCB: train on some board groups, validate on whole held-out groups.

    python -m bench.train_deeppcb [--minutes 20] [--preset nano] [--no-template] [--data ../shared/datasets/deeppcb]

Validation boards (groups 77000 and 92000 on the shared trainval half: the highest-numbered groups
until >= 20% of images) are never seen in training; images of one board are near-duplicates, so a
random split would overstate accuracy. Prints time-to-mAP@0.5 0.90 / 0.95 (wall clock including
validation) and the final metrics, with the DeepPCB F at a threshold chosen on the training split,
and writes bench/results/train_deeppcb_<preset>_<minutes>min.json.
"""

from __future__ import annotations

import argparse
import csv
import logging
import resource
import sys
import time
from pathlib import Path

from bench.common import print_table, write_result
from defectdet.engine.config import TrainConfig, load_config
from defectdet.engine.trainer import train

DEFAULT_DATA = Path(__file__).resolve().parents[1] / ".." / "shared" / "datasets" / "deeppcb"
THRESHOLDS = (0.90, 0.95, 0.986)


def time_to_reach(rows: list[dict[str, str]], key: str, threshold: float) -> float | None:
    """Seconds (the run's own clock, validation included) at the first validation with `key` >= threshold."""
    for row in rows:
        value = row.get(key)
        if value not in (None, "") and float(value) >= threshold:
            return float(row["time"])
    return None


def train_and_summarize(
    data: Path,
    minutes: float,
    preset: str,
    val_every: int,
    out: Path,
    seed: int = 0,
    template: bool | None = None,
    pretrained: bool | None = None,
    overrides: dict | None = None,
) -> dict:
    """Train `preset` on DeepPCB's train split for `minutes`, validating on the held-out groups; returns
    {config (with the settings the run chose from the data), result, wall_seconds, time_to, final, curve}
    (bench/peers.py calls this too). `overrides`: other TrainConfig fields (bench/ablate.py)."""
    fields = {
        "data": data,
        "train_split": "train",
        "val_split": "val",
        "preset": preset,
        "time_minutes": minutes,
        "val_every": val_every,
        "out": out,
        "seed": seed,
        "template": template,
        "pretrained": pretrained,
        "progress": sys.stdout.isatty(),
    }
    config = TrainConfig(**{**fields, **(overrides or {})})  # an override may replace val_every too
    started = time.perf_counter()
    result = train(config)
    wall_seconds = time.perf_counter() - started
    config = load_config(result.run_dir / "config.yaml")  # the settings it chose: pretrained, strides, ...

    with open(result.run_dir / "metrics.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    reached = {f"time_to_mAP50_{t:g}_s": time_to_reach(rows, "mAP50", t) for t in THRESHOLDS}
    headline = result.final_metrics.get("headline", {})
    final = {
        "mAP50": headline.get("mAP50"),
        "mAP50_95": headline.get("mAP50_95"),
        "deeppcb_mAP_iou0.33": headline.get("deeppcb_mAP"),
        "deeppcb_F_best": headline.get("deeppcb_F"),
        "best_mAP50": result.best_metrics.get("mAP50"),
        "epochs": float(rows[-1]["epoch"]) if rows else None,
        "steps": int(rows[-1]["step"]) if rows else None,
        "train_images_per_second": float(rows[-1]["images_per_second"]) if rows else None,
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }
    final.update(score_at_threshold_from_train(result, data, out))
    curve = [
        {"time_s": float(r["time"]), "epoch": float(r["epoch"]), "mAP50": float(r["mAP50"])}
        for r in rows
        if r.get("mAP50") not in (None, "")
    ]
    return {
        "config": config,
        "result": result,
        "wall_seconds": wall_seconds,
        "time_to": reached,
        "final": final,
        "curve": curve,
    }


def score_at_threshold_from_train(result, data: Path, out: Path) -> dict:
    """DeepPCB F on the held-out groups at the threshold with the best box F1 on the *training* split: a
    threshold chosen on other data than it is reported on (the trainer's own F is the best-F1 point of
    the held-out records themselves, which flatters it)."""
    from defectdet.engine.validate import validate

    checkpoint = result.last_checkpoint  # the final weights: best.pt is picked on the held-out split itself
    metrics = validate(
        checkpoint, data, split="val", conf_from="train", conf_rule="f1", out=out / "val_conf_from_train"
    )
    at_threshold = metrics["deeppcb"]["at_threshold"]
    return {
        "conf_from_train": metrics["threshold"]["threshold"],
        "deeppcb_F_at_conf_from_train": at_threshold["f_score"],
        "precision_at_conf_from_train": at_threshold["precision"],
        "recall_at_conf_from_train": at_threshold["recall"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--minutes", type=float, default=20.0)
    parser.add_argument("--preset", default="nano")
    parser.add_argument("--val-every", type=int, default=2, help="validate every N epochs")
    parser.add_argument("--out", type=Path, default=Path("runs/bench_deeppcb"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--no-template",
        action="store_true",
        help="train on the tested image alone (DeepPCB without its templates)",
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    if not (args.data / "trainval.txt").is_file():
        print(f"DeepPCB not found at {args.data} (needs trainval.txt); pass --data", file=sys.stderr)
        return 2

    template = False if args.no_template else None
    run = train_and_summarize(
        args.data, args.minutes, args.preset, args.val_every, args.out, args.seed, template
    )
    config, result, wall_seconds = run["config"], run["result"], run["wall_seconds"]
    reached, final, curve = run["time_to"], run["final"], run["curve"]
    print_table(
        f"DeepPCB, {args.preset}, {args.minutes:g} min budget, held-out board groups",
        ["figure", "value"],
        [[key, value if value is not None else "not reached"] for key, value in {**reached, **final}.items()],
    )
    path = write_result(
        f"train_deeppcb_{args.preset}_{args.minutes:g}min" + ("_notemplate" if args.no_template else ""),
        {
            "settings": config.to_dict(),
            "wall_seconds": wall_seconds,
            "time_to": reached,
            "final": final,
            "curve": curve,
            "run_dir": str(result.run_dir),
        },
    )
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

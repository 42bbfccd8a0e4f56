"""Clean-board false-call rate and escape rate at a threshold chosen on other boards.

Usage: ``python -m bench.clean_boards [--checkpoint runs/deeppcb_nano/best.pt] [--data ../shared/datasets/deeppcb]
[--label deeppcb] [--name clean_boards_deeppcb]``; synthetic boards: ``defectdet synth runs/synth_small --boards 240
--seed 7 --min-size 320 --max-size 384``, ``defectdet train runs/synth_small/data.yaml --preset nano --time 10
--out runs/synth_nano``, then ``--checkpoint runs/synth_nano/best.pt --data runs/synth_small/data.yaml --label synth
--name clean_boards_synth``. Writes ``bench/results/<name>.json``.

For each dataset the held-out split (`--split`, default val) is cut in two folds: DeepPCB by board group
(77000 / 92000), other data by alternating images. Cross-fitting: the threshold is the highest one whose
board-level escape rate on fold A's defective boards is <= 1 % (`evaluation.threshold.threshold_for_escape`);
fold B's defective boards give the escape rate and fold B's clean boards the false-call rate; then A and B
swap, and the counts are pooled. So no board is scored at a threshold chosen on itself.

A clean board is a recapture of a template (`data.recapture`): conditions are the old test (template as its
own tested image), the default nuisances (exposure, gamma, noise, JPEG, 0.25-2 px shift, <= 0.25 deg), and
fixed 0 / 1 / 2 / 3 / 6 px shifts with 0.5 deg rotation; each with pair registration off and on.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bench import common
from defectdet.data.formats import load_dataset
from defectdet.data.formats.deeppcb import group_of
from defectdet.data.recapture import RecaptureConfig, make_clean_boards
from defectdet.data.sample import DatasetSplit, Sample
from defectdet.engine.checkpoint import load_detector
from defectdet.engine.predict import predict_records, registration_summary
from defectdet.evaluation.threshold import board_rates, threshold_for_escape
from defectdet.runtime.spec import ModelSpec

TARGET_ESCAPE = 0.01


def conditions() -> list[tuple[str, RecaptureConfig, float | None, float | None]]:
    """(name, recapture config, fixed shift px, fixed |rotation| deg)."""
    default = RecaptureConfig()
    rows = [
        ("template as tested (old test)", RecaptureConfig.none(), 0.0, 0.0),
        ("nuisances, default ranges", default, None, None),
    ]
    for shift in (0.0, 1.0, 2.0, 3.0, 6.0):  # 6 px: beyond the default range, where misregistration bites
        rows.append((f"nuisances, {shift:g} px + 0.5 deg", default.with_motion(shift, 0.5), shift, 0.5))
    return rows


def score_quantiles(records: Sequence) -> dict[str, float]:
    """The highest detection score per clean board (0 without detections): the margin to the threshold."""
    scores = np.array([max(record.max_score, 0.0) for record in records])
    return {
        "p50": float(np.median(scores)),
        "p99": float(np.percentile(scores, 99)),
        "max": float(scores.max()),
    }


def folds(split: DatasetSplit) -> tuple[list[Sample], list[Sample], str]:
    if split.format == "deeppcb":
        groups = sorted({group_of(sample) for sample in split.samples})
        if len(groups) >= 2:
            first = set(groups[: len(groups) // 2])
            a = [s for s in split.samples if group_of(s) in first]
            b = [s for s in split.samples if group_of(s) not in first]
            return a, b, f"board groups {sorted(first)} vs {sorted(set(groups) - first)}"
    return split.samples[0::2], split.samples[1::2], "alternating images"


class Runner:
    def __init__(self, checkpoint: Path, imgsz: int | None) -> None:
        self.model, state = load_detector(checkpoint)
        spec = ModelSpec.from_checkpoint(state, checkpoint)
        self.imgsz = imgsz or spec.input_size
        self.template = spec.template
        self.spec = spec.model_copy(update={"input_size": self.imgsz})
        self.checkpoint = checkpoint
        self.seconds = 0.0

    def predict(self, samples: Sequence[Sample], register: bool) -> list:
        started = time.perf_counter()
        spec = self.spec.model_copy(update={"registration": self.template and register})
        records, skipped = predict_records(self.model, samples, spec)
        self.seconds += time.perf_counter() - started
        if skipped:
            raise SystemExit(f"unreadable images: {skipped[:3]}")
        return records


def bench_dataset(
    name: str, runner: Runner, data: Path, split_name: str, work: Path, seed: int
) -> list[dict]:
    split = load_dataset(data, split_name)
    fold_a, fold_b, how = folds(split)
    defective: dict[bool, tuple[list, list]] = {}
    for register in (False, True):
        defective[register] = (runner.predict(fold_a, register), runner.predict(fold_b, register))
    rows = []
    for condition, config, shift, rotation in conditions():
        for register in (False, True):
            if not runner.template and register:
                continue
            pooled: dict[str, Any] = {
                "defective_boards": 0,
                "escapes": 0,
                "clean_boards": 0,
                "false_calls": 0,
            }
            thresholds, registered = [], []
            for calibration, report, report_samples in (
                (defective[register][0], defective[register][1], fold_b),
                (defective[register][1], defective[register][0], fold_a),
            ):
                choice = threshold_for_escape(calibration, TARGET_ESCAPE, source="the other fold")
                folder = work / f"{name}_{len(rows)}_{len(thresholds)}"
                part = DatasetSplit(report_samples, split.class_names, split.format, split_name, split.root)
                clean = runner.predict(
                    make_clean_boards(part, folder, config, channels=runner.channels, seed=seed), register
                )
                rates = board_rates(list(report) + clean, choice.threshold)
                for key in pooled:
                    pooled[key] += rates[key]
                thresholds.append({**choice.to_dict(), "report_fold_rates": rates})
                registered += clean
            row = {
                "dataset": name,
                "condition": condition,
                "registration": register,
                "shift_px": shift,
                "rotation_deg": rotation,
                "nuisances": config.model_dump(mode="json"),
                **pooled,
                "false_call_rate": pooled["false_calls"] / pooled["clean_boards"],
                "escape_rate": pooled["escapes"] / pooled["defective_boards"],
                "thresholds": thresholds,
                "clean_registration": registration_summary(registered),
                "clean_max_score": score_quantiles(registered),
            }
            rows.append(row)
            print(
                f"{name:8s} {condition:34s} reg={'on ' if register else 'off'} "
                f"false calls {row['false_calls']}/{row['clean_boards']} ({100 * row['false_call_rate']:.1f} %), "
                f"escapes {row['escapes']}/{row['defective_boards']} ({100 * row['escape_rate']:.1f} %), "
                f"thresholds {[round(t['threshold'], 3) for t in thresholds]}, "
                f"highest clean score {row['clean_max_score']['max']:.3f}",
                flush=True,
            )
    for row in rows:
        row["folds"] = how
        row["checkpoint"] = str(runner.checkpoint)
        row["data"] = f"{data} [{split_name}]"
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", type=Path, default=Path("runs/deeppcb_nano/best.pt"))
    parser.add_argument("--data", type=Path, default=Path("../shared/datasets/deeppcb"))
    parser.add_argument("--label", default="deeppcb", help="dataset name in the rows")
    parser.add_argument("--split", default="val")
    parser.add_argument("--imgsz", type=int, default=None)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--name", default="clean_boards_deeppcb")
    parser.add_argument("--note", default="")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    load_before = common.machine_info().get("load_average")
    started = time.perf_counter()
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as work:
        runner = Runner(args.checkpoint, args.imgsz)
        rows += bench_dataset(args.label, runner, args.data, args.split, Path(work), args.seed)
    payload = {
        "description": "board-level false-call rate (recaptured clean templates) and escape rate (defective "
        "boards) at a threshold chosen on the other fold (highest with escape <= 1 % there), pooled over two folds",
        "target_escape_on_calibration": TARGET_ESCAPE,
        "shared_machine": True,
        "load_average_before": load_before,
        "seconds": time.perf_counter() - started,
        "note": args.note,
        "rows": rows,
    }
    path = common.write_result(args.name, payload)
    common.print_table(
        "clean boards",
        ["dataset / condition", "registration", "false calls", "escapes"],
        [
            [
                f"{row['dataset']}: {row['condition']}",
                "on" if row["registration"] else "off",
                f"{row['false_calls']}/{row['clean_boards']} ({100 * row['false_call_rate']:.1f} %)",
                f"{row['escapes']}/{row['defective_boards']} ({100 * row['escape_rate']:.1f} %)",
            ]
            for row in rows
        ],
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()

"""Seconds per training step of each default preset at the shape `train` gives it, measured side by side.

    python -m bench.step_speed [--threads 1 2] [--rounds 3]

The shapes are the defaults for DeepPCB-like data (640 px images, 320 px crops, gray): nano with templates at
batch 16; tiny without templates at batch 16; lite0 without templates at batch 8, from ImageNet with its stem
frozen (the default) and with every layer training; lite0 with one companion capture (every layer trains).
Each is timed with `defectdet.engine.step_speed.measure_step_seconds`, the measurement `train` itself makes
before choosing between lite0 and tiny, rounds interleaved so the machine's load falls on every shape alike.
Writes bench/results/step_speed.json: seconds per step, images per second, and each shape's images per second
against tiny's.
"""

from __future__ import annotations

import argparse
import statistics

from bench.common import limit_threads, print_table, write_result
from defectdet.engine.step_speed import StepShape, measure_step_seconds

SHAPES = {
    "nano, with templates": StepShape("nano", 1, True, 0, 320, 16),
    "tiny, no templates": StepShape("tiny", 1, False, 0, 320, 16),
    "lite0, no templates, frozen stem": StepShape("lite0", 1, False, 0, 320, 8, True),
    "lite0, no templates, every layer": StepShape("lite0", 1, False, 0, 320, 8),
    "lite0, one companion capture": StepShape("lite0", 1, False, 1, 320, 8),
}
BASELINE = "tiny, no templates"


def measure(threads: int, rounds: int) -> list[dict]:
    limit_threads(threads)
    timings: dict[str, list[float]] = {name: [] for name in SHAPES}
    for _ in range(rounds):
        for name, shape in SHAPES.items():
            timings[name].append(measure_step_seconds(shape))
    rows = []
    for name, shape in SHAPES.items():
        seconds = statistics.median(timings[name])
        rows.append({"shape": name, **vars(shape), "threads": threads, "seconds_per_step": seconds})
        rows[-1]["images_per_second"] = shape.batch / seconds
    base = next(row["images_per_second"] for row in rows if row["shape"] == BASELINE)
    for row in rows:
        row["images_per_second_vs_tiny"] = row["images_per_second"] / base
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    rows = [row for threads in args.threads for row in measure(threads, args.rounds)]
    print_table(
        "training step per preset",
        ("shape", "threads", "s/step", "images/s", "images/s vs tiny"),
        [
            (
                r["shape"],
                r["threads"],
                r["seconds_per_step"],
                r["images_per_second"],
                r["images_per_second_vs_tiny"],
            )
            for r in rows
        ],
    )
    threads = " ".join(map(str, args.threads))
    command = f"python -m bench.step_speed --threads {threads} --rounds {args.rounds}"
    path = write_result("step_speed", {"command": command, "settings": vars(args), "results": rows})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()

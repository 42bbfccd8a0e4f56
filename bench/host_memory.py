"""What keeping freed host memory buys a CPU training step (`engine.host_memory`, on by default in `train`).

    python -m bench.host_memory [--steps 25] [--repeats 3] [--threads 2] [--tag xeon]

Times forward + backward + AdamW steps the way the trainer runs them (channels-last, batch 16 crops of
320 px, fp32) for the default no-template layout (tiny, gray) and the template layout (nano, gray pairs), each
in a fresh process with glibc's default malloc and with `keep_freed_memory()`, the two arms alternating
`--repeats` times. Prints median ms/step, minor page faults and kernel CPU time per step and the peak RSS, and writes
bench/results/host_memory[_<tag>].json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from bench.common import print_table, write_result

LAYOUTS = {"tiny, no template": ("tiny", 1, False), "nano, template": ("nano", 2, True)}
ARMS = ("default malloc", "keep freed memory")

STEP_PROBE = """
import json, resource, sys, time
import torch
from defectdet.engine.host_memory import keep_freed_memory
from defectdet.model import build_model
preset, channels, template, keep, steps, threads = sys.argv[1:7]
if keep == "1":
    keep_freed_memory()
torch.manual_seed(0)
torch.set_num_threads(int(threads))
model = build_model(preset, num_classes=6, in_channels=int(channels), template=template == "1")
model = model.to(memory_format=torch.channels_last).train()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
images = torch.rand(16, int(channels), 320, 320).contiguous(memory_format=torch.channels_last)
targets = [torch.tensor([[i % 6, 40.0, 40.0, 80.0, 76.0], [1, 150.0, 120.0, 190.0, 170.0]]) for i in range(16)]
def step():
    optimizer.zero_grad(set_to_none=True)
    model(images, targets)["loss"].backward()
    optimizer.step()
for _ in range(3):
    step()
usage = resource.getrusage(resource.RUSAGE_SELF)
started = time.perf_counter()
for _ in range(int(steps)):
    step()
seconds = time.perf_counter() - started
after = resource.getrusage(resource.RUSAGE_SELF)
n = int(steps)
print(json.dumps({
    "ms_per_step": 1e3 * seconds / n,
    "page_faults_per_step": (after.ru_minflt - usage.ru_minflt) / n,
    "kernel_ms_per_step": 1e3 * (after.ru_stime - usage.ru_stime) / n,
    "peak_rss_mb": after.ru_maxrss / 1024,
}))
"""


def time_arm(layout: tuple[str, int, bool], keep: bool, steps: int, threads: int) -> dict:
    preset, channels, template = layout
    source = str(Path(__file__).resolve().parents[1] / "src")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([source, os.environ.get("PYTHONPATH", "")])}
    args = [preset, str(channels), str(int(template)), str(int(keep)), str(steps), str(threads)]
    completed = subprocess.run(
        [sys.executable, "-c", STEP_PROBE, *args], capture_output=True, text=True, check=True, env=env
    )
    return json.loads(completed.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=25)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tag", default="", help="appended to the file name (another CPU)")
    args = parser.parse_args()
    figures: dict[str, dict] = {}
    rows = []
    for name, layout in LAYOUTS.items():
        runs: dict[str, list[dict]] = {arm: [] for arm in ARMS}
        for _ in range(args.repeats):  # alternating, so a slower minute of the machine hits both arms
            for arm in ARMS:
                runs[arm].append(time_arm(layout, arm == ARMS[1], args.steps, args.threads))
        medians = {
            arm: {key: statistics.median(run[key] for run in runs[arm]) for key in runs[arm][0]}
            for arm in ARMS
        }
        speedup = medians[ARMS[0]]["ms_per_step"] / medians[ARMS[1]]["ms_per_step"]
        figures[name] = {"runs": runs, "median": medians, "speedup": speedup}
        for arm in ARMS:
            m = medians[arm]
            rows.append(
                [
                    name,
                    arm,
                    m["ms_per_step"],
                    m["page_faults_per_step"],
                    m["kernel_ms_per_step"],
                    m["peak_rss_mb"],
                ]
                + [speedup if arm == ARMS[1] else 1.0]
            )
    print_table(
        f"train step, batch 16 x 320 px, channels-last, {args.threads} threads (median of {args.repeats})",
        ["layout", "malloc", "ms/step", "page faults/step", "kernel ms/step", "peak RSS MB", "speed"],
        rows,
    )
    write_result(
        f"host_memory_{args.tag}" if args.tag else "host_memory", {"settings": vars(args), **figures}
    )


if __name__ == "__main__":
    main()

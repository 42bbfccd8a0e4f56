"""Does bf16 autocast speed up a training step on this CPU? (It decides `amp` on CPU: off unless it helps.)

    python -m bench.amp_cpu [--preset nano] [--batch 16] [--crop 320] [--steps 20] [--tag xeon]

The answer depends on the CPU: bf16 needs AVX512-BF16 or AMX to be fast (the JSON records the CPU model and
whether torch sees AMX); `--tag` writes bench/results/amp_cpu_<tag>.json so one CPU's answer does not replace
another's.

Times forward + backward + AdamW step on random template-stacked crops, fp32 vs bf16 autocast, same
seed; prints ms/step and the ratio, writes bench/results/amp_cpu.json.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from bench.common import print_table, write_result
from defectdet.model import build_model


def time_steps(
    preset: str, batch: int, crop: int, steps: int, threads: int, dtype: torch.dtype | None
) -> float:
    torch.manual_seed(0)
    torch.set_num_threads(threads)
    model = build_model(preset, num_classes=6, in_channels=2, template=True).to(
        memory_format=torch.channels_last
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    images = torch.rand(batch, 2, crop, crop).to(memory_format=torch.channels_last)
    targets = [
        torch.tensor([[i % 6, 40.0, 40.0, 80.0, 76.0], [1, 150.0, 120.0, 190.0, 170.0]]) for i in range(batch)
    ]
    timings = []
    for step in range(steps + 3):
        started = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
            losses = model(images, targets)
        losses["loss"].backward()
        optimizer.step()
        if step >= 3:  # warm-up steps excluded
            timings.append((time.perf_counter() - started) * 1e3)
    return statistics.median(timings)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--preset", default="nano")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--crop", type=int, default=320)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tag", default="", help="appended to the file name (another CPU)")
    args = parser.parse_args()
    fp32 = time_steps(args.preset, args.batch, args.crop, args.steps, args.threads, None)
    bf16 = time_steps(args.preset, args.batch, args.crop, args.steps, args.threads, torch.bfloat16)
    rows = [["fp32", fp32, 1.0], ["bf16 autocast", bf16, fp32 / bf16]]
    print_table(
        f"train step, {args.preset}, batch {args.batch} x {args.crop}px, {args.threads} threads",
        ["precision", "ms/step (p50)", "speed vs fp32"],
        rows,
    )
    write_result(
        f"amp_cpu_{args.tag}" if args.tag else "amp_cpu",
        {
            "settings": vars(args),
            "cpu_has_amx": bool(getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)()),
            "ms_per_step": {"fp32": fp32, "bf16": bf16},
            "bf16_speedup": fp32 / bf16,
        },
    )


if __name__ == "__main__":
    main()

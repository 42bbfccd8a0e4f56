"""`defectdet demo` timed end to end, its held-out figures written to bench/results/demo.json.

    .venv/bin/python -m bench.demo [--out runs/demo_check] [--minutes 6] [--boards 160]

Runs exactly what `make demo` runs (`defectdet.demo.run_demo`: synthesize, check, train, validate on the
held-out boards with their templates as clean boards, export the bundle, predict without torch) and records
the wall time of all steps together with the held-out metrics the demo prints. The checkpoint it leaves in
`--out/run/best.pt` is the one bench/synth_to_deeppcb.py scores on DeepPCB.
"""

from __future__ import annotations

import argparse
import logging
import resource
import sys
import time
from pathlib import Path

import yaml
from rich.console import Console

from bench.common import print_table, write_result
from defectdet.demo import DEMO_MINUTES, run_demo

HEADLINE_KEYS = ("mAP50", "mAP50_95", "deeppcb_F", "threshold", "escape_rate", "false_call_rate")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=Path("runs/demo_check"))
    parser.add_argument(
        "--minutes", type=float, default=DEMO_MINUTES, help="training budget (the demo's default)"
    )
    parser.add_argument("--boards", type=int, default=160, help="synthetic boards (the demo's default)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")

    started = time.perf_counter()
    metrics = run_demo(args.out, minutes=args.minutes, boards=args.boards, console=Console())
    wall_seconds = time.perf_counter() - started
    headline = metrics.get("headline", {})
    held_out = {key: headline.get(key) for key in HEADLINE_KEYS}
    held_out["threshold_source"] = headline.get("threshold_source")
    config_path = args.out / "run" / "config.yaml"
    run_config = yaml.safe_load(config_path.read_text(encoding="utf-8")) if config_path.is_file() else None
    payload = {
        "command": f"defectdet demo --out {args.out} --minutes {args.minutes:g} --boards {args.boards}",
        "wall_minutes_all_steps": round(wall_seconds / 60, 2),
        "held_out": held_out,
        "held_out_per_class_AP50": {row["class"]: row.get("AP50") for row in metrics.get("per_class", [])},
        "deploy": metrics.get("deploy"),
        "training_settings": run_config,
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }
    print_table(
        "defectdet demo, all steps",
        ["figure", "value"],
        [["wall minutes (all steps)", payload["wall_minutes_all_steps"]]]
        + [[key, value] for key, value in held_out.items()],
    )
    print(f"wrote {write_result('demo', payload)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

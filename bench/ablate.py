"""One default switched: the budget ladder's run with a setting changed, against the ladder's rung.

    python -m bench.ablate --rung deeppcb_plain:nano:10 --set clean_templates=false [--threads 1]
    python -m bench.ablate --rung surface:nano:10 --set seed=1      # the rung again, another seed
    python -m bench.ablate --rung deeppcb_plain:tiny:20 --set synthetic_boards=400 --threads 2   # both cores: *_threads-2.json
    python -m bench.ablate --rung deeppcb_plain:tiny:20 --set synthetic_boards=0 --tag stop38   # a same-commit control
    python -m bench.ablate --rung deeppcb_plain:tiny:20 --set val_every=null   # the product's validation cadence
    python -m bench.ablate --rung surface:tiny:30 --set epochs=40 --set "augment={mosaic_prob: 0.5}"  # a nested field

DeepPCB rungs validate on the held-out groups every 2 epochs (the curves between budget points), which takes
training time from a time-budgeted run; `val_every=null` validates as `train` does by default (about ten times).

Runs `bench/pretrained.run_arm` (defaults + a time budget, the held-out split) with the TrainConfig fields
given by `--set` (YAML values), and writes `bench/results/ablate_<dataset>_<preset>_<minutes>min_<k>-<v>.json`
beside the rung `scaling_<dataset>_<preset>_<minutes>min.json` it is compared with (`bench/scaling.py`).
Run both from the same commit, side by side at one thread each, so that they see the same machine.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import yaml

from bench.common import RESULTS_DIR, limit_threads, print_table, write_result
from bench.pretrained import run_arm
from bench.result_schema import read_result
from bench.scaling import result_name


def parse_settings(pairs: list[str]) -> dict:
    """['clean_templates=false', 'lr=0.004'] -> {'clean_templates': False, 'lr': 0.004}."""
    found = {}
    for pair in pairs:
        key, separator, value = pair.partition("=")
        if not separator or not key:
            raise SystemExit(f"--set {pair!r}: expected KEY=VALUE")
        found[key] = yaml.safe_load(value)
    return found


def _flat(tree: dict, prefix: str = "") -> dict:
    """{'augment': {'mosaic_prob': 0.5}} -> {'augment.mosaic_prob': 0.5}: file names without braces or spaces."""
    flat = {}
    for key, value in tree.items():
        flat.update(_flat(value, f"{prefix}{key}.") if isinstance(value, dict) else {f"{prefix}{key}": value})
    return flat


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rung", required=True, help="dataset:preset:minutes, e.g. deeppcb_plain:nano:10")
    parser.add_argument("--set", dest="settings", action="append", required=True, help="KEY=VALUE")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument(
        "--tag",
        default="",
        help="appended to the file name: a repeat of a setting whose file exists (another commit)",
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    limit_threads(args.threads)
    dataset, preset, minutes = args.rung.split(":")
    overrides = parse_settings(args.settings)
    suffix = "_".join(f"{key}-{value}" for key, value in _flat(overrides).items())
    base = result_name(dataset, preset, float(minutes))
    name = base.replace("scaling_", "ablate_", 1) + f"_{suffix}"
    if args.threads and args.threads > 1:  # a whole-machine run is not the one-core rung's peer: its own file
        name += f"_threads-{args.threads}"
    if args.tag:
        name += f"_{args.tag}"
    seed = int(overrides.pop("seed", 0))  # run_arm's own argument (a repeat of the rung with another seed)
    body = run_arm(dataset, None, float(minutes), Path("runs/bench_ablate") / name, seed, preset, overrides)
    rows = [[k, v] for k, v in {**body["time_to"], **body["final"]}.items()]
    baseline = RESULTS_DIR / f"{base}.json"
    if baseline.is_file():
        rows.append([f"{base} mAP50", read_result(baseline)["final"]["mAP50"]])
    print_table(name, ["figure", "value"], rows)
    path = write_result(
        name,
        {
            "command": " ".join(["python -m bench.ablate", *sys.argv[1:]]),
            "dataset": dataset,
            "preset": preset,
            "minutes": float(minutes),
            "overrides": {**overrides, "seed": seed},
            "compared_with": baseline.name,
            "threads": args.threads,
            **body,
        },
    )
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

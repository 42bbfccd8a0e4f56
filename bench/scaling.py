"""The budget ladder: does more CPU time (or a larger preset) buy more accuracy?

    python -m bench.scaling --rung deeppcb_plain:nano:10      # one run; writes its own JSON
    python -m bench.scaling --all [--presets nano,tiny]        # every missing rung, in order
    python -m bench.scaling --summary                          # curves JSON + bench/results/scaling.png

Rungs (issue 19): each preset at 10, 30 and 60 minutes on DeepPCB without templates and on the surface
family, and the default preset for templates (nano) at 10 and 60 minutes on DeepPCB with templates. Every run uses the product's
defaults plus a time budget (shipped starting weights where they exist), through `bench/pretrained.run_arm`,
and writes `bench/results/scaling_<dataset>_<preset>_<minutes>min.json`, so a stopped session loses only the
run in flight. The curves between budget points are each run's own validation log.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from bench.common import RESULTS_DIR, _git, limit_threads, print_table, write_result
from bench.pretrained import run_arm
from bench.result_schema import read_result

LADDER_MINUTES = (10, 30, 60)
TEMPLATE_MINUTES = (10, 60)


def rungs(presets: list[str]) -> list[tuple[str, str, int]]:
    """(dataset, preset, minutes), cheapest first so that a short session still fills the 10-minute column."""
    found = [(d, p, m) for m in LADDER_MINUTES for p in presets for d in ("deeppcb_plain", "surface")]
    from defectdet.engine.autoconfig import auto_preset

    found += [("deeppcb_template", auto_preset(True)[0], m) for m in TEMPLATE_MINUTES]
    return sorted(found, key=lambda rung: rung[2])


def result_name(dataset: str, preset: str, minutes: float) -> str:
    return f"scaling_{dataset}_{preset}_{minutes:g}min"


def run_rung(dataset: str, preset: str, minutes: float, threads: int | None = None) -> Path:
    name = result_name(dataset, preset, minutes)
    body = run_arm(dataset, None, minutes, Path("runs/bench_scaling") / name, 0, preset)
    print_table(name, ["figure", "value"], [[k, v] for k, v in {**body["time_to"], **body["final"]}.items()])
    return write_result(
        name,
        {
            "command": f"python -m bench.scaling --rung {dataset}:{preset}:{minutes:g}"
            + (f" --threads {threads}" if threads else ""),
            "dataset": dataset,
            "threads": threads,
            "preset": preset,
            "minutes": minutes,
            **body,
        },
    )


def rises_with_budget(points: list[dict]) -> dict[str, dict]:
    """Per dataset and preset: the final mAP@0.5 at each budget, the gain of the largest budget over the
    smallest, and whether every longer budget beat the shorter one."""
    found: dict[str, dict] = {}
    for key in sorted({(p["dataset"], p["preset"]) for p in points}):
        ladder = sorted((p["minutes"], p["mAP50"]) for p in points if (p["dataset"], p["preset"]) == key)
        values = [value for _, value in ladder]
        found[f"{key[0]}:{key[1]}"] = {
            "minutes": [minutes for minutes, _ in ladder],
            "mAP50": values,
            "gain_last_over_first": values[-1] - values[0] if len(values) > 1 else None,
            "rises": all(b > a for a, b in zip(values[:-1], values[1:], strict=True))
            if len(values) > 1
            else None,
        }
    return found


def started_from_shipped_weights(run: dict) -> bool:
    """Whether a run started from the shipped weights. Runs that left `pretrained` to the default record None:
    they did when the preset's plain file was in the package at the run's commit (template weights never ship)."""
    pretrained = (run.get("settings") or {}).get("pretrained")
    if pretrained is not None or run["dataset"] == "deeppcb_template":
        return bool(pretrained)
    commit = (run.get("environment") or {}).get("git_commit")
    if not commit:
        return True
    path = f"src/defectdet/model/weights/{run['preset']}_plain.pt"
    return (_git("cat-file", "-t", f"{commit}:{path}") or "").strip() == "blob"


def ladder_runs() -> list[dict]:
    """Every scaling_*.json, plus each pretrained arm of `bench/pretrained.py` (`--init pretrained`: the shipped
    weights, defaults and a budget, the very run a rung makes) for a rung that has no file of its own. Each run
    gets `ladder`: its preset, marked "random start" where a run without templates did not start from the
    shipped weights (a run from before they shipped), so that it is not read as a point of the default's curve."""
    runs = [read_result(path) for path in sorted(RESULTS_DIR.glob("scaling_*_*min.json"))]
    have = {(run["dataset"], run["preset"], float(run["minutes"])) for run in runs}
    for path in sorted(RESULTS_DIR.glob("pretrained_*_pretrained_*min.json")):
        arm = read_result(path)
        minutes = float(arm["settings"]["time_minutes"])
        key = (arm.get("dataset"), arm.get("preset") or "nano", minutes)
        if key[0] in ("deeppcb_plain", "surface") and key not in have:
            runs.append({**arm, "preset": key[1], "minutes": minutes})
            have.add(key)
    for run in runs:
        random = run["dataset"] != "deeppcb_template" and not started_from_shipped_weights(run)
        run["ladder"] = f"{run['preset']} (random start)" if random else run["preset"]
    return runs


def summary() -> int:
    """Collects the ladder's runs (`ladder_runs`) into scaling.json (final points, curves, rises-with-budget)
    and one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = ladder_runs()
    if not runs:
        print("no scaling_*.json yet: run --rung or --all first", file=sys.stderr)
        return 1
    datasets = sorted({run["dataset"] for run in runs})
    threads = sorted({str(run.get("threads") or "default") for run in runs})
    figure, axes = plt.subplots(1, len(datasets), figsize=(5 * len(datasets), 4), squeeze=False)
    rows, points, curves = [], [], []
    for axis, dataset in zip(axes[0], datasets, strict=True):
        for run in sorted(
            (r for r in runs if r["dataset"] == dataset), key=lambda r: (r["ladder"], r["minutes"])
        ):
            curve = run.get("curve", [])
            label = f"{run['ladder']} {run['minutes']:g} min"
            (line,) = axis.plot([p["time_s"] / 60 for p in curve], [p["mAP50"] for p in curve], label=label)
            final = run["final"]["mAP50"]
            axis.scatter([run["minutes"]], [final], marker="o", color=line.get_color(), zorder=3)
            rows.append(
                [dataset, run["ladder"], f"{run['minutes']:g}", f"{final:.3f}", run["final"].get("steps")]
            )
            points.append(
                {"dataset": dataset, "preset": run["ladder"], "minutes": run["minutes"], "mAP50": final}
            )
            curves.append({"run": run["name"], "dataset": dataset, "preset": run["ladder"], "curve": curve})
        axis.set_title(dataset)
        axis.set_xlabel(f"training minutes (CPU, torch threads: {', '.join(threads)})")
        axis.set_ylabel("mAP@0.5 (dot: held-out, kept weights)")
        axis.grid(alpha=0.3)
        axis.legend(fontsize=7)
    figure.suptitle("Budget ladder: each budget is its own run with its own LR schedule", fontsize=10)
    figure.tight_layout()
    figure.savefig(RESULTS_DIR / "scaling.png", dpi=110)
    print_table("budget ladder, held-out mAP@0.5", ["dataset", "preset", "minutes", "mAP@0.5", "steps"], rows)
    trend = rises_with_budget(points)
    print_table(
        "does more budget buy more accuracy?",
        ["dataset:preset", "minutes", "mAP@0.5", "last - first", "rises"],
        [
            [
                key,
                ", ".join(f"{m:g}" for m in v["minutes"]),
                ", ".join(f"{x:.3f}" for x in v["mAP50"]),
                "-" if v["gain_last_over_first"] is None else f"{v['gain_last_over_first']:+.3f}",
                v["rises"],
            ]
            for key, v in trend.items()
        ],
    )
    write_result(
        "scaling",
        {"points": points, "rises_with_budget": trend, "curves": curves, "runs": [r["name"] for r in runs]},
    )
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rung", help="dataset:preset:minutes, e.g. surface:nano:30")
    parser.add_argument("--all", action="store_true", help="run every rung without a result file yet")
    parser.add_argument(
        "--presets", default="nano,tiny", help="comma-separated presets of the no-template rungs"
    )
    parser.add_argument("--summary", action="store_true")
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads (default: torch's); 1 leaves the other core free for a second run or other work",
    )
    parser.add_argument("--datasets", default=None, help="comma-separated subset of the ladder's datasets")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    limit_threads(args.threads)
    if args.summary:
        return summary()
    if args.rung:
        dataset, preset, minutes = args.rung.split(":")
        print(f"wrote {run_rung(dataset, preset, float(minutes), args.threads)}")
        return 0
    if args.all:
        wanted = set(args.datasets.split(",")) if args.datasets else None
        done = {(run["dataset"], run["preset"], float(run["minutes"])) for run in ladder_runs()}
        for dataset, preset, minutes in rungs(args.presets.split(",")):
            if wanted is not None and dataset not in wanted:
                continue
            if (dataset, preset, float(minutes)) not in done:
                print(f"wrote {run_rung(dataset, preset, minutes, args.threads)}")
        return summary()
    parser.error("give --rung, --all or --summary")
    return 2


if __name__ == "__main__":
    sys.exit(main())

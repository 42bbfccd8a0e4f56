"""Does the default preset without templates (tiny) hold on data no benchmark tuned it on?

    python -m bench.preset_modes --mode steel --preset tiny --minutes 5 --threads 1   # one arm, its own JSON
    python -m bench.preset_modes --all --minutes 5 --threads 1                        # every missing arm
    python -m bench.preset_modes --summary --minutes 5                                # preset_modes_<m>min.json

`engine.autoconfig.auto_preset` picks tiny for data without templates from two datasets (DeepPCB without
templates and the default surface family, `bench/results/pretrained_tiny_10min.json`). This bench checks that
choice on other synthetic modes, each drawn with a seed no other bench or the pretraining uses (`MODES`): small
gray steel strips, the cast material the pretraining left out, odd-sized colour tiles, and colour boards
without templates. Both arms are the product's defaults with a time budget and shipped weights; only the
preset differs. Scored on each mode's own `val` split (20%, never trained on) by `engine.validate`. Run the
arms of a mode on the same core, or side by side at one thread each, so that both see the same machine.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from bench.common import RESULTS_DIR, limit_threads, print_table, write_result
from bench.pretrained import run_on_yaml
from bench.result_schema import read_result
from defectdet.data.synth import synthesize_dataset

ROOT = Path("runs/bench_preset_modes")
PRESETS = ("nano", "tiny")
SEED = 4242  # + the mode's index: pretraining uses 1001-1003, the surface family 0, the demo 0: none of them
MODES: dict[str, dict] = {
    # NEU-like: 200-320 px gray strips of rolled steel
    "steel": {"kind": "surface", "materials": ("rolled",), "color": False, "min_size": 200, "max_size": 320},
    # the material pretraining never saw, colour, mid-sized
    "cast": {"kind": "surface", "materials": ("cast",), "color": True, "min_size": 256, "max_size": 1024},
    # odd-sized ceramic tiles, colour
    "tile": {"kind": "surface", "materials": ("tile",), "color": True, "min_size": 105, "max_size": 618},
    # colour boards, the tested image alone (a line without golden images)
    "boards": {"kind": "pcb", "template": False, "color": True, "min_size": 400, "max_size": 640},
}
IMAGES = 300


def mode_seed(mode: str) -> int:
    """One seed per mode: the same seed would draw the same defects on every material."""
    return SEED + list(MODES).index(mode)


def mode_data(mode: str) -> Path:
    """The mode's dataset, synthesized once (a stamp records what was drawn)."""
    root = ROOT / mode
    settings = {key: list(value) if isinstance(value, tuple) else value for key, value in MODES[mode].items()}
    wanted = {"mode": mode, "images": IMAGES, "seed": mode_seed(mode), **settings}
    stamp = root / "bench_stamp.json"
    if stamp.is_file() and json.loads(stamp.read_text()) == wanted:
        return root / "data.yaml"
    data_yaml = synthesize_dataset(root, boards=IMAGES, seed=mode_seed(mode), progress=False, **MODES[mode])
    stamp.write_text(json.dumps(wanted))
    return data_yaml


def arm_name(mode: str, preset: str, minutes: float) -> str:
    return f"preset_modes_{mode}_{preset}_{minutes:g}min"


def run(mode: str, preset: str, minutes: float, threads: int | None) -> Path:
    name = arm_name(mode, preset, minutes)
    body = run_on_yaml(mode_data(mode), None, minutes, ROOT / "runs" / name, 0, preset)
    print_table(name, ["figure", "value"], [[k, v] for k, v in {**body["time_to"], **body["final"]}.items()])
    command = f"python -m bench.preset_modes --mode {mode} --preset {preset} --minutes {minutes:g}"
    return write_result(
        name,
        {
            "command": command + (f" --threads {threads}" if threads else ""),
            "mode": mode,
            "mode_settings": {**MODES[mode], "images": IMAGES, "seed": mode_seed(mode)},
            "preset": preset,
            "minutes": minutes,
            "threads": threads,
            **body,
        },
    )


def summary(minutes: float) -> Path:
    """Per mode: each preset's mAP@0.5 and lowest class AP50, and tiny minus nano."""
    modes: dict[str, dict] = {}
    for mode in MODES:
        arms = {}
        for preset in PRESETS:
            path = RESULTS_DIR / f"{arm_name(mode, preset, minutes)}.json"
            if path.is_file():
                doc = read_result(path)
                per_class = doc.get("held_out_per_class_AP50") or {}
                lowest = min(per_class.items(), key=lambda item: item[1]) if per_class else (None, None)
                arms[preset] = {
                    "mAP50": doc["final"]["mAP50"],
                    "mAP50_95": doc["final"]["mAP50_95"],
                    "steps": doc["final"]["steps"],
                    "lowest_class": {"name": lowest[0], "AP50": lowest[1]},
                    "imgsz": doc["settings"].get("imgsz"),
                    "file": path.name,
                    "commit": doc["environment"].get("git_commit"),
                }
        if len(arms) == len(PRESETS):
            arms["tiny_minus_nano_mAP50"] = arms["tiny"]["mAP50"] - arms["nano"]["mAP50"]
            modes[mode] = arms
    if not modes:
        raise SystemExit(f"--summary: no mode has both arms at {minutes:g} min in {RESULTS_DIR}")
    print_table(
        f"tiny vs nano, defaults, {minutes:g} min",
        ["mode", "px", "nano", "tiny", "tiny - nano", "nano lowest", "tiny lowest"],
        [
            [mode, arms["tiny"]["imgsz"], arms["nano"]["mAP50"], arms["tiny"]["mAP50"],
             arms["tiny_minus_nano_mAP50"], arms["nano"]["lowest_class"]["AP50"],
             arms["tiny"]["lowest_class"]["AP50"]]
            for mode, arms in modes.items()
        ],
    )  # fmt: skip
    wins = sum(arms["tiny_minus_nano_mAP50"] > 0 for arms in modes.values())
    return write_result(
        f"preset_modes_{minutes:g}min",
        {
            "command": f"python -m bench.preset_modes --summary --minutes {minutes:g}",
            "minutes": minutes,
            "modes": modes,
            "tiny_wins": f"{wins} of {len(modes)}",
        },
    )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mode", choices=list(MODES))
    parser.add_argument("--preset", choices=PRESETS)
    parser.add_argument("--all", action="store_true", help="every arm without a result file, mode by mode")
    parser.add_argument("--minutes", type=float, default=5.0)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--summary", action="store_true")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    if args.summary:
        print(f"wrote {summary(args.minutes)}")
        return 0
    limit_threads(args.threads)
    if args.all:
        for mode in MODES:
            for preset in PRESETS:
                if not (RESULTS_DIR / f"{arm_name(mode, preset, args.minutes)}.json").is_file():
                    print(f"wrote {run(mode, preset, args.minutes, args.threads)}")
        print(f"wrote {summary(args.minutes)}")
        return 0
    if args.mode is None or args.preset is None:
        parser.error("give --mode and --preset, --all, or --summary")
    print(f"wrote {run(args.mode, args.preset, args.minutes, args.threads)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

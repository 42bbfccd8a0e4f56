"""Before and after on a shifted line: does the closed loop (keep -> review -> fine-tune -> compare) win back
what a new lamp took?

    python -m bench.loop_shift [--base-steps 700] [--finetune-steps 300] [--new-images 40] [--threads 1]

1. Line A: synthetic gray boards with their golden templates (`synth`, seed 11, 160 boards). A model is trained
   with the product's defaults for --base-steps and exported: the deployed bundle. (Steps, not minutes: the
   loop and its control must get the same training whatever else runs on the machine.)
2. The shift: boards of the same kind (seed 12, other boards) under a new lamp: the tested images darker, with
   less contrast and a light fall-off across the board (`new_lamp`); the golden templates stay the ones taken
   under the old lamp, as on a line where the template was captured once.
3. The loop: --new-images shifted images from the shifted train split, labelled with their true boxes (what
   an operator's review gives), become the new data; `train --from BUNDLE --old-data LINE_A` for
   --finetune-steps; export; `compare OLD NEW` on the shifted val split. A control fine-tunes from the same
   bundle for the same steps on line A alone: is it the new images, or only more training?
4. Every bundle is scored through the torch-free runtime at its own stored threshold (`compare_models`) on
   both val splits: the shifted one (recovered?) and line A's (forgotten?). False calls are counted on clean
   boards of the same lamp: for line A, recaptures of its templates (`--clean-auto`); for the shifted line,
   its val templates under the new lamp.

Writes bench/results/loop_shift.json and loop_shift.png (the top of `compare`'s disagreement grid on the shifted
line). The thresholds are the ones each export chose on its own training
data's validation split; every figure is on val splits no model trained on.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import sys
import time
from pathlib import Path

import cv2
import numpy as np

from bench.common import RESULTS_DIR, limit_threads, print_table, write_result

OUT = Path("runs/bench_loop_shift")


def new_lamp(image: np.ndarray, seed: int) -> np.ndarray:
    """The tested image under the new lamp: `defectdet synth --shift lamp` (`data.synth.shift.new_lamp`)."""
    from defectdet.data.synth.shift import new_lamp as lamp

    return lamp(image, seed)


def make_lines(new_images: int) -> tuple[Path, Path, Path]:
    """(line A data.yaml, shifted data.yaml, the new data: `new_images` shifted train images as a dataset)."""
    from defectdet.data.synth import synthesize_dataset
    from defectdet.data.synth.shift import shift_dataset

    line_a = synthesize_dataset(OUT / "line_a", boards=160, seed=11, template=True, progress=False)
    root = OUT / "shifted"
    shutil.rmtree(root, ignore_errors=True)  # the lamp is applied once, to freshly drawn boards
    shifted = synthesize_dataset(
        root, boards=2 * new_images, seed=12, template=True, val_fraction=0.5, progress=False
    )
    shift_dataset(root, ["lamp"], seed=0)  # what `defectdet synth --shift lamp` does
    new = OUT / "new_data"
    shutil.rmtree(new, ignore_errors=True)
    for folder in ("images", "labels", "templates"):
        (new / folder).mkdir(parents=True)
    for image in sorted((root / "images" / "train").glob("*.png"))[:new_images]:
        shutil.copyfile(image, new / "images" / image.name)
        shutil.copyfile(root / "labels" / "train" / f"{image.stem}.txt", new / "labels" / f"{image.stem}.txt")
        shutil.copyfile(root / "templates" / "train" / image.name, new / "templates" / image.name)
    names = (line_a.read_text().split("names:")[1]).strip()
    (new / "data.yaml").write_text(
        f"path: .\ntrain: images\nval: images\ntemplates: templates\nnames:\n{names}\n"
    )
    return line_a, shifted, new / "data.yaml"


def clean_boards(root: Path) -> tuple[Path, Path]:
    """The shifted val split's templates photographed under the new lamp: defect-free boards of that line."""
    folder = root / "clean_new_lamp"
    folder.mkdir(exist_ok=True)
    templates = root / "templates" / "val"
    for number, path in enumerate(sorted(templates.glob("*.png"))):
        cv2.imwrite(
            str(folder / path.name), new_lamp(cv2.imread(str(path), cv2.IMREAD_UNCHANGED), 10_000 + number)
        )
    return folder, templates


def train_bundle(name: str, steps: int, data: Path, **fields: object) -> tuple[Path, dict]:
    """Train with the defaults (plus `fields`) for `steps` optimizer steps, export; (bundle, run facts)."""
    from defectdet.engine.config import TrainConfig
    from defectdet.engine.trainer import build_train_data, train
    from defectdet.export.exporter import export_bundle

    config = TrainConfig(data=data, max_steps=steps, epochs=10_000, out=OUT / name, progress=False, **fields)
    prepared = build_train_data(config)
    started = time.perf_counter()
    result = train(prepared.config or config, data=prepared)
    wall = time.perf_counter() - started
    checkpoint = result.last_checkpoint  # the final weights: best.pt is picked on the held-out split itself
    bundle = export_bundle(checkpoint, OUT / f"{name}.onnx", force=True).bundle
    facts = {
        "max_steps": steps,
        "wall_seconds": round(wall, 1),
        "steps": result.state.step,
        "epochs": result.state.epoch,
        "data": str(data),
        "settings_rows": {choice.name: str(choice.value) for choice in prepared.choices},
    }
    return bundle, facts


def score(old: Path, new: Path, data: Path, name: str, threads: int, clean: tuple[Path, Path] | None) -> dict:
    """Both bundles on `data`'s val split, each at its own stored threshold (the `compare` command's scoring);
    `clean`: (clean boards, their templates), else recaptures of the split's templates."""
    from defectdet.export.compare import compare_models

    where = {"clean": clean[0], "clean_templates": clean[1]} if clean else {"clean_auto": True}
    document = compare_models(old, new, data, out=OUT / "compare" / name, threads=threads, **where)
    keep = ("mAP50", "mAP50_95", "escapes", "false_calls", "latency_ms")
    return {
        "models": {
            role: {key: entry.get(key) for key in keep} | {"threshold": entry["threshold"]["value"]}
            for role, entry in document["models"].items()
        },
        "verdict": document["verdict"]["decision"],
        "reasons": document["verdict"]["reasons"],
        "split_images": document["split_images"],
        "disagreements": len(document["disagreements"]),
    }


def grid_excerpt(grid: Path, out: Path, height_px: int = 1400, width_px: int = 1000) -> Path | None:
    """The top of `compare`'s disagreement grid (its first boards), scaled to `width_px`, for the README."""
    image = cv2.imread(str(grid))
    if image is None:
        return None
    top = image[:height_px]
    scale = width_px / top.shape[1]
    cv2.imwrite(str(out), cv2.resize(top, None, fx=scale, fy=scale, interpolation=cv2.INTER_AREA))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--base-steps", type=int, default=700)
    parser.add_argument("--finetune-steps", type=int, default=300)
    parser.add_argument("--new-images", type=int, default=40)
    parser.add_argument("--threads", type=int, default=None, help="torch and onnxruntime threads")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    limit_threads(args.threads)
    threads = args.threads or 1
    line_a, shifted, new_data = make_lines(args.new_images)
    clean = clean_boards(shifted.parent)
    base, base_facts = train_bundle("base", args.base_steps, line_a)
    loop, loop_facts = train_bundle("loop", args.finetune_steps, new_data, start_from=base, old_data=line_a)
    control, control_facts = train_bundle("control", args.finetune_steps, line_a, start_from=base)
    figures = {
        "loop_on_shifted": score(base, loop, shifted, "loop_shifted", threads, clean),
        "loop_on_line_a": score(base, loop, line_a, "loop_line_a", threads, None),
        "control_on_shifted": score(base, control, shifted, "control_shifted", threads, clean),
        "control_on_line_a": score(base, control, line_a, "control_line_a", threads, None),
    }
    rows = []
    for split, key in (("shifted val", "shifted"), ("line A val", "line_a")):
        before = figures[f"loop_on_{key}"]["models"]["old"]
        after = figures[f"loop_on_{key}"]["models"]["new"]
        control_after = figures[f"control_on_{key}"]["models"]["new"]
        rows.append([split, before["mAP50"], after["mAP50"], control_after["mAP50"]])
    print_table(
        "loop_shift: mAP@0.5", ["split", "deployed", "after the loop", "control (old data only)"], rows
    )
    grid_excerpt(OUT / "compare" / "loop_shifted" / "disagreements.png", RESULTS_DIR / "loop_shift.png")
    write_result(
        "loop_shift",
        {
            "command": "python -m bench.loop_shift " + " ".join(sys.argv[1:]),
            "description": __doc__.split("\n\n")[1].strip(),
            "settings": {
                "base_steps": args.base_steps,
                "finetune_steps": args.finetune_steps,
                "new_images": args.new_images,
                "threads": args.threads,
                "line_a": "synth seed 11, 160 gray boards with templates",
                "shifted": f"synth seed 12, {2 * args.new_images} boards (half train, half val), new_lamp()",
            },
            "runs": {"base": base_facts, "loop": loop_facts, "control": control_facts},
            "figures": figures,
            "table": {"columns": ["split", "deployed", "after_loop", "control"], "rows": rows},
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Learn the starting weights the package ships (`model.pretrained`) from the project's synthetic families.

    python -m bench.pretrain --preset nano --layout plain [--epochs 30] [--boards 400] [--surfaces 600]

Data, all written by `defectdet synth` with seeds no benchmark uses (1001-1003):
- `template` layout: PCB boards with their golden templates, half gray and half colour.
- `plain` layout: the same boards without their templates, plus textured surfaces of four of the five
  materials (`cast` is left out) at 128-1024 px. `bench/pretrained.py` measures transfer on the default
  surface family (seed 0, all five materials, up to 2048 px) and on DeepPCB, which pretraining never saw.
The classes of the families are kept apart (pcb 6 + surface 6); fine-tuning replaces the class logits.
Training: RGB, whole images letterboxed to 384 px, head levels at strides 8/16/32 (so every level a
fine-tuned model may use gets weights), an epoch budget (the same on any machine), EMA weights kept.
Writes `src/defectdet/model/weights/<preset>_<layout>.pt` and `bench/results/pretrain_<preset>_<layout>.json`.
"""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from bench.common import print_table, write_result
from defectdet.data.formats import load_dataset
from defectdet.data.sample import DatasetSplit, Sample
from defectdet.engine.checkpoint import load_detector
from defectdet.engine.config import TrainConfig
from defectdet.engine.trainer import TrainData, cache_budget_bytes, train
from defectdet.model.pretrained import WEIGHTS_DIR, layout_name, save_weights
from defectdet.trainingdata.dataset import DetectionDataset, Draws, ItemLayout, Reading

ROOT = Path(__file__).resolve().parents[1]
PCB_SEEDS = {"gray": 1001, "color": 1002}
SURFACE_SEED = 1003
SURFACE_MATERIALS = "brushed,rolled,tile,weave"  # 'cast' is left out for the transfer benchmark
IMGSZ = 384


def synthesize(root: Path, name: str, arguments: list[str]) -> Path:
    """One synthetic family under `root/name`, reused when the same arguments made it."""
    folder = root / name
    stamp = folder / "pretrain_stamp.json"
    if stamp.is_file() and json.loads(stamp.read_text()) == arguments:
        return folder / "data.yaml"
    command = [sys.executable, "-m", "defectdet.cli", "synth", str(folder), *arguments]
    subprocess.run(command, check=True)
    stamp.write_text(json.dumps(arguments))
    return folder / "data.yaml"


def merge(splits: list[DatasetSplit], template: bool, split: str, root: Path) -> DatasetSplit:
    """One split holding every family's samples; class ids are offset so the families stay apart."""
    samples: list[Sample] = []
    names: list[str] = []
    for part in splits:
        offset = len(names)
        names += [f"{part.root.name}:{name}" for name in part.class_names]
        for sample in part.samples:
            samples.append(
                Sample(
                    sample.image_path,
                    sample.boxes,
                    sample.classes + offset,
                    sample.template_path if template else None,
                    sample.source,
                    f"{part.root.name}/{sample.image_id}",
                )
            )
    return DatasetSplit(samples, names, "yolo", split, root)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--preset", default="nano")
    parser.add_argument("--layout", choices=("plain", "template"), required=True)
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--boards", type=int, default=400, help="PCB boards per colour mode (80%% train)")
    parser.add_argument("--surfaces", type=int, default=600, help="surfaces (plain layout only)")
    parser.add_argument("--root", type=Path, default=Path("runs/pretrain"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--weights-dir", type=Path, default=WEIGHTS_DIR, help="where the weights file goes")
    parser.add_argument("--results-dir", type=Path, default=None, help="default bench/results")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    template = args.layout == "template"

    started = time.perf_counter()
    families = [
        synthesize(
            args.root / "data", "pcb_gray", ["--boards", str(args.boards), "--seed", "1001", "--gray"]
        ),
        synthesize(
            args.root / "data", "pcb_color", ["--boards", str(args.boards), "--seed", "1002", "--color"]
        ),
    ]
    if not template:
        surface_arguments = ["--kind", "surface", "--boards", str(args.surfaces), "--seed", str(SURFACE_SEED)]
        surface_arguments += ["--max-size", "1024", "--materials", SURFACE_MATERIALS]
        families.append(synthesize(args.root / "data", "surface", surface_arguments))
    synth_seconds = time.perf_counter() - started
    run_root = args.root / f"{args.preset}_{args.layout}"
    splits = {
        split: merge([load_dataset(path, split) for path in families], template, split, run_root)
        for split in ("train", "val")
    }
    config = TrainConfig(
        data=families[0],
        preset=args.preset,
        input_size=IMGSZ,
        crop_size=0,
        channels=3,
        template=template,
        strides=[8, 16, 32],
        batch=12,
        class_balance="off",
        tiles=False,
        pretrained=False,
        epochs=args.epochs,
        val_every=max(1, args.epochs // 5),
        out=run_root / "run",
        seed=args.seed,
        progress=sys.stdout.isatty(),
    )

    def dataset(split: str, training: bool) -> DetectionDataset:
        augment = config.augment if training else None
        return DetectionDataset(
            splits[split],
            ItemLayout(input_size=IMGSZ, channels=3, template=template),
            Draws(augment=augment, train=training, seed=args.seed),
            Reading(register_pairs=False, cache_bytes=cache_budget_bytes(None, None) if training else 0),
        )

    data = TrainData(
        dataset("train", True),
        dataset("val", False),
        list(splits["train"].class_names),
        in_channels=6 if template else 3,
        template=template,
        config=config,
    )
    train_started = time.perf_counter()
    result = train(config, data=data)
    train_seconds = time.perf_counter() - train_started

    checkpoint = result.last_checkpoint
    model, _ = load_detector(checkpoint)  # EMA weights
    provenance = {
        "made_by": "bench/pretrain.py",
        "families": [str(path.parent.name) for path in families],
        "train_images": len(splits["train"].samples),
        "epochs": args.epochs,
        "imgsz": IMGSZ,
        "class_names": list(splits["train"].class_names),
        "synthetic_val_mAP50": result.final_metrics.get("headline", {}).get("mAP50"),
    }
    weights = save_weights(model, args.weights_dir / f"{args.preset}_{layout_name(template)}.pt", provenance)
    figures = {
        "synthetic_val_mAP50": provenance["synthetic_val_mAP50"],
        "synthetic_val_mAP50_95": result.final_metrics.get("headline", {}).get("mAP50_95"),
        "train_images": provenance["train_images"],
        "val_images": len(splits["val"].samples),
        "epochs": args.epochs,
        "steps": result.state.step,
        "train_minutes": round(train_seconds / 60, 2),
        "synth_minutes": round(synth_seconds / 60, 2),
        "weights_kib": round(weights.stat().st_size / 1024, 1),
        "parameters": int(sum(np.prod(p.shape) for p in model.parameters())),
    }
    print_table(
        f"pretraining {args.preset} ({args.layout})",
        ["figure", "value"],
        [[k, v] for k, v in figures.items()],
    )
    path = write_result(
        f"pretrain_{args.preset}_{args.layout}",
        {
            "command": " ".join(["python -m bench.pretrain", *sys.argv[1:]]),
            "weights": str(weights.resolve().relative_to(ROOT))
            if weights.resolve().is_relative_to(ROOT)
            else str(weights),
            "provenance": provenance,
            "settings": config.to_dict(),
            "final": figures,
        },
        **({"directory": args.results_dir} if args.results_dir else {}),
        produced=[weights],
    )
    print(f"wrote {weights} and {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

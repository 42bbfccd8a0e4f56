"""Synthetic boards mixed into DeepPCB training without templates: do they teach that a round hole in a pad is design?

    python bench/synth_mix.py --synthetic 400 [--minutes 20] [--preset tiny] [--threads 1]
    python bench/synth_mix.py --synthetic 0 ...      # the same path without synthetic boards: the control arm

A template-free model loses most of DeepPCB's held-out pin-hole AP on the drill holes of group 92000's pads, a
design no training group has (`bench/template_oracle.py`). The synthetic boards of `defectdet synth` draw drilled
pads and vias as design and pin-holes as defects, with exact boxes. This bench writes one YOLO dataset: the DeepPCB
training groups' tested images (their labels, no templates), plus `--synthetic` gray 640 px boards drawn with a seed
no other bench or the pretraining uses (their `missing-hole` boxes dropped: DeepPCB has no such class, and a pad
without its hole is not one of its defects), and DeepPCB's held-out groups as `val`. It then trains with the
defaults and a time budget (`bench/pretrained.run_on_yaml`) and scores the final weights on the held-out groups.
Run `--synthetic 0` beside it, one thread each on its own core, for a control on the same path and machine.
Writes `bench/results/synth_mix_deeppcb_plain_<preset>_<minutes>min_synthetic-<N>.json`.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

import cv2
import numpy as np
from common import limit_threads, print_table, write_result
from pretrained import run_on_yaml
from train_deeppcb import DEFAULT_DATA

from defectdet.data.formats import load_dataset
from defectdet.data.sample import Sample
from defectdet.data.synth import synthesize_dataset

ROOT = Path("runs/bench_synth_mix")
SYNTH_SEED = 5151  # pretraining uses 1001-1003, preset_modes 4242-4245, the demo and the surface family 0


def yolo_lines(sample: Sample, width: int, height: int) -> list[str]:
    """`cls cx cy w h` (normalised) for every box of `sample`."""
    lines = []
    for (x0, y0, x1, y1), cls in zip(sample.boxes.tolist(), sample.classes.tolist(), strict=True):
        cx, cy = (x0 + x1) / 2 / width, (y0 + y1) / 2 / height
        lines.append(f"{cls} {cx:.6f} {cy:.6f} {(x1 - x0) / width:.6f} {(y1 - y0) / height:.6f}")
    return lines


def link_sample(sample: Sample, root: Path, split: str, name: str) -> None:
    """`root/images/split/name<ext>` -> the sample's image, and its YOLO label file beside it."""
    image = cv2.imread(str(sample.image_path), cv2.IMREAD_UNCHANGED)
    if image is None:
        raise SystemExit(f"cannot read {sample.image_path}")
    target = root / "images" / split / f"{name}{sample.image_path.suffix}"
    target.symlink_to(sample.image_path.resolve())
    label = root / "labels" / split / f"{name}.txt"
    label.write_text("\n".join(yolo_lines(sample, image.shape[1], image.shape[0])) + "\n")


def build_dataset(synthetic: int, data: Path) -> Path:
    """The mixed YOLO dataset (built once per `synthetic`; a stamp records what was drawn)."""
    root = ROOT / f"data_{synthetic}"
    wanted = {"deeppcb": str(data.resolve()), "synthetic": synthetic, "seed": SYNTH_SEED}
    stamp = root / "bench_stamp.json"
    if stamp.is_file() and json.loads(stamp.read_text()) == wanted:
        return root / "data.yaml"
    if root.exists():
        import shutil

        shutil.rmtree(root)
    for split in ("train", "val"):
        (root / "images" / split).mkdir(parents=True)
        (root / "labels" / split).mkdir(parents=True)
    names: list[str] = []
    for split in ("train", "val"):
        loaded = load_dataset(data, split, format="deeppcb")
        names = list(loaded.class_names)
        for index, sample in enumerate(loaded.samples):
            link_sample(sample, root, split, f"deeppcb_{index:04d}")
    if synthetic:
        boards = synthesize_dataset(
            ROOT / f"synthetic_{synthetic}", boards=synthetic, seed=SYNTH_SEED, template=False,
            min_size=640, max_size=640, val_fraction=0.0, color=False, progress=False,
        )  # fmt: skip
        loaded = load_dataset(boards, "train")
        keep = {index: names.index(name) for index, name in enumerate(loaded.class_names) if name in names}
        for index, sample in enumerate(loaded.samples):
            chosen = [i for i, cls in enumerate(sample.classes.tolist()) if cls in keep]
            classes = np.array([keep[int(sample.classes[i])] for i in chosen], np.int64)
            remapped = Sample(image_path=sample.image_path, boxes=sample.boxes[chosen], classes=classes)
            link_sample(remapped, root, "train", f"synthetic_{index:04d}")
    yaml_text = "path: .\ntrain: images/train\nval: images/val\nnames:\n" + "".join(f"- {n}\n" for n in names)
    (root / "data.yaml").write_text(yaml_text)
    stamp.write_text(json.dumps(wanted))
    return root / "data.yaml"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--synthetic", type=int, required=True, help="synthetic boards added (0: control)")
    parser.add_argument("--minutes", type=float, default=20.0)
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    limit_threads(args.threads)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    if not args.data.is_dir():
        parser.error(f"no DeepPCB at {args.data}")
    data_yaml = build_dataset(args.synthetic, args.data)
    name = f"synth_mix_deeppcb_plain_{args.preset}_{args.minutes:g}min_synthetic-{args.synthetic}"
    body = run_on_yaml(data_yaml, None, args.minutes, ROOT / "runs" / name, 0, args.preset)
    rows = [
        [key, value] for key, value in {**body["final"], **(body["held_out_per_class_AP50"] or {})}.items()
    ]
    print_table(name, ["figure", "value"], rows)
    write_result(
        name,
        {
            "command": " ".join(["python bench/synth_mix.py", *sys.argv[1:]]),
            "synthetic_boards": args.synthetic,
            "synthetic_seed": SYNTH_SEED,
            "preset": args.preset,
            "minutes": args.minutes,
            "threads": args.threads,
            **body,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

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
import shutil
import sys
from pathlib import Path, PurePosixPath

from common import limit_threads, print_table, write_result
from pretrained import run_on_yaml
from train_deeppcb import DEFAULT_DATA

from defectdet.data.formats import load_dataset
from defectdet.data.formats.interchange import LabelledImage, write_yolo
from defectdet.data.sample import Sample
from defectdet.data.synth import synthesize_dataset

ROOT = Path("runs/bench_synth_mix")
SYNTH_SEED = 5151  # pretraining uses 1001-1003, preset_modes 4242-4245, the demo and the surface family 0


def labelled(samples: list[Sample], names: list[str], prefix: str) -> list[LabelledImage]:
    """`samples` as `write_yolo` items named `<prefix>_<index><suffix>`, classes by name."""
    return [
        LabelledImage(
            source=sample.image_path,
            name=PurePosixPath(f"{prefix}_{index:04d}{sample.image_path.suffix}"),
            boxes=[tuple(box) for box in sample.boxes.tolist()],
            classes=[names[int(cls)] for cls in sample.classes],
            origin=str(sample.image_path),
        )
        for index, sample in enumerate(samples)
    ]


def build_dataset(synthetic: int, data: Path) -> Path:
    """The mixed YOLO dataset (built once per `synthetic`; a stamp records what was drawn)."""
    root = ROOT / f"data_{synthetic}"
    wanted = {"deeppcb": str(data.resolve()), "synthetic": synthetic, "seed": SYNTH_SEED}
    stamp = root / "bench_stamp.json"
    if stamp.is_file() and json.loads(stamp.read_text()) == wanted:
        return root / "data.yaml"
    if root.exists():
        shutil.rmtree(root)
    names: list[str] = []
    for split in ("train", "val"):
        loaded = load_dataset(data, split, format="deeppcb")
        names = list(loaded.class_names)
        items = labelled(loaded.samples, names, "deeppcb")
        write_yolo(items, root, split=split, classes=names, link=True)
    if synthetic:
        boards = synthesize_dataset(
            ROOT / f"synthetic_{synthetic}", boards=synthetic, seed=SYNTH_SEED, template=False,
            min_size=640, max_size=640, val_fraction=0.0, color=False, progress=False,
        )  # fmt: skip
        loaded = load_dataset(boards, "train")
        items = labelled(loaded.samples, list(loaded.class_names), "synthetic")
        # missing-hole is not a DeepPCB class: its boxes are dropped, the boards kept
        write_yolo(items, root, split="train", classes=names, unknown="skip", link=True)
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

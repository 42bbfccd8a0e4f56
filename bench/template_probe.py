"""What a model without templates calls defects on defect-free boards: DeepPCB's templates, group by group.

    python -m bench.template_probe CHECKPOINT [--per-group 6] [--conf 0.3]

A DeepPCB template is the board without its defects, so every detection on it is a false call. Counting them
per board group (and class) shows whether a held-out group's design carries features the training groups never
showed (e.g. drill holes in pads read as pin-holes). Runs the checkpoint's bundle (exported beside it when
missing) on the first `--per-group` templates of each group, at `--conf`. Writes
`bench/results/template_probe_<checkpoint's run folder>.json`.
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

from bench.common import print_table, write_result
from bench.train_deeppcb import DEFAULT_DATA
from defectdet.data.formats import load_dataset


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--per-group", type=int, default=6)
    parser.add_argument("--conf", type=float, default=0.3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    from defectdet.export.exporter import export_bundle
    from defectdet.runtime.predictor import Predictor

    bundle = args.checkpoint.with_suffix(".onnx")
    if not bundle.is_file():
        export_bundle(args.checkpoint, bundle)
    predictor = Predictor(bundle, threads=args.threads)
    templates: dict[str, list[Path]] = collections.defaultdict(list)
    for split in ("train", "val"):
        for sample in load_dataset(args.data, split, format="deeppcb").samples:
            group = sample.image_path.parent.name
            if sample.template_path is not None and len(templates[(split, group)]) < args.per_group:
                templates[(split, group)].append(sample.template_path)
    groups = {}
    for (split, group), paths in sorted(templates.items()):
        counts: collections.Counter = collections.Counter()
        for path in paths:
            for detection in predictor.predict(path, threshold=args.conf).detections:
                counts[detection.class_name] += 1
        groups[group] = {"split": split, "templates": len(paths), "false_calls": dict(counts)}
    rows = [
        [g, v["split"], v["templates"], sum(v["false_calls"].values()), v["false_calls"]]
        for g, v in groups.items()
    ]
    print_table(
        "false calls on defect-free templates", ["group", "split", "templates", "calls", "by class"], rows
    )
    name = f"template_probe_{args.checkpoint.parent.name}"
    write_result(
        name,
        {
            "command": " ".join(["python -m bench.template_probe", *sys.argv[1:]]),
            "checkpoint": str(args.checkpoint),
            "conf": args.conf,
            "groups": groups,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

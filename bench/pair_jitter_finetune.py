"""Does training with pair registration + random pair jitter help clean boards? A same-budget comparison.

Fine-tunes a trained DeepPCB checkpoint (its EMA weights) twice for the same number of epochs, identical except
for the pair handling: `control` as the checkpoint was trained (no registration, no pair jitter) and `jitter`
with the defaults (`register_pairs=True`, `augment.pair_jitter_prob=0.5`, `pair_shift=1 px`,
`pair_rotate_degrees=0.1`). Then run `bench/clean_boards.py --checkpoint runs/<out>_<arm>/best.pt` on each.

Usage: ``python -m bench.pair_jitter_finetune [--checkpoint runs/deeppcb_nano/best.pt] [--epochs 4] [--arms control jitter]``
Writes ``runs/<out>_<arm>/`` and ``bench/results/<name>.json`` (default pair_jitter_finetune).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from bench import common
from defectdet.engine.checkpoint import load_detector
from defectdet.engine.config import config_from_dict
from defectdet.engine.trainer import train

ARMS = {
    "control": {"register_pairs": False, "pair_jitter_prob": 0.0},
    "jitter": {"register_pairs": True, "pair_jitter_prob": 0.5},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", type=Path, default=Path("runs/deeppcb_nano/best.pt"))
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--lr", type=float, default=0.002)
    parser.add_argument("--out", default="runs/deeppcb_nano_ft")
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--name", default="pair_jitter_finetune", help="result file name")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    load_before = common.machine_info().get("load_average")
    results = {}
    for arm in args.arms:
        model, state = load_detector(args.checkpoint)
        values = dict(state["config"])
        for key in ("resume", "time_minutes", "max_steps"):
            values[key] = None
        values.update(
            epochs=args.epochs,
            lr=args.lr,
            warmup_epochs=0.2,
            val_every=args.epochs,  # one evaluation, at the end: best = last
            out=f"{args.out}_{arm}",
            progress=False,
            register_pairs=ARMS[arm]["register_pairs"],
            augment={**values.get("augment", {}), "pair_jitter_prob": ARMS[arm]["pair_jitter_prob"]},
        )
        config = config_from_dict(values, where=f"{args.checkpoint} config + {arm}")
        started = time.perf_counter()
        result = train(config, model=model)
        results[arm] = {
            "settings": ARMS[arm],
            "run_dir": str(result.run_dir),
            "best_checkpoint": str(result.best_checkpoint),
            "best": result.best_metrics,
            "seconds": time.perf_counter() - started,
        }
        print(arm, result.best_metrics, flush=True)
    payload = {
        "description": "fine-tune of a DeepPCB checkpoint, same epochs and LR, with and without pair registration + "
        "pair jitter; validation mAP on the held-out groups (registration as trained)",
        "checkpoint": str(args.checkpoint),
        "epochs": args.epochs,
        "lr": args.lr,
        "shared_machine": True,
        "load_average_before": load_before,
        "arms": results,
    }
    print(f"wrote {common.write_result(args.name, payload)}")


if __name__ == "__main__":
    main()

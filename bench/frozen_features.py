"""Frozen ImageNet features: EfficientNet-Lite0's backbone run once per training image, only the neck and head
trained on the stored maps, scored as the real-data benchmark scores the defaults.

    python -m bench.frozen_features --dataset agdd_1light --minutes 10 --seed 0 --threads 1
    python -m bench.frozen_features --dataset deeppcb_plain --minutes 10 --neck-width 128 --head-depth 2

Why: on a 2-core CPU a lite0 training step costs several of tiny's, so in a time budget lite0 trains far fewer
steps and tiny leads (see the real-data page). With the backbone frozen its features can be computed once: each
later step costs only the neck and head, and the ImageNet features stay as they were learned. The question this
answers is whether those frozen features, with the budget spent on the neck and head, beat tiny trained end to
end on the same data and minutes.

The budget covers everything after the data is read: computing the stored maps (one pass of the backbone over the
training images at the chosen input size, letterboxed, no augmentation), then neck-and-head steps (AdamW, warm-up
then cosine, EMA, each image flipped left-right and up-down at random in feature space, boxes with it). The
weights are written as a training checkpoint, exported with the threshold chosen on the plan's threshold split
and scored on its report split, exactly as `bench.realdata` does (`score_bundle`). Writes
`bench/results/frozen_features_<dataset>_<minutes>min_seed<k>[_neck<w>_head<d>].json`.
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import time
from pathlib import Path
from typing import Any

from bench.common import limit_threads, print_table, refuse_uncommitted, write_result
from bench.realdata import DATASETS, SHARED, _plan, score_bundle, speed_probe

WORK = Path("runs/bench_frozen_features")
BATCH = 8
LR = 0.004
WARMUP_STEPS = 100
FINAL_LR_RATIO = 0.05


def result_name(args: argparse.Namespace) -> str:
    shape = (
        ""
        if (args.neck_width, args.head_depth) == (64, 1)
        else f"_neck{args.neck_width}_head{args.head_depth}"
    )
    return f"frozen_features_{args.dataset}_{args.minutes:g}min_seed{args.seed}{shape}"


def build(plan: dict[str, Any], args: argparse.Namespace, work: Path):
    """(TrainData with augmentation off, lite0 detector with ImageNet weights and every backbone layer frozen)."""
    from defectdet.engine.config import TrainConfig
    from defectdet.engine.trainer import build_train_data
    from defectdet.model import build_model
    from defectdet.model.imagenet import transfer_imagenet_weights

    fields = {**plan["train"], "preset": "lite0", "seed": args.seed, "out": work / "run", "progress": False}
    fields |= {"augment": {"enabled": False}, "class_balance": "off", "crop_size": 0}
    data = build_train_data(TrainConfig(**fields))
    overrides = {"frozen_stem": True, "neck_width": args.neck_width, "head_depth": args.head_depth}
    model = build_model(
        "lite0", len(data.class_names), data.in_channels, data.template, data.companions, **overrides
    )
    transfer_imagenet_weights(model)
    for parameter in model.backbone.parameters():
        parameter.requires_grad_(False)
    return data, model


def store_features(model, dataset) -> list[tuple[list, Any]]:
    """(backbone maps in float16, targets) per training image: one pass of the frozen backbone."""
    import torch

    stored = []
    model.eval()
    with torch.inference_mode():
        for index in range(len(dataset)):
            item = dataset[index]
            if item is None:
                continue
            maps = model.backbone(model.fusion(item[0][None].float()))
            stored.append(([level[0].half() for level in maps], item[1].float()))
    return stored


def flipped_batch(stored, indices: list[int], size: int, rng: random.Random):
    """The batch's maps (float32) and targets, each image flipped left-right and up-down with probability 1/2."""
    import torch

    maps = [torch.stack([stored[i][0][level] for i in indices]).float() for level in range(3)]
    targets = []
    for row, index in enumerate(indices):
        target = stored[index][1].clone()
        for axis, (low, high) in ((-1, (1, 3)), (-2, (2, 4))):
            if rng.random() < 0.5:
                for level in maps:
                    level[row] = level[row].flip(axis)
                target[:, [low, high]] = size - target[:, [high, low]]
        targets.append(target)
    return maps, targets


def head_loss(model, maps, targets):
    from defectdet.model.head import distances_to_boxes, make_anchor_points

    features = model.neck(maps)
    logits, distances = model.head(features)
    points, _ = make_anchor_points(features, model.strides)
    return model.criterion(logits, distances_to_boxes(points, distances.float()), points, targets)["loss"]


def train_head(model, stored, size: int, seconds: float, seed: int) -> tuple[Any, int]:
    """Neck-and-head steps on the stored maps for `seconds`; returns (EMA model, steps)."""
    import torch

    from defectdet.engine.ema import ModelEMA

    rng = random.Random(seed)
    parameters = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(parameters, lr=LR, weight_decay=0.05)
    ema = ModelEMA(model, 0.995, 200.0)
    model.train()
    model.backbone.eval()
    start, order, step = time.perf_counter(), [], 0
    while (elapsed := time.perf_counter() - start) < seconds:
        if len(order) < BATCH:
            order += rng.sample(range(len(stored)), len(stored))
        indices, order = order[:BATCH], order[BATCH:]
        maps, targets = flipped_batch(stored, indices, size, rng)
        cosine = 0.5 * (1 + math.cos(math.pi * elapsed / seconds))
        lr = LR * min(1.0, (step + 1) / WARMUP_STEPS) * (FINAL_LR_RATIO + (1 - FINAL_LR_RATIO) * cosine)
        for group in optimizer.param_groups:
            group["lr"] = lr
        loss = head_loss(model, maps, targets)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(parameters, 10.0)
        optimizer.step()
        ema.update(model)
        step += 1
        if step % 200 == 0:
            print(f"step {step}: loss {float(loss.detach()):.3f}, {elapsed:.0f} s", flush=True)
    return ema.module, step


def write_checkpoint(model, data, path: Path, step: int) -> Path:
    """The trained detector as a training checkpoint `export` reads (weights, configs, class names)."""
    import torch

    from defectdet.engine.checkpoint import CHECKPOINT_VERSION

    payload = {
        "model": model.state_dict(),
        "ema": None,
        "step": step,
        "config": data.config.to_dict(),
        "model_config": model.config,
        "class_names": list(data.class_names),
        "metrics": {},
        "best_metrics": {},
        "version": CHECKPOINT_VERSION,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(payload, path)
    return path


def run(args: argparse.Namespace, dirty: bool) -> Path:
    name = result_name(args)
    work = WORK / name
    probe_ms = speed_probe(args.threads)
    started = time.perf_counter()
    plan = _plan(args.dataset, work, args.shared)
    data, model = build(plan, args, work)
    read_s = time.perf_counter() - started
    stored = store_features(model, data.train)
    store_s = time.perf_counter() - started - read_s
    budget = args.minutes * 60 - store_s
    if budget <= 0:
        raise SystemExit(f"storing the features took {store_s:.0f} s, the whole budget")
    trained, steps = train_head(model, stored, data.config.input_size, budget, args.seed)
    checkpoint = write_checkpoint(trained, data, work / "run" / "last.pt", steps)
    scoring = score_bundle(plan, checkpoint, work)
    body = {
        "command": " ".join(["python -m bench.frozen_features", *sys.argv[1:]]),
        "dataset": args.dataset,
        "minutes": args.minutes,
        "seed": args.seed,
        "threads": args.threads,
        "dirty": dirty,
        "model": {
            "preset": "lite0",
            "frozen": "every backbone layer",
            "neck_width": args.neck_width,
            "head_depth": args.head_depth,
            "input_size": data.config.input_size,
        },
        "training": {
            "batch": BATCH,
            "lr": LR,
            "warmup_steps": WARMUP_STEPS,
            "augment": "feature-space flips",
        },
        "speed_probe": {"ms_per_step": probe_ms, "ms_per_step_after": speed_probe(args.threads)},
        "images_stored": len(stored),
        "store_s": store_s,
        "read_s": read_s,
        "steps": steps,
        **scoring,
    }
    path = write_result(name, body)
    print_table(name, ["figure", "value"], [[key, body[key]] for key in ("mAP50", "steps", "store_s")])
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", choices=DATASETS, default="agdd_1light")
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--neck-width", type=int, default=64)
    parser.add_argument("--head-depth", type=int, default=1)
    parser.add_argument("--shared", type=Path, default=SHARED)
    parser.add_argument("--allow-dirty", action="store_true")
    args = parser.parse_args()
    dirty = refuse_uncommitted(args.allow_dirty)
    if not (args.shared / "agdd").is_dir():
        raise SystemExit(f"no datasets under {args.shared}")
    limit_threads(args.threads)
    import torch

    torch.manual_seed(args.seed)
    run(args, dirty)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

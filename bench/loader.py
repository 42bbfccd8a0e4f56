"""Training-loader throughput: images/s for crop x image dtype x batch x workers, augmentation on.

It times the loader training uses: `engine.loader.build_loader` + `start_epoch` over `DetectionDataset`
(per-sample (seed, epoch, index) draws, pairs decoded with one intensity mapping). The consumer here
does nothing, so workers only pay off when they beat in-process loading outright; in training the
main process is busy with the model step and workers overlap with it.

    .venv/bin/python -m bench.loader                 # DeepPCB trainval, a few minutes on 2 cores
    .venv/bin/python -m bench.loader --synthetic     # a synthetic dataset in a temp dir instead

Writes bench/results/loader.json. Figures depend on what else runs on the machine: the JSON records
the load average at the start.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bench.common import machine_info, print_table, write_result
from defectdet.data.formats import available_splits, load_dataset
from defectdet.data.imageio import read_image, read_pair
from defectdet.data.letterbox import boxes_to_letterbox, letterbox_image
from defectdet.data.sample import DatasetSplit
from defectdet.engine.loader import SampleIndex, build_loader, start_epoch
from defectdet.trainingdata.augment import AugmentConfig, build_augment
from defectdet.trainingdata.dataset import DetectionDataset, Draws, ItemLayout, Reading

DEEPPCB = Path("/work/shared/datasets/deeppcb")


def load_split(data: Path, synthetic: bool, temp: Path) -> tuple[DatasetSplit, str]:
    if not synthetic and data.exists():
        splits = available_splits(data)
        name = "trainval" if "trainval" in splits else splits[0]
        return load_dataset(data, name), f"{data} ({name})"
    if not synthetic:
        print(f"note: {data} not found; benchmarking a synthetic dataset instead", file=sys.stderr)
    from defectdet.data.synth import synthesize_dataset

    yaml_path = synthesize_dataset(
        temp / "synth", boards=64, seed=0, min_size=640, max_size=640, progress=False
    )
    return load_dataset(yaml_path, "train"), "synthetic 640x640 boards (temp dir)"


def stage_breakdown(split: DatasetSplit, samples: int) -> dict[str, float]:
    """Mean ms per sample for each step, single process (what one worker spends)."""
    augmenter = build_augment(AugmentConfig(), train=True, seed=0)
    timings: dict[str, list[float]] = {
        "read (image+template)": [],
        "letterbox": [],
        "augment": [],
        "to tensor": [],
    }
    dataset = DetectionDataset(split, ItemLayout(input_size=640), Draws(augment=AugmentConfig(), train=True))
    for index, sample in enumerate(split.samples[:samples]):
        start = time.perf_counter()
        if sample.template_path:
            image, template = read_pair(sample.image_path, sample.template_path)
        else:
            image, template = read_image(sample.image_path), None
        after_read = time.perf_counter()
        image, transform = letterbox_image(image, 640)
        if template is not None:
            template, _ = letterbox_image(template, 640)
        boxes = boxes_to_letterbox(sample.boxes, transform)
        after_letterbox = time.perf_counter()
        augmenter.reseed(index)  # the dataset reseeds per sample from (seed, epoch, index)
        image, template, boxes, classes = augmenter(image, template, boxes, sample.classes)
        after_augment = time.perf_counter()
        planes = [image] if template is None else [image, template]
        np.multiply(np.stack(planes), np.float32(1 / 255), dtype=np.float32)
        end = time.perf_counter()
        for key, seconds in zip(
            timings,
            (
                after_read - start,
                after_letterbox - after_read,
                after_augment - after_letterbox,
                end - after_augment,
            ),
            strict=True,
        ):
            timings[key].append(seconds * 1000)
    start = time.perf_counter()
    for index in range(samples):
        dataset[SampleIndex(index, epoch=0)]
    whole = (time.perf_counter() - start) * 1000 / samples
    result = {key: float(np.mean(values)) for key, values in timings.items()}
    result["whole item (dataset[i], 640)"] = whole
    return result


DTYPES = {"float32": torch.float32, "uint8": torch.uint8}


def time_loader(
    split: DatasetSplit,
    workers: int,
    batch: int,
    crop: int | None,
    batches: int,
    warmup: int,
    image_dtype: str = "float32",
) -> dict:
    dataset = DetectionDataset(
        split,
        ItemLayout(input_size=640, channels=1, dtype=DTYPES[image_dtype]),
        Draws(augment=AugmentConfig(), train=True, crop_size=crop),
    )
    loader = build_loader(dataset, batch_size=batch, train=True, workers=workers, seed=0)
    start_epoch(loader, 0)
    iterator = iter(loader)
    start = time.perf_counter()
    for _ in range(warmup):
        next(iterator)
    warm = time.perf_counter()
    images = 0
    for batch_images, _, _ in itertools.islice(iterator, batches):
        images += len(batch_images)
    elapsed = time.perf_counter() - warm
    del iterator, loader
    gc.collect()
    return {
        "workers": workers,
        "batch_size": batch,
        "crop": crop or 640,
        "image_dtype": image_dtype,
        "input_shape": list(dataset.output_shape),
        "images": images,
        "seconds": elapsed,
        "images_per_s": images / elapsed,
        "ms_per_batch": elapsed * 1000 / batches,
        "warmup_s": warm - start,
    }


def cache_effect(split: DatasetSplit, batch: int, crop: int | None, batches: int) -> dict:
    """In-process throughput over the same samples, first epoch (decoding) vs second (decoded-image cache)."""
    subset = DatasetSplit(
        split.samples[: batch * batches], split.class_names, split.format, split.split, split.root
    )
    dataset = DetectionDataset(
        subset,
        ItemLayout(input_size=640, channels=1),
        Draws(augment=AugmentConfig(), train=True, crop_size=crop),
        Reading(cache_bytes=4 * 2**30),
    )
    loader = build_loader(dataset, batch_size=batch, train=True, workers=0, seed=0)
    rates = []
    for epoch in (0, 1):
        start_epoch(loader, epoch)
        started, images = time.perf_counter(), 0
        for batch_images, _, _ in loader:
            images += len(batch_images)
        rates.append(images / (time.perf_counter() - started))
    return {
        "crop": crop or 640,
        "batch_size": batch,
        "images": len(subset.samples),
        "images_per_s_decoding": rates[0],
        "images_per_s_cached": rates[1],
        "speedup": rates[1] / rates[0],
        "cache_mb": dataset.cache_info["bytes"] / 2**20,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", type=Path, default=DEEPPCB)
    parser.add_argument("--synthetic", action="store_true", help="use a synthetic dataset in a temp dir")
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--batch", type=int, nargs="+", default=[8, 16])
    parser.add_argument("--crop", type=int, nargs="+", default=[320, 640], help="640 = full image, no crop")
    parser.add_argument(
        "--dtype",
        nargs="+",
        default=["float32", "uint8"],
        choices=sorted(DTYPES),
        help="image tensor dtype the dataset returns (uint8: the trainer converts)",
    )
    parser.add_argument("--batches", type=int, default=10, help="timed batches per setting")
    parser.add_argument("--warmup", type=int, default=2, help="untimed batches first (worker start-up)")
    parser.add_argument("--stage-samples", type=int, default=40)
    args = parser.parse_args(argv)

    start_machine = machine_info()
    with tempfile.TemporaryDirectory() as temp:
        split, source = load_split(args.data, args.synthetic, Path(temp))
        stages = stage_breakdown(split, min(args.stage_samples, len(split.samples)))
        print_table("per-sample cost, one process (ms)", ["step", "ms"], list(stages.items()))
        rows: list[dict[str, Any]] = []
        for crop, dtype, batch, workers in itertools.product(args.crop, args.dtype, args.batch, args.workers):
            crop_size = None if crop >= 640 else crop
            rows.append(time_loader(split, workers, batch, crop_size, args.batches, args.warmup, dtype))
        cache = [cache_effect(split, 16, None if crop >= 640 else crop, args.batches) for crop in args.crop]
    print_table(
        "decoded-image cache, in process (images/s)",
        ["crop", "decoding", "cached", "speed-up", "cache MB"],
        [
            [r["crop"], r["images_per_s_decoding"], r["images_per_s_cached"], r["speedup"], r["cache_mb"]]
            for r in cache
        ],
    )
    print_table(
        f"training loader throughput, augmentation on — {source}",
        ["crop", "dtype", "batch", "workers", "images/s", "ms/batch", "warm-up s"],
        [
            [
                r["crop"],
                r["image_dtype"],
                r["batch_size"],
                r["workers"],
                r["images_per_s"],
                r["ms_per_batch"],
                r["warmup_s"],
            ]
            for r in rows
        ],
    )
    path = write_result(
        "loader",
        {
            "dataset": source,
            "settings": {
                "imgsz": 640,
                "channels": 1,
                "template": bool(split.samples and split.samples[0].template_path),
                "augment": AugmentConfig().model_dump(),
                "timed_batches": args.batches,
                "warmup_batches": args.warmup,
                "load_average_at_start": start_machine.get("load_average"),
            },
            "stages_ms": stages,
            "results": rows,
            "cache": cache,
        },
    )
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

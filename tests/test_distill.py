"""bench/distill.py: two distillation steps on small crops write a file a tiny model starts from."""

from __future__ import annotations

import math
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from bench import distill
from defectdet.model import build_model
from defectdet.model.imagenet import weights_path
from defectdet.model.pretrained import read_weights, save_weights, shipped_weights, transfer_weights

pytestmark = pytest.mark.skipif(
    weights_path() is None, reason="the ImageNet weights package is not installed"
)


def _sources() -> distill.Sources:
    generator = np.random.default_rng(0)
    board = generator.integers(0, 256, (96, 128, 3), dtype=np.uint8)
    surface = np.repeat(generator.integers(0, 256, (80, 80, 1), dtype=np.uint8), 3, axis=2)
    return distill.Sources(families={"board": [board], "surface": [surface]}, real=[board[::-1].copy()])


def test_random_crops_are_rgb_in_the_unit_range() -> None:
    settings = distill.Settings(batch=3, crop=64)
    batch = distill.make_batch(_sources(), settings, random.Random(1))
    assert batch.shape == (3, 3, 64, 64)
    assert 0.0 <= float(batch.min()) and float(batch.max()) <= 1.0


def test_two_steps_write_weights_a_tiny_model_starts_from(tmp_path: Path) -> None:
    start = shipped_weights("tiny", False)
    assert start is not None
    settings = distill.Settings(steps=2, batch=2, crop=64, warmup=1, print_every=1)
    outcome = distill.distill(_sources(), start, settings)
    assert len(outcome.curve) == 2
    assert all(math.isfinite(row["loss"]) for row in outcome.curve)
    record = distill.provenance(outcome, settings, {"synthetic": {"board": 1}}, start)
    path = save_weights(outcome.student, tmp_path / "distilled.pt", record)

    assert read_weights(path)["provenance"]["made_by"] == "bench/distill.py"
    for channels in (3, 1):  # RGB as written, and gray (the stem summed over colour)
        model = build_model("tiny", 4, channels, False, levels=(0, 1))
        report = transfer_weights(model, path)
        assert report.left_random and all(name.startswith("head.classifiers.") for name in report.left_random)
        assert report.copied == report.total - len(report.left_random)
    shipped = read_weights(start)["state_dict"]
    distilled = read_weights(path)["state_dict"]
    name = "backbone.stages.1.1.pointwise.conv.weight"
    assert not torch.equal(shipped[name], distilled[name])  # the backbone learned
    assert torch.equal(shipped["neck.lateral.0.conv.weight"], distilled["neck.lateral.0.conv.weight"])

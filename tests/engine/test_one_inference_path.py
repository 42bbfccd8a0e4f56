"""Training-time evaluation and `val` are one inference path: `val best.pt` reproduces what the trainer logged."""

from __future__ import annotations

import json

import pytest

from defectdet.data.formats import load_dataset
from defectdet.data.synth import synthesize_dataset
from defectdet.engine.checkpoint import load_checkpoint
from defectdet.engine.config import TrainConfig
from defectdet.engine.trainer import train
from defectdet.engine.validate import validate


def test_val_reproduces_the_metrics_logged_for_best_checkpoint(tmp_path) -> None:
    data_yaml = synthesize_dataset(
        tmp_path / "data", boards=10, seed=3, min_size=128, max_size=160, progress=False
    )
    config = TrainConfig(
        data=data_yaml,
        imgsz=128,
        crop_size=0,
        epochs=3,
        batch=4,
        workers=0,
        device="cpu",
        out=tmp_path / "run",
        progress=False,
        warmup_steps=1,
        protocol="coco",
    )
    result = train(config)
    assert result.best_checkpoint is not None
    logged = load_checkpoint(result.best_checkpoint)["best_metrics"]
    assert 0.0 <= logged["mAP50"] <= 1.0 and 0.0 <= logged["mAP50_95"] <= logged["mAP50"]
    summary = json.loads((result.run_dir / "metrics.json").read_text())
    assert summary["best"]["mAP50"] == logged["mAP50"]

    metrics = validate(result.best_checkpoint, data_yaml, split="val", protocol="coco", out=tmp_path / "val")
    assert metrics["headline"]["mAP50"] == pytest.approx(logged["mAP50"], abs=1e-9)
    assert metrics["headline"]["mAP50_95"] == pytest.approx(logged["mAP50_95"], abs=1e-9)
    # the templates were registered to their tested images (on by default), and that is reported
    assert metrics["registration"]["pairs"] == len(load_dataset(data_yaml, "val").samples)

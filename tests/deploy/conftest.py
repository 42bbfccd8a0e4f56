"""Session fixtures for the deployment tests: a tiny synthetic dataset, a briefly trained checkpoint and its
exported bundle (measured on the dataset's validation split)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """8 synthetic gray boards with templates, 160-192 px; returns data.yaml."""
    from defectdet.data.synth import synthesize_dataset

    return synthesize_dataset(
        tmp_path_factory.mktemp("deploy_data"), boards=8, seed=3, template=True, min_size=160, max_size=192
    )


@pytest.fixture(scope="session")
def trained_checkpoint(tiny_dataset: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """best.pt of a few training steps at imgsz 192 (weights are far from converged: parity, not accuracy)."""
    from defectdet.engine.config import TrainConfig
    from defectdet.engine.trainer import train

    run = tmp_path_factory.mktemp("deploy_run")
    config = TrainConfig(
        data=tiny_dataset, input_size=192, crop_size=None, epochs=3, batch=2, workers=0, out=run,
        progress=False, warmup_steps=2, preset="nano",
    )  # fmt: skip
    result = train(config)
    return Path(result.best_checkpoint or result.last_checkpoint)


@pytest.fixture(scope="session")
def bundle_path(trained_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The checkpoint exported to a bundle with thresholds and drift reference measured on its val split."""
    from defectdet.export.exporter import export_bundle

    out = tmp_path_factory.mktemp("deploy_bundle") / "model.onnx"
    return export_bundle(trained_checkpoint, out).bundle

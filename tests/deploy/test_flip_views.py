"""Test-time flips: a bundle exported with them answers as the wrapped eager model does, says so in its
metadata, and `val` runs a checkpoint with them but refuses to pretend a bundle has views it was not built with."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from defectdet.engine.checkpoint import load_detector
from defectdet.engine.validate import validate
from defectdet.errors import ConfigError
from defectdet.export.exporter import export_bundle, fold_batchnorm
from defectdet.model.flip_average import FlipAveraged
from defectdet.runtime.predictor import Predictor


@pytest.fixture(scope="module")
def flipped_bundle(trained_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("flip_bundle") / "flipped.onnx"
    return export_bundle(trained_checkpoint, out, flip_views="lr+ud").bundle


def test_the_bundle_runs_the_views_in_its_graph(trained_checkpoint: Path, flipped_bundle: Path) -> None:
    predictor = Predictor(flipped_bundle)
    assert predictor.metadata.flip_views == "lr+ud"
    detector, _ = load_detector(trained_checkpoint)
    fold_batchnorm(detector)
    size, channels = predictor.metadata.input_size, predictor.metadata.input_channels
    images = np.random.default_rng(1).random((2, channels, size, size), dtype=np.float32)
    with torch.inference_mode():
        plain = detector(torch.from_numpy(images)).numpy()
        averaged = FlipAveraged(detector, "lr+ud")(torch.from_numpy(images)).numpy()
    predictions, _ = predictor.run(images)
    assert np.abs(predictions - averaged).max() < 1e-3
    assert np.abs(predictions - plain).max() > 1e-3  # the flips changed the answer: the check can fail


def test_val_runs_a_checkpoint_with_flips_and_records_them(
    trained_checkpoint: Path, tiny_dataset: Path, tmp_path: Path
) -> None:
    metrics = validate(trained_checkpoint, tiny_dataset, out=tmp_path, protocol="coco", flip_views="lr")
    assert metrics["flip_views"] == "lr"
    assert metrics["coco"]["mAP50"] is not None


def test_val_refuses_other_views_than_the_bundle_has(
    flipped_bundle: Path, tiny_dataset: Path, tmp_path: Path
) -> None:
    with pytest.raises(ConfigError, match=r"exported with flip views 'lr\+ud'.*--flip-views lr"):
        validate(flipped_bundle, tiny_dataset, out=tmp_path, flip_views="lr")
    assert validate(flipped_bundle, tiny_dataset, out=tmp_path, flip_views="lr+ud")["flip_views"] == "lr+ud"


def test_unknown_views_are_refused_naming_the_option(trained_checkpoint: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--flip-views"):
        export_bundle(trained_checkpoint, tmp_path / "x.onnx", flip_views="diagonal")


def test_the_service_says_which_views_a_served_model_runs(flipped_bundle: Path, bundle_path: Path) -> None:
    from defectdet.serve.deployment import ServedModel

    assert ServedModel.of(Predictor(flipped_bundle)).describe()["flip_views"] == "lr+ud"
    assert ServedModel.of(Predictor(bundle_path)).describe()["flip_views"] == "none"


def test_predict_exports_a_checkpoint_with_the_views_and_refuses_a_bundle_without_them(
    trained_checkpoint: Path, flipped_bundle: Path, tiny_dataset: Path, tmp_path: Path
) -> None:
    from typer.testing import CliRunner

    from defectdet.cli import app
    from defectdet.runtime.bundle import read_metadata

    image = next((tiny_dataset.parent / "images" / "val").iterdir())
    golden = ["--templates", str(tiny_dataset.parent / "templates" / "val")]
    out = tmp_path / "predicted"
    args = ["predict", str(trained_checkpoint), str(image), *golden, "--out", str(out), "--flip-views", "lr"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert read_metadata(out / "model.onnx").flip_views == "lr"
    assert (out / "predictions.jsonl").read_text().strip()
    refused = CliRunner().invoke(
        app, ["predict", str(flipped_bundle), str(image), *golden, "--flip-views", "lr"]
    )
    assert "exported with flip views 'lr+ud'" in str(refused.exception)
    same = [
        "predict",
        str(flipped_bundle),
        str(image),
        *golden,
        "--flip-views",
        "lr+ud",
        "--out",
        str(tmp_path / "b"),
    ]
    assert CliRunner().invoke(app, same).exit_code == 0

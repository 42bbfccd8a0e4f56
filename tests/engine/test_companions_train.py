"""Companion captures through training, validation, export and `train --from`, on a tiny synthetic dataset whose
images each have an aligned second lighting (`companion_data`): the settings row, the checkpoint's model config,
the bundle's planes and graph input, a prediction with and without the companion, and the errors on the way."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
import yaml
from companion_data import COMPANION, make_companion_dataset
from typer.testing import CliRunner

from defectdet.cli import app
from defectdet.engine.autoconfig import SplitStats, choose_settings
from defectdet.engine.checkpoint import load_checkpoint
from defectdet.engine.config import TrainConfig
from defectdet.engine.start_model import read_start
from defectdet.engine.trainer import build_train_data, train
from defectdet.engine.validate import validate
from defectdet.errors import CheckpointError, ConfigError, InputError
from defectdet.export.exporter import export_bundle
from defectdet.runtime.bundle import read_metadata, write_metadata
from defectdet.runtime.predictor import Predictor

QUICK = {
    "device": "cpu",
    "workers": 0,
    "progress": False,
    "epochs": 1,
    "batch": 4,
    "warmup_steps": 1,
    "preset": "nano",
}


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """12 gray 96 px images (8 train, 4 val), each with its L2 capture (data.yaml)."""
    return make_companion_dataset(tmp_path_factory.mktemp("companion_data"), images=12, size=96)


@pytest.fixture(scope="module")
def checkpoint(data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """last.pt of two training steps with the companions chosen from the data."""
    out = tmp_path_factory.mktemp("companion_run")
    return train(TrainConfig(**QUICK, data=data, out=out, max_steps=2, val_split=None)).last_checkpoint


@pytest.fixture(scope="module")
def bundle(checkpoint: Path, data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The checkpoint exported with thresholds measured on the val split, through the bundle itself."""
    return export_bundle(
        checkpoint, tmp_path_factory.mktemp("companion_bundle") / "model.onnx", data=data
    ).bundle


def _without_companions(data: Path, folder: Path) -> Path:
    """The same images and labels, with no companion captures declared."""
    values = yaml.safe_load(data.read_text())
    values.pop("companions")
    values["path"] = str(data.parent)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "data.yaml").write_text(yaml.safe_dump(values))
    return folder / "data.yaml"


def test_training_stacks_every_companion_and_says_why(checkpoint: Path, data: Path, tmp_path: Path) -> None:
    state = load_checkpoint(checkpoint)
    assert state["model_config"]["companions"] == [COMPANION] and state["model_config"]["in_channels"] == 2
    assert state["config"]["companions"] == [COMPANION]
    row = next(row for row in state["settings_chosen"] if row["name"] == "companions")
    assert row["source"] == "auto" and f"every training image has {COMPANION}" in row["reason"]
    pretrained = next(row for row in state["settings_chosen"] if row["name"] == "pretrained")
    assert "stem weights start at zero" in pretrained["reason"]
    # validation leaves out an image whose L2 capture is missing, and scores the others with theirs
    copy = tmp_path / "data"
    shutil.copytree(data.parent, copy)
    (copy / COMPANION / "val_010.png").unlink()
    metrics = validate(checkpoint, copy / "data.yaml", out=tmp_path / "val", console=None)
    assert metrics["num_images"] == 3 and not metrics["skipped_images"]


def _stats(with_companion: dict[str, int]) -> SplitStats:
    """4 gray 96 px images, 20 px defects, with these companion captures (declared in this order)."""
    counts = np.array([4, 4], np.int64)
    return SplitStats(
        images=4,
        sizes=np.full((4, 2), 96, np.float32),
        box_wh=np.full((4, 2), 20, np.float32),
        box_image_long=np.full(4, 96, np.float32),
        class_names=["scratch", "spot"],
        class_boxes=counts,
        class_images=counts,
        with_template=0,
        color_checked=4,
        companion_names=list(with_companion),
        with_companion=with_companion,
    )


def test_the_companions_row_takes_those_every_image_has_and_an_older_checkpoint_none() -> None:
    config, choices = choose_settings(_stats({"UV": 3, "L2": 4}), TrainConfig(data="d.yaml"))
    row = next(choice for choice in choices if choice.name == "companions")
    assert config.companions == ["L2"] and row.source == "auto"
    assert "left out, not every image has it: UV (3 of 4 images)" in row.reason
    both, _ = choose_settings(_stats({"UV": 4, "L2": 4}), TrainConfig(data="d.yaml"))
    assert both.companions == ["UV", "L2"]  # the dataset's order
    older = {"input_size": 96, "template": False}  # a run resumed from before companions existed
    resumed, choices = choose_settings(_stats({"L2": 4}), TrainConfig(data="d.yaml"), older)
    assert resumed.companions == [] and ("companions", "checkpoint") in {(c.name, c.source) for c in choices}


def test_companions_can_be_left_out_or_named_and_a_wrong_name_is_refused(data: Path, tmp_path: Path) -> None:
    plain = build_train_data(TrainConfig(**QUICK, data=data, out=tmp_path, companions=[]))
    assert plain.in_channels == 1 and plain.companions == []
    assert next(c for c in plain.choices if c.name == "companions").source == "user"
    with pytest.raises(ConfigError, match=r"field 'companions': .* no companion 'UV' \(its companions: L2\)"):
        build_train_data(TrainConfig(**QUICK, data=data, out=tmp_path, companions=["UV"]))
    with pytest.raises(
        ConfigError, match="field 'synthetic_boards': those images have no companion captures"
    ):
        build_train_data(TrainConfig(**QUICK, data=data, out=tmp_path, synthetic_boards=2))
    both = CliRunner().invoke(app, ["train", str(data), "--companions", "L2", "--no-companions"])
    assert both.exit_code != 0 and "exclude each other" in str(both.exception)


def test_the_bundle_names_its_planes_and_predicts_with_the_companion(bundle: Path, data: Path) -> None:
    metadata = read_metadata(bundle)
    assert metadata.companions == [COMPANION] and metadata.planes == ["image", COMPANION]
    assert "mAP50" in metadata.metrics  # measured on the val split through the bundle itself
    graph_input = onnx.load(str(bundle)).graph.input[0].type.tensor_type.shape.dim
    assert [dim.dim_value for dim in graph_input[1:]] == [2, metadata.input_size, metadata.input_size]
    image = data.parent / "images" / "val" / "val_008.png"
    predictor = Predictor(bundle, threads=1)
    companion = data.parent / COMPANION / image.name
    result = predictor.predict(image, companions={COMPANION: companion})
    assert result.image_size == (96, 96) and result.features is not None
    # two training steps moved the companion's stem weights off zero: another L2 capture changes what it sees
    other = predictor.predict(image, companions={COMPANION: data.parent / COMPANION / "val_009.png"})
    assert not np.allclose(result.features, other.features)
    with pytest.raises(InputError, match=f"pass it as companion '{COMPANION}'"):
        predictor.predict(image)


def test_a_fine_tune_from_the_bundle_keeps_its_companions(bundle: Path, data: Path, tmp_path: Path) -> None:
    again = build_train_data(TrainConfig(**QUICK, data=data, out=tmp_path, start_from=bundle))
    assert again.config.companions == [COMPANION] and again.in_channels == 2
    row = next(c for c in again.choices if c.name == "companions")
    assert row.source == "model" and "[from model] model.onnx" in row.reason
    plain = _without_companions(data, tmp_path / "plain")
    with pytest.raises(ConfigError, match=f"reads the companion capture '{COMPANION}', which this dataset"):
        build_train_data(TrainConfig(**QUICK, data=plain, out=tmp_path, start_from=bundle))
    with pytest.raises(ConfigError, match=r"field 'companions': \[\] was set, but model.onnx was built with"):
        build_train_data(TrainConfig(**QUICK, data=data, out=tmp_path, start_from=bundle, companions=[]))
    # metadata that names other companions than the weights it carries
    odd = tmp_path / "odd.onnx"
    odd.write_bytes(bundle.read_bytes())
    write_metadata(odd, read_metadata(bundle).model_copy(update={"companions": ["UV"]}))
    with pytest.raises(
        CheckpointError, match=r"'companions' lists \['UV'\] but its embedded weights read \['L2'\]"
    ):
        read_start(odd)

"""Chosen settings travel: the train CLI prints them, config.yaml and checkpoints record them, and
`validate` rebuilds the same model (levels, template mode) and letterbox size from the checkpoint."""

from __future__ import annotations

import cv2
import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from defectdet.cli import app
from defectdet.data.synth import synthesize_dataset
from defectdet.engine.checkpoint import load_checkpoint
from defectdet.engine.trainer import build_train_data, train
from defectdet.engine.validate import validate
from defectdet.errors import ConfigError

runner = CliRunner()


def test_no_template_on_a_dataset_with_templates(tmp_path, small_train_config) -> None:
    data_yaml = synthesize_dataset(
        tmp_path / "pcb", boards=6, seed=0, min_size=160, max_size=200, progress=False
    )
    assert "templates" in yaml.safe_load(data_yaml.read_text())
    config = small_train_config(
        tmp_path / "run", data=data_yaml, template=False, epochs=1, batch=2, max_steps=2
    )
    assert build_train_data(config).config.clean_templates is False  # off unless asked for
    config.clean_templates = True
    data = build_train_data(config)
    # the templates also train, as defect-free images: the same boards without their defects
    assert data.config.clean_templates is True
    defective = [s for s in data.train.split.samples if not s.image_id.endswith("_template")]
    clean = [s for s in data.train.split.samples if s.image_id.endswith("_template")]
    assert len(clean) == len({s.template_path for s in defective}) > 0
    assert all(len(s.boxes) == 0 and s.template_path is None for s in clean)
    assert {s.image_path for s in clean} == {s.template_path for s in defective}
    with pytest.raises(ConfigError, match="clean_templates"):  # a template model reads them as input
        build_train_data(small_train_config(tmp_path / "run2", data=data_yaml, clean_templates=True))
    config.val_every = 3  # set after the data, as the demo does: train keeps it and takes the chosen settings
    result = train(config, data=data)
    checkpoint = load_checkpoint(result.last_checkpoint)
    assert checkpoint["config"]["val_every"] == 3 and checkpoint["config"]["batch"] == data.config.batch
    assert checkpoint["model_config"]["template"] is False and checkpoint["model_config"]["in_channels"] == 1
    chosen = {c["name"]: c for c in checkpoint["settings_chosen"]}
    assert chosen["template"]["value"] is False and chosen["template"]["source"] == "user"
    assert "from the data: True" in chosen["template"]["reason"]  # the data has templates
    config_text = (result.run_dir / "config.yaml").read_text()
    assert config_text.startswith("# settings chosen for this run")
    recorded = yaml.safe_load(config_text)
    assert (
        recorded["input_size"] == checkpoint["config"]["input_size"] == 192
    )  # 160-200 px boards, no upsampling
    assert recorded["template"] is False and recorded["crop_size"] == 0
    metrics = validate(result.last_checkpoint, data_yaml, split="val", out=tmp_path / "val", protocol="coco")
    assert "mAP50" in metrics["headline"]


def test_train_cli_prints_the_table_and_levels_travel_to_validate(tmp_path) -> None:
    data_yaml = synthesize_dataset(
        tmp_path / "surface", boards=8, seed=4, kind="surface", min_size=128, max_size=224, progress=False
    )
    args = [
        "train",
        str(data_yaml),
        "--epochs",
        "1",
        "--batch",
        "2",
        "--workers",
        "0",
        "--out",
        str(tmp_path / "run"),
    ]
    clean = _clean_folder(tmp_path / "good_parts", count=2)
    result = runner.invoke(
        app,
        [*args, "--set", "max_steps=2", "--set", "progress=false", "--strides", "8,16,32"]
        + ["--clean-images", str(clean)],
    )
    assert result.exit_code == 0, result.output
    for text in (  # each within one cell's line at any terminal width
        "settings chosen for this run",
        "input size (px)",
        "(--input-size)",
        "(--crop)",
        "(--strides)",
        "golden template",
        "rare classes shown",
    ):
        assert text in result.output, text
    for internal in ("grad step", "glibc", "world size", "softplus"):  # details wait for -v
        assert internal not in result.output, internal
    checkpoint = load_checkpoint(tmp_path / "run" / "last.pt")
    chosen = {c["name"]: c for c in checkpoint["settings_chosen"]}
    assert (
        chosen["clean_images"]["source"] == "user"
        and "2 defect-free images" in chosen["clean_images"]["reason"]
    )
    assert tuple(checkpoint["model_config"]["levels"]) == (0, 1, 2)
    assert checkpoint["config"]["strides"] == [8, 16, 32] and checkpoint["config"]["input_size"] <= 224
    metrics = validate(
        tmp_path / "run" / "last.pt", data_yaml, split="val", out=tmp_path / "val", protocol="coco"
    )
    assert metrics["headline"]["mAP50"] is not None


def _clean_folder(folder, count: int):
    """`count` defect-free images (a 160 x 128 gradient), one of them in a subfolder, and a file that is not one."""
    (folder / "line2").mkdir(parents=True)
    image = np.tile(np.linspace(60, 200, 160, dtype=np.uint8), (128, 1))
    for index in range(count):
        cv2.imwrite(str(folder / ("line2" if index else "") / f"good_{index}.png"), image)
    (folder / "notes.txt").write_text("not an image")
    return folder


def test_clean_images_join_the_training_split_without_boxes(tmp_path, small_train_config) -> None:
    data_yaml = synthesize_dataset(
        tmp_path / "pcb", boards=6, seed=0, min_size=160, max_size=200, progress=False
    )
    clean = _clean_folder(tmp_path / "good", count=3)
    config = small_train_config(tmp_path / "run", data=data_yaml, template=False, clean_images=clean)
    data = build_train_data(config)
    extra = [s for s in data.train.split.samples if s.image_id.startswith("clean/")]
    assert sorted(s.image_path.name for s in extra) == ["good_0.png", "good_1.png", "good_2.png"]
    assert all(len(s.boxes) == 0 and s.template_path is None for s in extra)
    labelled = build_train_data(small_train_config(tmp_path / "run0", data=data_yaml, template=False))
    assert len(data.train.split.samples) == len(labelled.train.split.samples) + 3
    assert {c.name: c for c in data.choices}["clean_images"].value == str(clean)
    unset = {c.name: c for c in labelled.choices}["clean_images"]  # the row says what the option is for
    assert unset.value is None and "--clean-images DIR" in unset.reason and "benchmarks" in unset.reason
    with pytest.raises(ConfigError, match="clean_images.*template"):  # a template model needs a pair
        build_train_data(small_train_config(tmp_path / "run1", data=data_yaml, clean_images=clean))
    with pytest.raises(ConfigError, match="clean_images.*not a folder"):
        build_train_data(
            small_train_config(tmp_path / "r2", data=data_yaml, template=False, clean_images=tmp_path / "x")
        )
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="no images in"):
        build_train_data(
            small_train_config(
                tmp_path / "r3", data=data_yaml, template=False, clean_images=tmp_path / "empty"
            )
        )

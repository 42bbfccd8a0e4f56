"""Training-time evaluation and `val` are one inference path: `val best.pt` reproduces what the trainer logged.
Also: `val`'s clean boards, its threshold from another split, and the per-image registration report."""

from __future__ import annotations

import csv
import json

import pytest

from defectdet.data.formats import load_dataset
from defectdet.data.recapture import RecaptureConfig
from defectdet.data.synth import synthesize_dataset
from defectdet.engine.checkpoint import load_checkpoint
from defectdet.engine.trainer import train
from defectdet.engine.validate import ValidateSettings, validate
from defectdet.errors import ConfigError


@pytest.fixture(scope="module")
def trained(tmp_path_factory, small_train_config):
    root = tmp_path_factory.mktemp("one_path")
    data_yaml = synthesize_dataset(
        root / "data", boards=10, seed=3, min_size=128, max_size=160, progress=False
    )
    config = small_train_config(
        root / "run", data=data_yaml, input_size=128, crop_size=0, epochs=3, batch=4, protocol="coco"
    )
    return root, data_yaml, train(config)


def test_val_reproduces_the_metrics_logged_for_best_checkpoint(trained) -> None:
    root, data_yaml, result = trained
    assert result.best_checkpoint is not None
    logged = load_checkpoint(result.best_checkpoint)["best_metrics"]
    assert 0.0 <= logged["mAP50"] <= 1.0 and 0.0 <= logged["mAP50_95"] <= logged["mAP50"]
    summary = json.loads((result.run_dir / "metrics.json").read_text())
    assert summary["best"]["mAP50"] == logged["mAP50"]

    metrics = validate(result.best_checkpoint, data_yaml, split="val", protocol="coco", out=root / "val")
    assert metrics["headline"]["mAP50"] == pytest.approx(logged["mAP50"], abs=1e-9)
    assert metrics["headline"]["mAP50_95"] == pytest.approx(logged["mAP50_95"], abs=1e-9)
    # the templates were registered to their tested images (on by default), and that is reported
    assert metrics["registration"]["pairs"] == len(load_dataset(data_yaml, "val").samples)
    assert metrics["threshold"]["rule"] == "best_f1" and "optimistic" in metrics["threshold"]["source"]
    assert metrics["tiles"] is False  # boards near the letterbox size: no tiles chosen


def test_clean_boards_and_threshold_from_another_split(trained) -> None:
    root, data_yaml, result = trained
    val_images = len(load_dataset(data_yaml, "val").samples)
    out = root / "clean"
    metrics = validate(
        result.best_checkpoint,
        data_yaml,
        split="val",
        protocol="coco",
        out=out,
        clean_templates=True,
        threshold_from="train",
    )
    choice = metrics["threshold"]
    assert choice["rule"] == "escape" and "'train'" in choice["source"] and choice["target_escape"] == 0.01
    assert metrics["headline"]["threshold"] == pytest.approx(choice["threshold"])
    boards = metrics["boards"]
    assert boards["clean_boards"] == val_images == metrics["clean_boards"]["count"]
    assert boards["defective_boards"] + boards["clean_boards"] == metrics["num_images"]
    assert 0 <= boards["false_calls"] <= boards["clean_boards"]
    assert (out / "clean_boards" / "clean_boards.json").is_file()
    # the report's threshold card says where the threshold came from, not "given"
    card = (out / "report.html").read_text().split("operating threshold", 1)[1][:400]
    assert "defective images of split &#x27;train&#x27;" in card and "given" not in card
    assert metrics["operating_point"]["chosen"]["chosen_by"].startswith("the highest at which at most 1%")
    rows = list(csv.DictReader((out / "registration.csv").open()))
    assert len(rows) == 2 * val_images and all(abs(float(row["dx"])) <= 8 for row in rows)

    given_settings = ValidateSettings(
        split="val",
        protocol="coco",
        clean_templates=True,
        clean_nuisance=RecaptureConfig.none(),
        threshold=0.5,
        register_pairs=False,
    )
    given = validate(
        result.best_checkpoint, data_yaml, given_settings, out=root / "given"
    )  # keywords apply over
    assert (root / "given" / "report.html").is_file()
    assert given["threshold"]["rule"] == "given" and given["headline"]["threshold"] == 0.5
    assert "given with --threshold" in (root / "given" / "report.html").read_text()
    assert given["registration"] is None
    by_f1 = validate(
        result.best_checkpoint,
        data_yaml,
        split="val",
        out=root / "f1",
        threshold_from="train",
        threshold_rule="f1",
        protocol="both",
    )
    assert by_f1["threshold"]["rule"] == "f1" and "'train'" in by_f1["threshold"]["source"]
    assert by_f1["headline"]["threshold"] == pytest.approx(by_f1["threshold"]["threshold"])
    # the DeepPCB F at that threshold is reported beside the best one
    at_threshold = by_f1["deeppcb"]["at_threshold"]
    assert at_threshold["threshold"] == pytest.approx(by_f1["threshold"]["threshold"])
    assert at_threshold["f_score"] <= by_f1["deeppcb"]["best"]["f_score"] + 1e-9
    with pytest.raises(ConfigError, match="threshold-rule"):
        validate(
            result.best_checkpoint,
            data_yaml,
            split="val",
            threshold_from="train",
            threshold_rule="x",
            out=root / "x",
        )
    with pytest.raises(ConfigError, match="another split"):
        validate(result.best_checkpoint, data_yaml, split="val", threshold_from="val", out=root / "bad")


def test_clean_boards_for_a_model_without_templates(trained, tmp_path, small_train_config) -> None:
    """Without templates the clean boards are still recaptures of the templates, fed alone (no registration)."""
    root, data_yaml, _ = trained
    config = small_train_config(
        tmp_path / "plain",
        data=data_yaml,
        input_size=128,
        crop_size=0,
        epochs=1,
        batch=4,
        protocol="coco",
        template=False,
    )
    result = train(config)
    metrics = validate(
        result.last_checkpoint,
        data_yaml,
        split="val",
        protocol="coco",
        out=tmp_path / "val",
        clean_templates=True,
    )
    val_images = len(load_dataset(data_yaml, "val").samples)
    assert metrics["registration"] is None and metrics["boards"]["clean_boards"] == val_images
    assert metrics["num_images"] == 2 * val_images


def test_validate_settings_take_keywords_over_them_and_refuse_bad_ones(tmp_path) -> None:
    base = ValidateSettings(split="test", protocol="coco", threshold=0.3)
    with pytest.warns(DeprecationWarning, match="'conf_threshold' is deprecated: use 'threshold'"):
        merged = ValidateSettings.merged(base, {"conf_threshold": 0.6, "out": tmp_path})
    assert (merged.split, merged.protocol, merged.threshold, merged.out) == (
        "test",
        "coco",
        0.6,
        tmp_path,
    )
    assert (
        ValidateSettings.merged(base, {}) is base and ValidateSettings.merged(None, {}) == ValidateSettings()
    )
    with pytest.raises(TypeError, match="protcol"):
        validate(tmp_path / "none.pt", tmp_path, protcol="coco")
    # refused in the CLI's words before anything is loaded (the checkpoint does not exist)
    with pytest.raises(ConfigError, match="--protocol must be one of"):
        validate(tmp_path / "none.pt", tmp_path, ValidateSettings(protocol="voc"))
    with pytest.raises(ConfigError, match="either --threshold or --threshold-from"):
        validate(tmp_path / "none.pt", tmp_path, base, conf_from="train")

"""The table of retired names: an old bundle's keys, an old config file and an old option still work."""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

import pytest

from defectdet.compat import (
    RENAMED,
    Surface,
    current_keys,
    current_keywords,
    current_option_names,
    retired_names,
)
from defectdet.errors import ConfigError


def test_every_retired_name_maps_to_a_different_current_name() -> None:
    for surface, renames in RENAMED.items():
        assert renames, surface
        assert not set(renames) & set(renames.values()), surface


def test_current_keys_moves_retired_keys_with_a_warning() -> None:
    with pytest.warns(DeprecationWarning, match="run.yaml: 'imgsz' is deprecated: use 'input_size'"):
        assert current_keys({"imgsz": 320, "epochs": 3}, Surface.TRAIN_CONFIG, "run.yaml") == {
            "input_size": 320,
            "epochs": 3,
        }
    current = {"input_size": 320}
    assert current_keys(current, Surface.TRAIN_CONFIG) is current  # nothing retired: the same mapping
    with pytest.raises(ConfigError, match="'imgsz' and 'input_size' are the same setting"):
        current_keys({"imgsz": 320, "input_size": 320}, Surface.TRAIN_CONFIG, "run.yaml")


def test_current_keywords_warns_and_refuses_unknown_ones() -> None:
    with pytest.warns(
        DeprecationWarning, match=r"Predictor.predict\(\): 'conf' is deprecated: use 'threshold'"
    ):
        assert current_keywords({"conf": 0.4, "min_score": 0.1}, Surface.PREDICT) == {
            "threshold": 0.4,
            "score_floor": 0.1,
        }
    with pytest.raises(TypeError, match="unexpected keyword argument 'colour'"):
        current_keywords({"colour": 1}, Surface.PREDICT)


def test_an_old_bundles_keys_load_as_the_current_ones() -> None:
    from defectdet.runtime.bundle import BundleMetadata

    old = {
        "defectdet_version": "0.0.9",
        "created": "",
        "class_names": ["a"],
        "input_size": 64,
        "channels": 1,
        "template": False,
        "thresholds": {"score": 0.4, "score_source": "best F1", "min_score": 0.01},
        "train_config": {"imgsz": 64, "score_threshold": 0.01, "nms_iou_threshold": 0.5},
    }
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an old bundle loads without noise
        meta = BundleMetadata.model_validate(old)
    thresholds = meta.thresholds
    assert (thresholds.threshold, thresholds.threshold_source, thresholds.score_floor) == (
        0.4,
        "best F1",
        0.01,
    )
    with pytest.warns(DeprecationWarning, match="'thresholds.min_score' is deprecated"):
        assert thresholds.min_score == 0.01
    written = meta.model_dump()["thresholds"]
    assert {"threshold", "threshold_source", "score_floor"} <= set(written)  # written under the current names
    assert not set(written) & set(RENAMED[Surface.BUNDLE_THRESHOLDS])


def test_an_old_runs_config_gives_its_model_settings() -> None:
    from defectdet.runtime.spec import ModelSpec

    config = {
        "imgsz": 96,
        "score_threshold": 0.02,
        "nms_iou_threshold": 0.5,
        "channels": 1,
        "template": False,
    }
    spec = ModelSpec.from_checkpoint({"config": config})
    assert (spec.input_size, spec.score_floor, spec.nms_iou) == (96, 0.02, 0.5)


def test_an_old_config_file_still_loads(tmp_path: Path) -> None:
    from defectdet.engine.config import load_config

    path = tmp_path / "old.yaml"
    path.write_text("imgsz: 320\nscore_threshold: 0.01\nnms_iou_threshold: 0.5\n", encoding="utf-8")
    with pytest.warns(DeprecationWarning, match="'imgsz' is deprecated: use 'input_size'"):
        config = load_config(path)
    assert (config.input_size, config.score_floor, config.nms_iou) == (320, 0.01, 0.5)


def test_an_old_option_is_read_as_its_current_name() -> None:
    notes: list[str] = []
    args = ["train", "data", "--imgsz", "320", "--min-score=0.01", "--", "--conf"]
    assert current_option_names(args, notes.append) == [
        "train",
        "data",
        "--input-size",
        "320",
        "--score-floor=0.01",
        "--",
        "--conf",
    ]
    assert notes == [
        "--imgsz is deprecated: use --input-size",
        "--min-score is deprecated: use --score-floor",
    ]


def test_the_old_detect_form_field_is_read_with_a_log_line(caplog: pytest.LogCaptureFixture) -> None:
    from defectdet.serve.detect_form import _threshold_field
    from defectdet.serve.upload import UploadError

    class Field:
        def __init__(self, data: bytes) -> None:
            self.data = data

    assert retired_names("threshold", Surface.DETECT_FORM) == ["conf"]
    with caplog.at_level(logging.WARNING):
        assert _threshold_field({"conf": Field(b"0.3")}) == 0.3
    assert "form field 'conf' is deprecated: send 'threshold'" in caplog.text
    with pytest.raises(UploadError, match=r"send 'threshold' only \('conf' is its deprecated name\)"):
        _threshold_field({"conf": Field(b"0.3"), "threshold": Field(b"0.3")})

"""The repeat check: a detection on a feature the image repeats unchanged (a drilled pad among identical pads)
is dropped, a defect beside its repeats and a scratch on texture that repeats nothing stay; the setting travels
from `export` through the bundle to `Predictor`, `val` and the service, and is refused for template models."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest

from defectdet.errors import ConfigError
from defectdet.runtime import pipeline
from defectdet.runtime.repeat_check import as_gray, repeat_evidence, repeated_mask
from defectdet.runtime.spec import ModelSpec

PAD_CENTRES = [(40 + 48 * col, 40 + 48 * row) for row in range(4) for col in range(4)]


def board_with_pads() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A 224 px gray board: 16 identical drilled pads joined by traces, one pad bitten (a defect).
    Returns the image, a box on an intact pad's hole and a box on the bite."""
    image = np.zeros((224, 224), np.uint8)
    for x, y in PAD_CENTRES:
        cv2.line(image, (x, y), (x + 48, y), 255, 3)
        cv2.circle(image, (x, y), 11, 255, -1)
        cv2.circle(image, (x, y), 4, 0, -1)
    bitten_x, bitten_y = PAD_CENTRES[5]
    cv2.circle(image, (bitten_x + 9, bitten_y - 8), 5, 0, -1)
    intact_x, intact_y = PAD_CENTRES[10]
    hole_box = np.array([intact_x - 6, intact_y - 6, intact_x + 6, intact_y + 6], np.float32)
    bite_box = np.array([bitten_x + 3, bitten_y - 14, bitten_x + 15, bitten_y - 2], np.float32)
    return image, hole_box, bite_box


def test_a_hole_every_pad_has_is_repeated_design_and_a_bite_out_of_one_pad_is_not() -> None:
    image, hole_box, bite_box = board_with_pads()
    gray = as_gray(image)
    hole, bite = repeat_evidence(gray, hole_box), repeat_evidence(gray, bite_box)
    assert hole.match > 0.95 and hole.changed_pixels == 0 and hole.repeated
    assert bite.match > 0.7 and bite.changed_pixels >= 6 and not bite.repeated  # its copy shows the pad whole


def test_a_scratch_on_texture_finds_no_copy_and_stays() -> None:
    rng = np.random.default_rng(0)
    texture = cv2.GaussianBlur(rng.integers(60, 200, (240, 320), dtype=np.uint8), (5, 5), 1.5)
    rgb = np.repeat(texture[..., None], 3, axis=2)
    cv2.line(rgb, (100, 100), (160, 118), (20, 20, 20), 2)
    evidence = repeat_evidence(as_gray(rgb), np.array([96, 96, 164, 122], np.float32))
    assert evidence.match < 0.7 and not evidence.repeated


def test_low_scores_are_not_checked() -> None:
    image, hole_box, bite_box = board_with_pads()
    boxes = np.stack([hole_box, bite_box, hole_box])
    assert repeated_mask(image, boxes, np.array([0.9, 0.9, 0.01])).tolist() == [True, False, False]


def test_finish_drops_the_repeated_detection_only_when_the_spec_asks() -> None:
    image, hole_box, bite_box = board_with_pads()
    spec = ModelSpec(input_size=224, channels=1, template=False, class_names=("pin-hole", "mousebite"))
    raw = np.zeros(
        (1, 2, 6), np.float32
    )  # letterbox of a 224 px image at 224 px: input pixels = image pixels
    raw[0, 0, :4], raw[0, 0, 4] = hole_box, 0.8
    raw[0, 1, :4], raw[0, 1, 5] = bite_box, 0.7
    settings = spec.postprocess
    plain = pipeline.finish(raw, pipeline.prepare(image, None, spec), settings)
    checked_spec = spec.with_repeat_check(True)
    checked = pipeline.finish(raw, pipeline.prepare(image, None, checked_spec), settings)
    assert plain.classes.tolist() == [0, 1]
    assert checked.classes.tolist() == [1] and np.allclose(checked.boxes[0], bite_box, atol=0.5)


def test_template_models_refuse_the_check(
    trained_checkpoint: Path, bundle_path: Path, tmp_path: Path
) -> None:
    from defectdet.export.exporter import export_bundle
    from defectdet.runtime.predictor import Predictor

    with pytest.raises(ConfigError, match="--repeat-check.*reads templates"):
        Predictor(bundle_path, repeat_check=True)
    with pytest.raises(ConfigError, match="--repeat-check.*reads templates"):
        export_bundle(trained_checkpoint, tmp_path / "x.onnx", repeat_check=True)
    assert Predictor(bundle_path, repeat_check=False).spec.repeat_check is False


@pytest.fixture(scope="module")
def plain_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(last.pt, data.yaml): a few steps of a template-free nano model on 8 synthetic boards (the check's
    wiring, not accuracy)."""
    from defectdet.data.synth import synthesize_dataset
    from defectdet.engine.config import TrainConfig
    from defectdet.engine.trainer import train

    data = synthesize_dataset(
        tmp_path_factory.mktemp("plain_data"), boards=8, seed=4, template=False, min_size=160, max_size=192
    )
    config = TrainConfig(
        data=data, input_size=192, crop_size=None, epochs=2, batch=2, workers=0, out=tmp_path_factory.mktemp("run"),
        progress=False, warmup_steps=2, preset="nano", template=False,
    )  # fmt: skip
    return Path(train(config).last_checkpoint), data


def test_the_setting_travels_from_export_to_predictor_val_and_the_service(
    plain_run: tuple[Path, Path], tmp_path: Path
) -> None:
    from defectdet.engine.validate import validate
    from defectdet.export.exporter import export_bundle
    from defectdet.runtime.predictor import Predictor
    from defectdet.serve.deployment import ServedModel

    checkpoint, data = plain_run
    bundle = export_bundle(checkpoint, tmp_path / "checked.onnx", repeat_check=True).bundle
    predictor = Predictor(bundle)
    assert predictor.metadata.repeat_check and predictor.spec.repeat_check
    assert Predictor(bundle, repeat_check=False).spec.repeat_check is False
    assert ServedModel.of(predictor).describe()["repeat_check"] is True
    assert validate(bundle, data, out=tmp_path / "v1", protocol="coco")["repeat_check"] is True
    off = validate(bundle, data, out=tmp_path / "v2", protocol="coco", repeat_check=False)
    assert off["repeat_check"] is False
    on = validate(checkpoint, data, out=tmp_path / "v3", protocol="coco", repeat_check=True)
    assert on["repeat_check"] is True


def test_the_bench_scores_both_ways_and_counts_labelled_defects(
    plain_run: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import json
    import sys

    from bench import repeat_check as bench

    written: dict[str, dict] = {}

    def write_result(name: str, payload: dict, *args: object, **kwargs: object) -> Path:
        written[name] = json.loads(json.dumps(payload, default=str))
        return tmp_path / f"{name}.json"

    monkeypatch.setattr(bench, "write_result", write_result)
    checkpoint, data = plain_run
    argv = [str(checkpoint), "--data", str(data), "--timed", "2", "--warmup", "0", "--threads", "1"]
    monkeypatch.setattr(sys, "argv", ["repeat_check.py", *argv])
    assert bench.main() == 0
    (result,) = written.values()
    arm = result["arms"]["none"]
    assert arm["plain"]["mAP50"] is not None and arm["repeat_check"]["latency_ms"]["calls"] == 2
    assert arm["dropped"] is None  # the synthetic set carries no templates here
    assert result["labelled_defects"]["boxes"] > 0
    written.clear()
    monkeypatch.setattr(sys, "argv", ["repeat_check.py", "--labels-only", "--data", str(data), "--tag", "t"])
    assert bench.main() == 0
    (name,) = written
    assert name.startswith("repeat_check_labels_") and name.endswith("_val_t")


def test_the_cli_writes_the_check_into_the_bundle_and_predict_can_turn_it_off(
    plain_run: tuple[Path, Path], tmp_path: Path
) -> None:
    from typer.testing import CliRunner

    from defectdet.cli import app
    from defectdet.runtime.bundle import read_metadata

    checkpoint, data = plain_run
    bundle = tmp_path / "checked.onnx"
    exported = CliRunner().invoke(app, ["export", str(checkpoint), "--out", str(bundle), "--repeat-check"])
    assert exported.exit_code == 0, exported.output
    assert read_metadata(bundle).repeat_check is True and "repeat check on" in exported.output
    image = next((data.parent / "images" / "val").iterdir())
    out = tmp_path / "predicted"
    args = ["predict", str(bundle), str(image), "--out", str(out), "--no-repeat-check", "--no-save-images"]
    predicted = CliRunner().invoke(app, args)
    assert predicted.exit_code == 0, predicted.output
    assert (out / "predictions.jsonl").is_file()

"""One inference pipeline, one model description: `engine.predict.predict_records` (torch, batched: training-time
evaluation and `val`) and `runtime.predictor.Predictor` (onnxruntime) both run `runtime.pipeline.prepare` and
`finish`, so the same image pair gives the same input array and the same raw outputs the same boxes; a template
of another size is refused on both; `ModelSpec` reads the same settings from a checkpoint and from its bundle."""

from __future__ import annotations

import logging
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

from defectdet.data.sample import Sample
from defectdet.engine.predict import predict_records
from defectdet.errors import CheckpointError, InputError
from defectdet.export.exporter import base_metadata, export_onnx_graph, fold_batchnorm
from defectdet.model import build_model
from defectdet.postprocess import PostprocessSettings
from defectdet.runtime import pipeline
from defectdet.runtime.bundle import write_metadata
from defectdet.runtime.predictor import Predictor
from defectdet.runtime.spec import ModelSpec

SIZE = 64
CLASSES = ["open", "short"]
# fixed candidate boxes in input pixels; their scores depend on what the pass sees (fake_forward)
BOXES = np.array([[8, 8, 20, 20], [9, 8, 21, 20], [30, 34, 50, 44], [2, 40, 6, 44]], np.float32)


def fake_forward(batch: np.ndarray) -> np.ndarray:
    """A deterministic stand-in for the network, ``(B, C, S, S)`` -> ``(B, A, 4 + K)``: the same numbers on both
    paths, so any difference in the answers comes from around the forward pass, not from float noise."""
    rows = []
    for image in np.asarray(batch, np.float32):
        difference = float(np.abs(image[0] - image[1]).mean())  # tested vs template
        brightness = float(image[0].mean())
        scores = np.array(
            [
                [min(1.0, 0.3 + 5 * difference), 0.05],
                [min(1.0, 0.28 + 5 * difference), 0.04],
                [0.02, brightness],
                [0.6, 0.1],
            ],
            np.float32,
        )
        rows.append(np.concatenate([BOXES, scores], axis=1))
    return np.stack(rows)


def _checkpoint(tiles: bool = False) -> dict:
    model = build_model("nano", len(CLASSES), 2, True)
    config = {
        "imgsz": SIZE,
        "channels": 1,
        "template": True,
        "strides": [8, 16],
        "register_pairs": True,
        "tiles": tiles,
        "score_threshold": 0.01,
        "nms_iou_threshold": 0.5,
        "max_detections": 50,
    }
    return {"model": model, "model_config": model.config, "config": config, "class_names": list(CLASSES)}


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """A tiny template bundle (untrained nano at 64 px, tiles on) and the checkpoint dict it came from."""
    checkpoint = _checkpoint(tiles=True)
    detector = fold_batchnorm(checkpoint["model"])
    path = tmp_path_factory.mktemp("one_pipeline") / "model.onnx"
    export_onnx_graph(detector, path, channels=2, input_size=SIZE)
    write_metadata(path, base_metadata(detector, checkpoint))
    return path, checkpoint


def _pair(folder: Path, width: int = 150, height: int = 110, template_size: tuple[int, int] | None = None):
    """A gray board and its template (the board has a bright defect), written as PNG."""
    rng = np.random.default_rng(4)
    template = np.clip(rng.normal(100, 10, (height, width)), 0, 255).astype(np.uint8)
    image = template.copy()
    image[30:42, 40:60] = 240
    if template_size is not None:
        template = cv2.resize(template, template_size, interpolation=cv2.INTER_AREA)
    paths = folder / "board.png", folder / "golden.png"
    cv2.imwrite(str(paths[0]), image)
    cv2.imwrite(str(paths[1]), template)
    return paths


def _records(paths, predictor: Predictor, model=None, **kwargs):
    spec = predictor.spec
    sample = Sample(paths[0], np.zeros((0, 4), np.float32), np.zeros(0, np.int64), template_path=paths[1])
    return predict_records(model or (lambda batch: fake_forward(batch.numpy())), [sample], spec, **kwargs)


def test_both_paths_run_the_same_prepare_and_finish(bundle, tmp_path, monkeypatch) -> None:
    """Spies on `pipeline.prepare` and `pipeline.finish` see the torch path and the runtime path call them with
    the same image pair, get the same tiled input array, and the same raw outputs map to the same boxes in
    original pixels."""
    path, _ = bundle
    predictor = Predictor(path, threads=1)
    assert predictor.spec.tiles and predictor.spec.registration
    paths = _pair(tmp_path, width=150, height=110)  # > 1.5 x 64: the whole image and its tiles

    calls: dict[str, list] = {"prepare": [], "finish": []}
    real_prepare, real_finish = pipeline.prepare, pipeline.finish

    def prepare(image, template, spec, timer=None, companions=None):
        prepared = real_prepare(image, template, spec, timer, companions)
        calls["prepare"].append((image, template, spec, prepared))
        return prepared

    def finish(predictions, prepared, settings):
        found = real_finish(predictions, prepared, settings)
        calls["finish"].append((predictions, settings, found))
        return found

    monkeypatch.setattr(pipeline, "prepare", prepare)
    monkeypatch.setattr(pipeline, "finish", finish)
    monkeypatch.setattr(predictor, "run", lambda batch: (fake_forward(batch), None))

    seen: list[np.ndarray] = []

    def model(batch: torch.Tensor) -> np.ndarray:
        seen.append(batch.numpy().copy())
        return fake_forward(batch.numpy())

    records, skipped = _records(paths, predictor, model, batch_size=64)
    result = predictor.predict(paths[0], paths[1], threshold=0.5, score_floor=predictor.spec.score_floor)

    assert not skipped and len(calls["prepare"]) == len(calls["finish"]) == 2
    (torch_image, torch_template, torch_spec, torch_prepared), (image, template, spec, prepared) = calls[
        "prepare"
    ]
    assert np.array_equal(torch_image, image) and np.array_equal(torch_template, template)
    assert torch_spec == spec  # one model description: the val path is handed the bundle's spec itself
    # the same input array: the whole letterbox first, then its tiles, bit for bit
    assert prepared.passes > 1 and prepared.inputs.shape == (prepared.passes, 2, SIZE, SIZE)
    assert np.array_equal(np.concatenate(seen), prepared.inputs)
    assert np.array_equal(torch_prepared.inputs, prepared.inputs)
    assert torch_prepared.transform == prepared.transform
    # the same raw outputs give the same boxes in original pixels
    (torch_rows, torch_settings, torch_found), (rows, settings, found) = calls["finish"]
    assert np.array_equal(torch_rows, rows) and torch_settings == settings
    record = records[0]
    assert len(record.det_boxes) == len(result.detections) == len(found.boxes) > 0
    assert np.array_equal(record.det_boxes, found.boxes) and np.array_equal(torch_found.boxes, found.boxes)
    assert np.allclose(record.det_boxes, [d.box for d in result.detections])
    assert record.det_classes.tolist() == [d.class_id for d in result.detections]
    assert (record.width, record.height) == result.image_size == (150, 110)
    # boxes are in original pixels: inside the 150 x 110 board, not the 64 x 64 input
    assert record.det_boxes[:, 2].max() > SIZE and record.det_boxes[:, [0, 2]].max() <= 150
    assert result.verdict == pipeline.verdict(found.scores, 0.5) == "defective"
    assert result.tiles == prepared.passes - 1


def test_a_template_of_another_size_is_refused_on_both_paths(bundle, tmp_path, caplog) -> None:
    """The one rule: a template whose size differs from the tested image's is refused with both sizes named,
    never resized: the runtime raises InputError, `predict_records` (`val`, training-time evaluation) skips
    and lists the sample with the same reason."""
    path, _ = bundle
    predictor = Predictor(path, threads=1)
    paths = _pair(tmp_path, width=96, height=80, template_size=(90, 80))
    with pytest.raises(InputError, match=r"template is 90x80 but the image is 96x80"):
        predictor.predict(paths[0], paths[1])
    with pytest.raises(InputError, match=r"template is 90x80 but the image is 96x80"):
        pipeline.prepare(*pipeline.load_pair(paths[0], paths[1], 1), predictor.spec)

    called = []
    with caplog.at_level(logging.WARNING, logger="defectdet.engine.predict"):
        records, skipped = _records(
            paths, predictor, lambda batch: called.append(batch) or fake_forward(batch)
        )
    assert records == [] and skipped == [str(paths[0])] and not called
    assert "template is 90x80 but the image is 96x80" in caplog.text

    same = _pair(tmp_path, width=96, height=80)  # the same pair at one size runs on both
    assert len(_records(same, predictor)[0]) == 1 and predictor.predict(*same).image_size == (96, 80)


def test_model_spec_from_checkpoint_equals_from_its_bundle(bundle) -> None:
    path, checkpoint = bundle
    from_checkpoint = ModelSpec.from_checkpoint(checkpoint)
    assert from_checkpoint == ModelSpec.from_bundle(Predictor(path, threads=1).metadata)
    assert (from_checkpoint.input_size, from_checkpoint.channels, from_checkpoint.template) == (SIZE, 1, True)
    assert from_checkpoint.input_channels == 2 and from_checkpoint.class_names == tuple(CLASSES)
    assert from_checkpoint.strides == (8, 16) and from_checkpoint.registration and from_checkpoint.tiles
    assert from_checkpoint.postprocess == PostprocessSettings(0.01, 0.5, 50)

    plain = _checkpoint()
    plain["config"] = {**plain["config"], "register_pairs": False, "imgsz": None}
    spec = ModelSpec.from_checkpoint(plain)
    assert not spec.registration and not spec.tiles and spec.input_size == 640  # an older run's default


def test_model_spec_names_what_a_checkpoint_lacks() -> None:
    with pytest.raises(CheckpointError, match="old.pt: neither 'model_config'"):
        ModelSpec.from_checkpoint({"config": {"imgsz": 64}}, "old.pt")
    checkpoint = _checkpoint()
    checkpoint["config"] = {**checkpoint["config"], "imgsz": 16}
    with pytest.raises(CheckpointError, match="odd.pt: model setting 'input_size'"):
        ModelSpec.from_checkpoint(checkpoint, "odd.pt")
    # a checkpoint without model_config still describes itself through its config
    legacy = {"config": {"imgsz": 96, "channels": 3, "template": False}, "class_names": ["a"]}
    assert ModelSpec.from_checkpoint(legacy).input_channels == 3

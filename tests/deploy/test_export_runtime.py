"""The bundle: export parity per preset, metadata round trip, val(bundle) == val(checkpoint), the torch-free
runtime, its inputs and errors, predict on a folder with a corrupt file, and the int8 refusal path."""

from __future__ import annotations

import copy
import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import onnx
import pytest
import torch
from torch_blocker import BLOCK_TORCH
from typer.testing import CliRunner

from defectdet.cli import app
from defectdet.data.formats import load_dataset
from defectdet.data.imageio import read_image
from defectdet.engine.validate import validate
from defectdet.errors import ImageReadError, InputError
from defectdet.export.exporter import export_onnx_graph, fold_batchnorm
from defectdet.model import PRESETS, build_model
from defectdet.postprocess import postprocess
from defectdet.runtime.bundle import BundleMetadata, read_metadata, write_metadata
from defectdet.runtime.predictor import Predictor

runner = CliRunner()
PARITY_SIZE = 128


def _real_inputs(dataset: Path, size: int, template: bool) -> np.ndarray:
    """Two letterboxed synthetic boards (with their templates) as a (2, C, S, S) batch in [0, 1]."""
    from defectdet.data.letterbox import letterbox_image

    batch = []
    for sample in load_dataset(dataset, "train").samples[:2]:
        planes = [letterbox_image(read_image(sample.image_path), size)[0]]
        if template:
            planes.append(letterbox_image(read_image(sample.template_path), size)[0])
        batch.append(np.stack(planes).astype(np.float32) / 255.0)
    return np.stack(batch)


@pytest.mark.parametrize("preset", list(PRESETS))
def test_export_matches_eager_for_every_preset(preset: str, tiny_dataset: Path, tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = build_model(preset, num_classes=6, in_channels=2, template=True)
    for module in model.modules():  # non-trivial BatchNorm statistics, so folding them is really tested
        if isinstance(module, torch.nn.BatchNorm2d):
            module.running_mean.uniform_(-0.2, 0.2)
            module.running_var.uniform_(0.5, 2.0)
    model.eval()
    folded = fold_batchnorm(copy.deepcopy(model))
    path = tmp_path / f"{preset}.onnx"
    export_onnx_graph(folded, path, channels=2, input_size=PARITY_SIZE)
    graph = onnx.load(str(path))
    assert not any(node.op_type == "BatchNormalization" for node in graph.graph.node)
    assert graph.opset_import[0].version >= 17
    write_metadata(
        path,
        BundleMetadata(
            defectdet_version="test", created="now", class_names=[f"c{i}" for i in range(6)],
            input_size=PARITY_SIZE, channels=1, template=True,
        ),
    )  # fmt: skip
    images = _real_inputs(tiny_dataset, PARITY_SIZE, template=True)
    with torch.inference_mode():
        eager, eager_features = model.forward_with_features(torch.from_numpy(images))
    predictions, features = Predictor(path, threads=1).run(images)
    assert predictions.shape == tuple(eager.shape) and features.shape == tuple(eager_features.shape)
    assert np.abs(predictions - eager.numpy()).max() < 1e-4
    assert np.abs(features - eager_features.numpy()).max() < 1e-4
    for ours, theirs in zip(postprocess(predictions, 0.01), postprocess(eager.numpy(), 0.01), strict=True):
        _assert_same_detections(ours, theirs, clear_of=0.01)


def _assert_same_detections(ours, theirs, clear_of: float, margin: float = 1e-3) -> None:
    """Every detection scoring clearly above the threshold on one side is on the other: same class, box
    within 0.5 px. (An untrained model's scores crowd the threshold; a 1e-5 difference may flip those.)"""
    assert len(theirs) > 0
    for first, second in ((ours, theirs), (theirs, ours)):
        for box, score, label in zip(first.boxes, first.scores, first.classes, strict=True):
            if score < clear_of + margin:
                continue
            same = (second.classes == label) & (np.abs(second.boxes - box).max(1) < 0.5)
            assert same.any(), (box, score, label)


def test_bundle_metadata_round_trips_and_describes_the_model(
    bundle_path: Path, tiny_dataset: Path, trained_checkpoint: Path
) -> None:
    meta = read_metadata(bundle_path)
    predictor = Predictor(bundle_path)
    assert predictor.metadata == meta
    assert meta.class_names == load_dataset(tiny_dataset, "val").class_names
    assert (meta.input_size, meta.channels, meta.template) == (192, 1, True)
    assert "val" in meta.thresholds.threshold_source and 0.0 < meta.thresholds.threshold < 1.0
    assert meta.metrics["split"] == "val" and 0.0 <= meta.metrics["mAP50"] <= 1.0
    checkpoint = torch.load(trained_checkpoint, map_location="cpu", weights_only=False)
    assert meta.train_config["input_size"] == checkpoint["config"]["input_size"]
    assert len(meta.config_hash) == 16
    reference = meta.drift_reference
    # the drift reference profiles the training images (the val split is a few boards), groups and all
    assert reference is not None and reference["split"] == "train"
    assert (
        reference["images"] == len(load_dataset(tiny_dataset, "train").samples) == reference["sampled_from"]
    )
    assert reference["groups"]["count"] >= 1 and "within_std" in reference["statistics"]["brightness"]
    onnx.checker.check_model(onnx.load(str(bundle_path)))
    batch = np.random.default_rng(1).random((3, 2, 192, 192), dtype=np.float32)  # dynamic batch
    predictions, features = predictor.run(batch)
    assert predictions.shape[0] == 3 and features.shape == (3, reference["features"]["channels"])


def test_a_failed_export_leaves_the_bundle_at_out_as_it_was(trained_checkpoint: Path, tmp_path: Path) -> None:
    """Measuring on a dataset without a usable val split fails after the graph is written: nothing lands at
    --out (an earlier bundle there keeps its bytes) and no partial file is left beside it."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("path: .\ntrain: images\nval: nowhere\nnames: [a]\n")
    (tmp_path / "images").mkdir()
    out = tmp_path / "models" / "model.onnx"
    result = runner.invoke(app, ["export", str(trained_checkpoint), "--data", str(bad), "--out", str(out)])
    assert result.exit_code != 0 and "nowhere" in result.output + str(result.exception)
    assert not out.parent.exists() or list(out.parent.iterdir()) == []
    out.write_bytes(b"the served model")
    result = runner.invoke(
        app, ["export", str(trained_checkpoint), "--data", str(bad), "--out", str(out), "--overwrite"]
    )
    assert result.exit_code != 0 and "nowhere" in result.output + str(result.exception)
    assert out.read_bytes() == b"the served model" and list(out.parent.iterdir()) == [out]


def _export_cli(*args: Path | str) -> tuple[int, str]:
    done = subprocess.run(
        [sys.executable, "-m", "defectdet.cli", "export", *map(str, args)],
        capture_output=True, text=True, timeout=120, check=False, env={**os.environ, "COLUMNS": "300"},
    )  # fmt: skip
    return done.returncode, done.stdout + done.stderr


def test_export_never_replaces_a_bundle_without_overwrite(tmp_path: Path) -> None:
    """An existing bundle at --out (or the default path beside the checkpoint) is refused in one line, before
    anything is read or written; a folder as --out too. --overwrite lets the export go on."""
    checkpoint = tmp_path / "best.pt"
    checkpoint.write_bytes(b"not a checkpoint")  # never read: the refusal comes first
    out = tmp_path / "model.onnx"
    out.write_bytes(b"the served model")
    for args in ((checkpoint, "--out", out), (checkpoint,)):
        if len(args) == 1:
            (tmp_path / "best.onnx").write_bytes(b"the served model")
        code, said = _export_cli(*args)
        assert code == 2 and "a bundle is already there" in said and "--overwrite" in said, said
        assert "Traceback" not in said
    assert out.read_bytes() == (tmp_path / "best.onnx").read_bytes() == b"the served model"
    (tmp_path / "folder").mkdir()
    code, said = _export_cli(checkpoint, "--out", tmp_path / "folder")
    assert code == 2 and "a folder" in said and "Traceback" not in said
    code, said = _export_cli(checkpoint, "--out", out, "--overwrite")
    assert "already there" not in said  # it went on (and failed on the fake checkpoint)


def test_val_on_the_bundle_gives_the_checkpoint_metrics(
    bundle_path: Path, trained_checkpoint: Path, tiny_dataset: Path, tmp_path: Path
) -> None:
    from_checkpoint = validate(trained_checkpoint, tiny_dataset, split="train", out=tmp_path / "ckpt")
    from_bundle = validate(bundle_path, tiny_dataset, split="train", out=tmp_path / "bundle")
    for key in ("mAP50", "mAP50_95"):
        assert abs(from_checkpoint["headline"][key] - from_bundle["headline"][key]) <= 0.001, key
    assert from_checkpoint["num_detections"] > 0


def test_every_runtime_module_imports_with_torch_unimportable() -> None:
    """The whole `defectdet.runtime` and `defectdet.serve` packages (and `export.resolve`, which `predict` runs on a
    bundle) are torch-free, not only the modules the Predictor happens to pull in."""
    script = (
        BLOCK_TORCH
        + """
import importlib, pkgutil
import defectdet.runtime, defectdet.serve
names = [
    info.name
    for package in (defectdet.runtime, defectdet.serve)
    for info in pkgutil.walk_packages(package.__path__, package.__name__ + ".")
]
for name in names + ["defectdet.export.resolve", "defectdet.postprocess"]:
    importlib.import_module(name)
assert "torch" not in sys.modules
print(len(names))
"""
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    # runtime: bundle, monitor, predict, predictor, ...; serve: server, metrics, upload, ...
    assert int(done.stdout.split()[-1]) >= 7


def test_runtime_runs_with_torch_unimportable(bundle_path: Path, tiny_dataset: Path) -> None:
    sample = load_dataset(tiny_dataset, "val").samples[0]
    script = (
        BLOCK_TORCH
        + f"""
from defectdet.runtime.predictor import Predictor
import defectdet.runtime.monitor, defectdet.runtime.predict
result = Predictor({str(bundle_path)!r}).predict({str(sample.image_path)!r}, {str(sample.template_path)!r})
assert "torch" not in sys.modules
print(result.verdict, len(result.detections))
"""
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[0] in ("clean", "defective")


def test_runtime_install_does_not_require_torch() -> None:
    requirements = importlib.metadata.requires("defectdet") or []
    base_or_runtime = [
        line for line in requirements if "extra ==" not in line or 'extra == "runtime"' in line
    ]
    assert base_or_runtime and not any(line.lower().startswith("torch") for line in base_or_runtime)
    assert any(line.startswith("onnxruntime") for line in base_or_runtime)


def test_predictor_accepts_paths_bytes_and_arrays_alike(bundle_path: Path, tiny_dataset: Path) -> None:
    predictor = Predictor(bundle_path)
    sample = load_dataset(tiny_dataset, "val").samples[0]
    image, template = read_image(sample.image_path), read_image(sample.template_path)
    expected = predictor.predict(sample.image_path, sample.template_path, score_floor=0.01)
    assert expected.image_size == (image.shape[1], image.shape[0])
    assert set(expected.timings) == {"decode", "letterbox", "model", "postprocess", "total"}
    variants = [
        (Path(sample.image_path).read_bytes(), Path(sample.template_path).read_bytes()),
        (image, template),
        (np.repeat(image[:, :, None], 3, axis=2), np.repeat(template[:, :, None], 3, axis=2)),  # RGB
        (image.astype(np.uint16) * 257, template.astype(np.uint16) * 257),  # 16-bit
    ]
    for tested, reference in variants:
        result = predictor.predict(tested, reference, score_floor=0.01)
        assert [d.class_id for d in result.detections] == [d.class_id for d in expected.detections]
        for ours, theirs in zip(result.detections, expected.detections, strict=True):
            assert np.abs(np.subtract(ours.box, theirs.box)).max() < 0.5
    # the verdict follows the threshold the caller gives
    assert predictor.predict(image, template, threshold=0.0).verdict == "defective"
    assert predictor.predict(image, template, threshold=1.0).verdict == "clean"


def test_the_runtime_registers_a_shifted_template(bundle_path: Path, tiny_dataset: Path) -> None:
    predictor = Predictor(bundle_path)
    assert predictor.metadata.registration  # trained with registration (the default), so it runs it
    sample = load_dataset(tiny_dataset, "val").samples[0]
    template = read_image(sample.template_path)
    image = template  # a clean capture whose template was moved by (2, -1): the board moved by (-2, 1)
    shifted = cv2.warpAffine(template, np.float32([[1, 0, 2.0], [0, 1, -1.0]]), template.shape[::-1],
                             borderMode=cv2.BORDER_REPLICATE)  # fmt: skip
    result = predictor.predict(image, shifted)
    motion = result.registration
    assert motion is not None and motion["applied"]
    assert abs(motion["dx"] + 2.0) < 0.3 and abs(motion["dy"] - 1.0) < 0.3, motion


def test_a_deep_pair_gets_one_intensity_mapping(bundle_path: Path) -> None:
    """A 12-bit pair whose peaks straddle 2048: scaled apart, the clean background would differ by 2x."""
    template = np.full((64, 80), 2000, np.uint16)
    image = template.copy()
    image[10:20, 10:20] = 3000
    tested, reference = Predictor(bundle_path).load_pair(image, template)
    assert tested.dtype == reference.dtype == np.uint8
    assert tested[0, 0] == reference[0, 0] == round(2000 * 255 / 4095)
    assert tested[15, 15] == round(3000 * 255 / 4095)


def test_predictor_errors_name_the_problem(bundle_path: Path, tiny_dataset: Path) -> None:
    predictor = Predictor(bundle_path)
    sample = load_dataset(tiny_dataset, "val").samples[0]
    image = read_image(sample.image_path)
    with pytest.raises(InputError, match="template"):
        predictor.predict(image)
    with pytest.raises(InputError, match="same size"):
        predictor.predict(image, image[:-8])
    with pytest.raises(InputError, match="dtype"):
        predictor.predict(image.astype(np.complex64), image)
    with pytest.raises(ImageReadError):
        predictor.predict(b"not an image at all", image)
    with pytest.raises(InputError, match="threshold"):
        predictor.predict(image, image, threshold=1.5)


def test_predict_folder_skips_a_corrupt_file_and_writes_every_output(
    bundle_path: Path, tiny_dataset: Path, tmp_path: Path
) -> None:
    images, templates = tmp_path / "images", tmp_path / "templates"
    images.mkdir(), templates.mkdir()
    samples = load_dataset(tiny_dataset, "val").samples[:2]
    for sample in samples:
        (images / Path(sample.image_path).name).write_bytes(Path(sample.image_path).read_bytes())
        (templates / Path(sample.image_path).name).write_bytes(Path(sample.template_path).read_bytes())
    (images / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 truncated")
    out = tmp_path / "out"
    result = runner.invoke(
        app,
        [
            "predict",
            str(bundle_path),
            str(images),
            "--templates",
            str(templates),
            "--out",
            str(out),
            "--threshold",
            "0.0",
        ],
    )
    assert result.exit_code == 1, result.output
    assert "broken.jpg" in result.output
    lines = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert len(lines) == 3 and sum("error" in line for line in lines) == 1
    good = [line for line in lines if "error" not in line]
    assert all(line["verdict"] == "defective" and line["detections"] for line in good)  # conf 0: all flagged
    for line in good:
        stem = Path(line["file"]).stem
        labels = (out / "labels" / f"{stem}.txt").read_text().splitlines()
        assert len(labels) == len(line["detections"])
        values = [float(v) for v in labels[0].split()[1:]]
        assert all(0.0 <= v <= 1.0 for v in values)
        drawn = cv2.imread(str(out / "images" / f"{stem}.png"))
        assert drawn is not None and drawn.shape[:2] == tuple(reversed(line["image_size"]))


def test_int8_is_refused_when_it_loses_accuracy_and_kept_when_forced(
    bundle_path: Path, tiny_dataset: Path, tmp_path: Path
) -> None:
    from defectdet.export.quantize import int8_path_for, quantize_bundle

    bundle = tmp_path / "model.onnx"
    bundle.write_bytes(bundle_path.read_bytes())
    common = dict(train_split="train", val_split="val", calibration_images=4)
    refused = quantize_bundle(bundle, tiny_dataset, max_drop=-1.0, **common)
    assert refused["written"] is False and not int8_path_for(bundle).exists()
    assert 0.0 <= refused["mAP50_int8"] <= 1.0 and refused["p50_ms_int8"] > 0
    forced = quantize_bundle(bundle, tiny_dataset, max_drop=-1.0, force=True, **common)
    assert forced["written"] is True and forced["forced"] is True
    int8 = int8_path_for(bundle)
    assert read_metadata(int8).precision == "int8"
    graph = onnx.load(str(int8))
    assert any(node.op_type == "QuantizeLinear" for node in graph.graph.node)


def test_torchscript_and_pt2_match_the_bundle(
    bundle_path: Path, trained_checkpoint: Path, tmp_path: Path
) -> None:
    from defectdet.engine.checkpoint import load_detector
    from defectdet.export.exporter import export_pt2, export_torchscript

    detector = fold_batchnorm(load_detector(trained_checkpoint)[0])
    meta = read_metadata(bundle_path)
    batch = np.random.default_rng(2).random((1, 2, 192, 192), dtype=np.float32)
    expected, _ = Predictor(bundle_path).run(batch)
    extra = {"defectdet.json": ""}
    scripted = torch.jit.load(str(export_torchscript(detector, tmp_path / "m.ts", meta)), _extra_files=extra)
    assert BundleMetadata.model_validate_json(extra["defectdet.json"]) == meta
    scripted = torch.jit.optimize_for_inference(scripted)
    program = torch.export.load(str(export_pt2(detector, tmp_path / "m.pt2", meta)))
    with torch.inference_mode():
        traced, _ = scripted(torch.from_numpy(batch))
        exported, _ = program.module()(torch.from_numpy(np.repeat(batch, 2, axis=0)))
    assert np.abs(traced.numpy() - expected).max() < 1e-4
    assert np.abs(exported.numpy()[:1] - expected).max() < 1e-4


def test_templates_are_matched_by_name_or_by_deeppcb_pairing(tmp_path: Path) -> None:
    from defectdet.runtime.predict import find_template

    boards, golden = tmp_path / "boards", tmp_path / "golden"
    boards.mkdir(), golden.mkdir()
    for path in (boards / "a.png", golden / "a.png", golden / "b.jpg", boards / "b.png",
                 boards / "7_test.jpg", boards / "7_temp.jpg", boards / "9_test.jpg"):  # fmt: skip
        path.write_bytes(b"x")
    assert find_template(boards / "a.png", golden) == golden / "a.png"
    assert find_template(boards / "b.png", golden) == golden / "b.jpg"  # same stem, other suffix
    assert find_template(boards / "7_test.jpg", boards) == boards / "7_temp.jpg"  # DeepPCB, one folder
    assert find_template(boards / "9_test.jpg", boards) is None
    assert find_template(boards / "a.png", None) is None


def test_tiled_runtime_matches_the_tiled_val_path(
    bundle_path: Path,
    trained_checkpoint: Path,
    tiny_dataset: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A board enlarged 3x (over 1.5x the 192 input) runs as tiles in the torch-free runtime and in the torch
    path `val` uses. Compared in three steps so float noise cannot flip the answer (a barely trained model has
    many near-equal candidates near any threshold, and NMS between near-equal scores is a coin toss): the graph
    inputs (whole letterbox, then tiles) are the same, the raw outputs agree elementwise, and the same raw
    outputs give exactly the same merged detections in both paths."""
    from defectdet.data.sample import Sample
    from defectdet.engine.checkpoint import load_detector
    from defectdet.engine.predict import predict_records
    from defectdet.postprocess import PostprocessSettings
    from defectdet.runtime.spec import ModelSpec

    predictor = Predictor(bundle_path, tiles=True)
    meta = predictor.metadata
    sample = load_dataset(tiny_dataset, "val").samples[0]
    paths = []
    for name, source in (("board.png", sample.image_path), ("golden.png", sample.template_path)):
        image = cv2.imread(str(source), cv2.IMREAD_UNCHANGED)
        paths.append(tmp_path / name)
        cv2.imwrite(str(paths[-1]), cv2.resize(image, None, fx=3, fy=3, interpolation=cv2.INTER_NEAREST))

    model, checkpoint = load_detector(trained_checkpoint)
    settings = PostprocessSettings.from_config(checkpoint["config"])
    inputs, outputs = [], []

    def recorded(batch: torch.Tensor) -> np.ndarray:  # the val path's model, remembering what it saw
        inputs.append(batch.numpy().copy())
        outputs.append(model(batch).float().numpy())
        return outputs[-1]

    spec = ModelSpec(
        input_size=meta.input_size,
        channels=meta.channels,
        template=True,
        registration=meta.registration,
        tiles=True,
    ).with_postprocess(settings)
    sample = Sample(paths[0], np.zeros((0, 4)), np.zeros(0), template_path=paths[1], image_id="big")
    records, _ = predict_records(recorded, [sample], spec)
    val_inputs, val_outputs = np.concatenate(inputs), np.concatenate(outputs)

    # 1. the same graph inputs: the whole image's letterbox first, then its tiles
    prepared = predictor.prepare(*predictor.load_pair(paths[0], paths[1]))
    batch = np.concatenate([prepared.tensor[None], prepared.tile_tensors])
    assert len(batch) >= 5 and batch.shape == val_inputs.shape
    assert np.abs(batch - val_inputs).max() <= 1e-6
    # 2. the same raw outputs, elementwise (boxes in pixels of the 192 input, scores in [0, 1])
    runtime_outputs, _ = predictor.run(batch)
    assert runtime_outputs.shape == val_outputs.shape
    assert np.abs(runtime_outputs - val_outputs).max() <= 2e-3
    # 3. the same raw outputs merge to the same detections: NMS and the tile merge run on identical numbers
    assert (meta.thresholds.nms_iou, meta.thresholds.max_detections) == (
        settings.nms_iou,
        settings.max_detections,
    )
    monkeypatch.setattr(predictor, "run", lambda _batch: (val_outputs, None))
    result = predictor.predict(paths[0], paths[1], threshold=0.05, score_floor=settings.score_floor)
    assert result.tiles == len(batch) - 1
    record = records[0]
    assert len(record.det_boxes) == len(result.detections) > 0
    assert np.allclose(record.det_boxes, [d.box for d in result.detections], atol=1e-3)
    assert np.allclose(record.det_scores, [d.score for d in result.detections], atol=1e-6)
    assert record.det_classes.tolist() == [d.class_id for d in result.detections]

    untiled = Predictor(bundle_path, tiles=False).predict(paths[0], paths[1], threshold=0.05)
    assert untiled.tiles == 0 and result.to_dict()["tiles"] == result.tiles

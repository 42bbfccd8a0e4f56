"""Companion captures through the torch-free side: pipeline rules, a bundle whose graph reads a companion plane,
`predict --companion`, the service's multipart field per plane, the keep folder and the review export.

The bundle is a hand-built ONNX graph (no training): input ``(B, 2, 64, 64)`` = [image, L2]; one anchor with a
fixed box whose score is the brightest pixel of the L2 plane. So a bright L2 capture gives a detection and a
dark one none: the answer proves the companion reached the graph in its place.
"""

from __future__ import annotations

import json
from pathlib import Path

import cv2
import numpy as np
import pytest

from defectdet.errors import ImageTooLargeError, InputError
from defectdet.runtime import pipeline
from defectdet.runtime.spec import ModelSpec

SIZE = 64
BOX = [10.0, 12.0, 30.0, 28.0]


def _bundle(path: Path, companions: list[str] | None = None) -> Path:
    """The ONNX graph described above, with bundle metadata (`companions` None: metadata without the field, as
    an older bundle has)."""
    import onnx
    from onnx import TensorProto, helper

    from defectdet.runtime.bundle import BundleMetadata, write_metadata

    planes = 1 + len(companions or [])
    nodes = [
        helper.make_node("Constant", [], ["starts"], value=helper.make_tensor("s", TensorProto.INT64, [1], [planes - 1])),
        helper.make_node("Constant", [], ["ends"], value=helper.make_tensor("e", TensorProto.INT64, [1], [planes])),
        helper.make_node("Constant", [], ["axes"], value=helper.make_tensor("a", TensorProto.INT64, [1], [1])),
        helper.make_node("Slice", ["images", "starts", "ends", "axes"], ["last"]),
        helper.make_node("ReduceMax", ["last"], ["peak"], axes=[1, 2, 3], keepdims=1),  # (B, 1, 1, 1)
        helper.make_node("Constant", [], ["shape"], value=helper.make_tensor("h", TensorProto.INT64, [3], [-1, 1, 1])),
        helper.make_node("Reshape", ["peak", "shape"], ["score"]),  # (B, 1, 1)
        helper.make_node("Constant", [], ["box"], value=helper.make_tensor("b", TensorProto.FLOAT, [1, 1, 4], BOX)),
        helper.make_node("Mul", ["score", "zero"], ["nothing"]),
        helper.make_node("Add", ["box", "nothing"], ["boxes"]),  # (B, 1, 4)
        helper.make_node("Concat", ["boxes", "score"], ["predictions"], axis=2),
    ]  # fmt: skip
    graph = helper.make_graph(
        nodes,
        "companion-probe",
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, ["B", planes, SIZE, SIZE])],
        [helper.make_tensor_value_info("predictions", TensorProto.FLOAT, ["B", 1, 5])],
        [helper.make_tensor("zero", TensorProto.FLOAT, [1], [0.0])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(path))
    extra = {} if companions is None else {"companions": companions}
    metadata = BundleMetadata(
        defectdet_version="test", created="", class_names=["defect"], input_size=SIZE, channels=1, template=False,
        **extra,
    )  # fmt: skip
    write_metadata(path, metadata)
    return path


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _bundle(tmp_path_factory.mktemp("bundle") / "l2.onnx", ["L2"])


def _png(array: np.ndarray) -> bytes:
    return cv2.imencode(".png", array)[1].tobytes()


IMAGE = np.full((SIZE, SIZE), 90, np.uint8)
BRIGHT, DARK = np.full((SIZE, SIZE), 250, np.uint8), np.zeros((SIZE, SIZE), np.uint8)


def test_prepare_requires_each_companion_at_the_image_size_and_tiles_every_plane_alike() -> None:
    spec = ModelSpec(input_size=32, channels=1, template=True, companions=("L2",), tiles=True)
    assert spec.planes == ("image", "template", "L2") and spec.input_channels == 3
    image = np.random.default_rng(0).integers(0, 255, (70, 90), dtype=np.uint8)
    prepared = pipeline.prepare(image, image, spec, companions={"L2": image})
    assert prepared.passes > 1  # the whole image and its tiles
    assert np.array_equal(prepared.inputs[:, 2], prepared.inputs[:, 0])  # cut, letterboxed and scaled alike
    with pytest.raises(InputError, match="pass it as companion 'L2'"):
        pipeline.prepare(image, image, spec)
    with pytest.raises(InputError, match="companion 'L2' is 90x60 but the image is 90x70"):
        pipeline.prepare(image, image, spec, companions={"L2": image[:60]})
    with pytest.raises(InputError, match="'L3'.*its companions are: 'L2'"):
        pipeline.prepare(image, image, spec, companions={"L2": image, "L3": image})


def test_deep_companions_share_the_image_mapping() -> None:
    image, companion = np.full((8, 8), 1000, np.uint16), np.full((8, 8), 4000, np.uint16)
    planes = pipeline.load_planes(image, None, 1, companions={"L2": companion})
    # one 12-bit mapping for both: the companion stays four times brighter
    assert int(planes.image[0, 0]) * 4 == pytest.approx(int(planes.companions["L2"][0, 0]), abs=4)


def test_the_bundle_reads_its_companion_and_refuses_without_it(bundle: Path, tmp_path: Path) -> None:
    from defectdet.runtime.predictor import Predictor

    predictor = Predictor(bundle)
    assert predictor.metadata.planes == ["image", "L2"] and predictor.spec.companions == ("L2",)
    assert predictor.predict(IMAGE, companions={"L2": BRIGHT}).verdict == "defective"
    assert predictor.predict(IMAGE, companions={"L2": _png(DARK)}).detections == []
    with pytest.raises(InputError, match="also takes the aligned capture 'L2'"):
        predictor.predict(IMAGE)
    with pytest.raises(ImageTooLargeError, match="companion 'L2'"):  # the pixel limit holds for every plane
        Predictor(bundle, max_pixels=1000).predict(IMAGE, companions={"L2": _png(BRIGHT)})
    older = Predictor(_bundle(tmp_path / "plain.onnx"))  # metadata without the field loads unchanged
    assert older.metadata.companions == [] and older.predict(IMAGE).verdict == "defective"


def test_predict_cli_pairs_each_image_with_its_companion(bundle: Path, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from defectdet.cli import app

    (tmp_path / "images").mkdir(), (tmp_path / "L2").mkdir()
    for name, companion in (("bright.png", BRIGHT), ("dark.png", DARK)):
        (tmp_path / "images" / name).write_bytes(_png(IMAGE))
        (tmp_path / "L2" / name).write_bytes(_png(companion))
    out = tmp_path / "out"
    runner = CliRunner()
    args = ["predict", str(bundle), str(tmp_path / "images"), "--out", str(out), "--no-save-images"]
    result = runner.invoke(app, [*args, "--companion", f"L2={tmp_path / 'L2'}"])
    assert result.exit_code == 0, result.output
    records = {
        Path(r["file"]).name: r for r in map(json.loads, (out / "predictions.jsonl").read_text().splitlines())
    }
    assert records["bright.png"]["verdict"] == "defective" and records["dark.png"]["verdict"] == "clean"
    assert records["bright.png"]["companions"] == {"L2": str(tmp_path / "L2" / "bright.png")}
    refused = runner.invoke(app, args)  # `main` prints a DefectDetError as one line
    assert isinstance(refused.exception, InputError) and "--companion L2=DIR" in str(refused.exception)


def test_service_takes_one_field_per_plane_and_keeps_and_exports_companions(
    bundle: Path, tmp_path: Path
) -> None:
    from fastapi.testclient import TestClient

    from defectdet.data.formats import load_dataset
    from defectdet.serve.review import ReviewFolder
    from defectdet.serve.server import create_app
    from defectdet.serve.settings import ServeSettings

    kept = tmp_path / "kept"
    app = create_app(bundle, ServeSettings(keep=("all",), keep_dir=str(kept)))
    with TestClient(app, base_url="http://localhost") as client:
        while client.get("/readyz").status_code != 200:
            pass
        body = app.openapi()["paths"]["/v1/detect"]["post"]["requestBody"]["content"]["multipart/form-data"]
        assert body["schema"]["required"] == ["image", "L2"] and "L2" in body["schema"]["properties"]
        answer = client.post("/v1/detect", files={"image": _png(IMAGE), "L2": _png(BRIGHT)})
        assert answer.status_code == 200 and answer.json()["verdict"] == "defective", answer.text
        missing = client.post("/v1/detect", files={"image": _png(IMAGE)})
        assert missing.status_code == 422 and "'L2'" in missing.json()["error"]
        unknown = client.post("/v1/detect", files={"image": _png(IMAGE), "L2": _png(DARK), "L3": _png(DARK)})
        assert unknown.status_code == 422 and "L2" in unknown.json()["error"]
        other_size = client.post("/v1/detect", files={"image": _png(IMAGE), "L2": _png(BRIGHT[:40])})
        assert other_size.status_code == 422 and "64x40" in other_size.json()["error"]
        app.state.service.capture.drain()
    (image,) = (kept / "images").iterdir()
    assert (kept / "companions" / "L2" / image.name).read_bytes() == _png(BRIGHT)
    folder = ReviewFolder(kept)
    assert folder.listing()["items"][0]["companions"] == ["L2"]
    folder.decide(image.name, "accept", [{"class_id": 0, "box": BOX}], "op")
    assert "companions:\n  L2: companions/L2\n" in (kept / "data.yaml").read_text()
    (sample,) = load_dataset(kept / "data.yaml", "train").samples
    assert sample.companion_paths["L2"].name == image.name


def test_a_candidate_that_takes_other_companions_is_refused(tmp_path: Path) -> None:
    from server_fakes import CLASS_NAMES, FakePredictor

    from defectdet.serve.deployment import Deployment, ServedModel
    from defectdet.serve.metrics import ServiceMetrics
    from defectdet.serve.upload import UploadError

    (tmp_path / "two-lights.onnx").write_bytes(b"stands for a bundle")
    candidate = FakePredictor()
    candidate.metadata = candidate.metadata.model_copy(update={"companions": ["L2"]})
    deployment = Deployment(
        ServedModel.of(FakePredictor()),
        ServiceMetrics(CLASS_NAMES, None),
        models_dir=tmp_path,
        load=lambda path: candidate,
    )
    with pytest.raises(UploadError, match="without a template and the companion captures L2, the live model"):
        deployment.start_shadow("two-lights.onnx")


AGDD = Path(__file__).resolve().parents[2].parent / "shared" / "datasets" / "agdd" / "images"


@pytest.mark.parametrize("real", [False, True], ids=["synthetic", "agdd"])
def test_both_captures_in_one_folder_pair_by_their_tag(bundle: Path, tmp_path: Path, real: bool) -> None:
    """`part_L1.png` and `part_L2.png` side by side (AGDD's layout): `--companion L2=` that folder predicts each L1
    image with its L2 capture and never predicts an L2 file on its own."""
    from defectdet.runtime.predict import predict_source

    folder = tmp_path / "captures"
    folder.mkdir()
    if real:
        if not AGDD.is_dir():
            pytest.skip("../shared/datasets/agdd is not here")
        for first in sorted(AGDD.glob("*_L1.png"))[:2]:  # copied to a temporary folder, never into the repo
            for tag in ("L1", "L2"):
                name = first.name.replace("_L1", f"_{tag}")
                (folder / name).write_bytes((AGDD / name).read_bytes())
    else:
        for part in ("a", "b"):
            (folder / f"{part}_L1.png").write_bytes(_png(IMAGE))
            (folder / f"{part}_L2.png").write_bytes(_png(BRIGHT))
    summary = predict_source(bundle, folder, tmp_path / "out", companions={"L2": folder}, progress=False)
    assert summary.images == 2 and not summary.failed
    records = [json.loads(line) for line in (tmp_path / "out" / "predictions.jsonl").read_text().splitlines()]
    for record in records:
        assert Path(record["file"]).name.endswith("_L1.png")
        assert record["companions"]["L2"] == record["file"].replace("_L1.png", "_L2.png")

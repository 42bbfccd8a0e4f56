"""The whole loop with a companion capture, on a tiny synthetic set whose images each have an aligned second
lighting L2 (`companion_data`): train one step -> export -> `predict --companion` -> `serve` (one multipart field
per plane, keep folder) -> review -> the reviewed folder's data.yaml starts a fine-tune that reads L2 again."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from companion_data import COMPANION, make_companion_dataset

pytest.importorskip("torch")


def test_train_export_predict_serve_review_and_train_from_keep_the_companion(tmp_path: Path) -> None:
    from fastapi.testclient import TestClient
    from typer.testing import CliRunner

    from defectdet.cli import app
    from defectdet.engine.config import TrainConfig
    from defectdet.engine.trainer import build_train_data, train
    from defectdet.export.exporter import export_bundle
    from defectdet.serve.review import ReviewFolder
    from defectdet.serve.server import create_app
    from defectdet.serve.settings import ServeSettings

    data = make_companion_dataset(tmp_path / "data", images=6, size=64)
    quick = {
        "device": "cpu",
        "workers": 0,
        "progress": False,
        "batch": 4,
        "warmup_steps": 1,
        "preset": "nano",
    }
    run = train(TrainConfig(**quick, data=data, out=tmp_path / "run", max_steps=1, val_split=None))
    bundle = export_bundle(run.last_checkpoint, tmp_path / "model.onnx").bundle
    images, captures = data.parent / "images" / "val", data.parent / COMPANION
    out = tmp_path / "predicted"
    args = ["predict", str(bundle), str(images), "--out", str(out), "--no-save-images", "--threshold", "0"]
    result = CliRunner().invoke(app, [*args, "--companion", f"{COMPANION}={captures}"])
    assert result.exit_code == 0, result.output
    records = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert len(records) == 2 and all(r["companions"][COMPANION].startswith(str(captures)) for r in records)

    kept = tmp_path / "kept"
    service = create_app(bundle, ServeSettings(keep=("all",), keep_dir=str(kept), threads=1))
    image = sorted(images.iterdir())[0]
    with TestClient(service, base_url="http://localhost") as client:
        while client.get("/readyz").status_code != 200:
            pass
        files = {"image": image.read_bytes(), COMPANION: (captures / image.name).read_bytes()}
        answer = client.post("/v1/detect", files=files)
        assert answer.status_code == 200, answer.text
        service.state.service.capture.drain()
    (name,) = (path.name for path in (kept / "images").iterdir())
    assert (kept / "companions" / COMPANION / name).read_bytes() == (captures / image.name).read_bytes()
    ReviewFolder(kept).decide(name, "clean", operator="op")
    again = build_train_data(
        TrainConfig(**quick, data=kept / "data.yaml", out=tmp_path / "again", start_from=bundle)
    )
    assert again.config.companions == [COMPANION] and again.in_channels == 2

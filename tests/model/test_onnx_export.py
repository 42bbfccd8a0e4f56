"""ONNX export (opset 17, dynamic batch/height/width) and ONNX Runtime parity with eager."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from defectdet.model import PRESETS, build_model
from defectdet.model.onnx_export import export_onnx

onnxruntime = pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")


@pytest.mark.parametrize("preset", list(PRESETS))
def test_onnx_matches_eager(preset: str, tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = build_model(preset, num_classes=6, in_channels=2, template=True)
    # non-trivial BN statistics so the folded graph is really compared
    model.train()
    with torch.no_grad():
        for _ in range(3):
            model(torch.rand(2, 2, 64, 64), [torch.zeros(0, 5)] * 2)
    model.eval()
    path = tmp_path / f"{preset}.onnx"
    export_onnx(model, path, 2, imgsz=64)
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for shape in [(1, 2, 64, 64), (2, 2, 96, 128)]:  # dynamic batch and size
        images = torch.rand(*shape)
        with torch.no_grad():
            expected = model(images).numpy()
        (actual,) = session.run(None, {"images": images.numpy()})
        assert actual.shape == expected.shape
        np.testing.assert_allclose(actual, expected, atol=1e-4, rtol=1e-4)

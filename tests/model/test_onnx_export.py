"""ONNX export (opset 17, dynamic batch/height/width) and ONNX Runtime parity with eager."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from defectdet.model import PRESETS, build_model

onnxruntime = pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")


def export_onnx(model: torch.nn.Module, path: Path, channels: int) -> None:
    torch.onnx.export(
        model,
        (torch.rand(1, channels, 64, 64),),
        str(path),
        opset_version=17,
        input_names=["images"],
        output_names=["predictions"],
        dynamic_axes={
            "images": {0: "batch", 2: "height", 3: "width"},
            "predictions": {0: "batch", 1: "anchors"},
        },
        dynamo=False,
    )


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
    export_onnx(model, path, 2)
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for shape in [(1, 2, 64, 64), (2, 2, 96, 128)]:  # dynamic batch and size
        images = torch.rand(*shape)
        with torch.no_grad():
            expected = model(images).numpy()
        (actual,) = session.run(None, {"images": images.numpy()})
        assert actual.shape == expected.shape
        np.testing.assert_allclose(actual, expected, atol=1e-4, rtol=1e-4)

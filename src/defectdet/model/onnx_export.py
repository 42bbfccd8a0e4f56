"""Plain ONNX export of a detector (the deployable bundle with metadata builds on this)."""

from __future__ import annotations

from pathlib import Path

import torch

ONNX_OPSET = 17
INPUT_NAME = "images"
OUTPUT_NAME = "predictions"


def export_onnx(model: torch.nn.Module, path: str | Path, channels: int, imgsz: int = 640) -> Path:
    """Export `model` (eval mode) to ONNX: input `images` (B, C, H, W) in [0, 1] with dynamic batch/height/width,
    output `predictions` (B, A, 4 + K). Uses the TorchScript exporter, which needs no extra packages."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    was_training = model.training
    model.eval()
    try:
        torch.onnx.export(
            model,
            (torch.rand(1, channels, imgsz, imgsz),),
            str(path),
            opset_version=ONNX_OPSET,
            input_names=[INPUT_NAME],
            output_names=[OUTPUT_NAME],
            dynamic_axes={
                INPUT_NAME: {0: "batch", 2: "height", 3: "width"},
                OUTPUT_NAME: {0: "batch", 1: "anchors"},
            },
            dynamo=False,
        )
    finally:
        model.train(was_training)
    return path

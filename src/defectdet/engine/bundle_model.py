"""A bundle (.onnx) behind the same call as an eager detector, so `val model.onnx` runs the very prediction
path `val best.pt` runs: only the forward pass differs (onnxruntime instead of torch)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from defectdet.runtime.bundle import BundleMetadata


def is_bundle(path: str | Path) -> bool:
    """True for an ONNX bundle path (by extension; a checkpoint is a torch pickle)."""
    return Path(path).suffix.lower() == ".onnx"


class BundleModel:
    """Callable like ``Detector`` in eval mode: ``(B, C, S, S)`` float tensor in [0, 1] -> ``(B, A, 4 + K)``."""

    def __init__(self, path: str | Path, threads: int | None = None) -> None:
        from defectdet.runtime.predictor import Predictor

        self.predictor = Predictor(path, threads=threads)
        self.metadata: BundleMetadata = self.predictor.metadata
        self.template = self.metadata.template
        self.in_channels = self.metadata.input_channels

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        predictions, _ = self.predictor.run(images.detach().cpu().numpy().astype(np.float32, copy=False))
        return torch.from_numpy(predictions)

    def eval(self) -> BundleModel:
        return self


def load_bundle_model(path: str | Path, threads: int | None = None) -> tuple[BundleModel, dict[str, Any]]:
    """The bundle as a model plus a checkpoint-like dict (`config`, `class_names`, `metrics`) for `validate`."""
    model = BundleModel(path, threads)
    meta = model.metadata
    config = {
        **meta.train_config,
        "input_size": meta.input_size,
        "score_floor": meta.thresholds.score_floor,
        "nms_iou": meta.thresholds.nms_iou,
        "max_detections": meta.thresholds.max_detections,
    }
    return model, {"config": config, "class_names": list(meta.class_names), "metrics": meta.metrics}

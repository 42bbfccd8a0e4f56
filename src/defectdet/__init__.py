"""defectdet: industrial visual defect detection on PyTorch.

Every command is also a Python API:
`from defectdet import train, validate, export_bundle, predict, compare, Predictor, serve_bundle`.
Exports are resolved lazily so that `import defectdet` stays cheap and torch-free parts stay torch-free.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from defectdet._lazy import lazy_exports
from defectdet._limits import cap_opencv_pixels

cap_opencv_pixels()  # before any module imports cv2, which reads the cap only once

__version__ = "0.1.0"

_EXPORTS = {
    "TrainConfig": "defectdet.engine.config",
    "load_config": "defectdet.engine.config",
    "train": "defectdet.engine.trainer",
    "TrainResult": "defectdet.engine.trainer",
    "validate": "defectdet.engine.validate",
    "ValidateSettings": "defectdet.engine.validate",
    "export_bundle": "defectdet.export.exporter",
    "ExportSettings": "defectdet.export.export_settings",
    "predict": "defectdet.export.resolve",
    "PredictSettings": "defectdet.runtime.predict_settings",
    "compare": "defectdet.export.compare",
    "CompareSettings": "defectdet.export.compare_settings",
    "Predictor": "defectdet.runtime.predictor",
    "PredictionResult": "defectdet.runtime.predictor",
    "Detection": "defectdet.runtime.predictor",
    "serve_bundle": "defectdet.serve.launch",
    "load_detector": "defectdet.engine.checkpoint",
    "build_model": "defectdet.model",
    "load_dataset": "defectdet.data.formats",
    "check_dataset": "defectdet.data.check",
    "synthesize_dataset": "defectdet.data.synth",
    "SynthSettings": "defectdet.data.synth",
    "evaluate_records": "defectdet.evaluation.report",
    "run_demo": "defectdet.demo",
}

__all__ = ["__version__", *_EXPORTS]

# The same names for type checkers and the documentation (griffe reads these imports); never run.
if TYPE_CHECKING:
    from defectdet.data.check import check_dataset as check_dataset
    from defectdet.data.formats import load_dataset as load_dataset
    from defectdet.data.synth import SynthSettings as SynthSettings
    from defectdet.data.synth import synthesize_dataset as synthesize_dataset
    from defectdet.demo import run_demo as run_demo
    from defectdet.engine.checkpoint import load_detector as load_detector
    from defectdet.engine.config import TrainConfig as TrainConfig
    from defectdet.engine.config import load_config as load_config
    from defectdet.engine.trainer import TrainResult as TrainResult
    from defectdet.engine.trainer import train as train
    from defectdet.engine.validate import ValidateSettings as ValidateSettings
    from defectdet.engine.validate import validate as validate
    from defectdet.evaluation.report import evaluate_records as evaluate_records
    from defectdet.export.compare import compare as compare
    from defectdet.export.compare_settings import CompareSettings as CompareSettings
    from defectdet.export.export_settings import ExportSettings as ExportSettings
    from defectdet.export.exporter import export_bundle as export_bundle
    from defectdet.export.resolve import predict as predict
    from defectdet.model import build_model as build_model
    from defectdet.runtime.predict_settings import PredictSettings as PredictSettings
    from defectdet.runtime.predictor import Detection as Detection
    from defectdet.runtime.predictor import PredictionResult as PredictionResult
    from defectdet.runtime.predictor import Predictor as Predictor
    from defectdet.serve.launch import serve_bundle as serve_bundle

__getattr__ = lazy_exports(__name__, _EXPORTS)

"""defectdet: industrial visual defect detection on PyTorch.

Every command is also a Python API:
`from defectdet import train, validate, export_bundle, predict, compare, Predictor, serve_bundle`.
Exports are resolved lazily so that `import defectdet` stays cheap and torch-free parts stay torch-free.
"""

from __future__ import annotations

from defectdet._lazy import lazy_exports
from defectdet._limits import cap_opencv_pixels

cap_opencv_pixels()  # before any module imports cv2, which reads the cap only once

__version__ = "0.1.0"

_EXPORTS = {
    "TrainConfig": "defectdet.engine.config",
    "load_config": "defectdet.engine.config",
    "train": "defectdet.engine.trainer",
    "validate": "defectdet.engine.validate",
    "export_bundle": "defectdet.export.exporter",
    "predict": "defectdet.export.resolve",
    "compare": "defectdet.export.compare",
    "Predictor": "defectdet.runtime.predictor",
    "serve_bundle": "defectdet.serve.launch",
    "load_detector": "defectdet.engine.checkpoint",
    "build_model": "defectdet.model",
    "load_dataset": "defectdet.data.formats",
    "check_dataset": "defectdet.data.check",
    "synthesize_dataset": "defectdet.data.synth",
    "evaluate_records": "defectdet.evaluation.report",
    "run_demo": "defectdet.demo",
}

__all__ = ["__version__", *_EXPORTS]

__getattr__ = lazy_exports(__name__, _EXPORTS)

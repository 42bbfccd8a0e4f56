"""`resolve_bundle`: what `defectdet predict` runs on. A bundle path is used as is (torch-free: this module
imports torch only when a checkpoint must be exported), a training checkpoint is exported first."""

from __future__ import annotations

import logging
from pathlib import Path

from defectdet.errors import InputError

logger = logging.getLogger(__name__)


def resolve_bundle(model: str | Path, work_dir: Path) -> Path:
    """A bundle path as is; a training checkpoint is exported into ``work_dir`` first (needs torch)."""
    model = Path(model)
    if model.suffix.lower() == ".onnx":
        return model
    if not model.is_file():
        raise InputError(f"{model}: no such checkpoint or bundle")
    from defectdet.export.exporter import export_bundle

    work_dir.mkdir(parents=True, exist_ok=True)
    logger.info("%s is a checkpoint: exporting it to %s first", model, work_dir / "model.onnx")
    return export_bundle(model, work_dir / "model.onnx").bundle

"""The torch side of deployment: a training checkpoint -> a bundle (`export.exporter.export_bundle`), int8
quantization (`export.quantize`) and `export.resolve.resolve_bundle` (what `defectdet predict` runs on).

Sits above the engine (it validates the bundle it writes with `engine.validate`) and the torch-free
`defectdet.runtime` (which reads and runs bundles); see docs/design/architecture.md.

`from defectdet import export` gives this package, and the package is callable: `export(checkpoint, ...)` is
`defectdet.export.export`, so the name works whether or not a submodule was imported first:

    from defectdet import export
    bundle = export("runs/synth/best.pt", "runs/synth/model.onnx").bundle
"""

from __future__ import annotations

import sys
import types
from pathlib import Path
from typing import Any


def export(checkpoint: str | Path, out: str | Path | None = None, **options: Any) -> Any:
    """Export a checkpoint to one self-describing `.onnx` bundle; what `defectdet export` runs. Returns an
    `ExportResult` (`bundle`, `metadata`, ...).

    The bundle holds the EMA weights with BatchNorm folded, the threshold and score floor measured on the
    validation split, the class names, the preprocessing and the drift reference; `predict`, `serve` and
    `Predictor` run it without torch. `out` defaults to `<checkpoint stem>.onnx` beside the checkpoint;
    `options` are those of `defectdet.export.exporter.export_bundle` (`data`, `split`, `int8`, `flip_views`,
    `repeat_check`, ...).

    Example:
        ```python
        from defectdet import export

        bundle = export("runs/synth/best.pt", "runs/synth/model.onnx").bundle
        ```
    """
    from defectdet.export.exporter import export_bundle

    return export_bundle(checkpoint, out, **options)


class _CallableModule(types.ModuleType):
    def __call__(self, checkpoint: str | Path, out: str | Path | None = None, **options: Any) -> Any:
        return export(checkpoint, out, **options)


sys.modules[__name__].__class__ = _CallableModule

"""`resolve_bundle`: what `defectdet predict` runs on, and `predict`, its Python form. A bundle path is used as
is (torch-free: this module imports torch only when a checkpoint must be exported), a training checkpoint is
exported first."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from defectdet.errors import InputError
from defectdet.runtime.predict_settings import PredictSettings

logger = logging.getLogger(__name__)


def resolve_bundle(model: str | Path, work_dir: Path, flip_views: str | None = None) -> Path:
    """A bundle path as is; a training checkpoint is exported into ``work_dir`` first (needs torch).

    `flip_views` (None: as the bundle was exported, none for a checkpoint): the test-time flips of
    `model.flip_average`, written into the exported graph; a bundle exported with other views is refused,
    since its graph holds its own.
    """
    model = Path(model)
    if model.suffix.lower() == ".onnx":
        if flip_views is not None:
            _check_bundle_views(model, flip_views)
        return model
    if not model.is_file():
        raise InputError(f"{model}: no such checkpoint or bundle")
    from defectdet.export.exporter import export_bundle

    work_dir.mkdir(parents=True, exist_ok=True)
    logger.info("%s is a checkpoint: exporting it to %s first", model, work_dir / "model.onnx")
    return export_bundle(model, work_dir / "model.onnx", flip_views=flip_views or "none").bundle


def _check_bundle_views(bundle: Path, flip_views: str) -> None:
    """InputError when `bundle`'s graph was exported with views other than `flip_views`."""
    from defectdet.runtime.bundle import read_metadata
    from defectdet.runtime.predict import check_bundle_views

    check_bundle_views(bundle, read_metadata(bundle).flip_views, flip_views)


def predict(
    model: str | Path,
    source: str | Path,
    out: str | Path = "runs/predict",
    settings: PredictSettings | None = None,
    **keywords: Any,
) -> Any:
    """Predict an image file, a folder or a glob with a bundle or a checkpoint (exported first, with the
    settings' `flip_views`); what `defectdet predict` runs. Writes annotated images, `predictions.jsonl` and
    YOLO label files into `out` and returns a `PredictSummary` (`images`, `defective`, `detections`, `failed`,
    ...).

    `settings` is a `PredictSettings` (default: no progress bar); its fields may also be given as keywords,
    which apply over it: `templates` (a folder of templates matched by file name), `threshold` (default: the
    bundle's), `save_images`, `threads`, `tiles`, `flip_views`, `repeat_check`. For one image at a time in your
    own code, use `Predictor`.

    Example:
        ```python
        from defectdet import predict

        summary = predict("runs/synth/model.onnx", "data/synth/images/val", out="runs/predict")
        print(summary.images, summary.defective)
        ```
    """
    from defectdet.compat import Surface, with_keywords
    from defectdet.runtime.predict import predict_source

    settings = settings if settings is not None else PredictSettings(progress=False)
    settings = with_keywords(PredictSettings, settings, keywords, "predict", Surface.PREDICT_SOURCE)
    return predict_source(resolve_bundle(model, Path(out), settings.flip_views), source, out, settings)

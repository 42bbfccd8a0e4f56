"""The good-parts-only model as a standard bundle: the ONNX graph (`anomaly.graph.AnomalyGraph`), metadata that
`predict`, `serve` and `Predictor` read unchanged (one class, "anomaly", with the fragment merge on for it), the
threshold chosen on held-out good images and a drift reference from the fit images."""

from __future__ import annotations

import datetime
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from defectdet.anomaly.graph import BOX_CELLS, CELL_CENTRE_PX, OPERATING_SCORE, STRIDE
from defectdet.anomaly.memory import Calibration
from defectdet.errors import DefectDetError
from defectdet.runtime.bundle import BundleMetadata, Thresholds, config_hash, write_metadata
from defectdet.runtime.spec import ModelSpec

if TYPE_CHECKING:
    from defectdet.anomaly.fit import FitResult, FitSettings, _Extracted
    from defectdet.anomaly.graph import AnomalyGraph

logger = logging.getLogger(__name__)

CLASS_NAME = "anomaly"
MAX_PARITY_DIFF = 1e-3


def fit_config(spec: ModelSpec, settings: FitSettings, memory: int) -> dict[str, Any]:
    """What the model was fitted with (the bundle's `train_config`)."""
    return {
        "model": "good_only",
        "preset": "lite0",
        "features": "ImageNet EfficientNet-Lite0, stride 8 + stride 16 upsampled, 3x3 mean",
        "input_size": spec.input_size,
        "channels": spec.channels,
        "template": False,
        "strides": [STRIDE],
        "box_cells": BOX_CELLS,
        "cell_centre_px": CELL_CENTRE_PX,  # cell c answers for input pixel STRIDE x c + this (the map's place)
        "memory_vectors": memory,
        "false_call_rate": settings.false_call_rate,
        "holdout": settings.holdout,
        "time_minutes": settings.minutes,
        "seed": settings.seed,
    }


def good_only_metadata(
    spec: ModelSpec, calibration: Calibration, settings: FitSettings, memory: int, images: tuple[int, int]
) -> BundleMetadata:
    """The bundle metadata: threshold 0.5 (the calibrated operating distance), the fragment merge on."""
    from defectdet import __version__
    from defectdet.export.exporter import DRIFT_LAYERS

    config = fit_config(spec, settings, memory)
    source = (
        f"at most {settings.false_call_rate:.2%} false calls on {calibration.images} held-out good images"
    )
    thresholds = Thresholds(
        threshold=OPERATING_SCORE,
        threshold_source=source,
        recall_threshold=None,
        merge_fragments=[CLASS_NAME],
    )
    metrics = {
        "split": "held-out good images",
        "good_only": True,
        "fit_images": images[0],
        "heldout_images": images[1],
        "heldout_false_call_rate": calibration.false_call_rate,
        "false_call_rate_target": calibration.target_rate,
        "operating_distance": calibration.shift,
        "calibration_gain": calibration.gain,
        "memory_vectors": memory,
    }
    return BundleMetadata(
        defectdet_version=__version__,
        created=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        preset="lite0",
        class_names=[CLASS_NAME],
        input_size=spec.input_size,
        channels=spec.channels,
        template=False,
        thresholds=thresholds,
        metrics=metrics,
        config_hash=config_hash(config),
        train_config=config,
        drift_layers=list(DRIFT_LAYERS),
    )


def _drift_reference(held: _Extracted, fit: _Extracted) -> dict[str, Any] | None:
    from defectdet.runtime.monitor import build_reference

    try:
        reference = build_reference(fit.stats + held.stats, np.stack(fit.pooled + held.pooled))
    except ValueError as error:  # every image degenerate
        logger.warning("drift reference: %s", error)
        return None
    reference.update(split="good images", sampled_from=len(fit.stats) + len(held.stats))
    return reference


def write_bundle(
    graph: AnomalyGraph,
    out: Path,
    spec: ModelSpec,
    calibration: Calibration,
    settings: FitSettings,
    held: _Extracted,
    fit: _Extracted,
) -> FitResult:
    """The ONNX graph and its metadata at `out` (written beside it and moved there when complete), checked
    against eager on two held-out images."""
    from defectdet.anomaly.fit import FitResult
    from defectdet.export.exporter import export_onnx_graph, parity

    memory = int(graph.memory.shape[0])
    metadata = good_only_metadata(spec, calibration, settings, memory, (len(fit.patches), len(held.patches)))
    metadata = metadata.model_copy(update={"drift_reference": _drift_reference(held, fit)})
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(f".{out.stem}.partial-{os.getpid()}.onnx")
    try:
        export_onnx_graph(graph, partial, spec.input_channels, spec.input_size)
        write_metadata(partial, metadata)
        probe = np.random.default_rng(settings.seed).random(
            (2, spec.input_channels, spec.input_size, spec.input_size), dtype=np.float32
        )
        max_diff = parity(graph, partial, probe)
        if max_diff > MAX_PARITY_DIFF:
            raise DefectDetError(f"{out}: onnxruntime differs from eager by {max_diff:.2e}; this is a bug")
        os.replace(partial, out)
    finally:
        partial.unlink(missing_ok=True)
    return FitResult(
        bundle=out,
        metadata=metadata,
        calibration=calibration,
        fit_images=len(fit.patches),
        heldout_images=len(held.patches),
        memory_vectors=memory,
        parity_max_abs_diff=max_diff,
    )

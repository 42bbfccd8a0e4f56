"""`export` flags a model whose validation mAP is near zero: a warning on stderr naming the figure, and a flag in
the bundle's metrics that the service shows."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from defectdet.export.exporter import flag_quality
from defectdet.runtime.bundle import BundleMetadata


def test_a_near_zero_validation_map_is_flagged_loudly(caplog: pytest.LogCaptureFixture) -> None:
    poor = BundleMetadata.model_construct(metrics={"mAP50": 0.0003, "split": "val"})
    with caplog.at_level(logging.WARNING, logger="defectdet.export.exporter"):
        flagged = flag_quality(poor, Path("models/cand.onnx"))
    assert flagged.metrics["near_zero_map"] is True and flagged.metrics["mAP50"] == 0.0003
    (record,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert "models/cand.onnx" in record.getMessage() and "mAP50 0.0003" in record.getMessage()
    caplog.clear()
    fine = flag_quality(
        BundleMetadata.model_construct(metrics={"mAP50": 0.81, "split": "val"}), Path("m.onnx")
    )
    assert fine.metrics["near_zero_map"] is False and not caplog.records

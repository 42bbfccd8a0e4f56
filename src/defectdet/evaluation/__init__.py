"""Evaluation on plain NumPy records: COCO metrics, the DeepPCB protocol, operating points, plots, report.

Submodules are imported on use (`from defectdet.evaluation.report import evaluate_records`) so that
importing the package stays cheap.
"""

from __future__ import annotations

__all__ = ["ImageRecord", "StageTimer", "evaluate_records"]


def __getattr__(name: str):
    if name == "ImageRecord":
        from defectdet.evaluation.types import ImageRecord

        return ImageRecord
    if name == "StageTimer":
        from defectdet.evaluation.timing import StageTimer

        return StageTimer
    if name == "evaluate_records":
        from defectdet.evaluation.report import evaluate_records

        return evaluate_records
    raise AttributeError(f"module 'defectdet.evaluation' has no attribute {name!r}")

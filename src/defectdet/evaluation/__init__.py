"""Evaluation on plain NumPy records: COCO metrics, the DeepPCB protocol, operating points, plots, report.

Submodules are imported on use (`from defectdet.evaluation.report import evaluate_records`) so that
importing the package stays cheap.
"""

from __future__ import annotations

from defectdet._lazy import lazy_exports

__all__ = ["ImageRecord", "StageTimer", "evaluate_records"]

__getattr__ = lazy_exports(
    __name__,
    {
        "ImageRecord": "defectdet.evaluation.types",
        "StageTimer": "defectdet.evaluation.timing",
        "evaluate_records": "defectdet.evaluation.report",
    },
)

"""Diagnostics the trainer uses and `defectdet doctor` exposes: gradient statistics, non-finite value
tracing, state_dict comparison."""

from __future__ import annotations

from defectdet._lazy import lazy_exports

__all__ = [
    "diagnose_state_dict",
    "load_state_dict_checked",
    "GradStatsMonitor",
    "NonFiniteGuard",
    "locate_nonfinite_module",
]

_WHERE = {
    "diagnose_state_dict": "defectdet.diagnostics.state_dict",
    "load_state_dict_checked": "defectdet.diagnostics.state_dict",
    "GradStatsMonitor": "defectdet.diagnostics.grad_stats",
    "NonFiniteGuard": "defectdet.diagnostics.nonfinite",
    "locate_nonfinite_module": "defectdet.diagnostics.nonfinite",
}

__getattr__ = lazy_exports(__name__, _WHERE)

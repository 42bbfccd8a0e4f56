"""`defectdet doctor` as functions: environment, checkpoints and key mapping, loaders, NaN/Inf sources, tensor
inspection. This package sits above the engine and only imports downward; the training guards the engine itself
uses (gradient statistics, non-finite handling, checked state_dict loading) live in `defectdet.engine`
(`engine.grad_stats`, `engine.nonfinite`, `engine.state_dict`) and are re-exported here by name, lazily.
Every doctor command is also a function here, e.g. `environment_report()`, `checkpoint_report(path, model)`,
`migrate_checkpoint(path, out, model)`, `loader_report(data)`, `nan_report(model, batches)`, `inspect(tensor)`.
"""

from __future__ import annotations

from defectdet._lazy import lazy_exports

_WHERE = {
    "diagnose_state_dict": "defectdet.engine.state_dict",
    "load_state_dict_checked": "defectdet.engine.state_dict",
    "GradStatsMonitor": "defectdet.engine.grad_stats",
    "NonFiniteGuard": "defectdet.engine.nonfinite",
    "locate_nonfinite_module": "defectdet.engine.nonfinite",
    "environment_report": "defectdet.diagnostics.environment",
    "checkpoint_report": "defectdet.diagnostics.checkpoint_doctor",
    "migrate_checkpoint": "defectdet.diagnostics.checkpoint_doctor",
    "read_checkpoint": "defectdet.diagnostics.checkpoint_read",
    "RenameRule": "defectdet.diagnostics.key_mapping",
    "propose_rules": "defectdet.diagnostics.key_mapping",
    "apply_rules": "defectdet.diagnostics.key_mapping",
    "load_rules": "defectdet.diagnostics.key_mapping",
    "loader_report": "defectdet.diagnostics.loader_doctor",
    "scan_samples": "defectdet.diagnostics.sample_scan",
    "nan_report": "defectdet.diagnostics.nan_doctor",
    "checkpoint_nan_report": "defectdet.diagnostics.sources",
    "inspect": "defectdet.diagnostics.tensor_inspect",
    "inspect_file": "defectdet.diagnostics.tensor_inspect",
}

__all__ = list(_WHERE)

__getattr__ = lazy_exports(__name__, _WHERE)

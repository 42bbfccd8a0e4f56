"""Training engine: config, loop, optimizer/schedule, EMA, checkpoints, DDP.

Imported lazily: `from defectdet.engine import train` pulls in torch only when used.
"""

from __future__ import annotations

__all__ = [
    "TrainConfig",
    "TrainResult",
    "load_config",
    "train",
    "train_one_epoch",
    "evaluate",
    "save_checkpoint",
    "load_checkpoint",
]

_WHERE = {
    "TrainConfig": "defectdet.engine.config",
    "load_config": "defectdet.engine.config",
    "TrainResult": "defectdet.engine.trainer",
    "train": "defectdet.engine.trainer",
    "train_one_epoch": "defectdet.engine.loop",
    "evaluate": "defectdet.engine.loop",
    "save_checkpoint": "defectdet.engine.checkpoint",
    "load_checkpoint": "defectdet.engine.checkpoint",
}


def __getattr__(name: str):
    if name in _WHERE:
        import importlib

        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'defectdet.engine' has no attribute {name!r}")

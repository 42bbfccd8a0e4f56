"""Training engine: config, loop, optimizer/schedule, EMA, checkpoints (`load_detector`), DDP, and the training
guards (gradient statistics, non-finite handling, checked state_dict loading).

Imported lazily: `from defectdet.engine import train` pulls in torch only when used.
"""

from __future__ import annotations

from defectdet._lazy import lazy_exports

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

__getattr__ = lazy_exports(__name__, _WHERE)

"""Fixtures shared by the whole suite."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

# A quick, quiet CPU run: tests add the data, sizes and budgets they are about.
SMALL_TRAIN = {"device": "cpu", "workers": 0, "progress": False, "epochs": 2, "warmup_steps": 1}


@pytest.fixture(scope="session")
def small_train_config() -> Callable[..., Any]:
    """`small_train_config(out, **fields) -> TrainConfig`: a run into `out` on the CPU, without loader
    workers or progress bar, 2 epochs, 1 warmup step (`SMALL_TRAIN`); any field can be overridden, None
    included (e.g. `warmup_steps=None` for the warmup_epochs default). Session-scoped so module- and
    session-scoped fixtures can train with it too."""
    from defectdet.engine.config import TrainConfig

    def make(out: str | Path, **fields: Any) -> TrainConfig:
        return TrainConfig(**{**SMALL_TRAIN, "out": out, **fields})

    return make

"""Fixtures shared by the whole suite."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist (`make test` runs one worker per core) each worker gets its own share of the cores.

    Without it every worker's PyTorch, OpenCV and ONNX Runtime would size their thread pools to the whole
    machine, and on 2 cores two workers of 2 spinning threads each run small models tens of times slower.
    Processes a test starts inherit the share, so the code under test sizes itself as it would on that many
    cores."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if not worker.startswith("gw") or count < 2 or not hasattr(os, "sched_setaffinity"):
        return
    cores = sorted(os.sched_getaffinity(0))
    share = cores[int(worker[2:]) :: count] or cores
    os.sched_setaffinity(0, share)
    os.environ["OMP_NUM_THREADS"] = str(len(share))
    if "torch" in sys.modules:  # a plugin imported it first: its pool may already be sized
        sys.modules["torch"].set_num_threads(len(share))


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


@pytest.fixture(scope="session")
def good_only_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A good-parts-only bundle (`defectdet fit`) fitted in seconds on 8 defect-free gray surfaces of 96 px
    (`good/` beside it); input 96 x 96."""
    import cv2

    from defectdet.anomaly import FitSettings, fit_good_only
    from defectdet.data.synth import generate_surface

    root = tmp_path_factory.mktemp("good_only_bundle")
    (root / "good").mkdir()
    for index in range(8):
        surface = generate_surface(7, index, 96, 96, materials=("cast",), clean=True)
        cv2.imwrite(str(root / "good" / f"good_{index}.png"), surface.clean)
    return fit_good_only(root / "good", root / "model.onnx", FitSettings(progress=False)).bundle

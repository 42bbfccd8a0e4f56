"""Checkpoints: atomic save, safe load, and the RNG state that exact resume needs.

Everything we store is a tensor or a plain Python value (RNG states are converted), so our own
checkpoints load with `torch.load(weights_only=True)`: no arbitrary pickle code runs on load.
"""

from __future__ import annotations

import logging
import os
import random
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from defectdet.engine.state_dict import load_state_dict_checked
from defectdet.errors import CheckpointError

logger = logging.getLogger(__name__)

CHECKPOINT_VERSION = 1
REQUIRED_KEYS = ("model", "version")


def save_checkpoint(path: str | Path, state: dict[str, Any]) -> Path:
    """Write `state` to `path` atomically: temp file in the same folder, flush + fsync, os.replace.

    A crash mid-write leaves the previous file at `path` intact (and no temp file behind).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(descriptor, 0o666 & ~umask)  # mkstemp makes 0600; a checkpoint is shared like any file
        with os.fdopen(descriptor, "wb") as handle:
            torch.save(state, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp_name, path)
    except BaseException:
        try:
            os.unlink(temp_name)
        except FileNotFoundError:
            pass
        raise
    try:  # make the rename itself durable
        directory = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
    except OSError:  # pragma: no cover - some filesystems refuse fsync on directories
        pass
    return path


def load_checkpoint(path: str | Path, allow_pickle: bool = False) -> dict[str, Any]:
    """Load a checkpoint onto the CPU. Corrupt, truncated or foreign files raise CheckpointError naming `path`.

    `allow_pickle=True` permits arbitrary pickled objects (only for files you trust).
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: checkpoint file not found")
    try:
        state = torch.load(path, map_location="cpu", weights_only=not allow_pickle)
    except Exception as error:  # torch raises RuntimeError, EOFError, UnpicklingError, zip errors...
        lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()] or [
            type(error).__name__
        ]
        first_line = next((line for line in lines if "Unsupported global" in line), lines[0])
        if "Weights only load failed" in str(error) or "Unsupported global" in str(error):
            raise CheckpointError(
                f"{path}: contains Python objects beyond tensors and plain values, so it is not a defectdet "
                f"checkpoint (or it comes from another tool); refusing to unpickle it ({first_line})"
            ) from None
        raise CheckpointError(
            f"{path}: corrupt or truncated checkpoint ({type(error).__name__}: {first_line})"
        ) from None
    if not isinstance(state, dict) or any(key not in state for key in REQUIRED_KEYS):
        keys = sorted(state)[:10] if isinstance(state, dict) else type(state).__name__
        raise CheckpointError(
            f"{path}: not a defectdet checkpoint (expected keys {REQUIRED_KEYS}, found {keys})"
        )
    return state


def capture_rng_state() -> dict[str, Any]:
    """Python, NumPy, torch CPU (and CUDA when present) generator states as tensors / plain values."""
    kind, keys, position, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": {
            "kind": kind,
            "keys": torch.from_numpy(np.array(keys, dtype=np.int64)),
            "position": int(position),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    python_state = state["python"]
    random.setstate((python_state[0], tuple(python_state[1]), python_state[2]))
    numpy_state = state["numpy"]
    np.random.set_state(
        (
            numpy_state["kind"],
            numpy_state["keys"].numpy().astype(np.uint32),
            numpy_state["position"],
            numpy_state["has_gauss"],
            numpy_state["cached_gaussian"],
        )
    )
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        cuda_states = state["cuda"]
        if len(cuda_states) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda_states)
        else:
            logger.warning(
                "checkpoint has CUDA RNG state for %d devices, this machine has %d: not restored",
                len(cuda_states),
                torch.cuda.device_count(),
            )


def load_detector(
    checkpoint_path: str | Path, use_ema: bool = True
) -> tuple[torch.nn.Module, dict[str, Any]]:
    """Rebuild the detector stored in a training checkpoint (EMA weights when present) in eval mode."""
    from defectdet.model import detector_from_config

    checkpoint = load_checkpoint(checkpoint_path)
    model_config = checkpoint.get("model_config")
    if not isinstance(model_config, dict):
        raise CheckpointError(
            f"{checkpoint_path}: no 'model_config' in the checkpoint, so the detector cannot be rebuilt; "
            "was it written by `defectdet train`?"
        )
    model = detector_from_config(model_config)
    key = "ema" if use_ema and checkpoint.get("ema") is not None else "model"
    weights = checkpoint[key]
    if key == "ema" and isinstance(weights, dict) and "module" in weights:
        weights = weights["module"]
    load_state_dict_checked(model, weights, source=f"{checkpoint_path} '{key}'")
    model.eval()
    return model, checkpoint

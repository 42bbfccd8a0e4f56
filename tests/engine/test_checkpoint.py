import argparse
import random

import numpy as np
import pytest
import torch

from defectdet.engine import checkpoint as checkpoint_module
from defectdet.engine.checkpoint import capture_rng_state, load_checkpoint, restore_rng_state, save_checkpoint
from defectdet.errors import CheckpointError


def _state(value: float) -> dict:
    return {"model": {"w": torch.full((3,), value)}, "version": 1, "rng": capture_rng_state()}


def test_atomic_save_survives_a_crash_mid_write(tmp_path, monkeypatch):
    path = tmp_path / "last.pt"
    save_checkpoint(path, _state(1.0))

    def crashing_save(obj, handle):
        handle.write(b"PK\x03\x04 partial bytes")
        raise KeyboardInterrupt("simulated crash")

    monkeypatch.setattr(checkpoint_module.torch, "save", crashing_save)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(path, _state(2.0))
    monkeypatch.undo()
    assert torch.equal(load_checkpoint(path)["model"]["w"], torch.full((3,), 1.0))
    assert [p.name for p in tmp_path.iterdir()] == ["last.pt"]  # no temp file left behind


def test_truncated_and_foreign_files_raise_checkpoint_error(tmp_path):
    path = tmp_path / "c.pt"
    save_checkpoint(path, _state(1.0))
    data = path.read_bytes()
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="truncated.pt.*corrupt or truncated"):
        load_checkpoint(truncated)
    foreign = tmp_path / "foreign.pt"
    torch.save(
        {"model": {}, "version": 1, "obj": argparse.Namespace(a=1)}, foreign
    )  # arbitrary object: refused
    with pytest.raises(CheckpointError, match="foreign.pt"):
        load_checkpoint(foreign)
    not_ours = tmp_path / "plain.pt"
    torch.save({"weights": torch.zeros(1)}, not_ours)
    with pytest.raises(CheckpointError, match="not a defectdet checkpoint"):
        load_checkpoint(not_ours)
    with pytest.raises(CheckpointError, match="not found"):
        load_checkpoint(tmp_path / "missing.pt")


def test_rng_state_round_trip(tmp_path):
    torch.manual_seed(3)
    np.random.seed(3)
    random.seed(3)
    path = save_checkpoint(tmp_path / "r.pt", _state(0.0))
    expected = (torch.rand(2), np.random.rand(2), random.random())
    torch.manual_seed(99)
    np.random.seed(99)
    random.seed(99)
    restore_rng_state(load_checkpoint(path)["rng"])
    assert torch.equal(torch.rand(2), expected[0])
    assert np.array_equal(np.random.rand(2), expected[1])
    assert random.random() == expected[2]

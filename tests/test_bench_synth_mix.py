"""bench/synth_mix.py: the mixed dataset keeps DeepPCB's boxes and split, and adds synthetic boards in its classes."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import synth_mix  # noqa: E402

from defectdet.data.formats import load_dataset  # noqa: E402


def _write_deeppcb(root: Path) -> Path:
    spec = importlib.util.spec_from_file_location("data_writers", ROOT / "tests" / "data" / "conftest.py")
    writers = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(writers)
    return writers.write_deeppcb(root)


def test_mixed_dataset_round_trips_deeppcb_and_adds_boards_in_its_classes(tmp_path, monkeypatch):
    deeppcb = _write_deeppcb(tmp_path / "deeppcb")
    monkeypatch.setattr(synth_mix, "ROOT", tmp_path / "mix")
    data_yaml = synth_mix.build_dataset(3, deeppcb)

    for split in ("train", "val"):
        original = load_dataset(deeppcb, split, format="deeppcb")
        mixed = load_dataset(data_yaml, split)
        assert list(mixed.class_names) == list(original.class_names)
        from_deeppcb = sorted(
            (s for s in mixed.samples if s.image_path.name.startswith("deeppcb_")),
            key=lambda s: s.image_path.name,
        )
        assert len(from_deeppcb) == len(original.samples)
        for kept, source in zip(from_deeppcb, original.samples, strict=True):
            assert kept.image_path.resolve() == source.image_path.resolve()
            np.testing.assert_allclose(kept.boxes, source.boxes, atol=0.01)
            np.testing.assert_array_equal(kept.classes, source.classes)
        boards = [s for s in mixed.samples if s.image_path.name.startswith("synthetic_")]
        assert len(boards) == (3 if split == "train" else 0)
        assert all(board.classes.max(initial=-1) < len(original.class_names) for board in boards)
        assert split == "val" or sum(board.classes.size for board in boards) > 0

    assert synth_mix.build_dataset(3, deeppcb) == data_yaml  # built once, then reused

"""Exact resume with the real data pipeline: DetectionDataset (templates, crops, augmentation on) and
the real detector. An interrupted-and-resumed run must end with bit-identical weights to an
uninterrupted one, mid-epoch, in-process and with loader workers."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from defectdet.data.synth import synthesize_dataset
from defectdet.engine.checkpoint import load_checkpoint
from defectdet.engine.trainer import train


@pytest.fixture(scope="module")
def boards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return synthesize_dataset(
        tmp_path_factory.mktemp("boards"), boards=7, seed=0, min_size=96, max_size=128, progress=False
    )


@pytest.fixture(scope="module")
def run(boards: Path, small_train_config):
    """`run(out, workers, **overrides) -> TrainResult` on the boards: 7 boards, 6 in the train split; batch 2:
    3 steps per epoch; crops of 64 from 96 canvases, default augmentation."""

    def train_boards(out: Path, workers: int, **overrides):
        values = dict(
            data=boards, val_split=None, input_size=96, crop_size=64, batch=2, workers=workers, seed=7
        )
        return train(small_train_config(out, **{**values, **overrides}))

    return train_boards


@pytest.fixture(scope="module")
def straight(run, tmp_path_factory: pytest.TempPathFactory) -> dict[str, torch.Tensor]:
    """The uninterrupted run's final weights and optimizer moments."""
    result = run(tmp_path_factory.mktemp("straight"), workers=0)
    assert result.state.step == 6
    return weights(result.last_checkpoint)


def weights(checkpoint: Path) -> dict[str, torch.Tensor]:
    state = load_checkpoint(checkpoint)
    return {**{f"model.{k}": v for k, v in state["model"].items()}, **state["optimizer"]["state"][0]}


@pytest.mark.parametrize("workers", [0, 2])
def test_mid_epoch_resume_gives_identical_weights(
    run, straight: dict[str, torch.Tensor], tmp_path: Path, workers: int
) -> None:
    part = run(tmp_path / "part", workers=workers, max_steps=4)  # stops 1 batch into epoch 2
    assert part.state.step == 4 and (part.state.epoch, part.state.epoch_batch) == (1, 1)
    torch.manual_seed(999)  # a fresh process would start from other global RNG states
    resumed = run(tmp_path / "resumed", workers=workers, resume=part.last_checkpoint)
    assert resumed.state.step == 6 and resumed.state.epoch == 2

    expected, found = straight, weights(resumed.last_checkpoint)
    assert expected.keys() == found.keys()
    different = [name for name in expected if not torch.equal(expected[name], found[name])]
    assert not different, different[:5]
    # and the interruption did change something: the partial run's weights are not the final ones
    partial = weights(part.last_checkpoint)
    assert not all(torch.equal(partial[name], expected[name]) for name in expected)

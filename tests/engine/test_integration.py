"""The engine with the real detector and the real data pipeline on a tiny synthesized dataset."""

import csv

import torch
from fakes import TinyDataset

from defectdet.data.synth import synthesize_dataset
from defectdet.engine.loop import LoopOptions, TrainState, train_one_epoch
from defectdet.engine.optim import build_optimizer
from defectdet.engine.trainer import train
from defectdet.model import build_model


def test_real_detector_loss_falls():
    torch.manual_seed(0)
    model = build_model("nano", 2, 1, False)
    dataset = TinyDataset(4, size=64, noise=0.0)
    items = [dataset[i] for i in range(4)]
    batch = (torch.stack([i[0] for i in items]), [i[1] for i in items], [i[2] for i in items])
    optimizer = build_optimizer(model, "adamw", 0.01, 0.0)
    state = TrainState()
    first = train_one_epoch(model, [batch], optimizer, state, LoopOptions(clip_grad_norm=10.0)).loss_means[
        "loss"
    ]
    for _ in range(5):
        last = train_one_epoch(model, [batch], optimizer, state, LoopOptions(clip_grad_norm=10.0)).loss_means[
            "loss"
        ]
    assert state.step == 6 and last < 0.8 * first


def test_train_on_synthesized_dataset(tmp_path, small_train_config):
    data_yaml = synthesize_dataset(
        tmp_path / "data", boards=6, seed=0, min_size=128, max_size=160, progress=False
    )
    config = small_train_config(tmp_path / "run", data=data_yaml, input_size=128, crop_size=None, batch=2)
    result = train(config)
    assert result.state.epoch == 2 and result.best_checkpoint is not None
    rows = list(csv.DictReader((result.run_dir / "metrics.csv").open()))
    assert len(rows) == 2 and 0.0 <= float(rows[-1]["mAP50"]) <= 1.0
    assert (result.run_dir / "pr_curve.png").is_file()

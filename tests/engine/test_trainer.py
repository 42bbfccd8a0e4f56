import itertools
import json
import logging
import random
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from fakes import TinyDataset, TinyDetector

from defectdet.engine.checkpoint import load_checkpoint
from defectdet.engine.config import TrainConfig
from defectdet.engine.loop import LoopOptions, TrainState, train_one_epoch
from defectdet.engine.nonfinite import NonFiniteGuard
from defectdet.engine.optim import build_optimizer
from defectdet.engine.trainer import TrainData, train
from defectdet.errors import NonFiniteError

CLASSES = ["open", "short"]


@pytest.fixture
def make_config(tmp_path, small_train_config):
    """`make_config(name, **overrides)`: 2 epochs of 4 batches of 4 on the fake data, no validation."""

    def make(name, **overrides):
        values = dict(
            batch=4, val_split=None, warmup_steps=2, grad_stats_every=2, lr=0.01, ema_ramp_steps=3.0
        )
        return small_train_config(tmp_path / name, **{**values, **overrides})

    return make


def fresh_model(seed=0):
    torch.manual_seed(seed)
    return TinyDetector()


def data(val_folder=None):
    """Training data; with `val_folder`, 8 validation images written there (evaluation reads files)."""
    val = TinyDataset(8, seed=1).written(val_folder) if val_folder is not None else None
    return TrainData(TinyDataset(16), val, CLASSES)


def scramble_rng():
    torch.manual_seed(12345)
    np.random.seed(12345)
    random.seed(12345)


def _assert_states_equal(first: dict, second: dict):
    assert first.keys() == second.keys()
    for key in first:
        assert torch.equal(first[key], second[key]), key


@pytest.mark.parametrize("stop_after", [3, 4])  # mid-epoch and epoch boundary (4 batches per epoch)
def test_resume_is_exact(make_config, stop_after):
    straight_model = fresh_model()
    straight = train(make_config("straight"), data=data(), model=straight_model)
    assert straight.state.step == 8

    first = train(make_config("part", max_steps=stop_after), data=data(), model=fresh_model())
    assert first.state.step == stop_after
    scramble_rng()  # a fresh process would start from other RNG states
    resumed_model = TinyDetector()  # different init: the checkpoint must overwrite everything
    resumed = train(make_config("resumed", resume=first.last_checkpoint), data=data(), model=resumed_model)
    assert resumed.state.step == 8 and resumed.state.epoch == 2

    _assert_states_equal(straight_model.state_dict(), resumed_model.state_dict())
    a, b = load_checkpoint(straight.last_checkpoint), load_checkpoint(resumed.last_checkpoint)
    _assert_states_equal(a["ema"]["module"], b["ema"]["module"])
    assert a["ema"]["updates"] == b["ema"]["updates"] == 8
    for index, moments in a["optimizer"]["state"].items():
        for name, value in moments.items():
            assert torch.equal(value, b["optimizer"]["state"][index][name]), name
    assert [g["lr"] for g in a["optimizer"]["param_groups"]] == [
        g["lr"] for g in b["optimizer"]["param_groups"]
    ]


def test_run_dir_outputs_validation_and_best_checkpoint(tmp_path, make_config):
    result = train(
        make_config("run", val_split="val", epochs=2),
        data=data(tmp_path / "val_images"),
        model=fresh_model(),
    )
    run = result.run_dir
    for name in (
        "config.yaml",
        "metrics.csv",
        "metrics.json",
        "last.pt",
        "best.pt",
        "grad_stats.csv",
        "pr_curve.png",
        "report.html",
    ):
        assert (run / name).is_file(), name
    rows = (run / "metrics.csv").read_text().splitlines()
    assert len(rows) == 3 and "mAP50" in rows[0] and "loss_class" in rows[0]
    summary = json.loads((run / "metrics.json").read_text())
    assert summary["steps"] == 8 and "mAP50" in summary["best"]
    best = load_checkpoint(result.best_checkpoint)
    assert best["class_names"] == CLASSES and best["model_config"]["preset"] == "fake"
    assert 0.0 <= result.best_metrics["mAP50"] <= 1.0


def test_time_budget_stops_training_and_saves(make_config, monkeypatch):
    """A one-second budget on a fake clock that moves 0.02 s per reading, so the budget ends after the same
    steps however loaded the machine is (on the real clock one slow step could end it before the LR decayed)."""
    import defectdet.engine.trainer as trainer_module

    readings = itertools.count()
    monkeypatch.setattr(trainer_module, "time", SimpleNamespace(perf_counter=lambda: 0.02 * next(readings)))
    config = make_config("timed", epochs=None, time_minutes=1.0 / 60)  # one second
    result = train(config, data=data(), model=fresh_model())
    assert 1.0 <= result.state.elapsed_seconds < 1.1  # stopped at the first reading past the budget
    assert result.state.step > 10 and result.last_checkpoint.is_file()
    checkpoint = load_checkpoint(result.last_checkpoint)
    assert checkpoint["scheduler"]["time_budget_seconds"] == pytest.approx(1.0)
    # the LR followed elapsed / budget down to the final ratio
    assert checkpoint["optimizer"]["param_groups"][0]["lr"] < 0.01 * 0.2


def _batches(poisoned: set[int], count: int = 4):
    dataset = TinyDataset(4 * count)
    batches = []
    for index in range(count):
        items = [dataset[i] for i in range(4 * index, 4 * index + 4)]
        images = torch.stack([item[0] for item in items])
        if index in poisoned:
            images[0, 0, 0, 0] = float("inf")  # a corrupt pixel: non-finite from the first conv on
        batches.append((images, [item[1] for item in items], [item[2] for item in items]))
    return batches


def test_nonfinite_stop_names_the_module(tmp_path):
    model = fresh_model()
    model.poison.active = True
    optimizer = build_optimizer(model, "adamw", 0.01, 0.0)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(NonFiniteError) as error:
        train_one_epoch(
            model, _batches(set()), optimizer, TrainState(), LoopOptions(guard=NonFiniteGuard("stop"))
        )
    assert "module 'poison'" in str(error.value) and "has_nan=False" in str(error.value)
    _assert_states_equal(before, model.state_dict())  # no step, and the diagnosis re-run left BN stats alone


def test_nonfinite_skip_continues(tmp_path, caplog):
    model = fresh_model()
    optimizer = build_optimizer(model, "adamw", 0.01, 0.0)
    state = TrainState()
    with caplog.at_level(logging.WARNING):
        summary = train_one_epoch(model, _batches({1}), optimizer, state, LoopOptions())
    assert state.step == 3 and state.skipped_steps == 1 and summary.steps == 3
    assert "skipping batch" in caplog.text and "module 'stem.0'" in caplog.text
    assert all(torch.isfinite(p).all() for p in model.parameters())
    with pytest.raises(NonFiniteError, match="3 consecutive"):
        train_one_epoch(
            model,
            _batches({0, 1, 2, 3}),
            optimizer,
            TrainState(),
            LoopOptions(guard=NonFiniteGuard("skip", max_consecutive=3)),
        )


def test_empty_batches_are_skipped():
    model = fresh_model()
    optimizer = build_optimizer(model, "adamw", 0.01, 0.0)
    batches = _batches(set(), 2)
    batches.insert(1, (torch.zeros(0, 1, 32, 32), [], []))
    state = TrainState()
    train_one_epoch(model, batches, optimizer, state, LoopOptions())
    assert state.step == 2 and state.epoch_batch == 3


def test_validation_schedule_follows_val_every_or_a_share_of_the_time_budget() -> None:
    from defectdet.engine.trainer import validation_due

    every_third = TrainConfig(epochs=9, val_every=3)
    assert [validation_due(every_third, epoch, 0.0) for epoch in (1, 2, 3, 6)] == [False, False, True, True]
    assert validation_due(TrainConfig(epochs=5), 1, 0.0)  # epoch budget: every epoch
    timed = TrainConfig(time_minutes=10)  # 600 s: about every 60 s
    assert not validation_due(timed, 7, 59.0) and validation_due(timed, 8, 60.0)
    assert validation_due(TrainConfig(time_minutes=10, val_every=1), 1, 0.0)  # the user's choice wins

import math

import pytest
import torch
from torch import nn

from defectdet.engine.optim import (
    WarmupCosineSchedule,
    build_optimizer,
    check_optimizer_coverage,
    parameter_groups,
)
from defectdet.errors import ConfigError


def test_warmup_cosine_values_over_steps():
    schedule = WarmupCosineSchedule([1.0], warmup_steps=4, final_lr_ratio=0.1, total_steps=14)
    assert [round(schedule.factor(s), 6) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    # after warmup the cosine runs over the remaining 10 steps
    assert schedule.factor(4) == pytest.approx(1.0)
    assert schedule.factor(9) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert schedule.factor(14) == pytest.approx(0.1)
    assert schedule.factor(100) == pytest.approx(0.1)
    values = [schedule.factor(s) for s in range(4, 15)]
    assert all(a >= b for a, b in zip(values, values[1:], strict=False))


def test_schedule_over_time_and_apply():
    schedule = WarmupCosineSchedule(
        [0.01, 0.02], warmup_steps=0, final_lr_ratio=0.0, time_budget_seconds=100.0
    )
    optimizer = torch.optim.SGD(
        [{"params": [nn.Parameter(torch.zeros(1))]}, {"params": [nn.Parameter(torch.zeros(1))]}], lr=1.0
    )
    assert schedule.apply(optimizer, step=50, elapsed_seconds=50.0) == pytest.approx(0.005)
    assert optimizer.param_groups[1]["lr"] == pytest.approx(0.01)
    assert schedule.factor(0, 100.0) == pytest.approx(0.0)
    restored = WarmupCosineSchedule.from_state_dict(schedule.state_dict())
    assert restored == schedule


def test_no_weight_decay_on_norms_and_biases():
    model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.Linear(4, 2))
    groups = {g["name"]: g for g in parameter_groups(model, 0.05)}
    assert groups["decay"]["weight_decay"] == 0.05 and groups["no_decay"]["weight_decay"] == 0.0
    assert {p.ndim for p in groups["decay"]["params"]} == {2, 4}
    assert len(groups["no_decay"]["params"]) == 4  # conv bias, bn weight+bias, linear bias
    assert isinstance(build_optimizer(model, "sgd", 0.1, 1e-4), torch.optim.SGD)


def test_optimizer_coverage_error_lists_the_parameters():
    model = nn.Sequential(nn.Linear(2, 2))
    optimizer = build_optimizer(model, "adamw", 1e-3, 0.01)
    check_optimizer_coverage(model, optimizer)
    model.add_module("late", nn.Linear(2, 3))
    with pytest.raises(ConfigError) as error:
        check_optimizer_coverage(model, optimizer)
    assert "late.weight" in str(error.value) and "late.bias" in str(error.value)
    assert "2 parameter(s)" in str(error.value)

import logging

import pytest
import torch
from torch import nn

from defectdet.engine.nonfinite import (
    NonFiniteGuard,
    diagnose_nonfinite,
    locate_nonfinite_module,
    tensor_stats,
)
from defectdet.errors import NonFiniteError


class LogOfNegative(nn.Module):
    def forward(self, x):
        return torch.log(x - 10.0)  # NaN for inputs below 10


def build():
    return nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3), LogOfNegative(), nn.Linear(3, 1))


def test_locates_first_nonfinite_module_and_restores_buffers():
    torch.manual_seed(0)
    model = build().train()
    inputs = torch.rand(4, 3)
    running_mean = model[1].running_mean.clone()
    found = locate_nonfinite_module(model, lambda: model(inputs))
    assert found["module"] == "2" and found["module_type"] == "LogOfNegative"
    assert not found["input_stats"][0].has_nan and found["output_stats"][0].has_nan
    assert torch.equal(model[1].running_mean, running_mean)
    assert locate_nonfinite_module(nn.Linear(3, 1), lambda: nn.Linear(3, 1)(inputs)) is None


def test_diagnosis_message_and_guard(caplog):
    model = build()
    diagnosis = diagnose_nonfinite(model, 7, "loss", {"loss": float("nan")}, lambda: model(torch.rand(4, 3)))
    text = diagnosis.message()
    assert "step 7" in text and "module '2' (LogOfNegative)" in text and "min=" in text
    guard = NonFiniteGuard("skip", max_consecutive=2)
    with caplog.at_level(logging.WARNING):
        guard.record(diagnosis)
    assert "LogOfNegative" in caplog.text
    guard.finite()
    guard.record(diagnosis)
    with pytest.raises(NonFiniteError, match="2 consecutive"):
        guard.record(diagnosis)
    with pytest.raises(NonFiniteError, match="LogOfNegative"):
        NonFiniteGuard("stop").record(diagnosis)


def test_tensor_stats_ignores_nonfinite_values():
    stats = tensor_stats(torch.tensor([1.0, float("nan"), 3.0, float("inf")]))
    assert (stats.minimum, stats.maximum, stats.mean) == (1.0, 3.0, 2.0)
    assert stats.has_nan and stats.has_inf

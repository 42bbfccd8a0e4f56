import math

import pytest
import torch
from torch import nn

from defectdet.engine.ema import ModelEMA


def test_ema_update_math_with_ramp():
    model = nn.Sequential(nn.Linear(1, 1, bias=False), nn.BatchNorm1d(1))
    with torch.no_grad():
        model[0].weight.fill_(0.0)
    ema = ModelEMA(model, decay=0.9, ramp_steps=2.0)
    assert not any(p.requires_grad for p in ema.module.parameters())
    expected = 0.0
    for update in range(1, 5):
        with torch.no_grad():
            model[0].weight.fill_(float(update))
        model[1].num_batches_tracked += 1
        ema.update(model)
        decay = 0.9 * (1 - math.exp(-update / 2.0))
        expected = decay * expected + (1 - decay) * update
        assert ema.module[0].weight.item() == pytest.approx(expected, rel=1e-6)
    assert ema.module[1].num_batches_tracked.item() == 4  # integer buffers are copied, not averaged
    assert ema.updates == 4


def test_ema_state_round_trip():
    model = nn.Linear(3, 2)
    ema = ModelEMA(model, decay=0.99)
    ema.update(model)
    other = ModelEMA(nn.Linear(3, 2))
    other.load_state_dict(ema.state_dict())
    assert other.updates == 1
    assert torch.equal(other.module.weight, ema.module.weight)

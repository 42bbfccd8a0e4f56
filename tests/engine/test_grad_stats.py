import csv
import logging

import torch
from torch import nn

from defectdet.engine.grad_stats import GradStatsMonitor


def test_explosion_and_vanishing_warnings(caplog):
    monitor = GradStatsMonitor(every=10)
    with caplog.at_level(logging.WARNING):
        for step in range(10):
            monitor.observe(step, 1.0 + 0.01 * step)
        assert monitor.explosions == 0 and "explosion" not in caplog.text
        monitor.observe(10, 25.0)
        monitor.observe(11, 1e-10)
    assert monitor.explosions == 1 and "gradient explosion at step 10" in caplog.text
    assert monitor.vanishings == 1 and "vanishing gradients at step 11" in caplog.text


def test_record_writes_layer_norms(tmp_path):
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 1))
    with torch.no_grad():
        model[1].weight.mul_(100)
    model(torch.ones(3, 2)).sum().backward()
    monitor = GradStatsMonitor(every=5, csv_path=tmp_path / "grad_stats.csv")
    assert monitor.due(10) and not monitor.due(11)
    stats = monitor.record(10, model)
    assert stats.layers == 4 and stats.max_layer == "0.weight"
    assert stats.min_norm <= stats.max_norm <= stats.total_norm
    rows = list(csv.DictReader((tmp_path / "grad_stats.csv").open()))
    assert rows[0]["step"] == "10" and rows[0]["max_layer"] == "0.weight"

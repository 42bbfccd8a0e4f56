import pytest
import torch
from torch import nn

from defectdet.engine.state_dict import diagnose_state_dict, load_state_dict_checked
from defectdet.errors import CheckpointError


def model():
    return nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.Conv2d(4, 2, 1))


def test_mismatch_message_lists_each_kind():
    state = model().state_dict()
    del state["2.bias"]
    state["extra.weight"] = torch.zeros(1)
    state["0.weight"] = torch.zeros(8, 1, 3, 3)
    target = model()
    before = target[0].weight.clone()
    with pytest.raises(CheckpointError) as error:
        load_state_dict_checked(target, state, source="ckpt.pt")
    text = str(error.value)
    assert "ckpt.pt" in text
    assert "missing" in text and "2.bias" in text
    assert "unexpected" in text and "extra.weight" in text
    assert "0.weight: [8, 1, 3, 3] vs [4, 1, 3, 3]" in text
    assert torch.equal(target[0].weight, before)  # nothing was loaded
    with pytest.raises(CheckpointError, match="shape-mismatched"):  # never tolerated, even non-strict
        load_state_dict_checked(target, state, strict=False)


def test_ddp_prefix_is_stripped_and_load_is_complete():
    source = model()
    state = {f"module.{k}": v for k, v in source.state_dict().items()}
    target = model()
    report = load_state_dict_checked(target, state)
    assert report.ok and report.stripped_prefixes == ["module."]
    for key, value in source.state_dict().items():
        assert torch.equal(target.state_dict()[key], value)


def test_non_strict_load_reports_missing():
    state = model().state_dict()
    del state["1.running_var"]
    report = diagnose_state_dict(model(), state)
    assert report.missing == ["1.running_var"] and not report.ok
    assert load_state_dict_checked(model(), state, strict=False).missing == ["1.running_var"]

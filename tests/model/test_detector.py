"""Forward/backward/eval contract of every preset, builder errors, and a tiny overfit."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from defectdet.errors import ConfigError, DatasetError
from defectdet.model import PRESETS, Detector, build_model, detector_from_config, model_info, preset_summaries
from defectdet.postprocess import postprocess

CHANNEL_CASES = [(1, False), (3, False), (2, True), (6, True)]


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


@pytest.mark.parametrize("preset", list(PRESETS))
@pytest.mark.parametrize(("channels", "template"), CHANNEL_CASES)
def test_train_forward_backward(preset: str, channels: int, template: bool) -> None:
    model = build_model(preset, num_classes=3, in_channels=channels, template=template)
    images = torch.rand(2, channels, 64, 96)
    targets = [torch.tensor([[1.0, 10.0, 12.0, 40.0, 50.0]]), torch.zeros(0, 5)]
    losses = model(images, targets)
    assert {"loss", "loss_cls", "loss_box"} <= set(losses)
    assert losses["loss"].dim() == 0 and torch.isfinite(losses["loss"])
    losses["loss"].backward()
    missing = [name for name, parameter in model.named_parameters() if parameter.grad is None]
    assert not missing, f"parameters without gradient: {missing}"


@pytest.mark.parametrize("preset", list(PRESETS))
@pytest.mark.parametrize(("channels", "template"), CHANNEL_CASES)
def test_eval_output_shape_and_scores(preset: str, channels: int, template: bool) -> None:
    model = build_model(preset, num_classes=4, in_channels=channels, template=template).eval()
    with torch.no_grad():
        output = model(torch.rand(2, channels, 64, 96))
    strides = model.strides
    anchors = sum((64 // stride) * (96 // stride) for stride in strides)
    assert output.shape == (2, anchors, 4 + 4)
    scores = output[..., 4:]
    assert scores.min() >= 0 and scores.max() <= 1
    boxes = output[..., :4]
    assert torch.all(boxes[..., 2] >= boxes[..., 0]) and torch.all(boxes[..., 3] >= boxes[..., 1])


@pytest.mark.parametrize("preset", list(PRESETS))
def test_zero_targets_give_finite_loss(preset: str) -> None:
    model = build_model(preset, num_classes=2, in_channels=2, template=True)
    losses = model(torch.rand(3, 2, 64, 64), [torch.zeros(0, 5)] * 3)
    assert torch.isfinite(losses["loss"]) and float(losses["loss_box"]) == 0.0
    losses["loss"].backward()


def test_unknown_preset_lists_valid_ones() -> None:
    with pytest.raises(ConfigError) as error:
        build_model("huge", 3, 1, False)
    for name in PRESETS:
        assert name in str(error.value)


def test_unknown_override_keys_are_errors() -> None:
    with pytest.raises(ConfigError, match="widthz"):
        build_model("nano", 3, 1, False, widthz=(8, 8, 8, 8))
    with pytest.raises(ConfigError, match="box_wieght"):
        build_model("nano", 3, 1, False, loss={"box_wieght": 1.0})
    model = build_model("nano", 3, 1, False, neck_width=24, loss={"box_weight": 1.0})
    assert model.config["neck_width"] == 24 and model.criterion.box_weight == 1.0


def test_preset_summaries_one_line_each() -> None:
    lines = preset_summaries(input_size=64)
    assert len(lines) == len(PRESETS)
    assert all(line.startswith(name) and "GFLOPs" in line for line, name in zip(lines, PRESETS, strict=True))


def test_invalid_channels_and_targets() -> None:
    with pytest.raises(ConfigError):
        build_model("nano", 3, 3, True)
    model = build_model("nano", 3, 1, False)
    with pytest.raises(DatasetError, match="class id"):
        model(torch.rand(1, 1, 64, 64), [torch.tensor([[5.0, 0, 0, 10, 10]])])
    with pytest.raises(ValueError, match="divisible by 32"):
        model(torch.rand(1, 1, 60, 64))


def test_config_rebuilds_identical_model() -> None:
    model = build_model("nano", 6, 2, True)
    rebuilt = detector_from_config(model.config)
    assert isinstance(rebuilt, Detector)
    rebuilt.load_state_dict(model.state_dict())
    images = torch.rand(1, 2, 64, 64)
    model.eval(), rebuilt.eval()
    torch.testing.assert_close(model(images), rebuilt(images))


def test_model_info_counts_params_and_flops() -> None:
    model = build_model("nano", 6, 2, True)
    info = model_info(model, input_size=320)
    assert info["params"] == sum(parameter.numel() for parameter in model.parameters())
    bigger = model_info(model, input_size=640)
    assert bigger["gflops"] == pytest.approx(4 * info["gflops"], rel=0.05)
    assert model.training  # restored


def _square_scene() -> tuple[torch.Tensor, torch.Tensor]:
    """Two bright squares (class 0 and 1) on a dark 128x128 background; template = background."""
    background = torch.full((1, 128, 128), 0.1)
    tested = background.clone()
    tested[:, 20:52, 24:56] = 0.9  # class 0: 32x32 square
    tested[:, 70:110, 64:120] = 0.6  # class 1: 56x40 rectangle
    images = torch.cat([tested, background]).unsqueeze(0)  # (1, 2, 128, 128)
    boxes = torch.tensor([[0.0, 24, 20, 56, 52], [1.0, 64, 70, 120, 110]])
    return images, boxes


def _box_iou(a: np.ndarray, b: np.ndarray) -> float:
    width = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    height = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    intersection = width * height
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - intersection
    return float(intersection / union)


@pytest.mark.parametrize("preset", list(PRESETS))
def test_overfits_synthetic_squares(preset: str) -> None:
    model = build_model(preset, num_classes=2, in_channels=2, template=True)
    images, boxes = _square_scene()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(60):
        loss = model(images, [boxes])["loss"]
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    assert np.mean(losses[-5:]) < 0.3 * np.mean(losses[:5])
    # 60 steps are too few for BN running statistics (momentum 0.03) to settle: recalibrate them
    for module in model.modules():
        if isinstance(module, torch.nn.BatchNorm2d):
            module.reset_running_stats()
            module.momentum = None  # cumulative average: one pass gives this image's statistics
    with torch.no_grad():
        model(images, [boxes])
    model.eval()
    with torch.no_grad():
        detections = postprocess(model(images).numpy(), score_floor=0.05)[0]
    for gt in boxes.numpy():
        same_class = detections.classes == int(gt[0])
        assert same_class.any(), f"no detection of class {int(gt[0])}"
        best = detections.boxes[same_class][0]  # highest-scoring of that class
        assert _box_iou(best, gt[1:]) > 0.5, (best, gt)
    assert _box_iou(detections.boxes[0], boxes[int(detections.classes[0]), 1:].numpy()) > 0.5

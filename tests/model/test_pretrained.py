"""Shipped starting weights: what is copied, the gray stem, layout checks, and that the shipped files help."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from defectdet.data.synth.board import generate_board
from defectdet.engine.autoconfig import SplitStats, choose_settings
from defectdet.engine.config import TrainConfig
from defectdet.errors import ConfigError
from defectdet.model import build_model
from defectdet.model import pretrained as pretrained_module
from defectdet.model.pretrained import save_weights, shipped_weights, transfer_weights


def make_stats(images: int = 50) -> SplitStats:
    """Gray 640 px images without templates, 40 px defects of two classes."""
    counts = np.array([images, images], np.int64)
    return SplitStats(
        images=images,
        sizes=np.tile(np.array([[640, 640]], np.float32), (images, 1)),
        box_wh=np.full((20, 2), 40, np.float32),
        box_image_long=np.full(20, 640, np.float32),
        class_names=["c0", "c1"],
        class_boxes=counts,
        class_images=counts,
        with_template=0,
        color_checked=10,
        color_images=0,
    )


def _rgb_twin_of_gray(template: bool, tmp_path: Path) -> tuple[torch.nn.Module, torch.nn.Module]:
    torch.manual_seed(0)
    rgb = build_model("nano", 3, 6 if template else 3, template, levels=(0, 1, 2)).eval()
    path = save_weights(rgb, tmp_path / "w.pt", {"made_by": "test"})
    gray = build_model("nano", 3, 2 if template else 1, template).eval()
    report = transfer_weights(gray, path)
    assert report.stem == "summed to gray"
    assert all(name.startswith("head.classifiers.") for name in report.left_random)
    # the class logits are never copied: give the twin the same ones to compare outputs
    for index in range(2):
        gray.head.classifiers[index].load_state_dict(rgb.head.classifiers[index].state_dict())
    return rgb, gray


@pytest.mark.parametrize("template", [False, True])
def test_a_gray_model_from_colour_weights_sees_a_gray_image_as_the_colour_model_does(template, tmp_path):
    rgb, gray = _rgb_twin_of_gray(template, tmp_path)
    generator = torch.Generator().manual_seed(1)
    halves = [torch.rand(2, 1, 64, 96, generator=generator) for _ in range(2 if template else 1)]
    gray_input = torch.cat(halves, 1)
    rgb_input = torch.cat([half.repeat(1, 3, 1, 1) for half in halves], 1)
    with torch.no_grad():
        expected = rgb(rgb_input)[:, : gray(gray_input).shape[1]]  # levels 8/16 come first
        got = gray(gray_input)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


def test_other_layouts_presets_and_files_are_refused(tmp_path):
    plain = build_model("nano", 2, 3, False)
    path = save_weights(plain, tmp_path / "plain.pt", {})
    with pytest.raises(ConfigError, match="template=False"):
        transfer_weights(build_model("nano", 2, 6, True), path)
    with pytest.raises(ConfigError, match="preset 'nano'"):
        transfer_weights(build_model("tiny", 2, 3, False), path)
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"not weights at all")
    with pytest.raises(ConfigError, match="junk.pt"):
        transfer_weights(plain, junk)


def test_the_settings_table_says_where_the_starting_weights_come_from(tmp_path, monkeypatch):
    from defectdet.model import imagenet

    stats = make_stats()
    monkeypatch.setattr(pretrained_module, "WEIGHTS_DIR", tmp_path)
    monkeypatch.setattr(imagenet, "weights_path", lambda: None)  # without the ImageNet package: tiny
    _, choices = choose_settings(stats, TrainConfig())
    assert [c for c in choices if c.name == "pretrained"][0].value is False
    save_weights(build_model("tiny", 2, 1, False), tmp_path / "tiny_plain.pt", {})  # no templates: tiny
    config, choices = choose_settings(stats, TrainConfig())
    row = [c for c in choices if c.name == "pretrained"][0]
    assert config.pretrained is True and row.source == "auto" and "tiny_plain.pt" in row.reason
    _, choices = choose_settings(stats, TrainConfig(preset="nano"))  # no nano file in this folder
    assert [c for c in choices if c.name == "pretrained"][0].value is False
    config, choices = choose_settings(stats, TrainConfig(pretrained=False))  # --from-scratch
    assert config.pretrained is False and [c for c in choices if c.name == "pretrained"][0].source == "user"


def _board_batch(count: int, size: int = 320) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Synthetic boards (a seed no pretraining used), gray, resized to `size`, with their boxes."""
    import cv2

    images, targets = [], []
    for index in range(count):
        board = generate_board(7, index, 480, 520, False)
        height, width = board.image.shape[:2]
        image = cv2.resize(board.image, (size, size), interpolation=cv2.INTER_AREA)
        scale = np.array([size / width, size / height] * 2, np.float32)
        images.append(torch.from_numpy(image).float()[None] / 255)
        boxes = torch.from_numpy(board.boxes * scale)
        targets.append(torch.cat([torch.zeros(len(boxes), 1), boxes], 1))
    return torch.stack(images), targets


@pytest.mark.skipif(shipped_weights("nano", False) is None, reason="no nano weights shipped in this checkout")
def test_the_shipped_weights_already_place_boxes_on_boards_they_never_saw():
    images, targets = _board_batch(4)
    losses = {}
    for start in ("scratch", "pretrained"):
        torch.manual_seed(0)
        model = build_model("nano", 1, 1, False).eval()
        if start == "pretrained":
            transfer_weights(model, shipped_weights("nano", False))
        with torch.no_grad():
            losses[start] = float(model(images, targets)["loss_box"])
    assert losses["pretrained"] < 0.8 * losses["scratch"], losses

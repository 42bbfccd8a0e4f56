"""ImageNet starting weights for lite0: read from the installed package with no network, every backbone tensor
placed, and each input layout (gray, colour, template, companions) starting from the ImageNet features."""

from __future__ import annotations

import socket

import pytest
import torch
import torch.nn.functional as functional

from defectdet.errors import ConfigError
from defectdet.model import build_model, imagenet
from defectdet.model.imagenet import read_imagenet_state, transfer_imagenet_weights

pytestmark = pytest.mark.skipif(imagenet.weights_path() is None, reason=imagenet.missing_reason())


def _lite0(in_channels: int, template: bool = False, companions: tuple[str, ...] = ()) -> torch.nn.Module:
    model = build_model("lite0", 2, in_channels, template, companions).eval()
    transfer_imagenet_weights(model)
    return model


def _features(model: torch.nn.Module, images: torch.Tensor) -> list[torch.Tensor]:
    with torch.no_grad():
        return model.backbone(model.fusion(images))


def _assert_same_features(got: list[torch.Tensor], expected: list[torch.Tensor]) -> None:
    assert len(got) == len(expected) == 3
    for level, (a, b) in enumerate(zip(got, expected, strict=True)):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4, msg=f"level {level}")


def test_weights_load_from_the_package_without_the_network(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("ImageNet weights must not touch the network")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    model = build_model("lite0", 3, 3, False)
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    report = transfer_imagenet_weights(model)
    backbone = [name for name in model.state_dict() if name.startswith("backbone.")]
    assert report.copied == len(backbone) and not [n for n in report.left_random if n.startswith("backbone.")]
    assert all(not name.startswith("backbone.") for name in report.left_random)
    changed = [name for name, tensor in model.state_dict().items() if not torch.equal(tensor, before[name])]
    assert set(changed) >= {n for n in backbone if not n.endswith("num_batches_tracked")}
    assert "ImageNet" in report.summary() and "Apache-2.0" in report.summary()


def test_the_colour_stem_sees_images_as_imagenet_training_did():
    """Our [0, 1] input with our normalization gives exactly the stem response of the published preprocessing."""
    model = _lite0(3)
    original = read_imagenet_state()["_conv_stem.weight"]
    images = torch.rand(2, 3, 64, 96, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours = model.backbone.stem.conv(model.fusion(images))
        published = functional.conv2d((images - 0.5) / 0.5, original, stride=2, padding=1)
    torch.testing.assert_close(ours, published, rtol=1e-4, atol=1e-4)


def test_a_gray_model_sees_a_gray_image_as_the_colour_model_does():
    gray = torch.rand(2, 1, 64, 96, generator=torch.Generator().manual_seed(1))
    _assert_same_features(_features(_lite0(1), gray), _features(_lite0(3), gray.repeat(1, 3, 1, 1)))


@pytest.mark.parametrize("channels", [1, 3])
def test_a_template_that_matches_leaves_the_imagenet_features_and_a_change_moves_them(channels):
    tested = torch.rand(1, channels, 64, 96, generator=torch.Generator().manual_seed(2))
    plain, paired = _lite0(channels), _lite0(2 * channels, template=True)
    assert paired.backbone.stem.conv.weight.shape[1] == 3 * channels  # tested, template, difference
    expected = _features(plain, tested)
    _assert_same_features(_features(paired, torch.cat([tested, tested], 1)), expected)
    changed = tested.clone()
    changed[..., 20:40, 30:50] = 1 - changed[..., 20:40, 30:50]
    moved = _features(paired, torch.cat([tested, changed], 1))[0]
    assert (moved - expected[0]).abs().max() > 0.1


@pytest.mark.parametrize("companions", [("L2",), ("L2", "L3", "UV")])
def test_companion_captures_share_the_stem_so_aligned_copies_give_the_plain_features(companions):
    tested = torch.rand(1, 1, 64, 96, generator=torch.Generator().manual_seed(3))
    planes = 1 + len(companions)
    model = _lite0(planes, companions=companions)
    assert model.backbone.stem.conv.weight.shape[1] == planes
    stacked = tested.repeat(1, planes, 1, 1)
    _assert_same_features(_features(model, stacked), _features(_lite0(1), tested))
    with_template = build_model("lite0", 2, 3 * 3, True, ("L2",))  # colour: tested, template, one companion
    transfer_imagenet_weights(with_template)
    assert with_template.backbone.stem.conv.weight.shape[1] == 3 * 3 + 3


def test_other_presets_and_bad_files_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="efficientnet_lite0 backbone"):
        transfer_imagenet_weights(build_model("tiny", 2, 3, False))
    junk = tmp_path / "junk.pth"
    junk.write_bytes(b"not weights")
    with pytest.raises(ConfigError, match="junk.pth"):
        transfer_imagenet_weights(build_model("lite0", 2, 3, False), junk)
    other = tmp_path / "other.pth"
    torch.save({"conv.weight": torch.zeros(1)}, other)
    with pytest.raises(ConfigError, match="_conv_stem"):
        transfer_imagenet_weights(build_model("lite0", 2, 3, False), other)


def test_a_frozen_stem_keeps_its_imagenet_weights_and_statistics_while_the_rest_learns():
    model = build_model("lite0", 2, 1, False, frozen_stem=True)
    transfer_imagenet_weights(model)
    model.train()
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    images = torch.rand(2, 1, 64, 64, generator=torch.Generator().manual_seed(4))
    targets = [torch.tensor([[0.0, 8, 8, 40, 40]]), torch.tensor([[1.0, 20, 10, 60, 30]])]
    for _ in range(2):
        optimizer.zero_grad()
        model(images, targets)["loss"].backward()
        optimizer.step()
    after = model.state_dict()
    frozen = [
        n for n in after if n.startswith(("backbone.stem.", *(f"backbone.blocks.{i}." for i in range(3))))
    ]
    assert frozen and all(
        torch.equal(after[n], before[n]) for n in frozen
    )  # weights and BatchNorm statistics
    assert not torch.equal(
        after["backbone.blocks.3.expand.conv.weight"], before["backbone.blocks.3.expand.conv.weight"]
    )
    assert not torch.equal(
        after["backbone.blocks.3.expand.norm.running_mean"],
        before["backbone.blocks.3.expand.norm.running_mean"],
    )

"""Companion captures in the model: channel counts, the fused plane order, the builder's checks, starting weights
whose companion stem channels are zero (the model answers exactly as without them), and older configs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from defectdet.errors import ConfigError
from defectdet.model import build_model, detector_from_config
from defectdet.model.backbone import INPUT_MEAN, INPUT_STD, InputFusion
from defectdet.model.pretrained import save_weights, shipped_weights, transfer_weights


def test_fusion_keeps_the_tested_template_difference_order_and_appends_the_companions() -> None:
    fusion = InputFusion(4 * 3, template=True, companions=2)  # RGB: tested, template, L2, L3
    assert (fusion.channels, fusion.out_channels) == (3, 3 * 3 + 2 * 3)
    images = torch.rand(2, 12, 8, 8)
    tested, template, l2, l3 = images.split(3, 1)
    expected = torch.cat([tested, template], 1).sub(INPUT_MEAN).div(INPUT_STD)
    expected = torch.cat([expected, (tested - template) / INPUT_STD, (l2 - INPUT_MEAN) / INPUT_STD], 1)
    expected = torch.cat([expected, (l3 - INPUT_MEAN) / INPUT_STD], 1)
    assert torch.allclose(fusion(images), expected, atol=1e-6)
    plain = InputFusion(2, template=False, companions=1)  # gray tested image + one companion, no difference
    assert plain.out_channels == 2
    assert torch.allclose(plain(images[:, :2]), (images[:, :2] - INPUT_MEAN) / INPUT_STD)
    with pytest.raises(ValueError, match="do not split into 3 planes"):
        InputFusion(4, template=True, companions=1)


@pytest.mark.parametrize(("channels", "template", "companions"), [(1, False, 1), (3, False, 2), (1, True, 2)])
def test_a_companion_model_takes_one_plane_per_companion(
    channels: int, template: bool, companions: int
) -> None:
    names = [f"L{index + 2}" for index in range(companions)]
    in_channels = channels * (1 + int(template) + companions)
    model = build_model("nano", 2, in_channels, template, companions=names).eval()
    assert model.config["companions"] == names and model.companions == names
    assert model.backbone.stem.conv.weight.shape[1] == channels * ((3 if template else 1) + companions)
    with torch.no_grad():
        assert model(torch.rand(1, in_channels, 64, 64)).shape[-1] == 4 + 2
    with pytest.raises(ValueError, match=f"expected images \\(B, {in_channels}, H, W\\)"):
        model(torch.rand(1, in_channels - channels, 64, 64))
    rebuilt = detector_from_config(model.config)
    rebuilt.load_state_dict(model.state_dict())
    assert rebuilt.companions == names


def test_the_builder_names_what_is_wrong_with_companions() -> None:
    with pytest.raises(ConfigError, match=r"in_channels: 2 is invalid .*companions=\['L2', 'L3'\].*\(3, 9\)"):
        build_model("nano", 2, 2, False, companions=["L2", "L3"])
    with pytest.raises(ConfigError, match=r"\['L2'\] named more than once"):
        build_model("nano", 2, 3, False, companions=["L2", "L2"])
    with pytest.raises(ConfigError, match="a list of names"):
        build_model("nano", 2, 3, False, companions="L2")
    assert build_model("nano", 2, 1, False).config["companions"] == []


def test_a_model_config_without_companions_still_loads() -> None:
    """Checkpoints and bundles written before companions existed have no `companions` key."""
    model = build_model("nano", 2, 2, True)
    older = {key: value for key, value in model.config.items() if key != "companions"}
    rebuilt = detector_from_config(older)
    rebuilt.load_state_dict(model.state_dict())
    assert rebuilt.companions == [] and rebuilt.in_channels == 2


def _same_logits(source: torch.nn.Module, target: torch.nn.Module) -> None:
    """The class logits are never transferred: give both models the same ones to compare outputs."""
    for source_head, target_head in zip(source.head.classifiers, target.head.classifiers, strict=True):
        target_head.load_state_dict(source_head.state_dict())


def _weights(preset: str, template: bool, tmp_path: Path) -> Path:
    """The shipped file of the layout; a template layout (none ships) gets an RGB file written here."""
    path = shipped_weights(preset, template)
    if path is None:
        torch.manual_seed(0)
        path = save_weights(build_model(preset, 3, 6, template), tmp_path / "w.pt", {"made_by": "test"})
    return path


@pytest.mark.parametrize(("channels", "template"), [(1, False), (3, False), (1, True)])
def test_zero_companion_stem_channels_answer_exactly_as_the_model_without_them(
    channels: int, template: bool, tmp_path: Path
) -> None:
    path = _weights("tiny", template, tmp_path)
    base_channels = channels * (2 if template else 1)
    plain = build_model("tiny", 3, base_channels, template).eval()
    transfer_weights(plain, path)
    with_companions = build_model("tiny", 3, base_channels + 2 * channels, template, companions=["L2", "L3"])
    report = transfer_weights(with_companions.eval(), path)
    assert "2 companion plane(s) at zero" in report.stem
    assert report.left_random == [name for name in report.left_random if name.startswith("head.classifiers.")]
    _same_logits(plain, with_companions)
    generator = torch.Generator().manual_seed(1)
    images = torch.rand(2, base_channels, 64, 96, generator=generator)
    for companions in (
        torch.rand(2, 2 * channels, 64, 96, generator=generator),
        torch.ones(2, 2 * channels, 64, 96),
    ):
        with torch.no_grad():
            assert torch.equal(with_companions(torch.cat([images, companions], 1)), plain(images))

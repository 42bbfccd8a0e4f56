"""Starting weights shipped inside the package, learned on the project's own synthetic families.

Nothing is downloaded: `bench/pretrain.py` (`make pretrain`) trains each preset on `synth --kind pcb`
and `--kind surface` images and writes `weights/<preset>_<layout>.pt`, layout ``template`` (tested
image + golden template) or ``plain`` (tested image only). The files are RGB; a gray model gets the
stem summed over the colour channels, which is exact for a gray image shown as RGB. A model that also takes
companion captures gets the layout's weights with the stem's companion input channels at zero: it starts out
answering exactly as the model without them, and training teaches it what the companions add.

`transfer_weights` copies every tensor whose name and shape match, except the class logits (the
classes differ between datasets). Levels, widths or a head the file lacks start from random weights,
and the report says how much was copied.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from defectdet.errors import ConfigError

WEIGHTS_DIR = Path(__file__).resolve().parent / "weights"
FORMAT = "defectdet-pretrained/1"
STEM_KEY = "backbone.stem.conv.weight"
SKIPPED_PREFIXES = ("head.classifiers.",)  # class logits: another dataset's classes


def layout_name(template: bool) -> str:
    return "template" if template else "plain"


def shipped_weights(preset: str, template: bool) -> Path | None:
    """The shipped starting weights for `preset` and this input layout, or None when none ship."""
    path = WEIGHTS_DIR / f"{preset}_{layout_name(template)}.pt"
    return path if path.is_file() else None


def load_tensors(path: str | Path, what: str) -> Any:
    """`torch.load` of tensors and plain values only (no pickled code runs); one clear error naming the file."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # noqa: BLE001 - any unreadable file gets one clear message
        raise ConfigError(f"{path}: not a readable {what} ({type(error).__name__})") from None


def read_weights(path: str | Path) -> dict[str, Any]:
    """Loads a pretrained-weights file (tensors and plain values only: no pickled code runs)."""
    path = Path(path)
    payload = load_tensors(path, "pretrained-weights file")
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise ConfigError(f"{path}: not a defectdet pretrained-weights file (format {FORMAT!r} expected)")
    return payload


def save_weights(model: nn.Module, path: str | Path, provenance: dict[str, Any]) -> Path:
    """Writes `model`'s float weights and its config (atomically), for `read_weights`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    config = dict(getattr(model, "config", {}))
    state = {name: tensor.detach().cpu().clone() for name, tensor in model.state_dict().items()}
    payload = {
        "format": FORMAT,
        "preset": config.get("preset"),
        "template": bool(config.get("template")),
        "in_channels": int(config.get("in_channels", 0)),
        "levels": list(config.get("levels", ())),
        "state_dict": state,
        "provenance": provenance,
    }
    temporary = path.with_name(path.name + ".tmp")
    torch.save(payload, temporary)
    temporary.replace(path)
    return path


@dataclass
class TransferReport:
    """What `transfer_weights` copied into the model."""

    source: str
    copied: int = 0  # tensors copied
    total: int = 0  # tensors in the model
    stem: str = "copied"  # copied | summed to gray | spread over colour; companion planes at zero
    left_random: list[str] = field(default_factory=list)  # model tensors that kept their initialization
    provenance: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> str:
        shown = ", ".join(sorted({name.rsplit(".", 2)[0] for name in self.left_random})[:4])
        rest = f"; random: {shown}" if shown else ""
        return f"{self.copied}/{self.total} tensors from {self.source} (stem {self.stem}){rest}"


def _adapt_stem(weight: torch.Tensor, wanted_channels: int, groups: int) -> tuple[torch.Tensor, str] | None:
    """The stem conv's `(out, groups * c, k, k)` weight for another colour count c: each group of
    channels (tested, template, difference) is summed to gray or spread over RGB."""
    have = weight.shape[1] // groups
    want = wanted_channels // groups
    if have * groups != weight.shape[1] or want * groups != wanted_channels:
        return None
    parts = weight.split(have, dim=1)
    if have == 3 and want == 1:
        return torch.cat([part.sum(1, keepdim=True) for part in parts], 1), "summed to gray"
    if have == 1 and want == 3:
        return torch.cat([part.repeat(1, 3, 1, 1) / 3 for part in parts], 1), "spread over colour"
    return None


def _companion_stem(
    weight: torch.Tensor, target: torch.Tensor, config: dict[str, Any]
) -> tuple[torch.Tensor, str] | None:
    """The stem weight for `target`'s input channels: the layout's own channels (adapted to gray or colour
    when needed) followed by zeros for the companion planes, so the companions add nothing until trained."""
    companions = len(config.get("companions") or [])
    planes = 1 + int(bool(config.get("template"))) + companions
    extra = int(config.get("in_channels", 0)) // planes * companions
    base_channels = target.shape[1] - extra
    stem = "copied"
    if weight.shape[1] != base_channels:
        adapted = _adapt_stem(weight, base_channels, 3 if config.get("template") else 1)
        if adapted is None:
            return None
        weight, stem = adapted
    if extra:
        zeros = weight.new_zeros((weight.shape[0], extra, *weight.shape[2:]))
        weight = torch.cat([weight, zeros], 1)
        stem += f", {companions} companion plane(s) at zero"
    return weight, stem


def transfer_weights(model: nn.Module, path: str | Path) -> TransferReport:
    """Copies the matching tensors of a pretrained-weights file into `model` (in place).

    Raises ConfigError when the file was learned for another input layout (template or not) or
    preset, since then almost nothing would carry over."""
    payload = read_weights(path)
    config = getattr(model, "config", {})
    if bool(payload["template"]) != bool(config.get("template")):
        raise ConfigError(
            f"{path}: learned with template={payload['template']}, the model has template={config.get('template')}"
        )
    if payload.get("preset") != config.get("preset"):
        raise ConfigError(
            f"{path}: learned for preset {payload.get('preset')!r}, not {config.get('preset')!r}"
        )
    source_state: dict[str, torch.Tensor] = payload["state_dict"]
    target_state = model.state_dict()
    report = TransferReport(
        source=Path(path).name, total=len(target_state), provenance=payload.get("provenance", {})
    )
    updates: dict[str, torch.Tensor] = {}
    for name, target in target_state.items():
        source = source_state.get(name)
        if source is None or name.startswith(SKIPPED_PREFIXES):
            report.left_random.append(name)
            continue
        # with companions the stem always changes: gray + 2 companions has the RGB stem's shape
        if name == STEM_KEY and (source.shape != target.shape or config.get("companions")):
            adapted = _companion_stem(source, target, config)
            if adapted is not None:
                source, report.stem = adapted
        if source.shape != target.shape:
            report.left_random.append(name)
            continue
        updates[name] = source.to(target.dtype)
    model.load_state_dict(updates, strict=False)
    report.copied = len(updates)
    return report

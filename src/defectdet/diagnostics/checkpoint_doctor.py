"""`checkpoint_report` and `migrate_checkpoint`: why a checkpoint does not load into a model, and a fixed copy.

Compares tensor by tensor (name, shape, dtype, saved device) against a target model: a preset, another
checkpoint, an `nn.Module`, or, by default, the model a defectdet checkpoint describes in `model_config`.
"""

from __future__ import annotations

import copy
import dataclasses
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from defectdet.diagnostics.checkpoint_read import LoadedCheckpoint, describe_contents, read_checkpoint
from defectdet.diagnostics.key_mapping import RenameRule, apply_rules, load_rules, propose_rules
from defectdet.diagnostics.report import Finding, format_bytes
from defectdet.errors import CheckpointError, ConfigError

DEFAULT_TARGET = {"num_classes": 6, "in_channels": 2, "template": True}  # DeepPCB: gray + template


@dataclasses.dataclass
class Target:
    description: str
    shapes: dict[str, tuple[int, ...]]
    module: nn.Module | None = None


@dataclasses.dataclass
class KeyRow:
    """One tensor: status is match | missing | unexpected | shape (same name, other shape)."""

    key: str
    status: str
    shape: list[int] | None = None
    dtype: str | None = None
    device: str | None = None
    expected_shape: list[int] | None = None
    source_key: str | None = None  # the name in the file, when a rule renamed it


@dataclasses.dataclass
class CheckpointReport:
    path: str
    file_bytes: int
    layout: str
    weights_key: str | None
    tensor_count: int
    weight_bytes: int
    dtypes: dict[str, int]
    saved_devices: dict[str, int]
    contents: dict[str, str]
    target: str | None
    applied_rules: list[RenameRule]
    proposed_rules: list[RenameRule]
    counts: dict[str, int]
    counts_after_proposal: dict[str, int] | None
    rows: list[KeyRow]
    findings: list[Finding]

    @property
    def loads_strictly(self) -> bool:
        return self.target is not None and self.counts["match"] == len(self.rows)


@dataclasses.dataclass
class MigrationResult:
    out: str
    rules: list[RenameRule]
    loads_strictly: bool
    message: str
    report: CheckpointReport


def _module_target(module: nn.Module, description: str) -> Target:
    return Target(description, {k: tuple(v.shape) for k, v in module.state_dict().items()}, module)


def _build_preset(preset: str, model_config: Mapping[str, Any] | None, overrides: dict[str, Any]) -> Target:
    from defectdet.model import build_model

    settings = {
        key: overrides.get(key) if overrides.get(key) is not None else (model_config or {}).get(key, default)
        for key, default in DEFAULT_TARGET.items()
    }
    module = build_model(preset, settings["num_classes"], settings["in_channels"], settings["template"])
    return _module_target(
        module,
        f"preset {preset} ({settings['num_classes']} classes, {settings['in_channels']} input channels, "
        f"template={settings['template']})",
    )


def _model_config(checkpoint: LoadedCheckpoint) -> dict[str, Any] | None:
    raw = checkpoint.raw
    config = raw.get("model_config") if isinstance(raw, Mapping) else None
    return config if isinstance(config, dict) else None


def resolve_target(
    model: nn.Module | str | Path | None, checkpoint: LoadedCheckpoint, unsafe: bool = False, **overrides: Any
) -> Target | None:
    """The model to compare against (see module docstring); None when there is nothing to compare with.

    `overrides` (num_classes, in_channels, template) apply when `model` is a preset name.
    """
    from defectdet.model import PRESETS, detector_from_config

    if isinstance(model, nn.Module):
        return _module_target(model, f"the given {type(model).__name__}")
    if model is None:
        config = _model_config(checkpoint)
        if config is None:
            return None
        return _module_target(
            detector_from_config(config),
            f"the model in its model_config (preset {config.get('preset', '?')})",
        )
    if str(model) in PRESETS:
        return _build_preset(str(model), _model_config(checkpoint), overrides)
    if Path(model).is_file():
        other = read_checkpoint(model, unsafe=unsafe)
        config = _model_config(other)
        if config is not None:
            return _module_target(detector_from_config(config), f"the model of {model}")
        return Target(f"the weights of {model}", {k: tuple(v.shape) for k, v in other.state_dict.items()})
    raise ConfigError(
        f"--model: {str(model)!r} is neither a preset ({', '.join(PRESETS)}) nor a checkpoint file"
    )


def compare_keys(
    state_dict: Mapping[str, torch.Tensor],
    target: Mapping[str, tuple[int, ...]],
    saved_devices: Mapping[str, str],
    original_names: Mapping[str, str],
) -> list[KeyRow]:
    """A row per tensor: the target's keys in its order, then the checkpoint's unexpected keys."""
    rows = []
    for key, expected in target.items():
        tensor = state_dict.get(key)
        if tensor is None:
            rows.append(KeyRow(key, "missing", expected_shape=list(expected)))
            continue
        status = "match" if tuple(tensor.shape) == tuple(expected) else "shape"
        rows.append(_row(key, status, tensor, saved_devices, original_names, list(expected)))
    rows += [
        _row(key, "unexpected", tensor, saved_devices, original_names, None)
        for key, tensor in state_dict.items()
        if key not in target
    ]
    return rows


def _row(
    key: str,
    status: str,
    tensor: torch.Tensor,
    devices: Mapping[str, str],
    original_names: Mapping[str, str],
    expected: list[int] | None,
) -> KeyRow:
    source = original_names.get(key, key)
    return KeyRow(
        key,
        status,
        list(tensor.shape),
        str(tensor.dtype).replace("torch.", ""),
        devices.get(source, "cpu"),
        expected,
        source if source != key else None,
    )


def _counts(rows: list[KeyRow]) -> dict[str, int]:
    counted = Counter(row.status for row in rows)
    return {status: counted.get(status, 0) for status in ("match", "missing", "unexpected", "shape")}


def _renamed(
    checkpoint: LoadedCheckpoint, rules: list[RenameRule]
) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    renamed = apply_rules(checkpoint.state_dict, rules, source=str(checkpoint.path))
    original_names = dict(zip(renamed, checkpoint.state_dict, strict=True))
    return renamed, original_names


def _findings(report: CheckpointReport, target: Target | None) -> list[Finding]:
    findings: list[Finding] = []
    path, counts = report.path, report.counts
    if target is None:
        findings.append(
            Finding(
                "info",
                "target",
                "no model to compare with (the file has no model_config)",
                f"defectdet doctor checkpoint {path} --model nano|tiny|small|OTHER.pt",
            )
        )
    elif report.loads_strictly:
        findings.append(Finding("ok", "keys", f"all {counts['match']} tensors match: loads with strict=True"))
    else:
        names = {"missing": "missing", "unexpected": "unexpected", "shape": "shape-mismatched"}
        problems = ", ".join(f"{counts[k]} {name}" for k, name in names.items() if counts[k])
        after = report.counts_after_proposal
        if after is not None and not (after["missing"] or after["unexpected"] or after["shape"]):
            advice = f"defectdet doctor checkpoint {path} --model ... --out fixed.pt writes a copy that loads strictly"
        elif counts["shape"]:
            advice = "same names, other shapes: usually another class count, preset or input channels (see --model)"
        elif counts["missing"] and not counts["unexpected"]:
            advice = (
                "the model has layers the checkpoint lacks: if they are new on purpose, load with strict=False "
                "(load_state_dict_checked) and they keep their initial values; else use the training run's model"
            )
        elif counts["unexpected"] and not counts["missing"]:
            advice = "the checkpoint has layers the model lacks: use the model it was trained with, or drop them with --map"
        else:
            advice = "no renaming explains it all: write a --map RULES.yaml for the rest, or use the training run's model"
        findings.append(Finding("error", "keys", f"does not load into {report.target}: {problems}", advice))
    devices = {device for device in report.saved_devices if device != "cpu"}
    if devices:
        findings.append(
            Finding(
                "info", "device", f"saved from {', '.join(sorted(devices))}; read onto the CPU (map_location)"
            )
        )
    half = {dtype for dtype in report.dtypes if dtype in ("float16", "bfloat16")}
    if half:
        findings.append(
            Finding(
                "info",
                "dtype",
                f"{', '.join(sorted(half))} weights: load_state_dict casts them to the model's dtype",
            )
        )
    return findings


def checkpoint_report(
    path: str | Path,
    model: nn.Module | str | Path | None = None,
    rules: list[RenameRule] | str | Path | None = None,
    unsafe: bool = False,
    **target_options: Any,
) -> CheckpointReport:
    """Explain how the checkpoint at `path` lines up with `model` (see `resolve_target`).

    `rules` (a list or a YAML rules file) are applied first; a proposed mapping covers what remains.
    """
    checkpoint = read_checkpoint(path, unsafe=unsafe)
    if isinstance(rules, str | Path):
        rules = load_rules(rules)
    rules = list(rules or [])
    target = resolve_target(model, checkpoint, unsafe=unsafe, **target_options)
    return _report(checkpoint, target, rules)


def _report(checkpoint: LoadedCheckpoint, target: Target | None, rules: list[RenameRule]) -> CheckpointReport:
    state_dict, original_names = _renamed(checkpoint, rules)
    target_shapes = target.shapes if target else {key: tuple(t.shape) for key, t in state_dict.items()}
    rows = compare_keys(state_dict, target_shapes, checkpoint.saved_devices, original_names)
    counts = _counts(rows)
    proposed: list[RenameRule] = []
    after = None
    if target is not None and counts["match"] != len(rows):
        proposed = propose_rules({k: tuple(v.shape) for k, v in state_dict.items()}, target.shapes)
        if proposed:
            after_dict = apply_rules(state_dict, proposed, source=str(checkpoint.path))
            after = _counts(compare_keys(after_dict, target.shapes, {}, {}))
    tensors = list(checkpoint.state_dict.values())
    report = CheckpointReport(
        path=str(checkpoint.path),
        file_bytes=checkpoint.file_bytes,
        layout=checkpoint.layout,
        weights_key=checkpoint.weights_key,
        tensor_count=len(tensors),
        weight_bytes=sum(t.numel() * t.element_size() for t in tensors),
        dtypes=dict(Counter(str(t.dtype).replace("torch.", "") for t in tensors)),
        saved_devices=dict(Counter(checkpoint.saved_devices.values())),
        contents=describe_contents(checkpoint),
        target=target.description if target else None,
        applied_rules=rules,
        proposed_rules=proposed,
        counts=counts,
        counts_after_proposal=after,
        rows=rows,
        findings=[],
    )
    report.findings = _findings(report, target)
    return report


def _rename_container(
    checkpoint: LoadedCheckpoint, renamed: dict[str, torch.Tensor], rules: list[RenameRule]
) -> Any:
    if checkpoint.weights_key is None or not isinstance(checkpoint.raw, Mapping):
        return renamed  # a bare state_dict, or a pickled model: written as a bare state_dict
    container = dict(checkpoint.raw)
    container[checkpoint.weights_key] = renamed
    for key, value in container.items():  # other pickled models (an EMA copy): written as state_dicts
        if isinstance(value, nn.Module):
            weights = value.state_dict()
            same = set(weights) == set(checkpoint.state_dict)
            container[key] = apply_rules(weights, rules, source=str(key)) if same else weights
    ema = container.get("ema")
    if isinstance(ema, Mapping) and isinstance(ema.get("module"), Mapping):
        if set(ema["module"]) == set(checkpoint.state_dict):
            container["ema"] = {**ema, "module": apply_rules(ema["module"], rules, source="ema")}
    return container


def migrate_checkpoint(
    path: str | Path,
    out: str | Path,
    model: nn.Module | str | Path | None = None,
    rules: list[RenameRule] | str | Path | None = None,
    unsafe: bool = False,
    **target_options: Any,
) -> MigrationResult:
    """Rename the weights with `rules` (default: the proposed mapping), write `out`, and check that the
    written file loads into the target model with `strict=True` (on a copy of the model)."""
    from defectdet.engine.checkpoint import save_checkpoint

    checkpoint = read_checkpoint(path, unsafe=unsafe)
    target = resolve_target(model, checkpoint, unsafe=unsafe, **target_options)
    if isinstance(rules, str | Path):
        rules = load_rules(rules)
    if rules is None:
        if target is None:
            raise CheckpointError(
                f"{path}: nothing to migrate to: pass --model (a preset or checkpoint) or --map RULES.yaml"
            )
        rules = propose_rules({k: tuple(v.shape) for k, v in checkpoint.state_dict.items()}, target.shapes)
    rules = list(rules)
    renamed, _ = _renamed(checkpoint, rules)
    out = Path(out)
    if out.resolve() == Path(path).resolve():
        raise CheckpointError(f"{out}: --out must differ from the checkpoint it migrates")
    save_checkpoint(out, _rename_container(checkpoint, renamed, rules))
    written = read_checkpoint(out, unsafe=unsafe)  # other pickled entries (e.g. training options) stay
    report = _report(written, target, [])
    if target is not None and target.module is not None:
        try:
            copy.deepcopy(target.module).load_state_dict(written.state_dict, strict=True)
            loads, message = True, f"{out} loads into {target.description} with strict=True"
        except RuntimeError as error:
            loads, message = False, f"{out} still fails strict loading: {str(error).splitlines()[0]}"
    else:
        loads = report.loads_strictly
        message = (
            f"{out}: keys and shapes "
            + ("match" if loads else "still differ from")
            + f" {report.target or 'nothing (no target)'}"
        )
    return MigrationResult(str(out), rules, loads, message, report)


def summary_line(report: CheckpointReport) -> str:
    """'12 tensors, 1.2 MiB of weights in a 3.4 MiB file (defectdet checkpoint)'."""
    return (
        f"{report.tensor_count} tensors, {format_bytes(report.weight_bytes)} of weights in a "
        f"{format_bytes(report.file_bytes)} file ({report.layout})"
    )

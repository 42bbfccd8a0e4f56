"""Load state_dicts without silent partial loads; explain every mismatch (`defectdet doctor checkpoint`)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch
from torch import nn

from defectdet.errors import CheckpointError

logger = logging.getLogger(__name__)

WRAPPER_PREFIXES = ("module.", "_orig_mod.")  # DDP / DataParallel, torch.compile


@dataclass
class StateDictReport:
    """How a state_dict lines up with a model's own."""

    matched: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)  # in the model, not in the state_dict
    unexpected: list[str] = field(default_factory=list)  # in the state_dict, not in the model
    mismatched: list[tuple[str, tuple[int, ...], tuple[int, ...]]] = field(
        default_factory=list
    )  # key, given, model
    stripped_prefixes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.missing or self.unexpected or self.mismatched)

    def format(self, limit: int = 30) -> str:
        lines = [f"{len(self.matched)} key(s) match"]
        if self.stripped_prefixes:
            lines.append(f"stripped wrapper prefix(es): {', '.join(self.stripped_prefixes)}")
        if self.missing:
            lines.append(f"{len(self.missing)} missing key(s) (in the model, not in the checkpoint):")
            lines += [f"  {key}" for key in self.missing[:limit]] + _more(self.missing, limit)
        if self.unexpected:
            lines.append(f"{len(self.unexpected)} unexpected key(s) (in the checkpoint, not in the model):")
            lines += [f"  {key}" for key in self.unexpected[:limit]] + _more(self.unexpected, limit)
        if self.mismatched:
            lines.append(f"{len(self.mismatched)} shape-mismatched key(s) (checkpoint shape vs model shape):")
            lines += [
                f"  {key}: {list(given)} vs {list(expected)}"
                for key, given, expected in self.mismatched[:limit]
            ]
            lines += _more(self.mismatched, limit)
        return "\n".join(lines)


def _more(items: list, limit: int) -> list[str]:
    return [f"  ... and {len(items) - limit} more"] if len(items) > limit else []


def strip_wrapper_prefixes(
    state_dict: Mapping[str, torch.Tensor],
) -> tuple[dict[str, torch.Tensor], list[str]]:
    """Remove 'module.' / '_orig_mod.' when every key carries it."""
    result = dict(state_dict)
    stripped: list[str] = []
    changed = True
    while changed and result:
        changed = False
        for prefix in WRAPPER_PREFIXES:
            if all(key.startswith(prefix) for key in result):
                result = {key[len(prefix) :]: value for key, value in result.items()}
                stripped.append(prefix)
                changed = True
    return result, stripped


def diagnose_state_dict(model: nn.Module, state_dict: Mapping[str, torch.Tensor]) -> StateDictReport:
    """Compare without loading: matched, missing, unexpected and shape-mismatched keys."""
    state_dict, stripped = strip_wrapper_prefixes(state_dict)
    own = model.state_dict()
    report = StateDictReport(stripped_prefixes=stripped)
    for key, value in own.items():
        if key not in state_dict:
            report.missing.append(key)
            continue
        given = state_dict[key]
        given_shape = tuple(given.shape) if isinstance(given, torch.Tensor) else ()
        if given_shape != tuple(value.shape):
            report.mismatched.append((key, given_shape, tuple(value.shape)))
        else:
            report.matched.append(key)
    report.unexpected = [key for key in state_dict if key not in own]
    return report


def load_state_dict_checked(
    model: nn.Module, state_dict: Mapping[str, torch.Tensor], strict: bool = True, source: str = "checkpoint"
) -> StateDictReport:
    """Load `state_dict` into `model` or raise CheckpointError listing every missing/unexpected/mismatched key.

    strict=False tolerates missing and unexpected keys (logged as a warning) but never shape mismatches,
    so nothing is ever loaded partially without saying so.
    """
    report = diagnose_state_dict(model, state_dict)
    if report.mismatched or (strict and not report.ok):
        raise CheckpointError(f"{source} does not match the model:\n{report.format()}")
    if not report.ok:
        logger.warning("%s: partial load (strict=False):\n%s", source, report.format())
    cleaned, _ = strip_wrapper_prefixes(state_dict)
    model.load_state_dict({key: cleaned[key] for key in report.matched}, strict=False)
    return report

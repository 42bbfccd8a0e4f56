"""Find where a NaN/Inf came from, and decide whether training skips the batch or stops.

Forward hooks cost time, so they are installed only for a diagnosis re-run of the failing batch.
The re-run saves and restores buffers (BatchNorm statistics) and RNG state so it leaves no trace.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from defectdet.errors import NonFiniteError

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TensorStats:
    shape: tuple[int, ...]
    dtype: str
    minimum: float
    maximum: float
    mean: float
    has_nan: bool
    has_inf: bool

    def __str__(self) -> str:
        return (
            f"shape={list(self.shape)} dtype={self.dtype} min={self.minimum:.4g} max={self.maximum:.4g} "
            f"mean={self.mean:.4g} has_nan={self.has_nan} has_inf={self.has_inf}"
        )


def tensor_stats(tensor: torch.Tensor) -> TensorStats:
    """Min/max/mean over the finite values, plus NaN/Inf flags."""
    values = tensor.detach().float()
    finite = values[torch.isfinite(values)]
    if finite.numel():
        minimum, maximum, mean = finite.min().item(), finite.max().item(), finite.mean().item()
    else:
        minimum = maximum = mean = float("nan")
    return TensorStats(
        tuple(tensor.shape),
        str(tensor.dtype).replace("torch.", ""),
        minimum,
        maximum,
        mean,
        bool(torch.isnan(values).any()),
        bool(torch.isinf(values).any()),
    )


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        return [t for item in value.values() for t in _tensors(item)]
    if isinstance(value, list | tuple):
        return [t for item in value for t in _tensors(item)]
    return []


def _is_nonfinite(value: Any) -> bool:
    return any(t.is_floating_point() and not bool(torch.isfinite(t).all()) for t in _tensors(value))


@dataclass
class NonFiniteDiagnosis:
    """What went non-finite at one step, and where."""

    step: int
    kind: str  # 'loss' or 'gradient'
    loss_terms: dict[str, float] = field(default_factory=dict)
    module: str | None = None  # first module (in execution order) whose output was non-finite
    module_type: str | None = None
    input_stats: list[TensorStats] = field(default_factory=list)
    output_stats: list[TensorStats] = field(default_factory=list)
    parameters: list[str] = field(default_factory=list)  # non-finite parameters or gradients
    note: str = ""

    def message(self) -> str:
        terms = ", ".join(f"{k}={v:.4g}" for k, v in self.loss_terms.items())
        lines = [f"non-finite {self.kind} at step {self.step}" + (f" (loss terms: {terms})" if terms else "")]
        if self.module is not None:
            where = (
                f"module '{self.module}'"
                if self.module
                else "the model's own forward (outside any submodule)"
            )
            lines.append(f"first non-finite output: {where} ({self.module_type})")
            lines += [f"  input {i}: {s}" for i, s in enumerate(self.input_stats)]
            lines += [f"  output {i}: {s}" for i, s in enumerate(self.output_stats[:4])]
            if self.input_stats and any(s.has_nan or s.has_inf for s in self.input_stats):
                lines.append("  its input was already non-finite: check the data (images/targets) feeding it")
        if self.parameters:
            shown = ", ".join(self.parameters[:10]) + (" ..." if len(self.parameters) > 10 else "")
            lines.append(f"non-finite {'gradients' if self.kind == 'gradient' else 'parameters'}: {shown}")
        if self.note:
            lines.append(self.note)
        return "\n".join(lines)


def nonfinite_parameters(model: nn.Module) -> list[str]:
    return [name for name, p in model.named_parameters() if not bool(torch.isfinite(p.detach()).all())]


def nonfinite_gradients(model: nn.Module) -> list[str]:
    return [
        name
        for name, p in model.named_parameters()
        if p.grad is not None and not bool(torch.isfinite(p.grad.detach()).all())
    ]


def locate_nonfinite_module(model: nn.Module, forward: Callable[[], Any]) -> dict[str, Any] | None:
    """Re-run `forward()` with hooks on every module; return the first one whose output is non-finite.

    Returns None when the re-run is finite everywhere (the NaN came from elsewhere, e.g. the backward).
    """
    found: dict[str, Any] = {}
    names = {module: name for name, module in model.named_modules()}

    def hook(module: nn.Module, inputs: Any, output: Any) -> None:
        if found or not _is_nonfinite(output):
            return
        found.update(
            module=names.get(module, "?"),
            module_type=type(module).__name__,
            input_stats=[tensor_stats(t) for t in _tensors(inputs) if t.is_floating_point()][:4],
            output_stats=[tensor_stats(t) for t in _tensors(output) if t.is_floating_point()][:4],
        )

    buffers = {name: buffer.detach().clone() for name, buffer in model.named_buffers()}
    rng_state = torch.get_rng_state()
    cuda_rng = (
        torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    )
    handles = [module.register_forward_hook(hook) for module in model.modules()]
    try:
        with torch.no_grad():
            forward()
    except Exception as error:  # the diagnosis must not hide the original problem
        found.setdefault("note", f"diagnosis re-run raised {type(error).__name__}: {error}")
    finally:
        for handle in handles:
            handle.remove()
        with torch.no_grad():
            for name, buffer in model.named_buffers():
                buffer.copy_(buffers[name])
        torch.set_rng_state(rng_state)
        if cuda_rng is not None:
            torch.cuda.set_rng_state_all(cuda_rng)
    return found or None


def diagnose_nonfinite(
    model: nn.Module, step: int, kind: str, loss_terms: dict[str, float], forward: Callable[[], Any] | None
) -> NonFiniteDiagnosis:
    diagnosis = NonFiniteDiagnosis(step=step, kind=kind, loss_terms=loss_terms)
    if kind == "gradient":
        diagnosis.parameters = nonfinite_gradients(model)
        return diagnosis
    diagnosis.parameters = nonfinite_parameters(model)
    if forward is not None:
        located = locate_nonfinite_module(model, forward)
        if located is None:
            diagnosis.note = "the diagnosis re-run produced finite outputs in every module"
        else:
            for key, value in located.items():
                setattr(diagnosis, key, value)
    return diagnosis


class NonFiniteGuard:
    """Applies the `on_nonfinite` policy: 'stop' raises at once; 'skip' warns and raises after
    `max_consecutive` non-finite steps in a row."""

    def __init__(self, policy: str = "skip", max_consecutive: int = 20, log: logging.Logger | None = None):
        if policy not in ("skip", "stop"):
            raise ValueError(f"on_nonfinite must be 'skip' or 'stop', got {policy!r}")
        self.policy = policy
        self.max_consecutive = max_consecutive
        self.consecutive = 0
        self.total = 0
        self.log = log or logger

    def record(self, diagnosis: NonFiniteDiagnosis | None, message: str | None = None) -> None:
        """Count one skipped step; raise NonFiniteError when the policy says stop."""
        self.total += 1
        self.consecutive += 1
        text = message or (diagnosis.message() if diagnosis else "non-finite value")
        if self.policy == "stop":
            raise NonFiniteError(f"{text}\n(on_nonfinite='stop'; use 'skip' to skip such batches)")
        if self.consecutive >= self.max_consecutive:
            raise NonFiniteError(
                f"{self.consecutive} consecutive non-finite steps; stopping. Last: {text}\n"
                "Try a lower lr, --no-amp, or check the data with `defectdet doctor nan`."
            )
        self.log.warning("skipping batch: %s", text)

    def finite(self) -> None:
        self.consecutive = 0

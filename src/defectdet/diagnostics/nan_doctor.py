"""`nan_report`: forward and backward a few batches with hooks on every module, in float32 and under autocast,
and name the first module whose output (or gradient) is NaN/Inf, in which dtype, and whether its input or its
parameters were already bad."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from torch import nn

from defectdet.diagnostics.report import Finding
from defectdet.engine.grad_stats import layer_gradient_norms
from defectdet.engine.nonfinite import _tensors, nonfinite_gradients, nonfinite_parameters, tensor_stats

DTYPE_MAX = {
    "float32": torch.finfo(torch.float32).max,
    "float16": 65504.0,
    "bfloat16": torch.finfo(torch.bfloat16).max,
}


@dataclasses.dataclass
class LayerStats:
    module: str
    module_type: str
    output_dtype: str = ""
    output_absmax: float = 0.0
    output_nonfinite: int = 0  # elements, summed over batches
    gradient_absmax: float = 0.0
    gradient_nonfinite: int = 0
    leaf: bool = True  # no child modules: its output is its own work, not a child's


@dataclasses.dataclass
class NanSource:
    """The first module whose output (phase 'forward') or output gradient ('backward') was not finite."""

    module: str
    module_type: str
    phase: str
    dtype: str
    kind: str  # 'nan', 'inf' or 'nan+inf'
    batch: int
    input_was_bad: bool
    bad_parameters: list[str]
    input_stats: list[str]
    output_stats: list[str]


@dataclasses.dataclass
class PassResult:
    name: str  # 'float32' or 'bfloat16 autocast' ...
    dtype: str
    losses: list[float]
    forward_source: NanSource | None
    backward_source: NanSource | None
    nonfinite_gradients: list[str]
    max_activation: float
    max_activation_module: str
    headroom: float  # dtype max / largest finite activation
    layers: list[LayerStats]
    error: str = ""

    @property
    def finite(self) -> bool:
        return (
            self.forward_source is None
            and self.backward_source is None
            and not self.nonfinite_gradients
            and not self.error
        )


@dataclasses.dataclass
class NanReport:
    model: str
    batches: int
    bad_parameters: list[str]  # non-finite before any step: the weights themselves
    passes: list[PassResult]
    findings: list[Finding]


def default_loss(model: nn.Module, batch: Any) -> torch.Tensor:
    """(images, targets, ...) -> model(images, targets)['loss']; a tensor batch -> model(batch).float().mean()."""
    if isinstance(batch, torch.Tensor):
        output = model(batch)
    else:
        output = model(batch[0], batch[1]) if len(batch) > 1 else model(batch[0])
    if isinstance(output, dict):
        return output["loss"] if "loss" in output else sum(value.float().sum() for value in output.values())
    return output.float().mean()


def _kind(tensors: list[torch.Tensor]) -> str:
    has_nan = any(bool(torch.isnan(t).any()) for t in tensors)
    has_inf = any(bool(torch.isinf(t).any()) for t in tensors)
    return "nan+inf" if has_nan and has_inf else ("nan" if has_nan else "inf")


def _bad(tensors: list[torch.Tensor]) -> bool:
    return any(t.is_floating_point() and not bool(torch.isfinite(t).all()) for t in tensors)


def _finite_absmax(tensor: torch.Tensor) -> float:
    values = tensor.detach().float().abs()
    values = values[torch.isfinite(values)]
    return float(values.max()) if values.numel() else 0.0


class _Recorder:
    """Forward hooks on every module; tensor hooks on their outputs for the backward."""

    def __init__(self, model: nn.Module) -> None:
        self.names = {module: name or "(model)" for name, module in model.named_modules()}
        self.layers = {
            name: LayerStats(name, type(module).__name__, leaf=not any(True for _ in module.children()))
            for module, name in self.names.items()
        }
        self.forward_source: NanSource | None = None
        self.backward_source: NanSource | None = None
        self.batch = 0
        self.handles = [module.register_forward_hook(self._forward) for module in model.modules()]

    def close(self) -> None:
        for handle in self.handles:
            handle.remove()

    def _source(
        self, module: nn.Module, phase: str, inputs: list[torch.Tensor], outputs: list[torch.Tensor]
    ) -> NanSource:
        return NanSource(
            module=self.names[module],
            module_type=type(module).__name__,
            phase=phase,
            dtype=str(outputs[0].dtype).replace("torch.", ""),
            kind=_kind(outputs),
            batch=self.batch,
            input_was_bad=_bad(inputs),
            bad_parameters=[
                name for name, p in module.named_parameters() if not bool(torch.isfinite(p.detach()).all())
            ],
            input_stats=[str(tensor_stats(t)) for t in inputs[:2]],
            output_stats=[str(tensor_stats(t)) for t in outputs[:2]],
        )

    def _forward(self, module: nn.Module, inputs: Any, output: Any) -> None:
        outputs = [t for t in _tensors(output) if t.is_floating_point()]
        if not outputs:
            return
        stats = self.layers[self.names[module]]
        stats.output_dtype = str(outputs[0].dtype).replace("torch.", "")
        stats.output_absmax = max(stats.output_absmax, max(_finite_absmax(t) for t in outputs))
        bad = sum(int((~torch.isfinite(t.detach())).sum()) for t in outputs)
        stats.output_nonfinite += bad
        input_tensors = [t for t in _tensors(inputs) if t.is_floating_point()]
        if bad and self.forward_source is None:
            self.forward_source = self._source(module, "forward", input_tensors, outputs)
        for tensor in outputs:
            if tensor.requires_grad:
                tensor.register_hook(self._gradient_hook(module, input_tensors, stats))

    def _gradient_hook(self, module: nn.Module, inputs: list[torch.Tensor], stats: LayerStats) -> Callable:
        def hook(gradient: torch.Tensor) -> None:
            stats.gradient_absmax = max(stats.gradient_absmax, _finite_absmax(gradient))
            bad = int((~torch.isfinite(gradient)).sum())
            stats.gradient_nonfinite += bad
            if bad and self.backward_source is None:
                self.backward_source = self._source(module, "backward", inputs, [gradient])

        return hook


def run_pass(
    model: nn.Module,
    batches: Sequence[Any],
    dtype: torch.dtype,
    device: torch.device,
    loss_fn: Callable[[nn.Module, Any], torch.Tensor] = default_loss,
) -> PassResult:
    """Forward + backward each batch on a copy of `model` (train mode), under autocast unless float32."""
    model = copy.deepcopy(model).to(device).train()
    name = str(dtype).replace("torch.", "")
    recorder = _Recorder(model)
    losses: list[float] = []
    bad_gradients: list[str] = []
    error = ""
    autocast = (
        contextlib.nullcontext()
        if dtype == torch.float32
        else torch.autocast(device_type=device.type, dtype=dtype)
    )
    try:
        for index, batch in enumerate(batches):
            recorder.batch = index
            model.zero_grad(set_to_none=True)
            with autocast:
                loss = loss_fn(model, _to_device(batch, device))
            losses.append(float(loss.detach().float()))
            loss.backward()
            bad_gradients = bad_gradients or nonfinite_gradients(model)
            layer_gradient_norms(model)
    except (RuntimeError, ValueError) as exception:
        error = f"{type(exception).__name__}: {str(exception).splitlines()[0]}"
    finally:
        recorder.close()
    layers = list(recorder.layers.values())
    leaves = [layer for layer in layers if layer.leaf] or layers
    largest = max(leaves, key=lambda layer: layer.output_absmax)
    return PassResult(
        name=name if dtype == torch.float32 else f"{name} autocast",
        dtype=name,
        losses=losses,
        forward_source=recorder.forward_source,
        backward_source=recorder.backward_source,
        nonfinite_gradients=bad_gradients,
        max_activation=largest.output_absmax,
        max_activation_module=largest.module,
        headroom=DTYPE_MAX[name] / largest.output_absmax if largest.output_absmax else float("inf"),
        layers=layers,
        error=error,
    )


def _to_device(batch: Any, device: torch.device) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.to(device)
    if isinstance(batch, list | tuple):
        return type(batch)(_to_device(item, device) for item in batch)
    return batch


def autocast_dtypes(device: torch.device) -> list[torch.dtype]:
    """float32, then what training would autocast to: bfloat16 on CPU; float16 (and bfloat16 if supported) on CUDA."""
    if device.type == "cuda":
        return [torch.float32, torch.float16] + ([torch.bfloat16] if torch.cuda.is_bf16_supported() else [])
    return [torch.float32, torch.bfloat16]


def _reference_absmax(reference: PassResult | None, module: str) -> float | None:
    """The module's largest output in a finite float32 pass, when there is one."""
    if reference is None or not reference.finite:
        return None
    return next((layer.output_absmax for layer in reference.layers if layer.module == module), None)


def _pass_findings(result: PassResult, reference: PassResult | None = None) -> list[Finding]:
    if result.error:
        return [
            Finding(
                "error", result.name, f"{result.name}: the step raised {result.error}", "fix the error first"
            )
        ]
    source = result.forward_source or result.backward_source
    if source is None and not result.nonfinite_gradients:
        level = "warning" if result.headroom < 10 else "ok"
        losses = ", ".join(f"{loss:.4g}" for loss in result.losses)
        message = (
            f"{result.name}: finite (loss {losses}); largest activation {result.max_activation:.3g} "
            f"in '{result.max_activation_module}'"
        )
        if result.dtype != "float32":
            message += f", {result.headroom:.3g}x below the {result.dtype} maximum"
        advice = (
            "activations are close to the dtype's range: normalise inputs or use bfloat16"
            if level == "warning"
            else ""
        )
        return [Finding(level, result.name, message, advice)]
    if source is None:
        shown = ", ".join(result.nonfinite_gradients[:5])
        return [
            Finding(
                "error",
                result.name,
                f"{result.name}: non-finite gradients in {shown}",
                "lower the lr; keep clip_grad_norm on",
            )
        ]
    where = f"'{source.module}' ({source.module_type}), {source.phase}, output {source.kind} in {source.dtype}, batch {source.batch}"
    if source.input_was_bad and source.phase == "forward":
        cause, advice = (
            "its input was already non-finite",
            "check the data: `defectdet check DATA`, and the preprocessing",
        )
    elif source.bad_parameters:
        cause = f"its parameters are non-finite ({', '.join(source.bad_parameters[:3])})"
        advice = "the weights diverged before this checkpoint: resume from an earlier one with a lower lr"
    elif source.dtype in ("float16", "bfloat16") and (
        source.kind == "inf" or _reference_absmax(reference, source.module) is not None
    ):
        in_float32 = _reference_absmax(reference, source.module)
        reached = f"; in float32 its output reaches {in_float32:.4g}" if in_float32 is not None else ""
        cause = (
            f"finite input and weights: an overflow of the {source.dtype} range "
            f"(max {DTYPE_MAX[source.dtype]:.4g}){reached}"
        )
        advice = f"train without {source.dtype} autocast (--no-amp), or keep '{source.module}' in float32"
    else:
        cause = "finite input and weights: the operation itself overflows or divides by zero"
        advice = f"look at '{source.module}': clamp, add an epsilon, or compute it in float32"
    return [
        Finding("error", result.name, f"{result.name}: first non-finite value at {where}; {cause}", advice)
    ]


def nan_report(
    model: nn.Module,
    batches: Iterable[Any],
    dtypes: Sequence[torch.dtype] | None = None,
    device: str | torch.device = "cpu",
    loss_fn: Callable[[nn.Module, Any], torch.Tensor] = default_loss,
    name: str = "model",
) -> NanReport:
    """Run `batches` through copies of `model` once per dtype (float32, then autocast: see `autocast_dtypes`).

    A batch is `(images, targets, ...)` for `model(images, targets)` returning a loss dict, or a tensor;
    pass `loss_fn(model, batch) -> loss` for anything else. The model itself is not modified.
    """
    device = torch.device(device)
    batches = list(batches)
    passes = [
        run_pass(model, batches, dtype, device, loss_fn) for dtype in (dtypes or autocast_dtypes(device))
    ]
    bad_parameters = nonfinite_parameters(model)
    findings: list[Finding] = []
    if bad_parameters:
        findings.append(
            Finding(
                "error",
                "weights",
                f"{len(bad_parameters)} parameter tensor(s) are already non-finite ({', '.join(bad_parameters[:3])})",
                "these weights cannot recover: resume from an earlier checkpoint with a lower lr",
            )
        )
    reference = next((result for result in passes if result.dtype == "float32"), None)
    for result in passes:
        findings += _pass_findings(result, reference if result is not reference else None)
    failing = [result.name for result in passes if not result.finite]
    if failing and len(failing) < len(passes):
        fine = [result.name for result in passes if result.finite]
        findings.append(
            Finding(
                "warning",
                "dtype",
                f"fails in {', '.join(failing)}; finite in {', '.join(fine)}",
                f"train in {fine[0]}",
            )
        )
    return NanReport(name, len(batches), bad_parameters, passes, findings)

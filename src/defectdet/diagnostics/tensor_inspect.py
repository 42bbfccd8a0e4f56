"""`inspect(tensor)`: storage, strides, autograd history, and the ops that will copy behind your back."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch

from defectdet.diagnostics.report import Finding, format_bytes
from defectdet.errors import CheckpointError


@dataclasses.dataclass
class TensorInspection:
    """Everything about one tensor that decides whether an op copies, fails or keeps memory alive."""

    name: str
    shape: list[int]
    strides: list[int]
    dtype: str
    device: str
    contiguous: bool
    channels_last: bool
    storage_pointer: int
    storage_offset: int
    storage_bytes: int
    tensor_bytes: int
    requires_grad: bool
    is_leaf: bool
    grad_fn_chain: list[str]
    shares_storage_with: list[str]
    findings: list[Finding]


def grad_fn_chain(tensor: torch.Tensor, limit: int = 12) -> list[str]:
    """The autograd graph from `tensor` back towards its leaves, first parent first (breadth-first)."""
    chain: list[str] = []
    queue = [tensor.grad_fn] if tensor.grad_fn is not None else []
    seen: set[int] = set()
    while queue and len(chain) < limit:
        function = queue.pop(0)
        if function is None or id(function) in seen:
            continue
        seen.add(id(function))
        chain.append(type(function).__name__)
        queue.extend(parent for parent, _ in getattr(function, "next_functions", ()))
    return chain


def _copy_findings(tensor: torch.Tensor, strides: list[int]) -> list[Finding]:
    findings: list[Finding] = []
    size = format_bytes(tensor.numel() * tensor.element_size())
    if tensor.numel() > 1:
        try:
            tensor.view(-1)
        except RuntimeError:
            channels_last = tensor.dim() == 4 and tensor.is_contiguous(memory_format=torch.channels_last)
            findings.append(
                Finding(
                    "info" if channels_last else "warning",  # NHWC on purpose: only flattening copies
                    "view",
                    f"not contiguous (strides {strides}): .view(-1) raises, .reshape(-1) / .flatten() "
                    f"silently copy {size}",
                    "call .contiguous() once where a copy is intended (e.g. after .transpose/.permute), "
                    "or keep the strided layout and use ops that accept it",
                )
            )
    if 0 in strides and tensor.numel() > 1:
        findings.append(
            Finding(
                "info",
                "expand",
                "a broadcast view (a stride of 0): in-place writes fail and .contiguous() materialises "
                f"{size}",
                "clone() before writing into it",
            )
        )
    if tensor.device.type != "cpu":
        findings.append(
            Finding(
                "warning",
                "numpy",
                f".numpy() fails on {tensor.device}: .cpu() first copies {size} device -> host",
                "move results to the CPU once, batched, not per element (.item() syncs every call)",
            )
        )
    elif tensor.requires_grad:
        findings.append(
            Finding("info", "numpy", ".numpy() fails on a tensor that requires grad", "use .detach().numpy()")
        )
    elif not tensor.is_contiguous():
        findings.append(
            Finding(
                "info",
                "numpy",
                ".numpy() shares memory but returns a strided array: OpenCV, ONNX Runtime and "
                f"np.ascontiguousarray copy {size}",
                "make it contiguous once before handing it to OpenCV / ONNX Runtime",
            )
        )
    return findings


def _storage_findings(tensor: torch.Tensor, storage_bytes: int, tensor_bytes: int) -> list[Finding]:
    if storage_bytes > 2 * max(tensor_bytes, 1) and storage_bytes - tensor_bytes > 1024:
        return [
            Finding(
                "warning",
                "storage",
                f"a view of {format_bytes(tensor_bytes)} keeps a {format_bytes(storage_bytes)} storage alive; "
                "torch.save writes the whole storage",
                ".clone() the slice before keeping or saving it",
            )
        ]
    return []


def inspect(
    tensor: torch.Tensor, name: str = "tensor", others: dict[str, torch.Tensor] | None = None
) -> TensorInspection:
    """Describe `tensor`; `others` (name -> tensor) are checked for storage shared with it."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"inspect() expects a torch.Tensor, got {type(tensor).__name__}")
    strides = list(tensor.stride())
    storage = tensor.untyped_storage()
    pointer = storage.data_ptr()
    storage_bytes = storage.nbytes()
    tensor_bytes = tensor.numel() * tensor.element_size()
    shared = [
        other_name
        for other_name, other in (others or {}).items()
        if other is not tensor and other.untyped_storage().data_ptr() == pointer and pointer != 0
    ]
    channels_last = tensor.dim() == 4 and tensor.is_contiguous(memory_format=torch.channels_last)
    findings = _copy_findings(tensor, strides) + _storage_findings(tensor, storage_bytes, tensor_bytes)
    if shared:
        findings.append(
            Finding(
                "info",
                "sharing",
                f"shares its storage with {', '.join(shared)}: an in-place change to one changes the others",
                "clone() where an independent copy is meant",
            )
        )
    if channels_last and not tensor.is_contiguous():
        findings.append(
            Finding("info", "layout", "channels_last (NHWC) memory format: fast for convolutions on CPU")
        )
    return TensorInspection(
        name=name,
        shape=list(tensor.shape),
        strides=strides,
        dtype=str(tensor.dtype).replace("torch.", ""),
        device=str(tensor.device),
        contiguous=tensor.is_contiguous(),
        channels_last=channels_last,
        storage_pointer=pointer,
        storage_offset=tensor.storage_offset(),
        storage_bytes=storage_bytes,
        tensor_bytes=tensor_bytes,
        requires_grad=tensor.requires_grad,
        is_leaf=tensor.is_leaf,
        grad_fn_chain=grad_fn_chain(tensor),
        shares_storage_with=shared,
        findings=findings,
    )


def _collect_tensors(value: Any, prefix: str, found: dict[str, torch.Tensor]) -> None:
    if isinstance(value, torch.Tensor):
        found[prefix or "tensor"] = value
    elif isinstance(value, dict):
        for key, item in value.items():
            _collect_tensors(item, f"{prefix}.{key}" if prefix else str(key), found)
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            _collect_tensors(item, f"{prefix}.{index}" if prefix else str(index), found)


def inspect_file(path: str | Path, key: str | None = None, limit: int = 50) -> list[TensorInspection]:
    """Inspect the tensors saved in `path` (a tensor, or dicts/lists of them; loaded with weights_only=True).

    torch.save keeps storage sharing, so tensors saved as views of one another are reported as sharing.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: file not found")
    try:
        value = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:
        raise CheckpointError(f"{path}: cannot be read as a saved tensor ({type(error).__name__})") from None
    tensors: dict[str, torch.Tensor] = {}
    _collect_tensors(value, "", tensors)
    if not tensors:
        raise CheckpointError(f"{path}: holds no tensors (found {type(value).__name__})")
    if key is not None:
        if key not in tensors:
            names = ", ".join(list(tensors)[:10])
            raise CheckpointError(f"{path}: no tensor named {key!r} (some names: {names})")
        return [inspect(tensors[key], key, tensors)]
    return [inspect(tensor, name, tensors) for name, tensor in list(tensors.items())[:limit]]

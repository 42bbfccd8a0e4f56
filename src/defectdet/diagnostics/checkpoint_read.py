"""Read any checkpoint onto the CPU and find its weights: a bare state_dict, a defectdet checkpoint, another
framework's dict (Lightning `state_dict`, `model_state_dict`, `net`, ...), or, only when asked, a pickled model."""

from __future__ import annotations

import dataclasses
import logging
import pickle
import re
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from defectdet.diagnostics.report import format_bytes
from defectdet.errors import CheckpointError

logger = logging.getLogger(__name__)

WEIGHT_KEYS = (
    "model",
    "state_dict",
    "model_state_dict",
    "model_state",
    "net",
    "network",
    "weights",
    "params",
)
UNSAFE_WARNING = (
    "--unsafe unpickles arbitrary Python objects: a malicious file runs code on this machine. "
    "Only use it on files you made or trust."
)


@dataclasses.dataclass
class LoadedCheckpoint:
    """What `read_checkpoint` found. `weights_key` is None for a bare state_dict or a pickled model."""

    path: Path
    raw: Any
    state_dict: dict[str, torch.Tensor]
    weights_key: str | None
    layout: str
    saved_devices: dict[str, str]  # key -> device the tensor was saved from
    file_bytes: int


def is_state_dict(value: Any) -> bool:
    """A non-empty mapping of string keys to tensors (a few plain values, like Lightning metadata, allowed)."""
    if not isinstance(value, Mapping) or not value:
        return False
    tensors = sum(isinstance(item, torch.Tensor) for item in value.values())
    return all(isinstance(key, str) for key in value) and tensors >= max(1, 0.9 * len(value))


def _torch_load(path: Path, unsafe: bool) -> tuple[Any, dict[int, str]]:
    """torch.load onto the CPU, remembering each storage's saved location (e.g. 'cuda:0')."""
    locations: dict[int, str] = {}

    def to_cpu(storage: Any, location: str) -> Any:
        locations[storage.data_ptr()] = location
        return storage

    try:
        return torch.load(path, map_location=to_cpu, weights_only=not unsafe), locations
    except pickle.UnpicklingError as error:
        found = re.search(r"Unsupported global: GLOBAL ([\w.]+)", str(error))
        if not unsafe and found:
            raise CheckpointError(
                f"{path}: holds pickled Python objects ({found.group(1)}) (a whole saved model?) that weights_only "
                "loading refuses; re-save it as a state_dict, or pass --unsafe if you trust the file"
            ) from None
        kind = describe_bytes(path)
        if not unsafe and kind.startswith("a pickle stream"):
            raise CheckpointError(
                f"{path}: {kind}, not a torch.save archive, and weights_only loading cannot read it "
                f"({_weights_only_reason(error)}); re-save it with torch.save, or pass --unsafe if you trust the file"
            ) from None
        raise CheckpointError(
            f"{path}: not a torch checkpoint: {kind} ({_weights_only_reason(error)})"
        ) from None
    except Exception as error:
        raise CheckpointError(
            f"{path}: corrupt or not a torch checkpoint: {describe_bytes(path)} ({_first_line(error)})"
        ) from None


def describe_bytes(path: Path) -> str:
    """What a file that torch cannot load actually is, from its first bytes: empty, a torch zip archive, another
    zip archive, a damaged zip archive, a pickle stream (with its protocol), text, or unknown bytes."""
    try:
        with path.open("rb") as handle:
            head = handle.read(64)
    except OSError as error:
        return f"an unreadable file ({error.strerror or error})"
    if not head:
        return "an empty file"
    if head.startswith(b"PK\x03\x04"):
        try:
            with zipfile.ZipFile(path) as archive:
                names = archive.namelist()
        except (zipfile.BadZipFile, OSError, ValueError, EOFError):
            return "a damaged zip archive (truncated or overwritten?)"
        if any(name == "data.pkl" or name.endswith("/data.pkl") for name in names):
            return f"a torch zip archive ({len(names)} entries)"
        shown = ", ".join(names[:4]) + (", ..." if len(names) > 4 else "")
        return f"a zip archive that is not a torch checkpoint (no data.pkl; holds {shown or 'nothing'})"
    if head[0] == 0x80 and len(head) > 1 and 2 <= head[1] <= 5:
        return f"a pickle stream (protocol {head[1]})"
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is not None and all(char.isprintable() or char in "\r\n\t" for char in text):
        first = text.splitlines()[0][:24] if text.splitlines() else ""
        return f"a text file (starts with {first!r})"
    return f"unknown bytes ({head[:8].hex(' ')} ...), neither a zip archive nor a pickle stream"


def _first_line(error: BaseException) -> str:
    """The exception's type and its first sentence (torch's messages run for paragraphs)."""
    text = str(error).strip()
    if not text:
        return type(error).__name__
    sentence = text.splitlines()[0].split(". ")[0].rstrip(".")
    return f"{type(error).__name__}: {sentence[:160]}"


def _weights_only_reason(error: BaseException) -> str:
    """The part of torch's long weights_only message that says what was refused."""
    found = re.search(r"WeightsUnpickler error:\s*(.+?)(?:\s{2,}|\n|$)", str(error))
    return found.group(1).strip() if found else _first_line(error)


def _find_weights(raw: Any) -> tuple[dict[str, torch.Tensor], str | None, str]:
    if isinstance(raw, nn.Module):
        return raw.state_dict(), None, f"pickled model ({type(raw).__name__})"
    if is_state_dict(raw):
        return {k: v for k, v in raw.items() if isinstance(v, torch.Tensor)}, None, "bare state_dict"
    if isinstance(raw, Mapping):
        for key in WEIGHT_KEYS:
            value = raw.get(key)
            if isinstance(value, nn.Module):
                return value.state_dict(), key, f"dict with a pickled model under '{key}'"
            if is_state_dict(value):
                layout = (
                    "defectdet checkpoint"
                    if "model_config" in raw and key == "model"
                    else f"dict, weights under '{key}'"
                )
                return {k: v for k, v in value.items() if isinstance(v, torch.Tensor)}, key, layout
        for key, value in raw.items():  # any other entry that is a state_dict
            if is_state_dict(value):
                return dict(value), str(key), f"dict, weights under '{key}'"
        found = ", ".join(map(str, list(raw)[:12]))
        raise CheckpointError(f"found no state_dict (a dict of tensors) in the checkpoint; its keys: {found}")
    raise CheckpointError(f"holds a {type(raw).__name__}, not a state_dict or a checkpoint dict")


def read_checkpoint(path: str | Path, unsafe: bool = False) -> LoadedCheckpoint:
    """Load `path` on the CPU (weights_only unless `unsafe`) and locate its weights."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: checkpoint file not found")
    if unsafe:
        logger.warning("%s", UNSAFE_WARNING)
    raw, locations = _torch_load(path, unsafe)
    try:
        state_dict, weights_key, layout = _find_weights(raw)
    except CheckpointError as error:
        raise CheckpointError(f"{path}: {error}") from None
    devices = {
        key: locations.get(tensor.untyped_storage().data_ptr(), "cpu") for key, tensor in state_dict.items()
    }
    return LoadedCheckpoint(path, raw, state_dict, weights_key, layout, devices, path.stat().st_size)


def _tensor_bytes(value: Any) -> tuple[int, int]:
    """(tensor count, bytes) inside any nesting of dicts and lists."""
    if isinstance(value, torch.Tensor):
        return 1, value.numel() * value.element_size()
    if isinstance(value, Mapping):
        parts = [_tensor_bytes(item) for item in value.values()]
    elif isinstance(value, list | tuple):
        parts = [_tensor_bytes(item) for item in value]
    else:
        return 0, 0
    return sum(count for count, _ in parts), sum(size for _, size in parts)


def describe_contents(checkpoint: LoadedCheckpoint) -> dict[str, str]:
    """What the checkpoint holds besides its weights: optimizer state, EMA, epoch, config ... (name -> summary)."""
    raw = checkpoint.raw
    if not isinstance(raw, Mapping) or checkpoint.weights_key is None:
        return {}
    contents: dict[str, str] = {}
    for key, value in raw.items():
        if key == checkpoint.weights_key:
            continue
        count, size = _tensor_bytes(value)
        if value is None:
            summary = "None"
        elif isinstance(value, list | tuple | dict) and not value:
            summary = f"empty {type(value).__name__}"
        elif isinstance(value, int | float | str | bool):
            summary = repr(value) if len(repr(value)) < 60 else repr(value)[:57] + "..."
        elif key in ("optimizer", "optimizer_state_dict") and isinstance(value, Mapping):
            summary = f"optimizer state: {len(value.get('state', {}))} parameter(s), {format_bytes(size)}"
        elif key == "ema" and isinstance(value, Mapping):
            summary = (
                f"EMA weights: {count} tensor(s), {format_bytes(size)}, updates={value.get('updates', '?')}"
            )
        elif count:
            summary = f"{count} tensor(s), {format_bytes(size)}"
        elif isinstance(value, list | tuple) and all(isinstance(item, str | int | float) for item in value):
            shown = ", ".join(map(str, value[:6])) + (", ..." if len(value) > 6 else "")
            summary = f"{len(value)} item(s): {shown}"
        elif isinstance(value, Mapping):
            summary = f"{len(value)} entries"
        else:
            summary = type(value).__name__
        contents[str(key)] = summary
    return contents

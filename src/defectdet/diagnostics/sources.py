"""Build what the doctor commands run on from user paths: the training dataset a config describes, and the
training model (not the EMA) a checkpoint holds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from defectdet.diagnostics.doctor_settings import NanDoctorSettings
from defectdet.errors import CheckpointError


def training_data(
    data: str | Path, config: str | Path | None = None, preset: str | None = None, **overrides: Any
) -> tuple[Any, Any]:
    """(TrainConfig, TrainData) exactly as `defectdet train DATA [--config ...]` would build them (no val split)."""
    from defectdet.engine.config import load_config
    from defectdet.engine.trainer import build_train_data

    values: dict[str, Any] = {"data": str(data), "val_split": None, **overrides}
    if preset is not None:
        values["preset"] = preset
    train_config = load_config(config, values)
    train_data = build_train_data(train_config)
    return getattr(train_data, "config", None) or train_config, train_data  # with auto settings filled


def training_model(checkpoint_path: str | Path, use_ema: bool = False) -> tuple[nn.Module, dict[str, Any]]:
    """The detector of a defectdet checkpoint with its training weights (`use_ema` for the EMA ones), train mode."""
    from defectdet.engine.checkpoint import load_detector

    model, checkpoint = load_detector(checkpoint_path, use_ema=use_ema)
    return model.train(), checkpoint


def nan_batches(
    checkpoint: dict[str, Any],
    model: nn.Module,
    data: str | Path,
    batches: int = 2,
    batch_size: int = 2,
    split: str | None = None,
    format: str | None = None,
) -> list[tuple[torch.Tensor, list[torch.Tensor]]]:
    """The first `batches` training batches of `data`, preprocessed as the checkpoint's run did (its input_size, crop,
    channels; no augmentation, so a rerun sees the same pixels). `format`: the dataset format (default: the run's
    when `data` is the run's dataset, else detected)."""
    from defectdet.data.formats import load_dataset
    from defectdet.runtime.spec import ModelSpec
    from defectdet.trainingdata.dataset import DetectionDataset, Draws, ItemLayout, collate_detections

    config = checkpoint.get("config") or {}
    spec = ModelSpec.from_checkpoint(checkpoint)
    taken = getattr(model, "in_channels", spec.input_channels)
    if taken != spec.input_channels:
        raise CheckpointError(
            f"the model takes {taken} input channels but its checkpoint describes {spec.input_channels}"
        )
    split_name = split or config.get("train_split") or "train"
    if format is None and str(data) == str(config.get("data")):
        format = config.get("format")
    dataset_split = load_dataset(data, split_name, format=format)
    if not dataset_split.samples:
        raise CheckpointError(f"{data}: split {split_name!r} has no samples")
    dataset = DetectionDataset(
        dataset_split,
        ItemLayout(
            input_size=spec.input_size,
            channels=spec.channels,
            template=spec.template,
            companions=spec.companions,
        ),
        # crop_size 0: whole images
        Draws(train=True, crop_size=config.get("crop_size") or None, seed=int(config.get("seed") or 0)),
    )
    result = []
    for start in range(0, min(len(dataset), batches * batch_size), batch_size):
        items = [dataset[index] for index in range(start, min(start + batch_size, len(dataset)))]
        images, targets, _ = collate_detections(items, empty_shape=dataset.output_shape)
        if len(images):
            result.append((images, targets))
    return result


def resolve_device(device: str) -> torch.device:
    """'auto' -> cuda when available, else cpu; 'cuda' without a GPU is a ConfigError."""
    from defectdet.errors import ConfigError

    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        chosen = torch.device(device)
    except RuntimeError:
        raise ConfigError(f"--device: unknown device {device!r}; use auto, cpu or cuda") from None
    if chosen.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda: torch sees no CUDA device on this machine")
    return chosen


def checkpoint_nan_report(
    checkpoint_path: str | Path, data: str | Path, settings: NanDoctorSettings | None = None
) -> Any:
    """`defectdet doctor nan CKPT DATA`: `nan_report` on the checkpoint's training model and the first batches of
    `data`, as `settings` say (default: `NanDoctorSettings()`); `settings.dtypes` are autocast dtypes to try
    besides float32 (default: bfloat16 on CPU, float16 on CUDA)."""
    from defectdet.diagnostics.nan_doctor import autocast_dtypes, nan_report
    from defectdet.errors import ConfigError

    settings = settings or NanDoctorSettings()
    valid = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
    unknown = [name for name in settings.dtypes or [] if name not in valid]
    if unknown:
        raise ConfigError(f"--dtype: unknown {unknown}; use float16, bfloat16 or float32")
    chosen = resolve_device(settings.device)
    model, state = training_model(checkpoint_path, use_ema=settings.use_ema)
    inputs = nan_batches(
        state,
        model,
        data,
        batches=settings.batches,
        batch_size=settings.batch_size,
        split=settings.split,
        format=settings.format,
    )
    if settings.dtypes:
        order = [torch.float32] + [valid[name] for name in settings.dtypes if name != "float32"]
    else:
        order = autocast_dtypes(chosen)
    return nan_report(model, inputs, dtypes=order, device=chosen, name=str(checkpoint_path))

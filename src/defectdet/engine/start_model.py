"""The model a fine-tune starts from (`train --from`): a training checkpoint or a bundle with embedded weights.

A bundle's graph has BatchNorm folded into its convolutions, so it cannot be trained as it stands; the exporter
therefore also stores the unfolded float state_dict (the checkpoint's EMA weights, the ones it exported) and the
model config in the ONNX file's `metadata_props[WEIGHTS_KEY]` (torch.save, zlib, base64), and `read_start`
restores exactly the model the bundle was exported from. Older bundles lack it: they are refused with a way out.

Classes are matched by name: the new data must keep every class of the model (a fine-tune does not silently
forget one); classes it adds get fresh logits rows, the old rows are copied.
"""

from __future__ import annotations

import base64
import io
import math
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from defectdet.compat import Surface, current_keys
from defectdet.errors import CheckpointError, ConfigError

WEIGHTS_KEY = "defectdet.weights"
WEIGHTS_FORMAT = "defectdet-bundle-weights/1"
CLASSIFIER_PREFIX = "head.classifiers."
# TrainConfig fields it fixes
ARCHITECTURE = ("preset", "input_size", "strides", "channels", "template", "companions")


@dataclass
class StartModel:
    """What `--from` names: the float weights, the model config they fit, the classes and training settings."""

    path: Path
    kind: str  # "checkpoint" | "bundle"
    model_config: dict[str, Any]
    state_dict: dict[str, torch.Tensor]
    class_names: list[str]
    train_config: dict[str, Any] = field(default_factory=dict)

    @property
    def architecture(self) -> dict[str, Any]:
        """The TrainConfig values the model was built with (preset, input_size, strides, channels, template,
        companions)."""
        from defectdet.model.detector import STRIDES_BY_LEVEL

        model, config = self.model_config, self.train_config
        in_channels, template = int(model["in_channels"]), bool(model["template"])
        companions = [str(name) for name in model.get("companions") or []]
        return {
            "preset": model.get("preset") or config.get("preset"),
            "input_size": current_keys(config, Surface.TRAIN_CONFIG, warn=False).get("input_size"),
            "strides": [STRIDES_BY_LEVEL[level] for level in model["levels"]],
            "channels": in_channels // (1 + int(template) + len(companions)),
            "template": template,
            "companions": companions,
        }


def encode_weights(model: nn.Module) -> str:
    """`model`'s float state_dict and config as one ASCII string (torch.save, zlib level 9, base64)."""
    buffer = io.BytesIO()
    state = {name: tensor.detach().cpu().clone() for name, tensor in model.state_dict().items()}
    torch.save({"format": WEIGHTS_FORMAT, "model_config": dict(model.config), "state_dict": state}, buffer)
    return base64.b64encode(zlib.compress(buffer.getvalue(), 9)).decode("ascii")


# A bundle is untrusted input: its compressed weights may inflate to at most this much (the small preset's
# state_dict is a few MB), so a zlib bomb in a bundle's metadata cannot exhaust memory.
MAX_EMBEDDED_WEIGHTS_BYTES = 256 * 1024 * 1024


def decode_weights(text: str, source: str | Path) -> dict[str, Any]:
    try:
        inflater = zlib.decompressobj()
        raw = inflater.decompress(
            base64.b64decode(text.encode("ascii"), validate=True), MAX_EMBEDDED_WEIGHTS_BYTES
        )
        if inflater.unconsumed_tail:
            raise CheckpointError(
                f"{source}: the embedded weights inflate beyond {MAX_EMBEDDED_WEIGHTS_BYTES >> 20} MiB; refused"
            )
        payload = torch.load(io.BytesIO(raw), map_location="cpu", weights_only=True)
    except CheckpointError:
        raise
    except Exception as error:  # noqa: BLE001 - base64, zlib and torch errors get one message
        raise CheckpointError(
            f"{source}: the embedded weights are unreadable ({type(error).__name__})"
        ) from None
    if not isinstance(payload, dict) or payload.get("format") != WEIGHTS_FORMAT:
        raise CheckpointError(f"{source}: the embedded weights are not in format {WEIGHTS_FORMAT!r}")
    return payload


def _read_bundle(path: Path) -> StartModel:
    import onnx

    from defectdet.runtime.predictor import Predictor

    # the checks predict, serve and compare run: the metadata must describe the graph (classes, input)
    metadata = Predictor(path, threads=1, tiles=False, repeat_check=False).metadata
    model = onnx.load(str(path), load_external_data=False)
    text = next((prop.value for prop in model.metadata_props if prop.key == WEIGHTS_KEY), None)
    if not text:
        raise CheckpointError(
            f"{path}: this bundle has no trainable weights (no {WEIGHTS_KEY!r} entry: exported before "
            "defectdet embedded them, and its graph has BatchNorm folded away); re-export it from its "
            "checkpoint with `defectdet export`, or pass the checkpoint to --from"
        )
    payload = decode_weights(text, path)
    model_config = payload.get("model_config")
    embedded = model_config.get("num_classes") if isinstance(model_config, dict) else None
    if embedded != len(metadata.class_names):
        raise CheckpointError(
            f"{path}: bundle metadata field 'class_names' lists {len(metadata.class_names)} class(es) but its "
            f"embedded weights have {embedded}"
        )
    embedded_companions = list(model_config.get("companions") or [])
    if embedded_companions != list(metadata.companions):
        raise CheckpointError(
            f"{path}: bundle metadata field 'companions' lists {list(metadata.companions)} but its embedded "
            f"weights read {embedded_companions}"
        )
    train_config = {**metadata.train_config, "input_size": metadata.input_size}
    return StartModel(
        path,
        "bundle",
        payload["model_config"],
        payload["state_dict"],
        list(metadata.class_names),
        train_config,
    )


def _read_checkpoint(path: Path) -> StartModel:
    from defectdet.engine.checkpoint import load_checkpoint

    checkpoint = load_checkpoint(path)
    model_config = checkpoint.get("model_config")
    if not isinstance(model_config, dict):
        raise CheckpointError(
            f"{path}: no 'model_config' in the checkpoint; was it written by `defectdet train`?"
        )
    weights = checkpoint["ema"] if checkpoint.get("ema") is not None else checkpoint["model"]
    if isinstance(weights, dict) and "module" in weights:  # the EMA's state: its module's weights
        weights = weights["module"]
    names = checkpoint.get("class_names") or []
    return StartModel(path, "checkpoint", model_config, weights, list(names), checkpoint.get("config") or {})


def read_start(path: str | Path) -> StartModel:
    """The model a fine-tune starts from: a checkpoint (EMA weights when kept, as `export` uses) or a bundle."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"field 'start_from': {path} not found (a checkpoint .pt or a bundle .onnx)")
    return _read_bundle(path) if path.suffix.lower() == ".onnx" else _read_checkpoint(path)


def check_classes(start: StartModel, class_names: list[str], data: str | Path) -> None:
    """ConfigError unless `class_names` (the new data's) keeps every class of the model, by name."""
    dropped = [name for name in start.class_names if name not in class_names]
    if dropped:
        raise ConfigError(
            f"{data}: its classes {class_names} drop {dropped}, which {start.path.name} detects; a fine-tune "
            "cannot forget a class silently: keep the name in the dataset's class list (with no boxes if need "
            "be) or train --from-scratch"
        )


def build_start_model(start: StartModel, class_names: list[str]) -> tuple[nn.Module, str]:
    """The model of `start` with `class_names` classes, its weights loaded: everything when the classes are
    the same, else the old classes' logits rows copied by name and added classes left at their fresh init.
    Returns the model and a one-line summary."""
    from defectdet.engine.state_dict import load_state_dict_checked
    from defectdet.model import detector_from_config

    model = detector_from_config({**start.model_config, "num_classes": len(class_names)})
    weights = dict(start.state_dict)
    added = [name for name in class_names if name not in start.class_names]
    if class_names != start.class_names:
        fresh = model.state_dict()
        for key, old in start.state_dict.items():
            if key.startswith(CLASSIFIER_PREFIX) and old.shape[0] == len(start.class_names):
                rows = fresh[key].clone()
                for index, name in enumerate(class_names):
                    if name in start.class_names:
                        rows[index] = old[start.class_names.index(name)]
                weights[key] = rows
    load_state_dict_checked(model, weights, source=f"{start.path} weights")
    summary = f"all {len(weights)} tensors from {start.path.name}"
    if added:
        summary += f"; logits rows of the old classes kept by name, new classes {added} start fresh"
    elif class_names != start.class_names:
        summary += "; logits rows reordered by class name"
    return model, summary


def fit_config(config: Any, start: StartModel, train_split: Any) -> Any:
    """`config` with the model's architecture (preset, input_size, strides, channels, template, companions) filled
    in, so the data cannot choose another; ConfigError when a value set by the user, or the data's layout,
    differs."""
    architecture = start.architecture
    name = start.path.name
    if architecture["input_size"] is None:
        raise ConfigError(f"{start.path}: it records no input size; re-export or retrain it")
    for key in ("input_size", "strides", "channels", "template", "companions"):
        given = getattr(config, key)
        if given is not None and given != architecture[key]:
            raise ConfigError(
                f"field {key!r}: {given} was set, but {name} was built with {architecture[key]}; a fine-tune keeps "
                f"the model's {key} (drop the setting, or train --from-scratch)"
            )
    if architecture["template"]:
        lacking = sum(sample.template_path is None for sample in train_split.samples)
        if lacking:
            raise ConfigError(
                f"{config.data}: {lacking} of {len(train_split.samples)} training images have no template, but "
                f"{name} compares each image with its template (template layout); give them templates or train "
                "--from-scratch"
            )
    _check_start_companions(config, architecture["companions"], train_split, name)
    return config.model_copy(update={**architecture, "pretrained": False})


def _check_start_companions(config: Any, companions: list[str], train_split: Any, name: str) -> None:
    """ConfigError when the new data lacks a companion capture the model reads (the model's plane order is kept
    whatever order the data declares them in)."""
    declared = list(getattr(train_split, "companion_names", []))
    for companion in companions:
        if companion not in declared:
            raise ConfigError(
                f"{config.data}: {name} also reads the companion capture {companion!r}, which this dataset does "
                f"not declare (its companions: {', '.join(declared) or 'none'}); add it to the data.yaml "
                "`companions:` or train --from-scratch"
            )


def start_choices(choices: list[Any], start: StartModel, config: Any) -> list[Any]:
    """The settings table with the rows the model fixes marked "[from model] FILE", plus its preset, the
    starting weights and the learning rate rows."""
    from defectdet.engine.autoconfig import Choice
    from defectdet.engine.config import DEFAULT_LEARNING_RATES, FINE_TUNE_LR_FACTOR

    name = start.path.name
    fixed = f"[from model] {name}: the model was built with it"
    rows = []
    for choice in choices:
        if choice.name in ARCHITECTURE:
            rows.append(Choice(choice.name, choice.value, fixed, "model"))
        elif choice.name == "pretrained":
            why = f"[from model] starts from {name}'s weights ({start.kind}), not the shipped ones"
            rows.append(Choice("pretrained", False, why, "model"))
        else:
            rows.append(choice)
    default = DEFAULT_LEARNING_RATES[config.optimizer]
    if math.isclose(config.lr, default * FINE_TUNE_LR_FACTOR):
        why = (
            f"continuing from {name}: {FINE_TUNE_LR_FACTOR:g} x the {config.optimizer} default {default:g}, so "
            "small steps keep what it learned (set lr to override)"
        )
        rows.append(Choice("lr", config.lr, why, "auto"))
    else:
        rows.append(Choice("lr", config.lr, f"set by you (continuing from {name})", "user"))
    return rows


def good_only_start(config: Any) -> tuple[Any, list[Any]]:
    """`train DATA --from MODEL` where MODEL is a good-parts-only bundle (`defectdet fit`): it holds no detector
    weights to continue, so the detector is trained on DATA (the reviewed boxes) from the preset's standard
    start, and one settings row says so. `--old-data` is refused: the model was fitted on good images, not on
    labelled data (pass them as --clean-images). Any other config is returned as it is, with no row."""
    from defectdet.engine.autoconfig import Choice
    from defectdet.engine.config import DEFAULT_LEARNING_RATES, FINE_TUNE_LR_FACTOR
    from defectdet.runtime.anomaly_map import is_good_only
    from defectdet.runtime.bundle import read_metadata

    path = config.start_from
    if path is None or Path(path).suffix.lower() != ".onnx" or not Path(path).is_file():
        return config, []
    if not is_good_only(read_metadata(path)):
        return config, []
    name = Path(path).name
    if config.old_data is not None:
        raise ConfigError(
            f"field 'old_data': {name} is a good-parts-only model, fitted on defect-free images, not on labelled "
            "data; drop --old-data (pass its good images as --clean-images GOOD_DIR to train on them as "
            "defect-free examples)"
        )
    why = (
        f"{name} is a good-parts-only model: no detector weights to continue, so a new detector is trained on "
        f"{config.data} from the preset's standard start"
    )
    update: dict[str, Any] = {"start_from": None}
    default = DEFAULT_LEARNING_RATES[config.optimizer]
    if math.isclose(config.lr, default * FINE_TUNE_LR_FACTOR):  # the fine-tune's tenth, not the user's
        update["lr"] = default
    return config.model_copy(update=update), [Choice("start", "standard", why, "model")]

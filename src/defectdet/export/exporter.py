"""`export_bundle`: a training checkpoint -> one self-describing `.onnx` file (and optionally TorchScript,
`torch.export` and int8 variants). Part of `defectdet.export`, the torch side of deployment; the torch-free
side is `defectdet.runtime`.

The operating thresholds are measured on the validation split, and the drift reference on a bounded sample
of the training split spread over its groups, by running the exported file itself through `val`'s
prediction path, so the numbers in the bundle are the bundle's own.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from defectdet.compat import Surface, current_keys, with_keywords
from defectdet.engine.start_model import WEIGHTS_KEY, encode_weights
from defectdet.errors import ConfigError, DatasetError, DefectDetError
from defectdet.export.export_settings import ExportSettings
from defectdet.export.fragment_choice import choose_merged, merge_candidates
from defectdet.runtime.bundle import (
    FEATURES_OUTPUT,
    INPUT_NAME,
    PREDICTIONS_OUTPUT,
    BundleMetadata,
    Letterbox,
    Normalization,
    Thresholds,
    config_hash,
    write_metadata,
)
from defectdet.runtime.model_quality import validation_quality
from defectdet.runtime.pipeline import sample_companions
from defectdet.runtime.spec import ModelSpec

logger = logging.getLogger(__name__)

ONNX_OPSET = 17
FORMATS = ("onnx", "torchscript", "pt2", "all")
INT8_MAX_MAP50_DROP = 0.005  # 0.5 mAP@0.5 points
DRIFT_LAYERS = ["backbone.stride8.mean", "backbone.stride16.mean", "backbone.stride32.mean"]


@dataclass
class ExportResult:
    """Paths written and what was measured on the way."""

    bundle: Path
    metadata: BundleMetadata
    parity_max_abs_diff: float
    extra_files: dict[str, Path] = field(default_factory=dict)
    int8: dict[str, Any] | None = None
    measured_on: str | None = None


class _BundleGraph(nn.Module):
    """What the ONNX graph computes: predictions plus the pooled features the drift monitor watches."""

    def __init__(self, detector: nn.Module) -> None:
        super().__init__()
        self.detector = detector

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.detector.forward_with_features(images)


def fold_batchnorm(model: nn.Module) -> nn.Module:
    """Fold every eval-mode BatchNorm into the convolution before it (in place); returns ``model``."""
    from torch.nn.utils.fusion import fuse_conv_bn_eval

    from defectdet.model.backbone import ConvBnAct

    model.eval()
    for module in model.modules():
        if isinstance(module, ConvBnAct) and isinstance(module.norm, nn.BatchNorm2d):
            module.conv = fuse_conv_bn_eval(module.conv, module.norm)
            module.norm = nn.Identity()
    return model


def export_onnx_graph(detector: nn.Module, path: Path, channels: int, input_size: int) -> None:
    """Write the bare graph: input (B, C, S, S) with a dynamic batch, outputs predictions and features."""
    import onnx

    path.parent.mkdir(parents=True, exist_ok=True)
    graph = _BundleGraph(detector).eval()
    with torch.inference_mode(False), torch.no_grad():
        torch.onnx.export(
            graph,
            (torch.rand(1, channels, input_size, input_size),),
            str(path),
            opset_version=ONNX_OPSET,
            input_names=[INPUT_NAME],
            output_names=[PREDICTIONS_OUTPUT, FEATURES_OUTPUT],
            dynamic_axes={
                INPUT_NAME: {0: "batch"},
                PREDICTIONS_OUTPUT: {0: "batch"},
                FEATURES_OUTPUT: {0: "batch"},
            },
            do_constant_folding=True,
            dynamo=False,
        )
    onnx.checker.check_model(onnx.load(str(path)), full_check=True)


def embed_weights(path: Path, text: str) -> None:
    """Store `engine.start_model.encode_weights` output as the ONNX file's `metadata_props[WEIGHTS_KEY]`
    (other entries kept; `write_metadata` keeps this one): the BatchNorm-folded graph cannot be trained, these
    can."""
    import onnx

    model = onnx.load(str(path))
    kept = [prop for prop in model.metadata_props if prop.key != WEIGHTS_KEY]
    del model.metadata_props[:]
    model.metadata_props.extend(kept)
    entry = model.metadata_props.add()
    entry.key, entry.value = WEIGHTS_KEY, text
    onnx.save(model, str(path))


def base_metadata(detector: nn.Module, checkpoint: dict[str, Any]) -> BundleMetadata:
    """Metadata known from the checkpoint alone (thresholds from its logged validation when present): its
    `ModelSpec` written down, so a bundle's `ModelSpec.from_bundle` is its checkpoint's `from_checkpoint`."""
    from defectdet import __version__

    config = checkpoint.get("config") or {}
    spec = ModelSpec.from_checkpoint(checkpoint)
    described = (spec.input_channels, spec.template, list(spec.companions))
    taken = (detector.in_channels, bool(detector.template), list(getattr(detector, "companions", [])))
    if described != taken:
        raise DefectDetError(
            f"the checkpoint describes {described[0]} input channels (template={described[1]}, companions="
            f"{described[2]}) but the detector takes {taken[0]} (template={taken[1]}, companions={taken[2]}); "
            "this is a bug"
        )
    metrics = checkpoint.get("best_metrics") or checkpoint.get("metrics") or {}
    thresholds = Thresholds(
        nms_iou=spec.nms_iou,
        max_detections=spec.max_detections,
        score_floor=spec.score_floor,
    )
    logged = current_keys(metrics, Surface.CHECKPOINT_METRICS, warn=False).get("threshold")
    if isinstance(logged, float):
        thresholds.threshold, thresholds.threshold_source = (
            logged,
            "best F1 logged by training on its validation split",
        )
    return BundleMetadata(
        defectdet_version=__version__,
        created=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        preset=spec.preset,
        class_names=list(spec.class_names),
        input_size=spec.input_size,
        channels=spec.channels,
        template=spec.template,
        companions=list(spec.companions),
        thresholds=thresholds,
        metrics={key: value for key, value in metrics.items() if isinstance(value, (int, float, str))},
        config_hash=config_hash(config),
        train_config=json.loads(json.dumps(config, default=str)),
        drift_layers=list(DRIFT_LAYERS),
        # val runs with registration unless the config turned it off; the bundle does as val did
        registration=spec.registration,
        tiles=spec.tiles,
        letterbox=Letterbox(pad_value=spec.pad_value),
        normalization=Normalization(scale=spec.input_scale),
    )


def parity(detector: nn.Module, bundle: Path, images: np.ndarray) -> float:
    """Largest absolute difference between eager and onnxruntime outputs on ``images`` (B, C, S, S)."""
    from defectdet.runtime.predictor import Predictor

    predictor = Predictor(bundle)
    with torch.inference_mode():
        eager_predictions, eager_features = detector.forward_with_features(torch.from_numpy(images))
    predictions, features = predictor.run(images)
    return float(
        max(
            np.abs(predictions - eager_predictions.numpy()).max(),
            np.abs(features - eager_features.numpy()).max(),
        )
    )


def _with_test_time_options(
    metadata: BundleMetadata, flip_views: str, repeat_check: bool, source: Path
) -> BundleMetadata:
    """`metadata` saying the bundle's flip views and repeat check (refused for a template model)."""
    check = ModelSpec.from_bundle(metadata).with_repeat_check(repeat_check, source).repeat_check
    return metadata.model_copy(update={"flip_views": flip_views, "repeat_check": check})


def _checked_options(formats: tuple[str, ...], flip_views: str) -> set[str]:
    """The formats to write (onnx always); ConfigError naming the option for an unknown format or view set."""
    from defectdet.model.flip_average import check_views

    try:
        check_views(flip_views)
    except ValueError as error:
        raise ConfigError(f"--flip-views: {error}") from None
    for name in formats:
        if name not in FORMATS:
            raise ConfigError(f"--format must be one of {', '.join(FORMATS)}, got {name!r}")
    return set(FORMATS[:-1]) if "all" in formats else set(formats) | {"onnx"}


def export_bundle(
    checkpoint: str | Path,
    out: str | Path | None = None,
    settings: ExportSettings | None = None,
    *,
    console: Any = None,
    **keywords: Any,
) -> ExportResult:
    """Export ``checkpoint`` (EMA weights, BatchNorm folded) to a bundle at ``out`` (default: beside the
    checkpoint, ``<stem>.onnx``). `settings` is an `ExportSettings`; its fields may also be given as keywords,
    which apply over it (`data`, `split`, `formats`, `int8`, `flip_views`, ...). With validation data (``data``,
    default the training config's dataset and ``split``, default its validation split) the bundle carries
    thresholds and metrics measured on it, and a drift reference from the same dataset's training split (the
    split itself when that is missing); without, the checkpoint's logged thresholds and no drift reference.
    `flip_views` (`model.flip_average`): test-time flips averaged inside the graph, one more forward pass per
    view. `repeat_check`: `runtime.repeat_check`. `merge_fragments`: choose the fragment merge's classes on the
    measured split (False: none).

    Example:
        ```python
        from defectdet import export_bundle

        bundle = export_bundle("runs/synth/best.pt", "runs/synth/model.onnx").bundle
        ```
    """
    from defectdet.engine.checkpoint import load_detector

    settings = with_keywords(ExportSettings, settings, keywords, "export_bundle")
    wanted = _checked_options(settings.formats, settings.flip_views)
    checkpoint = Path(checkpoint)
    bundle = Path(out) if out else checkpoint.with_suffix(".onnx")
    if bundle.suffix.lower() != ".onnx":
        raise ConfigError(f"--out {bundle}: the bundle file name must end in .onnx")
    detector, state = load_detector(checkpoint)
    config = state.get("config") or {}
    settings = settings.model_copy(
        update={
            "data": settings.data or config.get("data"),
            "split": settings.split or config.get("val_split") or "val",
        }
    )
    if settings.int8 and not _has_data(settings):
        raise ConfigError("--int8 needs validation data to prove the int8 model (pass --data)")
    result = _write_bundle(_Export(detector, state, checkpoint, bundle, settings, wanted))
    if settings.int8:
        result.int8 = _quantize(bundle, settings, config, console)
    return result


def _has_data(settings: ExportSettings) -> bool:
    return bool(settings.data) and Path(str(settings.data)).exists()


@dataclass
class _Export:
    """One export under way: the detector and its checkpoint, where the bundle goes, what to write."""

    detector: nn.Module
    state: dict[str, Any]
    checkpoint: Path
    bundle: Path
    settings: ExportSettings
    formats: set[str]


def _write_bundle(export: _Export) -> ExportResult:
    """The bundle (measured on the settings' data when there is some) and the extra formats; written beside the
    target and moved onto it only when complete, so that a failed export leaves no bundle."""
    settings, bundle = export.settings, export.bundle
    partial = bundle.with_name(f".{bundle.stem}.partial-{os.getpid()}.onnx")
    try:
        detector, metadata, max_diff = _write_graph(
            export.detector,
            export.state,
            export.checkpoint,
            partial,
            settings.flip_views,
            settings.repeat_check,
        )
        measured_on = None
        if _has_data(settings):
            metadata = _measured(partial, metadata, settings, export.state.get("config") or {})
            metadata = flag_quality(metadata, bundle)
            write_metadata(partial, metadata)
            measured_on = f"{settings.data}, split {settings.split}"
        else:
            logger.warning(
                "no validation data (%s): the bundle keeps the checkpoint's logged thresholds and has no drift "
                "reference; pass --data to measure them",
                settings.data,
            )
        result = ExportResult(bundle, metadata, max_diff, measured_on=measured_on)
        if "torchscript" in export.formats:
            result.extra_files["torchscript"] = export_torchscript(
                detector, bundle.with_suffix(".ts"), metadata
            )
        if "pt2" in export.formats:
            result.extra_files["pt2"] = export_pt2(detector, bundle.with_suffix(".pt2"), metadata)
        os.replace(partial, bundle)
    finally:
        partial.unlink(missing_ok=True)
    return result


def _measured(
    partial: Path, metadata: BundleMetadata, settings: ExportSettings, config: dict[str, Any]
) -> BundleMetadata:
    """`metadata` with the thresholds, metrics and drift reference measured on the settings' data."""
    train_split = config.get("train_split") or "train"
    return _measure(
        partial,
        metadata,
        settings.data,
        settings.split,
        settings.target_recall,
        train_split,
        settings.merge_fragments,
    )


def _quantize(bundle: Path, settings: ExportSettings, config: dict[str, Any], console: Any) -> Any:
    """The int8 variant of `bundle`, calibrated on the training split and proven on the settings' split."""
    from defectdet.export.quantize import quantize_bundle

    return quantize_bundle(
        bundle,
        settings.data,
        train_split=config.get("train_split") or "train",
        val_split=settings.split,
        calibration_images=settings.calibration_images,
        max_drop=INT8_MAX_MAP50_DROP,
        force=settings.force,
        console=console,
    )


def _write_graph(
    detector: nn.Module,
    state: dict[str, Any],
    checkpoint: Path,
    path: Path,
    flip_views: str,
    repeat_check: bool,
) -> tuple[nn.Module, BundleMetadata, float]:
    """The graph, its trainable weights and metadata at `path`, checked against eager: (the exported
    module, the metadata, the largest eager-vs-onnxruntime difference)."""
    from defectdet.model.flip_average import with_flip_views

    trainable = encode_weights(detector)  # the unfolded float weights, for `train --from model.onnx`
    fold_batchnorm(detector)
    metadata = _with_test_time_options(base_metadata(detector, state), flip_views, repeat_check, checkpoint)
    detector = with_flip_views(detector, flip_views, state.get("config"), checkpoint)
    size, channels = metadata.input_size, metadata.input_channels
    export_onnx_graph(detector, path, channels, size)
    embed_weights(path, trainable)
    write_metadata(path, metadata)
    probe = np.random.default_rng(0).random((2, channels, size, size), dtype=np.float32)
    max_diff = parity(detector, path, probe)
    if max_diff > 1e-3:
        raise DefectDetError(f"{path}: onnxruntime differs from eager by {max_diff:.2e}; this is a bug")
    return detector, metadata, max_diff


def flag_quality(metadata: BundleMetadata, bundle: Path) -> BundleMetadata:
    """`metrics["near_zero_map"]` set (`runtime.model_quality`: validation mAP under 0.05), and when it is, a
    warning on stderr naming the figure: such a model finds almost none of the labelled defects."""
    quality = validation_quality(metadata)
    if quality["near_zero"]:
        logger.warning("%s: %s", bundle, quality["warning"])
    return metadata.model_copy(
        update={"metrics": {**metadata.metrics, "near_zero_map": bool(quality["near_zero"])}}
    )


def _measure(
    bundle: Path,
    metadata: BundleMetadata,
    data: str | Path,
    split: str,
    target_recall: float,
    reference_split: str | None = None,
    merge_fragments: bool = True,
) -> BundleMetadata:
    """Thresholds and metrics from `val` on the bundle itself (with the fragment merge chosen there unless
    `merge_fragments` is False); the drift reference from `reference_split` (the training images: the validation
    split alone is a few boards), else from `split`."""
    metrics, metadata = _merge_fragments(bundle, metadata, data, split, target_recall, merge_fragments)
    headline = metrics.get("headline", {})
    thresholds = metadata.thresholds.model_copy()
    if isinstance(headline.get("threshold"), float):
        thresholds.threshold = headline["threshold"]
        thresholds.threshold_source = f"best F1 on {Path(str(data)).name}, split {split}"
    thresholds.recall_target = target_recall
    thresholds.recall_threshold = headline.get("target_recall_threshold")
    reference = None
    if reference_split and reference_split != split:
        try:
            reference = drift_reference(bundle, data, reference_split)
        except DatasetError as error:
            logger.warning("drift reference: no %s split (%s); using %s", reference_split, error, split)
    if reference is None:
        reference = drift_reference(bundle, data, split)
    kept = {
        key: value for key, value in headline.items() if isinstance(value, (int, float)) and value is not None
    }
    evidence = (
        {"fragment_merge": metadata.metrics["fragment_merge"]} if "fragment_merge" in metadata.metrics else {}
    )
    return metadata.model_copy(
        update={
            "thresholds": thresholds,
            "metrics": {**kept, "split": split, **evidence},
            "drift_reference": reference,
        }
    )


def _merge_fragments(
    bundle: Path,
    metadata: BundleMetadata,
    data: str | Path,
    split: str,
    target_recall: float,
    choose: bool = True,
) -> tuple[dict[str, Any], BundleMetadata]:
    """`val` of the bundle on `split`, with the fragment merge on for the classes where it raised AP there
    (`export.fragment_choice`; none when not `choose`): (the metrics of the bundle as written, its metadata)."""
    from defectdet.engine.validate import validate

    def scored() -> dict[str, Any]:
        with tempfile.TemporaryDirectory() as folder:
            return validate(bundle, data, split=split, out=folder, target_recall=target_recall, console=None)

    metrics = scored()
    candidates = merge_candidates(metrics.get("per_class") or []) if choose else []
    if not candidates:
        return metrics, metadata

    def with_merged(names: list[str]) -> BundleMetadata:
        thresholds = metadata.thresholds.model_copy(update={"merge_fragments": names})
        updated = metadata.model_copy(update={"thresholds": thresholds})
        write_metadata(bundle, updated)
        return updated

    with_merged(candidates)
    merged_metrics = scored()
    chosen, evidence = choose_merged(metrics["per_class"], merged_metrics.get("per_class") or [], candidates)
    metadata = with_merged(chosen)
    metadata = metadata.model_copy(update={"metrics": {**metadata.metrics, "fragment_merge": evidence}})
    if chosen:
        logger.info("fragment merge for %s (AP50 on split %s: %s)", ", ".join(chosen), split, evidence)
        metrics = merged_metrics if chosen == candidates else scored()
    return metrics, metadata


def drift_reference(
    bundle: Path, data: str | Path, split: str, max_images: int = 400, seed: int = 0
) -> dict[str, Any] | None:
    """Image statistics and pooled activations of at most `max_images` of the split's images, taken in turn
    from each group (`reference_groups`: board folders, name prefixes or runs of names; seeded), as the
    monitor's reference profile with the spread between the groups."""
    from defectdet.data.formats import load_dataset
    from defectdet.runtime.monitor import (
        build_reference,
        image_statistics,
        reference_groups,
        sample_reference,
    )
    from defectdet.runtime.predictor import Predictor

    predictor = Predictor(bundle, tiles=False)  # the monitor profiles the whole-image pass only
    samples = load_dataset(data, split).samples
    if not samples:
        return None
    labels, group_by = reference_groups([sample.image_path for sample in samples])
    stats, features, groups = [], [], []
    for index in sample_reference(labels, max_images, seed):
        sample = samples[index]
        try:
            planes = predictor.load_planes(
                sample.image_path,
                sample.template_path if predictor.metadata.template else None,
                sample_companions(sample, predictor.metadata.companions),
            )
            prepared = predictor.prepare(planes.image, planes.template, planes.companions)
        except DefectDetError as error:
            logger.warning("drift reference: skipping %s: %s", sample.image_path, error)
            continue
        stats.append(image_statistics(prepared.content))
        features.append(predictor.run(prepared.tensor[None])[1][0])
        groups.append(labels[index])
    if not stats:
        return None
    try:
        reference = build_reference(stats, np.stack(features), groups=groups, group_by=group_by)
    except ValueError as error:  # every image degenerate
        logger.warning("drift reference: %s", error)
        return None
    reference.update(split=split, sampled_from=len(samples), seed=seed)
    return reference


def export_torchscript(detector: nn.Module, path: Path, metadata: BundleMetadata) -> Path:
    """`torch.jit.trace` + `torch.jit.freeze`, the metadata in `_extra_files["defectdet.json"]`.

    TorchScript is in maintenance mode upstream (`torch.export`, the `.pt2` format, succeeds it); it stays for
    LibTorch/C++ users. Apply `torch.jit.optimize_for_inference` after `torch.jit.load`: its MKLDNN-converted
    graph cannot be saved and loaded again (torch 2.13: "required keyword attribute 'value' is undefined").
    """
    import warnings

    size, channels = metadata.input_size, metadata.input_channels
    example = torch.rand(1, channels, size, size)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(_BundleGraph(detector).eval(), example)
        frozen = torch.jit.freeze(traced.eval())
        torch.jit.save(frozen, str(path), _extra_files={"defectdet.json": metadata.to_json()})
    return path


def export_pt2(detector: nn.Module, path: Path, metadata: BundleMetadata) -> Path:
    """`torch.export` program (`.pt2`, dynamic batch), the metadata in its extra files."""
    size, channels = metadata.input_size, metadata.input_channels
    example = (torch.rand(2, channels, size, size),)
    batch = torch.export.Dim("batch", min=1, max=256)
    program = torch.export.export(_BundleGraph(detector).eval(), example, dynamic_shapes=({0: batch},))
    torch.export.save(program, str(path), extra_files={"defectdet.json": metadata.to_json()})
    return path

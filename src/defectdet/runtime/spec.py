"""`ModelSpec`: the one description of a trained model's input and output, from a checkpoint or a bundle.

What a model takes (input size, gray or colour, with or without a template, the companion captures it also
reads, pair registration, tiles, the letterbox pad and the pixel scale) and what it answers (class names, head strides, post-processing floor, NMS
IoU and cap). `val`, `export`, the doctor tools, the inference pipeline (`runtime.pipeline`) and the bench
scripts read a model's settings through it instead of each re-reading a checkpoint's `config`.

Torch-free and below the engine: a checkpoint is read here as the plain dict `torch.load` returned.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from defectdet.compat import Surface, current_keys
from defectdet.data.letterbox import DEFAULT_INPUT_SIZE, DEFAULT_PAD_VALUE
from defectdet.data.planes import INPUT_SCALE
from defectdet.errors import CheckpointError, ConfigError
from defectdet.postprocess import (
    DEFAULT_MAX_DETECTIONS,
    DEFAULT_NMS_IOU,
    DEFAULT_SCORE_FLOOR,
    PostprocessSettings,
)
from defectdet.runtime.bundle import BundleMetadata, check_companion_names

HEAD_STRIDES = (8, 16, 32)  # model.detector.STRIDES_BY_LEVEL: a head level is an index into it


class ModelSpec(BaseModel):
    """A trained model's settings; `input_channels` is what the network takes (`channels` per input plane)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    input_size: int = Field(ge=32)
    channels: int = Field(ge=1, le=3)
    template: bool
    companions: tuple[
        str, ...
    ] = ()  # aligned companion captures, input planes after the image (and template)
    class_names: tuple[str, ...] = ()
    strides: tuple[int, ...] | None = None  # head strides; None when the source does not say
    preset: str | None = None
    registration: bool = False  # register each template to its tested image (template models only)
    tiles: bool = False  # also run native-resolution tiles of large images (data.tiling)
    flip_views: str = (
        "none"  # test-time flips averaged per anchor (model.flip_average; a bundle: in its graph)
    )
    # drop detections whose surroundings repeat unchanged elsewhere in the image (runtime.repeat_check;
    # template-free models only)
    repeat_check: bool = False
    # classes whose overlapping fragments are reported as one box (postprocess.merge_fragments), chosen at export
    merge_fragments: tuple[str, ...] = ()
    score_floor: float = Field(DEFAULT_SCORE_FLOOR, ge=0, le=1)  # the score floor before NMS
    nms_iou: float = Field(DEFAULT_NMS_IOU, gt=0, le=1)
    max_detections: int = Field(DEFAULT_MAX_DETECTIONS, ge=1)
    pad_value: int = Field(DEFAULT_PAD_VALUE, ge=0, le=255)
    input_scale: float = Field(INPUT_SCALE, gt=0)

    @field_validator("companions")
    @classmethod
    def _companion_names(cls, names: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(check_companion_names(names))

    @property
    def planes(self) -> tuple[str, ...]:
        """The named input planes in network order: ``image``, ``template`` when it reads one, each companion."""
        return ("image", *(("template",) if self.template else ()), *self.companions)

    @property
    def input_channels(self) -> int:
        """C of the network input: `channels` per plane."""
        return self.channels * len(self.planes)

    @property
    def postprocess(self) -> PostprocessSettings:
        merged = tuple(
            self.class_names.index(name) for name in self.merge_fragments if name in self.class_names
        )
        return PostprocessSettings(self.score_floor, self.nms_iou, self.max_detections, merged)

    def with_postprocess(self, settings: PostprocessSettings) -> ModelSpec:
        """This spec with the score floor, NMS IoU and detection cap of `settings`."""
        return self.model_copy(
            update={
                "score_floor": settings.score_floor,
                "nms_iou": settings.nms_iou,
                "max_detections": settings.max_detections,
            }
        )

    def with_merge_fragments(self, merge: bool | None) -> ModelSpec:
        """This spec with its fragment merge as chosen (None or True: unchanged) or off (False)."""
        return self if merge is None or merge else self.model_copy(update={"merge_fragments": ()})

    def with_repeat_check(self, repeat_check: bool | None, source: str | Path = "model") -> ModelSpec:
        """This spec with the repeat check on or off (None: unchanged). ConfigError for a model that reads
        templates: its template already tells design from defect."""
        if repeat_check is None:
            return self
        if repeat_check and self.template:
            raise ConfigError(
                f"--repeat-check: {source} reads templates; the check is for models without them"
            )
        return self.model_copy(update={"repeat_check": bool(repeat_check)})

    @classmethod
    def from_checkpoint(cls, checkpoint: Mapping[str, Any], source: str | Path = "checkpoint") -> ModelSpec:
        """From a training checkpoint dict: the network from `model_config` (what `load_detector` rebuilds),
        the rest from the run's `config` (registration as `val` runs it: on unless the run turned it off)."""
        config = checkpoint.get("config") or {}
        network = checkpoint.get("model_config") or {}
        if not isinstance(config, Mapping) or not isinstance(network, Mapping):
            raise CheckpointError(f"{source}: 'config' and 'model_config' must be dicts")
        config = current_keys(config, Surface.TRAIN_CONFIG, warn=False)  # older runs use retired names
        companions = tuple(network.get("companions") or ())
        if "in_channels" in network and "template" in network:
            template = bool(network["template"])
            channels = int(network["in_channels"]) // (1 + int(template) + len(companions))
        elif config.get("channels") and config.get("template") is not None:
            template, channels = bool(config["template"]), int(config["channels"])
        else:
            raise CheckpointError(
                f"{source}: neither 'model_config' (in_channels, template) nor 'config' (channels, template) "
                "says what the model takes; was it written by `defectdet train`?"
            )
        levels = network.get("levels")
        strides = (
            tuple(HEAD_STRIDES[int(level)] for level in levels)
            if levels is not None
            else (tuple(int(stride) for stride in config["strides"]) if config.get("strides") else None)
        )
        settings = PostprocessSettings.from_config(config)
        return cls._checked(
            source,
            input_size=int(config.get("input_size") or DEFAULT_INPUT_SIZE),
            channels=channels,
            template=template,
            companions=companions,
            class_names=tuple(checkpoint.get("class_names") or ()),
            strides=strides,
            preset=network.get("preset") or config.get("preset"),
            registration=template and bool(config.get("register_pairs", True)),
            tiles=bool(config.get("tiles")),
            score_floor=settings.score_floor,
            nms_iou=settings.nms_iou,
            max_detections=settings.max_detections,
        )

    @classmethod
    def from_bundle(cls, metadata: BundleMetadata) -> ModelSpec:
        """From a bundle's metadata (`runtime.bundle`): what the bundle runs with, thresholds included."""
        strides = metadata.train_config.get("strides")
        return cls(
            input_size=metadata.input_size,
            channels=metadata.channels,
            template=metadata.template,
            companions=tuple(metadata.companions),
            class_names=tuple(metadata.class_names),
            strides=tuple(int(stride) for stride in strides) if strides else None,
            preset=metadata.preset,
            registration=metadata.template and metadata.registration,
            tiles=metadata.tiles,
            flip_views=metadata.flip_views,
            repeat_check=metadata.repeat_check,
            merge_fragments=tuple(metadata.thresholds.merge_fragments),
            score_floor=metadata.thresholds.score_floor,
            nms_iou=metadata.thresholds.nms_iou,
            max_detections=metadata.thresholds.max_detections,
            pad_value=metadata.letterbox.pad_value,
            input_scale=metadata.normalization.scale,
        )

    @classmethod
    def _checked(cls, source: str | Path, **values: Any) -> ModelSpec:
        try:
            return cls(**values)
        except ValidationError as error:
            first = error.errors()[0]
            field = ".".join(str(part) for part in first["loc"])
            raise CheckpointError(f"{source}: model setting {field!r}: {first['msg']}") from None

"""The bundle's metadata: one JSON document in the ONNX file's `metadata_props["defectdet"]`.

Torch-free. Writing needs the `onnx` package (export side); reading goes through onnxruntime, which the
runtime loads anyway, or `onnx` when it is installed.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from defectdet.compat import Surface, current_keys, retired_attributes
from defectdet.data.letterbox import DEFAULT_PAD_VALUE
from defectdet.data.sample import companion_name_problem
from defectdet.errors import CheckpointError
from defectdet.postprocess import DEFAULT_MAX_DETECTIONS, DEFAULT_NMS_IOU, DEFAULT_SCORE_FLOOR

METADATA_KEY = "defectdet"
FORMAT_VERSION = 1
INPUT_NAME = "images"
PREDICTIONS_OUTPUT = "predictions"
FEATURES_OUTPUT = "features"


def check_companion_names(names: list[str] | tuple[str, ...], field: str = "companions") -> list[str]:
    """`names` as a list when each can name a companion capture (`data.sample.companion_name_problem`: it is
    also a plane of the bundle and a multipart field of the service) and none is repeated; ValueError naming
    `field`."""
    for index, name in enumerate(names):
        problem = companion_name_problem(name)
        if problem is None and name in names[:index]:
            problem = f"companion {name!r} is named twice"
        if problem is not None:
            raise ValueError(f"{field}: {problem}")
    return list(names)


class Normalization(BaseModel):
    """How uint8 pixels become the graph input: ``x = pixel * scale``; mean/std are applied in the graph."""

    model_config = ConfigDict(extra="forbid")
    scale: float = 1.0 / 255.0
    mean: float = 0.5
    std: float = 0.25
    in_graph: bool = True


class Letterbox(BaseModel):
    model_config = ConfigDict(extra="forbid")
    pad_value: int = Field(DEFAULT_PAD_VALUE, ge=0, le=255)


class Thresholds(BaseModel, retired_attributes(Surface.BUNDLE_THRESHOLDS, "thresholds")):
    """Operating thresholds. ``threshold`` decides the image verdict (defective when any detection reaches it);
    ``score_floor`` is the lowest score kept as a proposal (candidates below it are dropped before NMS).
    Bundles written before the renaming use older names (`defectdet.compat`): they load as these."""

    model_config = ConfigDict(extra="forbid")
    threshold: float = Field(0.25, ge=0, le=1)
    threshold_source: str = "default"
    recall_target: float = 0.99
    recall_threshold: float | None = None
    nms_iou: float = Field(DEFAULT_NMS_IOU, gt=0, le=1)
    max_detections: int = Field(DEFAULT_MAX_DETECTIONS, ge=1)
    score_floor: float = Field(DEFAULT_SCORE_FLOOR, ge=0, le=1)
    # classes whose overlapping fragments are reported as one box: those where it raised AP on the export's
    # validation split (postprocess.merge_fragments)
    merge_fragments: list[str] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, values: Any) -> Any:
        return (
            current_keys(values, Surface.BUNDLE_THRESHOLDS, "thresholds", warn=False)
            if isinstance(values, dict)
            else values
        )


class BundleMetadata(BaseModel):
    """Everything needed to run a bundle; see docs/reference/bundle-format.md."""

    model_config = ConfigDict(extra="forbid")
    format_version: int = FORMAT_VERSION
    defectdet_version: str
    created: str
    preset: str | None = None
    class_names: list[str]
    input_size: int = Field(ge=32)
    channels: int = Field(ge=1, le=3)
    template: bool
    # aligned companion captures the model also takes, in input-plane order after the image (and template)
    companions: list[str] = Field(default_factory=list)
    normalization: Normalization = Field(default_factory=Normalization)
    letterbox: Letterbox = Field(default_factory=Letterbox)
    thresholds: Thresholds = Field(default_factory=Thresholds)
    metrics: dict[str, Any] = Field(default_factory=dict)
    config_hash: str | None = None
    train_config: dict[str, Any] = Field(default_factory=dict)
    drift_layers: list[str] = Field(default_factory=list)
    drift_reference: dict[str, Any] | None = None
    registration: bool = False
    tiles: bool = False  # also run native-resolution tiles of images >= 1.5x input_size (data.tiling)
    flip_views: str = "none"  # test-time flips averaged inside the graph (model.flip_average.FLIP_VIEWS)
    repeat_check: bool = False  # drop detections on repeated design (runtime.repeat_check; no template only)
    precision: str = "fp32"

    @field_validator("companions")
    @classmethod
    def _companion_names(cls, names: list[str]) -> list[str]:
        return check_companion_names(names)

    @model_validator(mode="after")
    def _merged_classes_known(self) -> BundleMetadata:
        unknown = [name for name in self.thresholds.merge_fragments if name not in self.class_names]
        if unknown:
            raise ValueError(f"thresholds.merge_fragments names classes the bundle does not have: {unknown}")
        return self

    @property
    def planes(self) -> list[str]:
        """The named input planes in graph order: ``image``, ``template`` when it reads one, each companion."""
        return ["image", *(["template"] if self.template else []), *self.companions]

    @property
    def input_channels(self) -> int:
        """C of the graph input: `channels` per plane."""
        return self.channels * len(self.planes)

    def to_json(self) -> str:
        return self.model_dump_json()


def config_hash(config: dict[str, Any]) -> str:
    """A short stable hash of a training config (keys sorted), to tell which run a bundle came from."""
    text = json.dumps(config, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def file_sha256(path: Path) -> str:
    """The sha256 of a file's bytes: the identity of a bundle for `compare` verdicts and the models store."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def parse_metadata(text: str | None, source: str | Path) -> BundleMetadata:
    """Parse the JSON stored under ``metadata_props["defectdet"]``; a clear error when absent or invalid."""
    if not text:
        raise CheckpointError(
            f"{source}: not a defectdet bundle (no {METADATA_KEY!r} metadata); export one with `defectdet export`"
        )
    try:
        return BundleMetadata.model_validate_json(text)
    except ValidationError as error:
        first = error.errors()[0]
        field = ".".join(str(part) for part in first["loc"])
        raise CheckpointError(f"{source}: bundle metadata field {field!r}: {first['msg']}") from None


def write_metadata(path: str | Path, metadata: BundleMetadata) -> None:
    """Store ``metadata`` in the ONNX file at ``path`` (replacing an earlier defectdet entry), atomically."""
    import onnx

    path = Path(path)
    model = onnx.load(str(path))
    kept = [prop for prop in model.metadata_props if prop.key != METADATA_KEY]
    del model.metadata_props[:]
    model.metadata_props.extend(kept)
    entry = model.metadata_props.add()
    entry.key, entry.value = METADATA_KEY, metadata.to_json()
    temporary = path.with_name(path.name + ".tmp")
    onnx.save(model, str(temporary))
    temporary.replace(path)


def read_metadata(path: str | Path) -> BundleMetadata:
    """Read a bundle's metadata without running it."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: bundle file not found")
    try:
        import onnx

        model = onnx.load(str(path), load_external_data=False)
        text = next((prop.value for prop in model.metadata_props if prop.key == METADATA_KEY), None)
    except ImportError:
        import onnxruntime

        session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        text = session.get_modelmeta().custom_metadata_map.get(METADATA_KEY)
    except Exception as error:  # onnx raises its own DecodeError types
        raise CheckpointError(f"{path}: not a readable ONNX file ({error})") from None
    return parse_metadata(text, path)

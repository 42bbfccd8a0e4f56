"""The one inference pipeline around a forward pass: `load_pair` -> `prepare` -> (forward) -> `finish` -> `verdict`.

`engine.predict.predict_records` (torch module or `BundleModel`, batched: training-time evaluation, `val`,
`export`'s measurements) and `runtime.predictor.Predictor` (onnxruntime, one image: `predict`, the server, the
demo) both call these functions; each keeps only its own forward pass. So the two cannot drift apart: the same
image pair gives the same input array and the same raw outputs give the same boxes.

- `load_planes` (`load_pair` without companions): decode paths, bytes or arrays to uint8 HxW gray or HxWx3 RGB
  (`data.imageio`); deep planes (the image, its template, its companion captures) get ONE intensity mapping.
- `prepare`: the plane rules (`check_planes`: template and companions present, each at the image's size),
  pair registration of the template (`data.registration`; companions are aligned captures, never registered),
  letterbox (`data.letterbox`), native-resolution tiles of a large image (`data.tiling`), every plane cut alike,
  the input arrays (`data.planes`): `Prepared.inputs` is ``(1 + T, C, S, S)`` float32, the whole image first.
- `finish`: score floor + class-aware NMS per pass (`defectdet.postprocess`), the whole image's boxes mapped back
  to original pixels and small tile detections merged in (`data.tiling.combine_passes`).
  Template-free models with `repeat_check` then drop detections whose surroundings repeat unchanged elsewhere
  in the image (`runtime.repeat_check`).
- `verdict`: "defective" when any detection reaches the threshold.

Lives in the runtime (torch-free, layer 3) rather than in `data` because it runs a model as `ModelSpec`
describes it (`runtime.spec`, built from a checkpoint or a bundle's metadata) and gives verdicts: deployment
concepts that `data` (layer 2) knows nothing of. The engine sits above the runtime and imports it; the one piece
training shares too, stacking planes into the input, is `data.planes`.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from defectdet.data.imageio import (
    DEFAULT_MAX_PIXELS,
    decode_image,
    decode_planes,
    effective_bit_depth,
    read_file_bytes,
    to_uint8,
)
from defectdet.data.letterbox import LetterboxTransform, letterbox_image
from defectdet.data.planes import input_array
from defectdet.data.registration import register_pair
from defectdet.data.sample import Sample
from defectdet.data.tiling import TilePlan, combine_passes, plan_tiles, tile_canvases
from defectdet.errors import InputError
from defectdet.postprocess import PostprocessSettings, merge_fragments, postprocess, visible_boxes
from defectdet.runtime.repeat_check import repeated_mask
from defectdet.runtime.spec import ModelSpec

ImageInput = str | os.PathLike | bytes | bytearray | memoryview | np.ndarray
DEFECTIVE, CLEAN = "defective", "clean"


class StageTimer(Protocol):
    """What `prepare` reports its stages to (`evaluation.timing.StageTimer` fits)."""

    def stage(self, name: str) -> contextlib.AbstractContextManager[Any]: ...


@dataclass
class Prepared:
    """One image ready for the forward pass: ``tensor`` (C, S, S) float32, the letterbox transform, the
    letterboxed tested image without padding (for the drift statistics) and the measured registration."""

    tensor: np.ndarray
    transform: LetterboxTransform
    content: np.ndarray
    registration: dict[str, Any] | None = None
    tile_plan: TilePlan | None = None  # with tiles on and a large image: where its tiles are
    tile_tensors: np.ndarray | None = None  # (T, C, S, S) float32, one per tile of `tile_plan`
    repeat_check_image: np.ndarray | None = None  # the tested image, kept when the spec runs the repeat check

    @property
    def inputs(self) -> np.ndarray:
        """Every pass of this image as one batch ``(1 + T, C, S, S)``: the whole letterbox, then its tiles."""
        if self.tile_tensors is None:
            return self.tensor[None]
        return np.concatenate([self.tensor[None], self.tile_tensors])

    @property
    def passes(self) -> int:
        return 1 + (0 if self.tile_tensors is None else len(self.tile_tensors))


@dataclass
class Planes:
    """One image's decoded planes, uint8 in the model's layout: the tested image, its template (None when the
    model reads none) and its companion captures by name."""

    image: np.ndarray
    template: np.ndarray | None = None
    companions: dict[str, np.ndarray] = field(default_factory=dict)


@dataclass(frozen=True)
class Found:
    """One image's detections in original pixels, by descending score."""

    boxes: np.ndarray  # (K, 4) xyxy float32
    scores: np.ndarray  # (K,)
    classes: np.ndarray  # (K,) int64

    def __iter__(self) -> Iterator[np.ndarray]:  # boxes, scores, classes = found
        return iter((self.boxes, self.scores, self.classes))


# ---------------------------------------------------------------------------------------------- decode
def load_image(
    source: ImageInput, channels: int, max_pixels: int = DEFAULT_MAX_PIXELS, name: str = "image"
) -> np.ndarray:
    """Decode a path, encoded bytes or an array to uint8 HxW (``channels == 1``) or HxWx3 RGB."""
    if isinstance(source, np.ndarray):
        return array_to_layout(source, channels, name)
    data, label = _encoded(source, name)
    return decode_image(data, label, channels, max_pixels)


def load_pair(
    image: ImageInput,
    template: ImageInput | None,
    channels: int,
    max_pixels: int = DEFAULT_MAX_PIXELS,
) -> tuple[np.ndarray, np.ndarray | None]:
    """`load_planes` of a tested image and its template (no companions)."""
    planes = load_planes(image, template, channels, max_pixels)
    return planes.image, planes.template


def load_planes(
    image: ImageInput,
    template: ImageInput | None,
    channels: int,
    max_pixels: int = DEFAULT_MAX_PIXELS,
    companions: Mapping[str, ImageInput] | None = None,
) -> Planes:
    """`load_image` for a tested image, its template and its companion captures with ONE intensity mapping for
    all: deep (12/16-bit) planes are scaled by their shared bit depth, so the model sees no false global
    difference between them. Paths decode exactly as `data.imageio.read_pair` does (errors name the file);
    every plane is held to `max_pixels`."""
    sources: dict[str, ImageInput] = {"image": image}
    if template is not None:
        sources["template"] = template
    for name, source in (companions or {}).items():
        if name in sources:
            raise InputError(f"companion {name!r}: {name!r} is the name of another plane")
        sources[name] = source
    decoded = _decode_planes(sources, channels, max_pixels)
    image_plane, template_plane = decoded.pop("image"), decoded.pop("template", None)
    return Planes(image_plane, template_plane, decoded)


def sample_companions(sample: Sample, names: Sequence[str]) -> dict[str, Path]:
    """The files of the companion captures `names` of a dataset sample, for `load_planes` / `Predictor.predict`;
    InputError naming the image and the first companion it lacks."""
    missing = [name for name in names if name not in sample.companion_paths]
    if missing:
        raise InputError(f"{sample.image_path}: no companion capture {missing[0]!r} for this image")
    return {name: sample.companion_paths[name] for name in names}


def _plane_label(name: str) -> str:
    return name if name in ("image", "template") else f"companion {name!r}"


def _decode_planes(
    sources: Mapping[str, ImageInput], channels: int, max_pixels: int
) -> dict[str, np.ndarray]:
    """Every plane decoded with one intensity mapping: all arrays (deep integer ones share a bit depth) or
    all encoded (`decode_planes`); a mix decodes each plane on its own."""
    labels = {name: _plane_label(name) for name in sources}
    if len(sources) == 1:
        ((name, source),) = sources.items()
        return {name: load_image(source, channels, max_pixels, labels[name])}
    arrays = [isinstance(source, np.ndarray) for source in sources.values()]
    if all(arrays):
        deep = [a for a in sources.values() if np.issubdtype(a.dtype, np.integer) and a.dtype != np.uint8]
        bits = max(effective_bit_depth(a) for a in deep) if len(deep) >= 2 else None
        return {
            name: array_to_layout(source, channels, labels[name], bits) for name, source in sources.items()
        }
    if not any(arrays):
        encoded = [_encoded(source, labels[name]) for name, source in sources.items()]
        decoded = decode_planes(
            [data for data, _ in encoded], [label for _, label in encoded], channels, max_pixels
        )
        return dict(zip(sources, decoded, strict=True))
    return {name: load_image(source, channels, max_pixels, labels[name]) for name, source in sources.items()}


def _encoded(source: ImageInput, name: str) -> tuple[bytes, str | Path]:
    if isinstance(source, (bytes, bytearray, memoryview)):
        return bytes(source), name
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        return read_file_bytes(path), path  # regular files only: a FIFO would block
    raise InputError(f"{name}: expected a path, bytes or a numpy array, got {type(source).__name__}")


def array_to_layout(array: np.ndarray, channels: int, name: str, bit_depth: int | None = None) -> np.ndarray:
    """A caller's array (HxW, HxWx1, HxWx3 RGB or HxWx4 RGBA; uint8, uint16 or float in [0, 1]) -> uint8 HxW
    or HxWx3."""
    if array.ndim == 3 and array.shape[2] == 1:
        array = array[:, :, 0]
    if array.ndim not in (2, 3) or (array.ndim == 3 and array.shape[2] not in (3, 4)):
        raise InputError(f"{name}: expected an HxW, HxWx3 or HxWx4 array, got shape {array.shape}")
    if array.shape[0] < 1 or array.shape[1] < 1:
        raise InputError(f"{name}: empty array of shape {array.shape}")
    if array.dtype == np.uint8:
        pass
    elif np.issubdtype(array.dtype, np.floating):
        if not np.isfinite(array).all():
            raise InputError(f"{name}: the float array holds NaN or Inf")
        array = (np.clip(array, 0.0, 1.0) * 255.0 + 0.5).astype(np.uint8)
    elif array.dtype in (np.uint16, np.int32, np.int64, np.uint32):
        array = to_uint8(array, bit_depth)
    else:
        raise InputError(f"{name}: unsupported dtype {array.dtype}; use uint8, uint16 or float in [0, 1]")
    if array.ndim == 3 and array.shape[2] == 4:
        array = array[:, :, :3]
    if channels == 1 and array.ndim == 3:
        import cv2

        return cv2.cvtColor(np.ascontiguousarray(array), cv2.COLOR_RGB2GRAY)
    if channels == 3 and array.ndim == 2:
        return np.repeat(array[:, :, None], 3, axis=2)
    return np.ascontiguousarray(array)


# ---------------------------------------------------------------------------------------------- prepare
def check_pair(image: np.ndarray, template: np.ndarray | None, spec: ModelSpec) -> None:
    """The template rule, the same on every path: a template model needs a template of exactly the tested
    image's size. A template of another size is refused (InputError naming both sizes), never resized:
    registration corrects a shift and a small rotation, not a scale, and a stretched template shows false
    differences at every edge."""
    if not spec.template:
        return
    if template is None:
        raise InputError("this model compares each image to its defect-free template: pass `template`")
    if template.shape[:2] != image.shape[:2]:
        raise InputError(
            f"template is {template.shape[1]}x{template.shape[0]} but the image is "
            f"{image.shape[1]}x{image.shape[0]}; a template must be a capture of the same board at the same size"
        )


def check_planes(
    image: np.ndarray,
    template: np.ndarray | None,
    companions: Mapping[str, np.ndarray] | None,
    spec: ModelSpec,
) -> list[np.ndarray]:
    """`check_pair`, then the companion rule: every companion capture the model names is given, at exactly the
    image's size (an aligned capture of the same part; never resized), and no other. The companions in the
    model's plane order."""
    check_pair(image, template, spec)
    given = dict(companions or {})
    unknown = [name for name in given if name not in spec.companions]
    if unknown:
        takes = ", ".join(repr(name) for name in spec.companions) or "none"
        raise InputError(
            f"companion {unknown[0]!r}: this model takes no such capture; its companions are: {takes}"
        )
    for name in spec.companions:
        if name not in given:
            raise InputError(
                f"this model also takes the aligned capture {name!r}: pass it as companion {name!r}"
            )
        if given[name].shape[:2] != image.shape[:2]:
            height, width = given[name].shape[:2]
            raise InputError(
                f"companion {name!r} is {width}x{height} but the image is {image.shape[1]}x{image.shape[0]}; "
                "a companion must be an aligned capture of the same part at the same size"
            )
    return [given[name] for name in spec.companions]


def prepare(
    image: np.ndarray,
    template: np.ndarray | None,
    spec: ModelSpec,
    timer: StageTimer | None = None,
    companions: Mapping[str, np.ndarray] | None = None,
) -> Prepared:
    """`check_planes`, then register the template onto the image (`spec.registration`), letterbox every plane,
    cut native-resolution tiles of a large image (`spec.tiles`) from every plane alike and stack them into the
    float32 inputs. A template given to a model without one is ignored; companions are not registered.
    `timer` gets the stages 'register' and 'preprocess'."""
    ordered = check_planes(image, template, companions, spec)
    template = template if spec.template else None
    registration = None
    if template is not None and spec.registration:
        with _stage(timer, "register"):
            template, measured = register_pair(image, template)
        registration = measured.to_dict()
    with _stage(timer, "preprocess"):
        size, pad = spec.input_size, spec.pad_value
        canvas, transform = letterbox_image(image, size, pad)
        template_canvas = None if template is None else letterbox_image(template, size, pad)[0]
        companion_canvases = [letterbox_image(plane, size, pad)[0] for plane in ordered]
        plan = plan_tiles(image.shape[1], image.shape[0], size) if spec.tiles else None
        tile_tensors = None
        if plan:
            tile_tensors = _tile_inputs(image, template, ordered, plan, spec)
        return Prepared(
            input_array(canvas, template_canvas, companions=companion_canvases, scale=spec.input_scale),
            transform,
            _content(canvas, transform),
            registration,
            plan or None,
            tile_tensors,
            image if spec.repeat_check and not spec.template else None,
        )


def _tile_inputs(
    image: np.ndarray,
    template: np.ndarray | None,
    companions: list[np.ndarray],
    plan: TilePlan,
    spec: ModelSpec,
) -> np.ndarray:
    """``(T, C, S, S)``: each tile of `plan` cut from every plane at the same place."""
    size, pad = spec.input_size, spec.pad_value
    pairs = tile_canvases(image, template, plan, size, pad)
    cut = [[canvas for canvas, _ in tile_canvases(plane, None, plan, size, pad)] for plane in companions]
    return np.stack(
        [
            input_array(
                tile, template_tile, companions=[tiles[index] for tiles in cut], scale=spec.input_scale
            )
            for index, (tile, template_tile) in enumerate(pairs)
        ]
    )


def _stage(timer: StageTimer | None, name: str) -> contextlib.AbstractContextManager[Any]:
    return contextlib.nullcontext() if timer is None else timer.stage(name)


def _content(canvas: np.ndarray, transform: LetterboxTransform) -> np.ndarray:
    """The resized image inside the letterbox canvas, without the padding."""
    x0, y0 = int(transform.pad_x), int(transform.pad_y)
    return canvas[y0 : y0 + transform.resized_height, x0 : x0 + transform.resized_width]


# ---------------------------------------------------------------------------------------------- finish
def finish(predictions: np.ndarray, prepared: Prepared, settings: PostprocessSettings) -> Found:
    """Raw outputs of `prepared.inputs` ``(1 + T, A, 4 + K)`` (boxes in input pixels) -> detections in original
    pixels: score floor and class-aware NMS per pass, then the whole image mapped back through the letterbox and
    small tile detections merged in, boxes under one pixel wide or high in the image dropped; with the repeat
    check (`runtime.repeat_check`), detections on repeated design dropped; fragments of one defect of the
    settings' `merge_classes` reported as one box (`postprocess.merge_fragments`)."""
    if len(predictions) != prepared.passes:
        raise ValueError(f"{len(predictions)} prediction rows for an image of {prepared.passes} passes")
    found = postprocess(predictions, settings.score_floor, settings.nms_iou, settings.max_detections)
    boxes, scores, classes = combine_passes(
        found, prepared.transform, prepared.tile_plan, settings.nms_iou, settings.max_detections
    )
    visible = visible_boxes(boxes)  # clipped to the image, a box off its edge is empty
    boxes, scores, classes = boxes[visible], scores[visible], classes[visible]
    if prepared.repeat_check_image is not None:
        keep = ~repeated_mask(prepared.repeat_check_image, boxes, scores)
        boxes, scores, classes = boxes[keep], scores[keep], classes[keep]
    boxes, scores, classes = merge_fragments(boxes, scores, classes, settings.merge_classes)
    return Found(boxes, scores, classes)


def verdict(scores: np.ndarray, threshold: float) -> str:
    """`DEFECTIVE` when any detection scores >= `threshold` (compared in float64), else `CLEAN`."""
    return DEFECTIVE if bool(np.any(np.asarray(scores, dtype=np.float64) >= threshold)) else CLEAN

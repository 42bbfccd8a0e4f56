"""`Predictor`: runs a defectdet bundle with onnxruntime, NumPy and OpenCV only (no torch import).

decode -> (register the template) -> letterbox (+ native-resolution tiles of a large image when the bundle
says so) -> model -> NMS -> boxes back to original pixels (tile detections merged in) -> verdict. The
letterbox, the tiling, the NMS and the box mapping are the very functions training and `val` use, so a bundle
scores what its checkpoint scored.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from defectdet.data.imageio import (
    DEFAULT_MAX_PIXELS,
    decode_image,
    decode_pair,
    effective_bit_depth,
    read_file_bytes,
    to_uint8,
)
from defectdet.data.letterbox import LetterboxTransform, letterbox_image
from defectdet.data.registration import register_pair
from defectdet.data.tiling import TilePlan, combine_passes, plan_tiles, tile_canvases
from defectdet.errors import CheckpointError, InputError
from defectdet.postprocess import postprocess
from defectdet.runtime.bundle import (
    FEATURES_OUTPUT,
    INPUT_NAME,
    METADATA_KEY,
    PREDICTIONS_OUTPUT,
    BundleMetadata,
    parse_metadata,
)

ImageInput = str | os.PathLike | bytes | bytearray | memoryview | np.ndarray
MAX_DEFAULT_THREADS = 4


@dataclass(frozen=True)
class Detection:
    """One defect: ``box`` xyxy in original image pixels."""

    box: tuple[float, float, float, float]
    class_id: int
    class_name: str
    score: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "class_id": self.class_id,
            "class_name": self.class_name,
            "score": round(self.score, 5),
            "box": [round(value, 2) for value in self.box],
        }


@dataclass
class Prepared:
    """One image ready for the graph: ``tensor`` (C, S, S) float32, the letterbox transform, the letterboxed
    tested image without padding (for the drift statistics) and the measured template registration."""

    tensor: np.ndarray
    transform: LetterboxTransform
    content: np.ndarray
    registration: dict[str, Any] | None = None
    tile_plan: TilePlan | None = None  # with tiles on and a large image: where its tiles are
    tile_tensors: np.ndarray | None = None  # (T, C, S, S) float32, one per tile of `tile_plan`


@dataclass
class PredictionResult:
    """What `Predictor.predict` answers for one image."""

    detections: list[Detection]
    verdict: str  # "defective" | "clean"
    threshold: float
    image_size: tuple[int, int]  # (width, height)
    timings: dict[str, float]  # milliseconds per stage and in total
    image_stats: dict[str, float] = field(default_factory=dict)
    features: np.ndarray | None = None  # (F,) pooled activations for the drift monitor
    registration: dict[str, Any] | None = None  # measured template motion when registration ran
    tiles: int = 0  # native-resolution tiles run besides the whole image (data.tiling)

    @property
    def defective(self) -> bool:
        return self.verdict == "defective"

    def to_dict(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "threshold": self.threshold,
            "image_size": list(self.image_size),
            "detections": [detection.to_dict() for detection in self.detections],
            "timings_ms": {key: round(value, 3) for key, value in self.timings.items()},
            "image_stats": {key: round(float(value), 5) for key, value in self.image_stats.items()},
            "registration": _json_safe(self.registration),
            "tiles": self.tiles,
        }


def _json_safe(values: dict[str, Any] | None) -> dict[str, Any] | None:
    """NaN/Inf floats become None (strict JSON has no NaN); floats rounded to 4 decimals."""
    if values is None:
        return None
    safe: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, float):
            safe[key] = round(value, 4) if math.isfinite(value) else None
        else:
            safe[key] = value
    return safe


def physical_cores() -> int:
    """Physical cores this process may use (hyper-threads counted once); falls back to the CPU count."""
    try:
        allowed = os.sched_getaffinity(0)
    except AttributeError:
        allowed = set(range(os.cpu_count() or 1))
    cores: set[tuple[str, str]] = set()
    try:
        processor = physical = core = None
        for line in Path("/proc/cpuinfo").read_text().splitlines() + [""]:
            key, _, value = (part.strip() for part in line.partition(":"))
            if key == "processor":
                processor = int(value)
            elif key == "physical id":
                physical = value
            elif key == "core id":
                core = value
            elif not line.strip() and processor is not None:
                if processor in allowed and core is not None:
                    cores.add((physical or "0", core))
                processor = physical = core = None
    except (OSError, ValueError):
        cores = set()
    return max(1, len(cores) or len(allowed))


def session_options(threads: int | None = None) -> Any:
    """onnxruntime settings for a process that answers for months: a bounded thread pool that does not
    spin between calls, and a memory arena that, with the bundle's fixed input size, stops growing after the
    first call."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads or min(physical_cores(), MAX_DEFAULT_THREADS)
    options.inter_op_num_threads = 1
    options.execution_mode = onnxruntime.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.enable_cpu_mem_arena = True
    options.enable_mem_pattern = True
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.add_session_config_entry("session.inter_op.allow_spinning", "0")
    options.log_severity_level = 3
    return options


class Predictor:
    """Loads a bundle once; `predict` is thread-safe (onnxruntime sessions are) and allocates per call only
    the arrays of that call."""

    def __init__(
        self,
        bundle: str | os.PathLike,
        threads: int | None = None,
        max_pixels: int = DEFAULT_MAX_PIXELS,
        tiles: bool | None = None,
    ):
        """`tiles`: also run native-resolution tiles of images >= 1.5x the input size (`data.tiling`);
        None: as the bundle says (its training run chose from the data)."""
        import onnxruntime

        self.path = Path(bundle)
        if not self.path.is_file():
            raise CheckpointError(f"{self.path}: bundle file not found")
        try:
            self.session = onnxruntime.InferenceSession(
                str(self.path), session_options(threads), providers=["CPUExecutionProvider"]
            )
        except Exception as error:  # onnxruntime raises its own exception types
            raise CheckpointError(f"{self.path}: onnxruntime cannot load it ({error})") from None
        meta = self.session.get_modelmeta().custom_metadata_map.get(METADATA_KEY)
        self.metadata: BundleMetadata = parse_metadata(meta, self.path)
        self.threads = self.session.get_session_options().intra_op_num_threads
        self.max_pixels = max_pixels
        self.tiles = self.metadata.tiles if tiles is None else bool(tiles)
        outputs = [output.name for output in self.session.get_outputs()]
        if PREDICTIONS_OUTPUT not in outputs:
            raise CheckpointError(f"{self.path}: no {PREDICTIONS_OUTPUT!r} output; outputs are {outputs}")
        self._outputs = [PREDICTIONS_OUTPUT] + ([FEATURES_OUTPUT] if FEATURES_OUTPUT in outputs else [])
        self._check_graph()

    def _check_graph(self) -> None:
        """The metadata must describe the graph: input ``(B, C, S, S)`` with C = `input_channels` and S =
        `input_size`, and ``4 + K`` values per anchor for K `class_names`. A mismatch is a clear error naming the
        field now, not a raw onnxruntime error or a wrong class name later."""
        meta = self.metadata
        inputs = {graph_input.name: graph_input for graph_input in self.session.get_inputs()}
        if INPUT_NAME not in inputs:
            raise CheckpointError(f"{self.path}: no {INPUT_NAME!r} input; inputs are {list(inputs)}")
        shape = list(inputs[INPUT_NAME].shape)
        if len(shape) != 4:
            raise CheckpointError(
                f"{self.path}: the {INPUT_NAME!r} input has shape {shape}, expected (B, C, S, S)"
            )
        graph_channels = shape[1] if isinstance(shape[1], int) else None
        if graph_channels is not None and graph_channels != meta.input_channels:
            if graph_channels == meta.channels * (1 if meta.template else 2):
                raise CheckpointError(
                    f"{self.path}: bundle metadata field 'template' is {str(meta.template).lower()} "
                    f"({meta.input_channels} input channels) but the graph takes {graph_channels}"
                )
            raise CheckpointError(
                f"{self.path}: bundle metadata field 'channels' is {meta.channels} ({meta.input_channels} input "
                f"channels with template={str(meta.template).lower()}) but the graph takes {graph_channels}"
            )
        sides = [side for side in shape[2:] if isinstance(side, int)]
        if any(side != meta.input_size for side in sides):
            raise CheckpointError(
                f"{self.path}: bundle metadata field 'input_size' is {meta.input_size} but the graph takes "
                f"{'x'.join(str(side) for side in shape[2:])} images"
            )
        width = next(o for o in self.session.get_outputs() if o.name == PREDICTIONS_OUTPUT).shape[-1]
        if not isinstance(width, int):  # a symbolic dimension: one zero image tells
            channels = graph_channels or meta.input_channels
            probe = np.zeros((1, channels, meta.input_size, meta.input_size), np.float32)
            try:
                width = self.run(probe)[0].shape[-1]
            except Exception as error:  # noqa: BLE001 - onnxruntime raises its own exception types
                raise CheckpointError(
                    f"{self.path}: the graph does not run on a {channels}x{meta.input_size}x{meta.input_size} "
                    f"input as its metadata says ({str(error).strip().splitlines()[0]})"
                ) from None
        classes = len(meta.class_names)
        if width != 4 + classes:
            raise CheckpointError(
                f"{self.path}: bundle metadata field 'class_names' lists {classes} class(es) but the graph's "
                f"{PREDICTIONS_OUTPUT!r} output has {width} values per anchor, i.e. {width - 4} class(es) (4 + K)"
            )

    # ------------------------------------------------------------------ stages
    def load(self, image: ImageInput, name: str = "image") -> np.ndarray:
        """Decode a path, encoded bytes or an array to the bundle's uint8 layout (HxW gray or HxWx3 RGB)."""
        channels = self.metadata.channels
        if isinstance(image, np.ndarray):
            return _array_to_layout(image, channels, name)
        data, label = self._encoded(image, name)
        return decode_image(data, label, channels, self.max_pixels)

    def load_pair(
        self, image: ImageInput, template: ImageInput | None
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """`load` for a tested image and its template with ONE intensity mapping for both: a deep (12/16-bit)
        pair is scaled by the pair's bit depth, so the model sees no false global difference."""
        if template is None:
            return self.load(image, "image"), None
        if isinstance(image, np.ndarray) and isinstance(template, np.ndarray):
            deep = [
                a for a in (image, template) if np.issubdtype(a.dtype, np.integer) and a.dtype != np.uint8
            ]
            bits = max(effective_bit_depth(a) for a in deep) if len(deep) == 2 else None
            channels = self.metadata.channels
            return (
                _array_to_layout(image, channels, "image", bits),
                _array_to_layout(template, channels, "template", bits),
            )
        if not isinstance(image, np.ndarray) and not isinstance(template, np.ndarray):
            (image_data, image_name), (template_data, template_name) = (
                self._encoded(image, "image"),
                self._encoded(template, "template"),
            )
            return decode_pair(
                image_data, template_data, image_name, template_name, self.metadata.channels, self.max_pixels
            )
        return self.load(image, "image"), self.load(template, "template")

    def _encoded(self, source: ImageInput, name: str) -> tuple[bytes, str | Path]:
        if isinstance(source, (bytes, bytearray, memoryview)):
            return bytes(source), name
        if isinstance(source, (str, os.PathLike)):
            path = Path(source)
            return read_file_bytes(path), path  # regular files only: a FIFO would block
        raise InputError(f"{name}: expected a path, bytes or a numpy array, got {type(source).__name__}")

    def prepare(self, image: np.ndarray, template: np.ndarray | None) -> Prepared:
        """Register the template onto the image (when the bundle was trained so), letterbox both and stack
        them into the graph input ``(C, S, S)`` float32."""
        meta = self.metadata
        registration = None
        if meta.template:
            if template is None:
                raise InputError(
                    "this bundle compares each image to its defect-free template: pass `template`"
                )
            if template.shape[:2] != image.shape[:2]:
                raise InputError(
                    f"template is {template.shape[1]}x{template.shape[0]} but the image is "
                    f"{image.shape[1]}x{image.shape[0]}; a template must be a capture of the same board at the same size"
                )
            if meta.registration:
                template, measured = register_pair(image, template)
                registration = measured.to_dict()
        size, pad = meta.input_size, meta.letterbox.pad_value
        canvas, transform = letterbox_image(image, size, pad)
        template_canvas = letterbox_image(template, size, pad)[0] if meta.template else None
        plan = plan_tiles(image.shape[1], image.shape[0], size) if self.tiles else None
        tile_tensors = None
        if plan:
            pairs = tile_canvases(image, template if meta.template else None, plan, size, pad)
            tile_tensors = np.stack([self._to_tensor(*pair) for pair in pairs])
        return Prepared(
            self._to_tensor(canvas, template_canvas),
            transform,
            _content(canvas, transform),
            registration,
            plan or None,
            tile_tensors,
        )

    def _to_tensor(self, canvas: np.ndarray, template_canvas: np.ndarray | None) -> np.ndarray:
        """uint8 canvases (HxW or HxWxc) -> the graph's ``(C, S, S)`` float32 input."""
        planes = [canvas] if template_canvas is None else [canvas, template_canvas]
        chw = [plane[None] if plane.ndim == 2 else plane.transpose(2, 0, 1) for plane in planes]
        return np.multiply(
            np.concatenate(chw, 0), np.float32(self.metadata.normalization.scale), dtype=np.float32
        )

    def run(self, batch: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """The raw graph: ``(B, C, S, S)`` float32 -> predictions ``(B, A, 4 + K)``, features ``(B, F)`` or None."""
        outputs = self.session.run(self._outputs, {INPUT_NAME: np.ascontiguousarray(batch, dtype=np.float32)})
        return outputs[0], (outputs[1] if len(outputs) > 1 else None)

    # ------------------------------------------------------------------ one call
    def predict(
        self,
        image: ImageInput,
        template: ImageInput | None = None,
        conf: float | None = None,
        min_score: float | None = None,
    ) -> PredictionResult:
        """Detect defects in one image. The verdict is "defective" when a detection scores >= ``conf``
        (default: the bundle's operating threshold); detections below ``min_score`` (default ``conf``) are
        not returned."""
        from defectdet.runtime.monitor import image_statistics

        meta = self.metadata
        threshold = meta.thresholds.score if conf is None else float(conf)
        if not 0.0 <= threshold <= 1.0:
            raise InputError(f"conf must be within [0, 1], got {threshold}")
        floor = threshold if min_score is None else float(min_score)
        started = time.perf_counter()
        decoded, decoded_template = self.load_pair(image, template)
        decoded_at = time.perf_counter()
        prepared = self.prepare(decoded, decoded_template)
        transform = prepared.transform
        stats = image_statistics(prepared.content)
        prepared_at = time.perf_counter()
        batch = prepared.tensor[None]
        if prepared.tile_tensors is not None:
            batch = np.concatenate([batch, prepared.tile_tensors])
        predictions, features = self.run(batch)  # whole image first, then its tiles
        ran_at = time.perf_counter()
        found = postprocess(
            predictions,
            max(floor, meta.thresholds.min_score),
            meta.thresholds.nms_iou,
            meta.thresholds.max_detections,
        )
        plan = prepared.tile_plan
        boxes, scores, classes = combine_passes(
            found, transform, plan, meta.thresholds.nms_iou, meta.thresholds.max_detections
        )
        detections = [
            Detection(
                box=(float(box[0]), float(box[1]), float(box[2]), float(box[3])),
                class_id=int(class_id),
                class_name=meta.class_names[int(class_id)],
                score=float(score),
            )
            for box, class_id, score in zip(boxes, classes, scores, strict=True)
        ]
        finished = time.perf_counter()
        defective = any(detection.score >= threshold for detection in detections)
        return PredictionResult(
            detections=detections,
            verdict="defective" if defective else "clean",
            threshold=threshold,
            image_size=(transform.original_width, transform.original_height),
            timings={
                "decode": (decoded_at - started) * 1e3,
                "letterbox": (prepared_at - decoded_at) * 1e3,
                "model": (ran_at - prepared_at) * 1e3,
                "postprocess": (finished - ran_at) * 1e3,
                "total": (finished - started) * 1e3,
            },
            image_stats=stats,
            features=None if features is None else features[0],
            registration=prepared.registration,
            tiles=len(plan) if plan is not None else 0,
        )


def _content(canvas: np.ndarray, transform: LetterboxTransform) -> np.ndarray:
    """The resized image inside the letterbox canvas, without the padding."""
    x0, y0 = int(transform.pad_x), int(transform.pad_y)
    return canvas[y0 : y0 + transform.resized_height, x0 : x0 + transform.resized_width]


def _array_to_layout(array: np.ndarray, channels: int, name: str, bit_depth: int | None = None) -> np.ndarray:
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

"""`Predictor`: runs a defectdet bundle with onnxruntime, NumPy and OpenCV only (no torch import).

decode -> (register the template) -> letterbox (+ native-resolution tiles of a large image when the bundle
says so) -> model -> NMS -> boxes back to original pixels (tile detections merged in) -> verdict. Everything
but the onnxruntime call is `runtime.pipeline` (`load_pair`, `prepare`, `finish`, `verdict`), the very
functions `engine.predict.predict_records` (training-time evaluation, `val`) runs around its torch forward
pass, so a bundle scores what its checkpoint scored.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from defectdet.compat import Surface, current_keywords
from defectdet.data.imageio import DEFAULT_MAX_PIXELS
from defectdet.errors import CheckpointError, InputError
from defectdet.runtime import pipeline
from defectdet.runtime.bundle import (
    FEATURES_OUTPUT,
    INPUT_NAME,
    METADATA_KEY,
    PREDICTIONS_OUTPUT,
    BundleMetadata,
    parse_metadata,
)
from defectdet.runtime.pipeline import ImageInput, Planes, Prepared
from defectdet.runtime.spec import ModelSpec

__all__ = [
    "Detection",
    "ImageInput",
    "PredictionResult",
    "Predictor",
    "Planes",
    "Prepared",
    "session_options",
]

MAX_DEFAULT_THREADS = 4


@dataclass(frozen=True)
class Detection:
    """One defect: ``box`` xyxy in original image pixels."""

    box: tuple[float, float, float, float]
    class_id: int
    class_name: str
    score: float

    def to_dict(self) -> dict[str, Any]:
        """The score exactly as the model gave it: a rounded score can pass a threshold the detection does not
        (0.4999996 rounds to 0.5), and every reader of these answers compares it with one."""
        return {
            "class_id": self.class_id,
            "class_name": self.class_name,
            "score": float(self.score),
            "box": [round(value, 2) for value in self.box],
        }


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
        """The JSON answer (the server's `/v1/detect` adds `model_version` and `drift`, and replaces the
        timings with its own)."""
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
    """A bundle loaded once, for one image at a time in your own code; torch-free. `predict` is thread-safe
    (onnxruntime sessions are) and allocates per call only the arrays of that call.

    Example:
        ```python
        from defectdet import Predictor

        predictor = Predictor("model.onnx")
        result = predictor.predict("board.png", template="golden.png")  # template: template bundles only
        print(result.verdict, [(d.class_name, round(d.score, 2), d.box) for d in result.detections])
        ```
    """

    def __init__(
        self,
        bundle: str | os.PathLike,
        threads: int | None = None,
        max_pixels: int = DEFAULT_MAX_PIXELS,
        tiles: bool | None = None,
        repeat_check: bool | None = None,
    ):
        """`tiles`: also run native-resolution tiles of images >= 1.5x the input size (`data.tiling`);
        None: as the bundle says (its training run chose from the data). `repeat_check`: drop detections on
        repeated design (`runtime.repeat_check`, models without templates); None: as the bundle was exported."""
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
        self.spec = (
            ModelSpec.from_bundle(self.metadata)
            .model_copy(update={"tiles": self.tiles})
            .with_repeat_check(repeat_check, self.path)
        )
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
            if meta.companions or graph_channels > meta.channels * 2:
                raise CheckpointError(
                    f"{self.path}: the bundle metadata names the planes {meta.planes} ({meta.input_channels} "
                    f"input channels) but the graph takes {graph_channels}"
                )
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
        return pipeline.load_image(image, self.spec.channels, self.max_pixels, name)

    def load_pair(
        self, image: ImageInput, template: ImageInput | None
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """`load` for a tested image and its template with ONE intensity mapping for both (`pipeline.load_pair`)."""
        return pipeline.load_pair(image, template, self.spec.channels, self.max_pixels)

    def load_planes(
        self,
        image: ImageInput,
        template: ImageInput | None,
        companions: Mapping[str, ImageInput] | None = None,
    ) -> Planes:
        """`load` for a tested image, its template and its companion captures with ONE intensity mapping for
        all (`pipeline.load_planes`)."""
        return pipeline.load_planes(image, template, self.spec.channels, self.max_pixels, companions)

    def prepare(
        self,
        image: np.ndarray,
        template: np.ndarray | None,
        companions: Mapping[str, np.ndarray] | None = None,
    ) -> Prepared:
        """`pipeline.prepare` as this bundle runs: the template and companion rules, registration, letterbox,
        tiles, and the graph input ``(C, S, S)`` float32."""
        return pipeline.prepare(image, template, self.spec, companions=companions)

    def run(self, batch: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """The raw graph: ``(B, C, S, S)`` float32 -> predictions ``(B, A, 4 + K)``, features ``(B, F)`` or None."""
        outputs = self.session.run(self._outputs, {INPUT_NAME: np.ascontiguousarray(batch, dtype=np.float32)})
        return outputs[0], (outputs[1] if len(outputs) > 1 else None)

    # ------------------------------------------------------------------ one call
    def predict(
        self,
        image: ImageInput,
        template: ImageInput | None = None,
        threshold: float | None = None,
        score_floor: float | None = None,
        *,
        companions: Mapping[str, ImageInput] | None = None,
        **renamed: Any,
    ) -> PredictionResult:
        """Detect defects in one image. The verdict is "defective" when a detection scores >= ``threshold``
        (default: the bundle's operating threshold); detections below ``score_floor`` (default ``threshold``)
        are not returned. ``companions``: the aligned captures the bundle also takes (`metadata.companions`),
        by name, each at the image's size; every one it names is required.

        Example:
            ```python
            result = Predictor("model.onnx").predict("board.png", template="golden.png")
            print(result.verdict, [(d.class_name, round(d.score, 2)) for d in result.detections])
            result = Predictor("two_lights.onnx").predict("part_L1.png", companions={"L2": "part_L2.png"})
            ```
        """
        from defectdet.runtime.monitor import image_statistics

        threshold, floor = self._cut_offs(threshold, score_floor, renamed)
        started = time.perf_counter()
        planes = self.load_planes(image, template, companions)
        decoded_at = time.perf_counter()
        prepared = self.prepare(planes.image, planes.template, planes.companions)
        transform = prepared.transform
        stats = image_statistics(prepared.content)
        prepared_at = time.perf_counter()
        predictions, features = self.run(prepared.inputs)  # whole image first, then its tiles
        ran_at = time.perf_counter()
        settings = self.spec.postprocess
        found = pipeline.finish(
            predictions,
            prepared,
            dataclasses.replace(settings, score_floor=max(floor, settings.score_floor)),
        )
        detections = self._detections(found)
        finished = time.perf_counter()
        return PredictionResult(
            detections=detections,
            verdict=pipeline.verdict(found.scores, threshold),
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
            tiles=prepared.passes - 1,
        )

    def _cut_offs(
        self, threshold: float | None, score_floor: float | None, renamed: dict[str, Any]
    ) -> tuple[float, float]:
        """The verdict threshold (the bundle's by default) and the score floor (the threshold by default),
        from `predict`'s arguments, retired keyword names included."""
        if renamed:  # keywords retired for one name per concept
            given = current_keywords(renamed, Surface.PREDICT)
            threshold = given.get("threshold", threshold)
            score_floor = given.get("score_floor", score_floor)
        threshold = self.metadata.thresholds.threshold if threshold is None else float(threshold)
        if not 0.0 <= threshold <= 1.0:
            raise InputError(f"threshold must be within [0, 1], got {threshold}")
        return threshold, threshold if score_floor is None else float(score_floor)

    def _detections(self, found: pipeline.Found) -> list[Detection]:
        """The postprocessed boxes, classes and scores as `Detection`s, in their order."""
        class_names = self.metadata.class_names
        return [
            Detection(
                box=(float(box[0]), float(box[1]), float(box[2]), float(box[3])),
                class_id=int(class_id),
                class_name=class_names[int(class_id)],
                score=float(score),
            )
            for box, class_id, score in zip(found.boxes, found.classes, found.scores, strict=True)
        ]

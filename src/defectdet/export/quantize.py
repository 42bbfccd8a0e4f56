"""int8 static quantization of a bundle (onnxruntime QDQ, S8S8, per-channel), proven before it is written.

Calibrated on training images prepared exactly as the runtime prepares them. Only convolutions are
quantized: the box decoding and the sigmoid stay float, so int8 cannot shift boxes by a rounding step.
The int8 file is kept only when its mAP@0.5 on the validation split is within `max_drop` of the fp32 bundle
(unless forced); whether it is faster depends on the CPU (VNNI), so the speed-up is measured, not assumed.
"""

from __future__ import annotations

import logging
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from defectdet.errors import DefectDetError
from defectdet.runtime.bundle import read_metadata, write_metadata

logger = logging.getLogger(__name__)


def int8_path_for(bundle: Path) -> Path:
    return bundle.with_name(f"{bundle.stem}.int8.onnx")


class _CalibrationReader:
    """onnxruntime's CalibrationDataReader protocol over letterboxed training images."""

    def __init__(self, bundle: Path, data: str | Path, split: str, count: int) -> None:
        from defectdet.data.formats import load_dataset
        from defectdet.runtime.predictor import Predictor

        self.predictor = Predictor(bundle, tiles=False)  # calibrates on whole-image inputs
        samples = load_dataset(data, split).samples
        if not samples:
            raise DefectDetError(f"{data} split {split!r} has no images to calibrate int8 on")
        picks = np.linspace(0, len(samples) - 1, num=min(count, len(samples))).round().astype(int)
        self.samples = [samples[index] for index in sorted(set(picks.tolist()))]
        self.position = 0

    def get_next(self) -> dict[str, np.ndarray] | None:
        from defectdet.runtime.pipeline import sample_companions

        while self.position < len(self.samples):
            sample = self.samples[self.position]
            self.position += 1
            try:
                template_path = sample.template_path if self.predictor.metadata.template else None
                companions = sample_companions(sample, self.predictor.metadata.companions)
                planes = self.predictor.load_planes(sample.image_path, template_path, companions)
                tensor = self.predictor.prepare(planes.image, planes.template, planes.companions).tensor
            except DefectDetError as error:
                logger.warning("int8 calibration: skipping %s: %s", sample.image_path, error)
                continue
            return {"images": tensor[None]}
        return None

    def rewind(self) -> None:
        self.position = 0


def depthwise_convolutions(path: Path) -> list[str]:
    """Names of the grouped (depthwise) Conv nodes of an ONNX file."""
    import onnx

    graph = onnx.load(str(path)).graph
    return [
        node.name
        for node in graph.node
        if node.op_type == "Conv" and any(a.name == "group" and a.i > 1 for a in node.attribute)
    ]


def quantize_onnx(
    bundle: Path,
    out: Path,
    data: str | Path,
    split: str,
    calibration_images: int,
    include_depthwise: bool = False,
) -> Path:
    """Write the int8 QDQ model of ``bundle`` to ``out`` (metadata copied, precision "int8").

    Depthwise convolutions stay float by default: onnxruntime 1.32 has no fast int8 depthwise kernel on x86;
    bench/results/int8.json times both variants (`p50_ms_int8_all_convs` quantizes them too).
    """
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    with tempfile.TemporaryDirectory() as folder:
        prepared = Path(folder) / "prepared.onnx"
        quant_pre_process(str(bundle), str(prepared), skip_symbolic_shape=True)
        quantize_static(
            str(prepared),
            str(out),
            _CalibrationReader(bundle, data, split, calibration_images),
            quant_format=QuantFormat.QDQ,
            activation_type=QuantType.QInt8,
            weight_type=QuantType.QInt8,
            per_channel=True,
            op_types_to_quantize=["Conv"],
            nodes_to_exclude=[] if include_depthwise else depthwise_convolutions(prepared),
            calibrate_method=CalibrationMethod.MinMax,
            extra_options={"ActivationSymmetric": True},
        )
    metadata = read_metadata(bundle)
    write_metadata(out, metadata.model_copy(update={"precision": "int8"}))
    return out


def time_onnx(path: Path, channels: int, size: int, runs: int = 30, threads: int | None = None) -> float:
    """p50 milliseconds of one batch-1 run of an ONNX file."""
    from defectdet.runtime.predictor import Predictor

    predictor = Predictor(path, threads=threads)
    batch = np.random.default_rng(0).random((1, channels, size, size), dtype=np.float32)
    for _ in range(5):
        predictor.run(batch)
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        predictor.run(batch)
        times.append((time.perf_counter() - start) * 1e3)
    return float(np.median(times))


def quantize_bundle(
    bundle: Path,
    data: str | Path,
    *,
    train_split: str,
    val_split: str,
    calibration_images: int = 64,
    max_drop: float = 0.005,
    force: bool = False,
    console: Any = None,
) -> dict[str, Any]:
    """Quantize, then compare fp32 and int8 on ``val_split`` (mAP@0.5) and in speed; keep the int8 file only
    when it loses at most ``max_drop`` mAP@0.5 (or ``force``). Returns the comparison."""
    from defectdet.engine.validate import validate

    target = int8_path_for(bundle)
    metadata = read_metadata(bundle)
    with tempfile.TemporaryDirectory() as folder:
        candidate = Path(folder) / target.name
        quantize_onnx(bundle, candidate, data, train_split, calibration_images)
        scores = {}
        for name, path in (("fp32", bundle), ("int8", candidate)):
            metrics = validate(
                path, data, split=val_split, protocol="coco", out=Path(folder) / name, console=None
            )
            scores[name] = float(metrics["headline"]["mAP50"] or 0.0)
        latency = {
            name: time_onnx(path, metadata.input_channels, metadata.input_size)
            for name, path in (("fp32", bundle), ("int8", candidate))
        }
        drop = scores["fp32"] - scores["int8"]
        accepted = drop <= max_drop or force
        report = {
            "mAP50_fp32": round(scores["fp32"], 4),
            "mAP50_int8": round(scores["int8"], 4),
            "mAP50_drop": round(drop, 4),
            "max_drop": max_drop,
            "p50_ms_fp32": round(latency["fp32"], 2),
            "p50_ms_int8": round(latency["int8"], 2),
            "speedup": round(latency["fp32"] / latency["int8"], 3),
            "calibration_images": calibration_images,
            "calibration_split": train_split,
            "validation_split": val_split,
            "written": bool(accepted),
            "forced": bool(force and drop > max_drop),
            "path": str(target) if accepted else None,
        }
        if accepted:
            candidate.replace(target)
    if not accepted:
        logger.warning(
            "int8 refused: mAP@0.5 %.4f -> %.4f (drop %.4f > %.4f); pass --force to write it anyway",
            scores["fp32"],
            scores["int8"],
            drop,
            max_drop,
        )
    return report

"""int8 or not: quantize a trained bundle (static QDQ, S8S8, per-channel) and compare mAP and speed with fp32.

Usage: ``python -m bench.int8 --checkpoint runs/deeppcb_nano/best.pt [--data ../shared/datasets/deeppcb]
[--calibration-images 64] [--threads 2]``. The checkpoint comes from ``bench/train_deeppcb.py`` or
``defectdet train``. Writes ``bench/results/int8.json``: the verdict `defectdet export --int8` would give
(written when mAP@0.5 drops by at most 0.5 points), mAP@0.5 of both on the validation split and p50 latency of both,
plus the latency of the variant that also quantizes the depthwise convolutions (export keeps those float).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from bench import common
from defectdet.export.exporter import (
    INT8_MAX_MAP50_DROP,
    export_bundle,
)
from defectdet.export.quantize import quantize_bundle, quantize_onnx, time_onnx
from defectdet.runtime.bundle import read_metadata

DEFAULT_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "datasets" / "deeppcb"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", type=Path, required=True)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--split", default="val")
    parser.add_argument("--train-split", default="train")
    parser.add_argument("--calibration-images", type=int, default=64)
    parser.add_argument("--out-dir", type=Path, default=common.RESULTS_DIR)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        bundle = export_bundle(
            args.checkpoint, Path(folder) / "model.onnx", data=args.data, split=args.split
        ).bundle
        report = quantize_bundle(
            bundle, args.data, train_split=args.train_split, val_split=args.split,
            calibration_images=args.calibration_images, max_drop=INT8_MAX_MAP50_DROP,
        )  # fmt: skip
        # the variant export does not use: depthwise convolutions quantized too
        variant = quantize_onnx(
            bundle,
            Path(folder) / "all_convs.onnx",
            args.data,
            args.train_split,
            args.calibration_images,
            include_depthwise=True,
        )
        report["p50_ms_int8_all_convs"] = round(
            time_onnx(variant, read_metadata(bundle).input_channels, read_metadata(bundle).input_size), 2
        )
    report["path"] = None
    report["verdict"] = "kept" if report["written"] else "refused"
    settings = {"checkpoint": str(args.checkpoint), "data": str(args.data), "split": args.split}
    path = common.write_result("int8", {"settings": settings, "result": report}, args.out_dir)
    columns = ["verdict", "mAP50_fp32", "mAP50_int8", "mAP50_drop", "p50_ms_fp32", "p50_ms_int8", "speedup",
               "p50_ms_int8_all_convs"]  # fmt: skip
    common.print_table("int8 vs fp32 (onnxruntime, batch 1)", columns, [[report[c] for c in columns]])
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

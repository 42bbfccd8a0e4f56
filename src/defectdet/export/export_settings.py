"""`ExportSettings`, what `export_bundle` writes into a bundle and beside it, and `defectdet export`'s options
(`EXPORT_OPTIONS`).

Apart from `export.exporter` so that reading them imports no torch: the command line builds its options from
them at start.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict

from defectdet.cli_option import COMMAND_OPTION, CliOption
from defectdet.runtime.predict_settings import REPEAT_CHECK_HELP


class ExportSettings(BaseModel):
    """What `export_bundle` measures and writes: the data its thresholds and drift reference come from, the
    extra formats and the int8 variant, and the test-time options written into the bundle.

    - `data` / `split`: the dataset and split the thresholds are measured on (None: the training's dataset and
      validation split); without data, the checkpoint's logged thresholds and no drift reference.
    - `flip_views` (`model.flip_average`): test-time flips averaged inside the graph, one more forward pass
      per view. `repeat_check`: `runtime.repeat_check`. `merge_fragments`: choose the fragment merge's
      classes on the measured split (False: none).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    data: str | Path | None = None  # dataset to measure on (None: the training data)
    split: str | None = None  # split to measure on (None: the training's validation split)
    formats: tuple[str, ...] = ("onnx",)  # of exporter.FORMATS; onnx is always written
    int8: bool = False  # also write <name>.int8.onnx if it keeps mAP@0.5
    force: bool = False  # write the int8 model even when it loses more than INT8_MAX_MAP50_DROP
    calibration_images: int = 64  # training images to calibrate int8 on
    target_recall: float = 0.99  # the bundle also records the threshold that reaches this recall
    flip_views: str = "none"  # none | lr | lr+ud
    repeat_check: bool = False  # written into the bundle
    merge_fragments: bool = True  # choose the fragment merge's classes on the measured split


# `defectdet export`'s options, in the order its help lists them; --out and --overwrite are the command's own (where
# the bundle goes, and whether one there may be replaced)
EXPORT_OPTIONS: dict[str, CliOption] = {
    "formats": CliOption(
        flag="--format",
        help="onnx (always written) | torchscript (.ts, trace + freeze; TorchScript is in maintenance mode upstream: "
        "prefer pt2; apply torch.jit.optimize_for_inference after loading) | pt2 (torch.export) | all. Repeatable.",
        type=list[str],
        default=["onnx"],
        to_setting=tuple,
    ),
    "int8": CliOption(
        flag="--int8",
        help="Also write <name>.int8.onnx (static QDQ S8S8, per-channel) if it keeps mAP@0.5.",
    ),
    "force": CliOption(flag="--force", help="Write the int8 model even when it loses > 0.5 mAP points."),
    "overwrite": COMMAND_OPTION,
    "data": CliOption(
        help="Dataset to measure thresholds and the drift reference on (default: the training data).",
        type=Path,
    ),
    "split": CliOption(help="Split to measure on (default: the training's validation split)."),
    "calibration_images": CliOption(help="Training images to calibrate int8 on."),
    "flip_views": CliOption(
        flag="--flip-views",
        help="Test-time flips averaged inside the bundle: none | lr (2 passes) | lr+ud (4 passes): more "
        "accuracy for more latency.",
    ),
    "repeat_check": CliOption(flag="--repeat-check", help=REPEAT_CHECK_HELP + " Written into the bundle."),
    "merge_fragments": CliOption(
        flag="--merge-fragments/--no-merge-fragments",
        help="Report overlapping pieces of one large defect as one box, for the classes where that raised AP@0.5 "
        "on the split measured on (default); --no-merge-fragments: never.",
    ),
}

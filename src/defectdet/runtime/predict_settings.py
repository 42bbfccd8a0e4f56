"""`PredictSettings`, how `predict_source` runs a bundle over a file, folder or glob, and `defectdet predict`'s
options (`PREDICT_OPTIONS`). Torch-free, as the whole runtime."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator

from defectdet.cli_option import COMMAND_OPTION, CliOption
from defectdet.compat import Surface, current_keys

# the repeat check (`runtime.repeat_check`) in the words of the command-line options that turn it on (val, export,
# predict)
REPEAT_CHECK_HELP = (
    "Models without templates: drop detections whose surroundings repeat unchanged elsewhere in the image (a drill "
    "hole drawn on every pad is design, not a pin-hole; runtime.repeat_check)."
)


class PredictSettings(BaseModel):
    """How `predict_source` predicts: the inputs that go with each image (templates, companion captures), the
    bundle's own settings overridden (None: the bundle's), and what is written and shown.

    - `templates`: a folder of template images, matched by file name (`runtime.predict.pair_template`).
    - `companions`: name -> folder of each aligned capture the bundle takes (`parse_companions` reads
      `--companion NAME=DIR`); each image's capture is the file of its name there.
    - `flip_views`: the test-time flips the bundle was exported with (`defectdet.predict` exports a checkpoint
      with them); a bundle exported with others is refused.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    templates: str | Path | None = None  # folder of template images, matched by file name
    companions: dict[str, Path] | None = None  # companion capture name -> its folder
    threshold: float | None = None  # operating threshold (None: the bundle's)
    save_images: bool = True  # write annotated PNGs
    threads: int | None = None  # onnxruntime threads (None: physical cores, at most 4)
    tiles: bool | None = None  # native-resolution tiles of large images (None: the bundle's)
    flip_views: str | None = None  # test-time flips none | lr | lr+ud (None: the bundle's)
    repeat_check: bool | None = None  # runtime.repeat_check (None: the bundle's)
    progress: bool = True  # show a progress bar

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, values: Any) -> Any:
        """Keywords retired for one name per concept (`defectdet.compat`) still work."""
        if not isinstance(values, dict):
            return values
        return current_keys(values, Surface.PREDICT_SOURCE, "predict_source()", stacklevel=6)


def _companion_folders(values: list[str]) -> dict[str, Path]:
    from defectdet.runtime.predict import parse_companions  # it reads the image folders: only when given

    return parse_companions(values)


# `defectdet predict`'s options, in the order its help lists them; --out is the command's own (`predict_source`'s
# `out`)
PREDICT_OPTIONS: dict[str, CliOption] = {
    "templates": CliOption(help="Folder of template images, matched by file name.", type=Path),
    "companions": CliOption(
        flag="--companion",
        help="NAME=DIR: the folder of the aligned companion capture NAME (another lighting, focus or band), "
        "matched by file name, or by the name's capture tag (part_L1.png -> part_L2.png: DIR may be the images' "
        "own folder); once per companion the model takes.",
        type=list[str],
        default=None,
        to_setting=_companion_folders,
    ),
    "threshold": CliOption(help="Operating threshold (default: the bundle's best-F1 threshold)."),
    "out": COMMAND_OPTION,
    "save_images": CliOption(flag="--save-images/--no-save-images", help="Write annotated PNGs."),
    "threads": CliOption(help="onnxruntime threads (default: physical cores, at most 4)."),
    "tiles": CliOption(
        flag="--tiles/--no-tiles",
        help="Also run native-resolution tiles of images >= 1.5x the input size and keep their small "
        "detections (default: as the training run chose from the data).",
    ),
    "flip_views": CliOption(
        flag="--flip-views",
        help="Test-time flips (none|lr|lr+ud) written into the graph when MODEL is a checkpoint; a bundle "
        "must have been exported with them (default: the bundle's own, none for a checkpoint).",
    ),
    "repeat_check": CliOption(
        flag="--repeat-check/--no-repeat-check",
        help=REPEAT_CHECK_HELP + " Default: a bundle's own, off for a checkpoint.",
    ),
}

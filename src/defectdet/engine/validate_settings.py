"""`ValidateSettings`, how `validate` scores a model, and `defectdet val`'s options (`VALIDATE_OPTIONS`).

Apart from `engine.validate` so that reading them imports no torch: the command line builds its options from
them at start.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator

from defectdet.cli_option import CliOption
from defectdet.compat import Surface, current_keys
from defectdet.data.recapture_config import RecaptureConfig
from defectdet.defaults import DEFAULT_TARGET_ESCAPE
from defectdet.errors import ConfigError
from defectdet.runtime.predict_settings import REPEAT_CHECK_HELP

PROTOCOLS = ("coco", "deeppcb", "both")
THRESHOLD_RULES = ("escape", "f1")
DEFAULT_EVAL_BATCH = 8  # images per forward pass in evaluation (the trainer and `val` share it)


class ValidateSettings(BaseModel):
    """How `validate` scores a model: the split and protocol, the output folder, how the operating threshold
    is chosen, clean boards, and overrides of the model's own input settings (None: as trained/exported).

    - Operating threshold: `threshold` when given; else with `threshold_from` (another split of the data) the
      highest threshold whose board escape rate there is <= `target_escape` (`threshold_rule="escape"`) or its
      best pooled box F1 (`threshold_rule="f1"`, for box-scoring protocols such as DeepPCB's F);
      `threshold_from="bundle"`: a bundle's stored `thresholds.threshold`; else the best-F1 threshold of the reported records themselves
      (optimistic; the report says so). `metrics["threshold"]` records the value, rule and source.
    - `clean_templates`: add a clean board per template, a recapture with `clean_nuisance` (default
      `RecaptureConfig()`; `RecaptureConfig.none()` feeds the template as its own tested image), seeded by `seed`.
    - `register_pairs`: align each template to its tested image (None: as the model was trained, default on).
    - `tiles`: also run native-resolution tiles of images much larger than the letterbox (`data.tiling`;
      None: as the bundle or the training run chose).
    - `flip_views`: test-time flips averaged per anchor (`model.flip_average`; None: a bundle's own, none for
      a checkpoint). A bundle runs the views written into its graph; asking it for others is an error.
    - `repeat_check`: drop detections whose surroundings repeat unchanged elsewhere in the image
      (`runtime.repeat_check`; models without templates; None: a bundle's own, off for a checkpoint).
    - `merge_fragments`: False reports a bundle's detections without its fragment merge
      (`postprocess.merge_fragments`; None: the bundle's own classes, none for a checkpoint).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    split: str = "val"
    protocol: str | None = None  # one of PROTOCOLS; None: coco, plus deeppcb on DeepPCB data
    out: str | Path | None = None  # default runs/val/<run folder>-<checkpoint stem> (default_out_dir)
    threshold: float | None = None
    threshold_from: str | None = None
    target_escape: float = DEFAULT_TARGET_ESCAPE
    threshold_rule: str = "escape"  # one of THRESHOLD_RULES
    target_recall: float = 0.99
    clean_templates: bool = False
    clean_nuisance: RecaptureConfig | None = None
    register_pairs: bool | None = None
    tiles: bool | None = None
    flip_views: str | None = None
    repeat_check: bool | None = None
    merge_fragments: bool | None = None
    seed: int = 0
    batch: int = DEFAULT_EVAL_BATCH
    format: str | None = None  # dataset format (None: detected)
    input_size: int | None = None
    threads: int | None = None

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, values: Any) -> Any:
        """Keywords retired for one name per concept (`defectdet.compat`) still work."""
        return (
            current_keys(values, Surface.VALIDATE, "ValidateSettings", stacklevel=5)
            if isinstance(values, dict)
            else values
        )

    def check(self) -> None:
        """Raise ConfigError, in the CLI's words, for values or combinations `validate` cannot run."""
        if self.protocol is not None and self.protocol not in PROTOCOLS:
            raise ConfigError(f"--protocol must be one of {', '.join(PROTOCOLS)}, got {self.protocol!r}")
        if self.threshold is not None and self.threshold_from is not None:
            raise ConfigError("give either --threshold or --threshold-from, not both")
        if self.flip_views is not None:
            from defectdet.model.flip_average import check_views  # torch: only when validating

            try:
                check_views(self.flip_views)
            except ValueError as error:
                raise ConfigError(f"--flip-views: {error}") from None
        if self.threshold_rule not in THRESHOLD_RULES:
            raise ConfigError(
                f"--threshold-rule must be one of {', '.join(THRESHOLD_RULES)}, got {self.threshold_rule!r}"
            )
        if self.threshold_from is not None and self.threshold_from == self.split:
            raise ConfigError(
                f"--threshold-from {self.threshold_from!r} is the split being reported: choose the threshold on "
                "another split"
            )

    @classmethod
    def merged(cls, settings: ValidateSettings | None, overrides: dict[str, Any]) -> ValidateSettings:
        """`settings` (default: all defaults) with `overrides` (field name -> value) applied over it."""
        overrides = current_keys(overrides, Surface.VALIDATE, "validate()")
        unknown = sorted(set(overrides) - set(cls.model_fields))
        if unknown:
            raise TypeError(f"validate() got unexpected keyword argument(s): {', '.join(unknown)}")
        base = settings if settings is not None else cls()
        return cls.model_validate({**dict(base), **overrides}) if overrides else base


# `defectdet val`'s options, in the order its help lists them (the clean boards' recapture is declared in cli.py:
# three options make one RecaptureConfig).
VALIDATE_OPTIONS: dict[str, CliOption] = {
    "split": CliOption(help="Split to evaluate (a DeepPCB list file stem, e.g. test)."),
    "protocol": CliOption(help="coco|deeppcb|both (default: coco, and both on DeepPCB data)."),
    "out": CliOption(help="Output folder (default: runs/val/<run>-<checkpoint stem>).", type=Path),
    "threshold": CliOption(help="Operating threshold (default: the best-F1 threshold)."),
    "target_recall": CliOption(help="Also report the threshold that reaches this recall."),
    "threshold_from": CliOption(
        help="Choose the operating threshold on this other split of DATA (the highest one whose board escape "
        "rate there is <= --target-escape) and report the rates on --split; 'bundle': the bundle's stored "
        "threshold."
    ),
    "target_escape": CliOption(help="Escape-rate target for --threshold-from."),
    "threshold_rule": CliOption(
        help="How --threshold-from chooses: 'escape' (boards, --target-escape) or 'f1' (the best box F1 there, "
        "for box-scoring protocols such as DeepPCB's F)."
    ),
    "clean_templates": CliOption(
        help="Add a clean board per template: a recapture of it (exposure, gamma, noise, JPEG, 0.25-2 px shift, "
        "<= 0.25 deg rotation) for the false-call rate."
    ),
    "register_pairs": CliOption(
        flag="--register/--no-register",
        help="Align each template to its tested image before the model (default: as trained, on).",
    ),
    "tiles": CliOption(
        flag="--tiles/--no-tiles",
        help="Also run native-resolution tiles of images >= 1.5x the input size and keep their small detections "
        "(default: as the training run chose from the data).",
    ),
    "batch": CliOption(help="Batch size."),
    "format": CliOption(flag="--format", help="Dataset format (default: detected)."),
    "flip_views": CliOption(help="Test-time flips: none, lr or lr+ud (bundle: its own)."),
    "repeat_check": CliOption(
        flag="--repeat-check/--no-repeat-check",
        help=REPEAT_CHECK_HELP + " Default: a bundle's own, off for a checkpoint.",
    ),
    "merge_fragments": CliOption(
        flag="--merge-fragments/--no-merge-fragments",
        help="A bundle's fragment merge: the classes where export found that overlapping pieces of one large "
        "defect are better reported as one box. --no-merge-fragments scores the bundle without it.",
        default=True,
        to_setting=lambda merge: None if merge else False,
    ),
}

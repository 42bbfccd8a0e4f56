"""`CompareSettings`, how `compare_models` compares OLD and NEW, and `defectdet compare`'s options
(`COMPARE_OPTIONS`).

Apart from `export.compare` so that reading them loads neither the evaluation nor the runtime's predictor: the
command line builds its options from them at start.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator

from defectdet.cli_option import CliOption
from defectdet.runtime.compare_rule import Tolerances

_RULE = Tolerances()  # the promotion rule's own tolerances


class CompareSettings(BaseModel):
    """How `compare_models` compares: the held-out images and clean boards, where the results go, the
    onnxruntime threads, and the tolerances of the promotion rule (`runtime.compare_rule.Tolerances`, also
    given whole as `tolerances=`).

    - `clean`: a folder of defect-free boards (with `clean_templates`, their templates, matched by file name);
      `clean_auto`: a recaptured clean board per template of the split (`data.recapture.make_clean_boards`,
      seeded by `seed`).
    - `out`: compare.json and, when the models disagree anywhere, disagreements.png (at most `max_grid` rows).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    split: str = "val"  # held-out split to compare on
    format: str | None = None  # dataset format (None: detected)
    clean: str | Path | None = None  # folder of defect-free boards, for the false calls
    clean_templates: str | Path | None = None  # templates of the clean boards, matched by file name
    clean_auto: bool = False  # add a recaptured clean board per template of the split
    out: str | Path = Path("runs/compare")  # output folder
    threads: int | None = None  # onnxruntime threads per model (None: physical cores, <= 4)
    tol_escape: float = _RULE.escape  # escape and missed-defect rates NEW may exceed OLD's by
    tol_map: float = _RULE.map50  # mAP@0.5 NEW may fall below OLD's by
    tol_false_call: float = _RULE.false_call  # false-call rate NEW may exceed OLD's by
    max_grid: int = 12  # rows of disagreements.png
    seed: int = 0  # the recaptured clean boards' seed
    progress: bool = False  # show a progress bar

    @model_validator(mode="before")
    @classmethod
    def _whole_tolerances(cls, values: Any) -> Any:
        return tolerance_keywords(values) if isinstance(values, dict) else values

    @property
    def tolerances(self) -> Tolerances:
        """The promotion rule's tolerances (an InputError names one out of [0, 1])."""
        return Tolerances(escape=self.tol_escape, map50=self.tol_map, false_call=self.tol_false_call)


def tolerance_keywords(keywords: Mapping[str, Any]) -> dict[str, Any]:
    """`keywords` with a whole `tolerances` (a `Tolerances`, or None: the rule's own) given as its three
    fields, as `compare_models(..., tolerances=Tolerances(...))` takes it."""
    keywords = dict(keywords)
    if "tolerances" not in keywords:
        return keywords
    tolerances = keywords.pop("tolerances") or Tolerances()
    given = {
        "tol_escape": tolerances.escape,
        "tol_map": tolerances.map50,
        "tol_false_call": tolerances.false_call,
    }
    both = sorted(set(given) & set(keywords))
    if both:
        raise TypeError(f"give either tolerances or {', '.join(both)}, not both")
    return {**keywords, **given}


# `defectdet compare`'s options, in the order its help lists them
COMPARE_OPTIONS: dict[str, CliOption] = {
    "split": CliOption(
        help="Held-out split to compare on (a dataset without one: the training's grouped hold-out)."
    ),
    "format": CliOption(flag="--format", help="yolo|coco|voc|deeppcb (default: detected)."),
    "clean": CliOption(flag="--clean", help="Folder of defect-free boards, for the false calls.", type=Path),
    "clean_templates": CliOption(
        flag="--clean-templates",
        help="Templates of the --clean boards, matched by file name (template models).",
        type=Path,
    ),
    "clean_auto": CliOption(
        flag="--clean-auto",
        help="Add a recaptured clean board per template of the split (exposure, noise, JPEG, small shift/rotation).",
    ),
    "out": CliOption(flag="--out", help="Output folder (compare.json, disagreements.png).", type=Path),
    "threads": CliOption(help="onnxruntime threads per model (default: physical cores, <= 4)."),
    "tol_escape": CliOption(help="Escape and missed-defect rates NEW may exceed OLD's by."),
    "tol_map": CliOption(help="mAP@0.5 NEW may fall below OLD's by."),
    "tol_false_call": CliOption(help="False-call rate NEW may exceed OLD's by."),
}

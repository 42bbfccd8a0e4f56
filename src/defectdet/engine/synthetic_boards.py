"""Synthetic PCB boards mixed into training (`train --synthetic-boards N`).

A model trained without templates on a few board designs calls what it never saw on a board a defect: a drilled
pad of a new design looks like a pin-hole. The synthetic boards of `defectdet synth` draw pads, vias and traces
of many layouts as design and their defects with exact boxes, so mixed into training they teach that a round
hole in a pad is drawn on purpose (measured on DeepPCB's held-out groups by
bench/results/ablate_deeppcb_plain_tiny_*_synthetic_boards-*.json).

The boards are drawn once per (count, seed, gray/colour, with/without templates, size) into a cache folder
(`$DEFECTDET_CACHE`, else `$XDG_CACHE_HOME/defectdet`, else `~/.cache/defectdet`) and reused: the same seed
draws identical files, so a resumed or repeated run trains on the same images. Their classes are matched to the
data's by name (case, spaces, `-` and `_` ignored, plus the names public PCB datasets use, such as
`spurious_copper`); boxes of a synthetic class the data lacks are dropped and the board kept.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np

from defectdet.data.sample import DatasetSplit, Sample
from defectdet.engine.autoconfig import Choice, defect_free_sample
from defectdet.errors import ConfigError

logger = logging.getLogger(__name__)
# pretraining draws seeds 1001-1003, preset_modes 4242-4245, the demo and the surface family 0
SYNTHETIC_SEED = 5151
# what of each drawn board trains: the damaged board, its defect-free design (golden template), or both
MODES = ("defects", "design", "both")
# the board generator's scale: a smaller or larger input size gets boards clamped to this
BOARD_SIZES = (480, 1024)
# other spellings of the synthetic classes in public PCB datasets (normalised: lower case, letters and digits)
ALIASES = {
    "opencircuit": "open",
    "shortcircuit": "short",
    "mousebites": "mousebite",
    "spurs": "spur",
    "spuriouscopper": "copper",
    "pinholes": "pinhole",
    "missingholes": "missinghole",
}


# what the boards cost a template model (drawn as pairs), measured against the same run without them
TEMPLATE_COST = (
    "the template already shows what is drawn on purpose; with templates, 400 boards lowered DeepPCB held-out "
    "mAP@0.5 at 10 minutes (see the accuracy benchmarks)"
)
# measured on one core of the 2-core machine: they cost at 10 minutes and paid at 20, 30 and 60 (15 is not
# measured; 20 is the first budget that paid). A faster machine buys more steps a minute: advice, not a refusal.
PAYS_FROM_MINUTES = 20
SHORT_BUDGET_COST = (
    "under 20 minutes the boards take training steps from the line's own images: on DeepPCB without templates, "
    "400 boards lowered held-out mAP@0.5 at 10 minutes (pin-hole up, every other class down) and raised it at "
    "20 (see the accuracy benchmarks)"
)


def short_budget(minutes: float | None) -> bool:
    """Whether a time budget is too short for synthetic boards to pay (an epoch budget is not judged)."""
    return minutes is not None and minutes < PAYS_FROM_MINUTES


def normalised(name: str) -> str:
    """`name` in lower case with everything but letters and digits removed, then un-aliased."""
    key = re.sub(r"[^0-9a-z]", "", name.lower())
    return ALIASES.get(key, key)


def class_table(synthetic_names: list[str], data_names: list[str]) -> dict[int, int]:
    """Synthetic class id -> the data's class id, for the synthetic classes the data has (by `normalised` name)."""
    data_ids = {normalised(name): index for index, name in enumerate(data_names)}
    return {
        index: data_ids[normalised(name)]
        for index, name in enumerate(synthetic_names)
        if normalised(name) in data_ids
    }


def cache_root() -> Path:
    """Where drawn boards are kept: $DEFECTDET_CACHE, else $XDG_CACHE_HOME/defectdet, else ~/.cache/defectdet."""
    if os.environ.get("DEFECTDET_CACHE"):
        return Path(os.environ["DEFECTDET_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "defectdet"


def board_size(input_size: int) -> int:
    """The side of the drawn boards: the training size, clamped to the scale the board generator draws at."""
    return min(max(input_size, BOARD_SIZES[0]), BOARD_SIZES[1])


def draw_boards(count: int, *, seed: int, color: bool, template: bool, size: int) -> Path:
    """The data.yaml of `count` synthetic boards, drawn into the cache unless already there.

    Drawn into a temporary folder and renamed into place, so a stopped run never leaves half a set and
    processes drawing the same set at once (DDP ranks) all end up reading one complete copy.
    """
    from defectdet.data.synth import synthesize_dataset

    wanted = {"boards": count, "seed": seed, "color": color, "template": template, "size": size, "version": 1}
    name = (
        f"boards-{count}_seed-{seed}_{'rgb' if color else 'gray'}_{'pairs' if template else 'plain'}_{size}px"
    )
    folder = cache_root() / "synthetic_boards" / name
    stamp = folder / "stamp.json"
    if _stamp_matches(stamp, wanted):
        return folder / "data.yaml"
    logger.info("synthetic_boards: drawing %d boards into %s", count, folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    scratch = folder.parent / f".{name}.{os.getpid()}.tmp"
    shutil.rmtree(scratch, ignore_errors=True)
    try:
        synthesize_dataset(
            scratch,
            boards=count,
            seed=seed,
            template=template,
            min_size=size,
            max_size=size,
            val_fraction=0.0,
            color=color,
            progress=False,
        )
        (scratch / "stamp.json").write_text(json.dumps(wanted))
        if folder.exists() and not _stamp_matches(stamp, wanted):
            shutil.rmtree(folder)  # an older or broken set under the same name
        try:
            os.rename(scratch, folder)
        except OSError:  # another process renamed its identical copy first
            if not stamp.is_file():
                raise
    except OSError as error:
        raise ConfigError(
            f"field 'synthetic_boards': could not draw boards into {folder}: {error}"
        ) from error
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return folder / "data.yaml"


def _stamp_matches(stamp: Path, wanted: dict) -> bool:
    """Whether `stamp` records exactly `wanted` (a missing, unreadable or garbled stamp does not)."""
    try:
        return json.loads(stamp.read_text()) == wanted
    except (OSError, ValueError):
        return False


def suggested_count(images: int) -> int:
    """About half as many boards as labelled images, in fifties: 400 beside DeepPCB's 789 training images
    was the best of 200, 400 and 800 (bench/results/ablate_deeppcb_plain_tiny_20min_synthetic_boards-*.json); more
    crowd the line's own images out of each epoch."""
    return max(50, int(round(images / 2 / 50)) * 50)


def no_synthetic_boards_row(template: bool, split: DatasetSplit, minutes: float | None = None) -> Choice:
    """The settings row of a run without synthetic boards: whether they fit this data (and its time budget,
    `minutes`), and what they measured."""
    from defectdet.data.synth import CLASS_NAMES

    if template:
        return Choice("synthetic_boards", 0, f"none: {TEMPLATE_COST}", "auto")
    matched = sorted(class_table(list(CLASS_NAMES), list(split.class_names)).values())
    if len(matched) < 2:
        return Choice(
            "synthetic_boards",
            0,
            f"none: synthetic PCB boards fit PCB data whose classes are board defects ({', '.join(CLASS_NAMES)})",
            "auto",
        )
    names = ", ".join(split.class_names[index] for index in matched)
    if short_budget(minutes):
        return Choice(
            "synthetic_boards",
            0,
            f"none: this data names board defects ({names}), but a {minutes:g}-minute budget is too short for "
            f"synthetic boards: {SHORT_BUDGET_COST}",
            "auto",
        )
    return Choice(
        "synthetic_boards",
        0,
        f"none given; this data names board defects ({names}): try `--synthetic-boards "
        f"{suggested_count(len(split.samples))}`. On DeepPCB without templates they steady pin-hole and cost spur and short; give them "
        "20 minutes or more (they cost accuracy at 10). Drawn as designs only (`--set "
        "synthetic_boards_mode=design`) and exported with `--flip-views lr+ud` they did better; so did training "
        "without them and exporting with `--repeat-check` (detections on the design's own repeats dropped). "
        "See the accuracy benchmarks.",
        "auto",
    )


def add_synthetic_boards(
    split: DatasetSplit,
    count: int,
    *,
    seed: int,
    color: bool,
    template: bool,
    input_size: int,
    minutes: float | None = None,
    mode: str = "defects",
) -> tuple[DatasetSplit, Choice]:
    """`split` plus `count` synthetic boards, classes moved onto the split's; and the settings row.

    `mode` (`MODES`): "defects" adds the damaged boards; "design" only their defect-free designs (the boards'
    golden templates, images without boxes: holes drawn on purpose, no synthetic defect to mistake for the
    line's own); "both" each damaged board and its design. ConfigError when no synthetic class matches one of
    the split's: the boards would only teach that their defects are background.
    """
    from defectdet.data.formats import load_dataset

    table = _matched_classes(split)
    if template:
        logger.warning("synthetic_boards: they are for runs without templates: %s", TEMPLATE_COST)
    if short_budget(minutes):
        logger.warning("synthetic_boards: a %g-minute budget: %s", minutes, SHORT_BUDGET_COST)
    if mode not in MODES:
        raise ConfigError(f"field 'synthetic_boards_mode': one of {', '.join(MODES)}, got {mode!r}")
    size = board_size(input_size)
    drawn = draw_boards(count, seed=seed, color=color, template=template or mode != "defects", size=size)
    samples = []
    for index, sample in enumerate(load_dataset(drawn, "train").samples):
        if mode != "design":
            samples.append(_damaged_board(sample, index, table, template))
        if mode != "defects":
            samples.append(_board_design(sample, index, template))
    what = {"defects": "boards", "design": "defect-free board designs", "both": "boards and their designs"}
    drawn_as = f"{count} synthetic {'colour' if color else 'gray'} {size} px {what[mode]} (seed {seed})"
    reason = f"{drawn_as} beside {len(split.samples)} labelled images; {_classes_note(table, split, mode)}"
    logger.info("synthetic_boards: %s", reason)
    return replace(split, samples=split.samples + samples), Choice("synthetic_boards", count, reason, "user")


def _matched_classes(split: DatasetSplit) -> dict[int, int]:
    """`class_table` of the synthetic classes onto the split's: ConfigError when none matches, a warning when
    only one does (the boards' other defects then train as background)."""
    from defectdet.data.synth import CLASS_NAMES

    table = class_table(list(CLASS_NAMES), list(split.class_names))
    if not table:
        raise ConfigError(
            f"field 'synthetic_boards': the synthetic boards' classes ({', '.join(CLASS_NAMES)}) share no name "
            f"with this data's classes ({', '.join(split.class_names)}); they help PCB data with those defect "
            "kinds (rename the classes to match, or leave synthetic_boards at 0)"
        )
    if len(table) == 1:
        only = CLASS_NAMES[next(iter(table))]
        logger.warning(
            "synthetic_boards: only %r matches a class of this data; the boards' other defects train as "
            "background. They are meant for PCB data with the board defect kinds (%s); on the synthetic surface "
            "family 200 boards lowered held-out mAP@0.5 at 10 minutes",
            only,
            ", ".join(CLASS_NAMES),
        )
    return table


def _classes_note(table: dict[int, int], split: DatasetSplit, mode: str) -> str:
    """The settings row's word on classes: which synthetic class trains as which of the data's, and (boards
    with defects) whose boxes are dropped."""
    from defectdet.data.synth import CLASS_NAMES

    matched = ", ".join(f"{CLASS_NAMES[s]}->{split.class_names[d]}" for s, d in sorted(table.items()))
    dropped = [name for index, name in enumerate(CLASS_NAMES) if index not in table]
    if dropped and mode != "design":
        return f"classes {matched}; boxes of {', '.join(dropped)} dropped (not in the data)"
    return f"classes {matched}"


def _damaged_board(sample: Sample, index: int, table: dict[int, int], template: bool) -> Sample:
    """A drawn board as trained on: its boxes of the classes the data has, moved onto the data's ids."""
    keep = np.isin(sample.classes, list(table))
    return replace(
        sample,
        boxes=sample.boxes[keep],
        classes=[table[int(cls)] for cls in sample.classes[keep].tolist()],
        template_path=sample.template_path if template else None,
        source=f"{sample.source or sample.image_path} (synthetic board)",
        image_id=f"synthetic/{index:05d}",
    )


def _board_design(sample: Sample, index: int, template: bool) -> Sample:
    """A drawn board's golden template as an image without defects (its own template when the run has them)."""
    design = sample.template_path
    clean = defect_free_sample(
        design, f"{design} (synthetic board design, no defects)", f"synthetic/design-{index:05d}"
    )
    return replace(clean, template_path=design if template else None)

"""Which classes get the fragment merge (`postprocess.merge_fragments`): chosen at export on the validation split.

Merging the overlapping pieces of one large defect into one box helps classes whose defects are long or large
(a scratch across a pane, a contusion) and can hurt classes whose defects lie close together (parallel scratches
each labelled on their own). Which is which depends on the data and on how it was labelled, so the exporter
measures it: a class is merged when merging raises its AP@0.5 on the validation split by at least `MIN_GAIN`,
and only classes with at least `MIN_BOXES` labelled boxes there are tried (on fewer the AP is too coarse to
decide). A class's AP measured on a few tens of boxes moves by a few points from one split to another, so a
smaller gain is not trusted. The bundle's metrics keep both figures per tried class.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

MIN_BOXES = 10
MIN_GAIN = 0.05


def merge_candidates(per_class: Sequence[dict[str, Any]]) -> list[str]:
    """The classes with at least `MIN_BOXES` labelled boxes, from `validate`'s `per_class` rows."""
    return [row["class"] for row in per_class if int(row.get("gt") or 0) >= MIN_BOXES]


def choose_merged(
    as_is: Sequence[dict[str, Any]], merged: Sequence[dict[str, Any]], candidates: Sequence[str]
) -> tuple[list[str], dict[str, dict[str, float]]]:
    """(classes to merge, evidence {class: {"as_is", "merged", "boxes"}}) from the `per_class` rows of the same
    split scored without and with every candidate merged."""
    before = {row["class"]: row for row in as_is}
    after = {row["class"]: row for row in merged}
    chosen, evidence = [], {}
    for name in candidates:
        old, new = before[name].get("AP50"), after[name].get("AP50")
        if old is None or new is None:
            continue
        evidence[name] = {"as_is": float(old), "merged": float(new), "boxes": int(before[name]["gt"])}
        if new - old >= MIN_GAIN:
            chosen.append(name)
    return chosen, evidence

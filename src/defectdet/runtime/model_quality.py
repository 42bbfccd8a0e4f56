"""How well a bundle did on its validation split, from the metrics its metadata carries, and a loud warning
when that is near zero (a model that finds almost none of the labelled defects must not go on a line
unnoticed). Works on every bundle written so far: `export` has always stored the validation metrics. No torch
import.
"""

from __future__ import annotations

import math
from typing import Any

NEAR_ZERO_MAP = 0.05
MAP_METRICS = ("mAP50", "deeppcb_mAP", "mAP50_95")  # the first one present is the one judged


def near_zero(value: float) -> bool:
    """True for a finite score (mAP, recall) below `NEAR_ZERO_MAP`: a model that finds almost nothing."""
    return isinstance(value, (int, float)) and math.isfinite(value) and value < NEAR_ZERO_MAP


def validation_quality(metadata: Any) -> dict[str, Any]:
    """`{"metric", "value", "split", "near_zero", "warning"}` for a bundle's metadata; metric and value are
    None when the bundle carries no validation mAP (then nothing is judged)."""
    metrics = getattr(metadata, "metrics", None) or {}
    split = metrics.get("split") if isinstance(metrics.get("split"), str) else None
    for name in MAP_METRICS:
        value = metrics.get(name)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            break
    else:
        return {"metric": None, "value": None, "split": split, "near_zero": False, "warning": None}
    low = near_zero(value)
    warning = None
    if low:
        where = f" on its {split} split" if split else ""
        warning = (
            f"validation {name} {value:.4f}{where} is near zero (below {NEAR_ZERO_MAP}): this model finds "
            "almost none of the labelled defects; do not put it on a line (train longer, check the labels)"
        )
    return {"metric": name, "value": float(value), "split": split, "near_zero": low, "warning": warning}

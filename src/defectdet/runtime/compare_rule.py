"""The promotion rule of `defectdet compare` (`decide`, `RULE`): a verdict from two models' measured figures.

Torch- and NumPy-free, so that the service's promotion gate can apply it again to the figures a compare.json
records (`verdict_from_document`): a verdict edited by hand, or written by another rule, does not follow from its
figures and is refused. A NEW model whose mAP@0.5 or recall (1 - missed-defect rate) is near zero
(`runtime.model_quality.near_zero`) is never promoted, whatever OLD does: equal is not worse, but two models that
both find nothing are not a reason to change the line.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from defectdet.errors import InputError
from defectdet.runtime.model_quality import NEAR_ZERO_MAP, near_zero

PROMOTE, KEEP = "promote", "keep OLD"
EXIT_PROMOTE, EXIT_KEEP = 0, 1
EPSILON = 1e-9  # equal is not worse: float noise never decides a verdict
RULE = (
    "promote NEW only if, each model at its own stored threshold: NEW's escape rate (defective images judged "
    "clean) <= OLD's + tol_escape, NEW's missed-defect rate <= OLD's + tol_escape, NEW's mAP@0.5 >= OLD's - tol_map, "
    "and NEW's false-call rate (defect-free images and clean boards flagged) <= OLD's + tol_false_call; a criterion "
    "that cannot be measured (no defect-free image: pass --clean DIR or --clean-auto) keeps OLD. Equal is not worse, "
    f"but NEW's mAP@0.5 and recall (1 - missed-defect rate) must not be near zero (below {NEAR_ZERO_MAP}): a model "
    "that finds almost none of the labelled defects is never promoted."
)


@dataclass(frozen=True)
class Tolerances:
    """How much worse than OLD NEW may be, in absolute rate (escape, false call) or mAP points (map50)."""

    escape: float = 0.005
    map50: float = 0.01
    false_call: float = 0.01

    def __post_init__(self) -> None:
        for name in ("escape", "map50", "false_call"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise InputError(f"tolerance {name} must be within [0, 1], got {value}")


def decide(old: dict[str, Any], new: dict[str, Any], tolerances: Tolerances) -> dict[str, Any]:
    """The promotion rule (`RULE`) applied to two `score_model` results."""
    checks = [
        _check(
            "escape rate",
            old["escapes"]["escape_rate"],
            new["escapes"]["escape_rate"],
            tolerances.escape,
            lower_is_better=True,
            missing="the split has no defective image",
        ),
        _check(
            "missed-defect rate",
            old["escapes"]["missed_defect_rate"],
            new["escapes"]["missed_defect_rate"],
            tolerances.escape,
            lower_is_better=True,
            missing="the split has no labelled defect",
        ),
        _check(
            "mAP@0.5",
            old["mAP50"],
            new["mAP50"],
            tolerances.map50,
            lower_is_better=False,
            missing="the split has no labelled defect",
        ),
        _check(
            "false-call rate",
            old["false_calls"]["false_call_rate"],
            new["false_calls"]["false_call_rate"],
            tolerances.false_call,
            lower_is_better=True,
            missing="no defect-free image in the split and no clean board: pass --clean DIR or --clean-auto",
        ),
        _finds_defects(new),
    ]
    failed = [check for check in checks if not check["passed"]]
    decision = PROMOTE if not failed else KEEP
    return {
        "decision": decision,
        "exit_code": EXIT_PROMOTE if decision == PROMOTE else EXIT_KEEP,
        "rule": RULE,
        "tolerances": {
            "escape": tolerances.escape,
            "map50": tolerances.map50,
            "false_call": tolerances.false_call,
        },
        "checks": checks,
        "reasons": [check["reason"] for check in (failed or checks)],
    }


def _finds_defects(new: dict[str, Any]) -> dict[str, Any]:
    """NEW's mAP@0.5 and recall must not be near zero (a criterion of its own: comparing with OLD cannot pass
    a model that finds almost nothing)."""
    mean_ap, missed = new["mAP50"], new["escapes"]["missed_defect_rate"]
    recall = None if missed is None else 1.0 - missed
    low = [
        f"{name} {value:.4f}"
        for name, value in (("mAP@0.5", mean_ap), ("recall", recall))
        if value is not None and near_zero(value)
    ]
    reason = (
        f"NEW finds almost none of the labelled defects: {' and '.join(low)} near zero (below {NEAR_ZERO_MAP}); "
        "never promoted, whatever OLD does (train longer, check the labels)"
        if low
        else f"NEW's mAP@0.5 and recall are not near zero (at least {NEAR_ZERO_MAP})"
    )
    return {
        "name": "NEW finds defects",
        "old": None,
        "new": mean_ap,
        "limit": NEAR_ZERO_MAP,
        "passed": not low,
        "reason": reason,
    }


def verdict_from_document(document: dict[str, Any]) -> dict[str, Any]:
    """The verdict the rule gives on the figures a compare.json records (`models.old`, `models.new`,
    `verdict.tolerances`). KeyError, TypeError or InputError when the figures are not there."""
    models, tolerances = document["models"], document["verdict"]["tolerances"]
    return decide(models["old"], models["new"], Tolerances(**tolerances))


def _check(
    name: str, old: float | None, new: float | None, tolerance: float, *, lower_is_better: bool, missing: str
) -> dict[str, Any]:
    if old is None or new is None:
        return {
            "name": name,
            "old": old,
            "new": new,
            "limit": None,
            "passed": False,
            "reason": f"{name} not measured: {missing}",
        }
    limit = old + tolerance if lower_is_better else old - tolerance
    passed = new <= limit + EPSILON if lower_is_better else new >= limit - EPSILON
    relation = ("<=" if lower_is_better else ">=") if passed else (">" if lower_is_better else "<")
    word = "within" if passed else "worse than"
    reason = (
        f"{name}: NEW {new:.4f} {relation} {limit:.4f} (OLD {old:.4f} {'+' if lower_is_better else '-'} "
        f"tolerance {tolerance:g}): {word} the limit"
    )
    return {"name": name, "old": old, "new": new, "limit": limit, "passed": passed, "reason": reason}

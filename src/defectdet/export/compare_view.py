"""The terminal view of a `compare_models` result: one rich table (OLD, NEW, change), the disagreements and the
verdict with its reasons."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

# (label, how to read it from a model's result, lower is better)
ROWS: list[tuple[str, str, bool]] = [
    ("mAP@0.5", "mAP50", False),
    ("mAP@0.5:0.95", "mAP50_95", False),
    ("escape rate (defective images judged clean)", "escapes.escape_rate", True),
    ("missed-defect rate", "escapes.missed_defect_rate", True),
    ("false-call rate (all defect-free images)", "false_calls.false_call_rate", True),
    ("latency p50 ms (end to end)", "latency_ms.p50", True),
    ("latency p95 ms (end to end)", "latency_ms.p95", True),
]


def _get(model: dict[str, Any], path: str) -> Any:
    value: Any = model
    for key in path.split("."):
        value = value.get(key) if isinstance(value, dict) else None
    return value


def _number(value: Any) -> str:
    if value is None:
        return "-"
    return f"{value:.4f}" if abs(value) < 10 else f"{value:.1f}"


def _change(old: Any, new: Any, lower_is_better: bool) -> str:
    if old is None or new is None:
        return "-"
    delta = new - old
    if abs(delta) < 1e-12:
        return "="
    better = delta < 0 if lower_is_better else delta > 0
    shown = f"{delta:+.4f}" if abs(delta) < 10 else f"{delta:+.1f}"
    return f"[{'green' if better else 'red'}]{shown}[/]"


def comparison_table(document: dict[str, Any]) -> Table:
    """Threshold, the headline metrics, the counts behind the rates and the per-class AP50, OLD vs NEW."""
    old, new = document["models"]["old"], document["models"]["new"]
    table = Table(title=f"OLD vs NEW on {document['images']}", show_lines=False)
    table.add_column("")
    table.add_column("OLD", justify="right")
    table.add_column("NEW", justify="right")
    table.add_column("NEW - OLD", justify="right")
    table.add_row(
        "operating threshold (stored in the bundle)",
        _number(old["threshold"]["value"]),
        _number(new["threshold"]["value"]),
        "",
    )
    for label, path, lower in ROWS:
        first, second = _get(old, path), _get(new, path)
        table.add_row(label, _number(first), _number(second), _change(first, second, lower))
    counts = [
        ("escaped images", "escapes.escaped_images", "escapes.defective_images"),
        ("missed defects", "escapes.missed_defects", "escapes.defects"),
        (
            "false calls, split's defect-free images",
            "false_calls.split_false_calls",
            "false_calls.split_clean_images",
        ),
        ("false calls, clean boards", "false_calls.clean_board_false_calls", "false_calls.clean_boards"),
    ]
    for label, part, whole in counts:
        cells = [f"{_get(model, part)}/{_get(model, whole)}" for model in (old, new)]
        table.add_row(label, *cells, _change(_get(old, part), _get(new, part), True))
    for name in dict.fromkeys([*old["class_AP50"], *new["class_AP50"]]):
        first, second = old["class_AP50"].get(name), new["class_AP50"].get(name)
        table.add_row(f"AP50 {name}", _number(first), _number(second), _change(first, second, False))
    return table


def print_comparison(document: dict[str, Any], console: Console) -> None:
    """The table, where the thresholds came from, the disagreements and the verdict."""
    console.print(comparison_table(document))
    for role in ("old", "new"):
        model = document["models"][role]
        exported = " (exported from the checkpoint)" if model["exported_from_checkpoint"] else ""
        console.print(
            f"{role.upper()}: {model['given']}{exported}; threshold {model['threshold']['value']:.4f} from the "
            f"{model['threshold']['source']}"
        )
    console.print(f"classes: {document['classes']['matching']}")
    console.print(document["latency"], style="dim")
    disagreements = document["disagreements"]
    if disagreements:
        console.print(f"{len(disagreements)} image(s) where they disagree -> {document['disagreements_png']}")
        for item in disagreements[:10]:
            console.print(f"  {item['image_id']}: {item['reason']}")
        if len(disagreements) > 10:
            console.print(f"  ... and {len(disagreements) - 10} more in {document['json']}")
    else:
        console.print("no image where they disagree at their thresholds")
    verdict = document["verdict"]
    color = "green" if verdict["decision"] == "promote" else "red"
    console.print(f"[bold {color}]verdict: {verdict['decision']}[/]")
    for reason in verdict["reasons"]:
        console.print(f"  {reason}")
    console.print(f"[dim]{document['json']}[/dim]")

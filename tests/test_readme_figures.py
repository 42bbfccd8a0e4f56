"""README figures must come from bench/results/: a quoted number no result file holds fails here.

Checked: every number with a decimal point in a README table row or in **bold** text. A table row that
names result files (`bench/results/<name>.json`) must find its figures in those files; other figures in
any result file. A figure is held when some number in the file, rounded to the figure's decimals,
equals it: as stored, seconds shown as minutes (/60), or a fraction shown as a percentage (x100).
Numbers are taken from JSON values, keys (`time_to_mAP50_0.95_s`) and strings. Skipped: code spans
(commands), metric names (`mAP@0.5:0.95`), and numbers after a comparison (`IoU>0.33`, `<= 15.0`: targets).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"

_DECIMAL = re.compile(r"\d+\.\d+(?!\.?\d)")
_ANY_NUMBER = re.compile(r"\d+(?:\.\d+)?")
_CODE_SPAN = re.compile(r"`[^`]*`")
_BOLD = re.compile(r"\*\*(.+?)\*\*")
_RESULT_FILE = re.compile(r"bench/results/([\w.-]+\.json)")
_NOT_A_FIGURE_AFTER = ("@", ":", "<", ">", "=", "≤", "≥", "~")


def figures_in(text: str) -> list[str]:
    """Decimal figures in `text` (code spans, metric names and comparison targets skipped)."""
    text = _CODE_SPAN.sub(" ", text)
    found = []
    for match in _DECIMAL.finditer(text):
        before = text[: match.start()]
        if before.rstrip().endswith(_NOT_A_FIGURE_AFTER) or (before and before[-1].isalpha()):
            continue  # '@0.5', ':0.95', '>0.33', '<= 15.0', 'v1.2'
        found.append(match.group())
    return found


def claims(readme: str) -> Iterator[tuple[str, list[str], list[str]]]:
    """(line, figures, result files named on that line) for table rows and bold text."""
    for line in readme.splitlines():
        stripped = line.strip()
        if stripped.startswith("|"):
            if set(stripped) <= set("|-: "):
                continue  # the header separator
            yield line, figures_in(stripped), _RESULT_FILE.findall(stripped)
        else:
            bold = " ".join(_BOLD.findall(stripped))
            if bold:
                yield line, figures_in(bold), _RESULT_FILE.findall(stripped)


def numbers_in(document: object) -> Iterator[float]:
    """Every number in a parsed JSON document: values, and numbers inside keys and strings."""
    if isinstance(document, bool) or document is None:
        return
    if isinstance(document, int | float):
        yield float(document)
    elif isinstance(document, str):
        yield from (float(number) for number in _ANY_NUMBER.findall(document))
    elif isinstance(document, dict):
        for key, value in document.items():
            yield from numbers_in(str(key))
            yield from numbers_in(value)
    elif isinstance(document, list):
        for value in document:
            yield from numbers_in(value)


def holds(figure: str, numbers: set[float]) -> bool:
    decimals = len(figure.split(".")[1])
    target = float(figure)
    tolerance = 0.5 * 10**-decimals * 1e-3
    for number in numbers:
        for shown in (number, number / 60.0, number * 100.0):
            if abs(round(shown, decimals) - target) <= tolerance:
                return True
    return False


def unheld_figures(readme: str, results: dict[str, set[float]]) -> list[str]:
    """Messages for figures that no (named) result file holds; empty when the README is clean."""
    everything = set().union(*results.values()) if results else set()
    problems = []
    for line, figures, named in claims(readme):
        missing_files = [name for name in named if name not in results]
        if missing_files:
            problems.append(f"names missing result file(s) {missing_files}: {line.strip()}")
            continue
        pool = set().union(*(results[name] for name in named)) if named else everything
        where = ", ".join(named) if named else "any bench/results/*.json"
        problems += [
            f"{figure} is in no result file ({where}): {line.strip()}"
            for figure in figures
            if not holds(figure, pool)
        ]
    return problems


def load_results(folder: Path) -> dict[str, set[float]]:
    return {
        path.name: set(numbers_in(json.loads(path.read_text(encoding="utf-8"))))
        for path in sorted(folder.glob("*.json"))
    }


def test_every_readme_figure_is_in_a_result_file() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    results = load_results(RESULTS)
    assert results, f"no result files in {RESULTS}"
    checked = sum(len(figures) for _, figures, _ in claims(readme))
    assert checked >= 5, "the README results table seems to have moved; update this test"
    problems = unheld_figures(readme, results)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize(
    ("readme", "expected"),
    [
        ("| nano | mAP@0.5 **0.962** after 7.5 min | `bench/results/run.json` |", []),
        ("| nano | mAP@0.5 **0.971** | `bench/results/run.json` |", ["0.971"]),  # not in the file
        ("| nano | 6.3 ms |  |", []),  # no file named: any result file may hold it
        ("| nano | 0.962, 12.5 % escape | `bench/results/run.json` |", []),  # 0.125 shown as a percentage
        ("| target | mAP@0.5 >= 0.986, <= 15.0 ms | `python bench/x.py --time 0.5` |", []),
        ("Reaches **0.970** on held-out boards.", ["0.970"]),
        ("| nano | 0.962 | `bench/results/other.json` |", ["missing result file"]),
    ],
)
def test_checker_catches_unheld_figures(readme: str, expected: list[str]) -> None:
    results = {
        "run.json": set(numbers_in({"mAP50": 0.96229, "time_to_mAP50_0.9_s": 452.08, "escape": 0.125})),
        "latency.json": set(numbers_in({"ort_p50_ms": 6.29})),
    }
    problems = unheld_figures(readme, results)
    assert len(problems) == len(expected)
    for problem, needle in zip(problems, expected, strict=True):
        assert needle in problem

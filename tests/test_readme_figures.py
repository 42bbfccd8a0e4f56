"""README figures must come from the result file they name: a figure no named file holds fails here.

Checked: every number with a decimal point in a README table row or in **bold** text. Each must name the
result file(s) it came from (`bench/results/<name>.json`), and only those files are searched:
- a table row: the files named in that row; when the row names none, the files named in the table's header
  row (e.g. `| fault (`bench/results/drift.json`) | ... |`), which then hold for every row of that table;
- bold text outside tables: the files named in the same paragraph (the run of non-blank lines around it).
A figure whose row, table header or paragraph names no result file fails, and so does a named file that
does not exist. A figure is held when some number in the file, rounded to the figure's decimals, equals it:
as stored, seconds shown as minutes (/60), or a fraction shown as a percentage (x100). Numbers are taken
from JSON values, keys (`time_to_mAP50_0.95_s`) and strings. Skipped: fenced code blocks, code spans
(commands), metric names (`mAP@0.5:0.95`), and numbers after a comparison (`IoU>0.33`, `<= 15.0`: targets).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
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


@dataclass(frozen=True)
class Claim:
    line_number: int  # 1-based, in the README
    line: str
    figures: list[str]
    named: list[str]  # result files the figures must come from


def _table_claims(rows: list[tuple[int, str]]) -> Iterator[Claim]:
    header_files = _RESULT_FILE.findall(rows[0][1])
    for number, row in rows:
        if set(row) <= set("|-: "):
            continue  # the header separator
        named = _RESULT_FILE.findall(row) or header_files
        yield Claim(number, row, figures_in(row), named)


def claims(readme: str) -> Iterator[Claim]:
    """Every table row, and every line with bold text, with its figures and the result files they must
    come from (the row's, else its table header's; for bold text, its paragraph's)."""
    blocks: list[list[tuple[int, str]]] = []  # tables and paragraphs, outside fenced code
    fenced = False
    for number, line in enumerate(readme.splitlines(), start=1):
        stripped = line.strip()
        if stripped.startswith("```"):
            fenced = not fenced
            blocks.append([])
            continue
        if fenced or not stripped:
            blocks.append([])
            continue
        is_row = stripped.startswith("|")
        if blocks and blocks[-1] and blocks[-1][-1][1].startswith("|") == is_row:
            blocks[-1].append((number, stripped))
        else:
            blocks.append([(number, stripped)])
    for block in filter(None, blocks):
        if block[0][1].startswith("|"):
            yield from _table_claims(block)
            continue
        paragraph_files = _RESULT_FILE.findall(" ".join(line for _, line in block))
        for number, line in block:
            bold = " ".join(_BOLD.findall(_CODE_SPAN.sub(" ", line)))
            if bold:
                yield Claim(number, line, figures_in(bold), paragraph_files)


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
    """Messages for figures that name no result file or that the named file does not hold; empty when clean."""
    problems = []
    for claim in claims(readme):
        if not claim.figures:
            continue
        where = f"README line {claim.line_number}"
        if not claim.named:
            problems.append(
                f"{where}: {', '.join(claim.figures)} name(s) no result file (name `bench/results/<file>.json` in "
                f"the row, the table's header row or the bold text's paragraph): {claim.line}"
            )
            continue
        missing_files = [name for name in claim.named if name not in results]
        if missing_files:
            problems.append(f"{where}: names missing result file(s) {missing_files}: {claim.line}")
            continue
        pool = set().union(*(results[name] for name in claim.named))
        problems += [
            f"{where}: {figure} is not in {', '.join(claim.named)}: {claim.line}"
            for figure in claim.figures
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
    checked = sum(len(claim.figures) for claim in claims(readme))
    assert checked >= 5, "the README results table seems to have moved; update this test"
    problems = unheld_figures(readme, results)
    assert not problems, "\n".join(problems)


_TABLE_WITH_HEADER_SOURCE = """\
| phase (`bench/results/run.json`) | mAP@0.5 |
| --- | --- |
| steady | 0.962 |
| steady | {figure} |
"""


@pytest.mark.parametrize(
    ("readme", "expected"),
    [
        ("| nano | mAP@0.5 **0.962** after 7.5 min | `bench/results/run.json` |", []),
        ("| nano | mAP@0.5 **0.971** | `bench/results/run.json` |", ["line 1: 0.971 is not in run.json"]),
        (
            "| nano | 6.29 ms | `bench/results/run.json` |",
            ["6.29 is not in run.json"],
        ),  # in latency.json only
        ("| nano | 6.3 ms | `bench/results/latency.json` |", []),
        ("| nano | 6.3 ms |  |", ["line 1: 6.3 name(s) no result file"]),  # held by latency.json, but unnamed
        ("| nano | 0.962, 12.5 % escape | `bench/results/run.json` |", []),  # 0.125 shown as a percentage
        ("| target | mAP@0.5 >= 0.986, <= 15.0 ms | `python bench/x.py --time 0.5` |", []),
        ("| nano | 0.962 | `bench/results/other.json` |", ["missing result file"]),
        (_TABLE_WITH_HEADER_SOURCE.format(figure="0.96"), []),  # rows take the header row's file
        (_TABLE_WITH_HEADER_SOURCE.format(figure="0.97"), ["line 4: 0.97 is not in run.json"]),
        # no file in the row nor in the header row
        ("| nano | 0.962 |\n| --- | --- |\n| tiny | 0.962 |", ["line 1:", "line 3:"]),
        ("Reaches **0.970** on held-out boards.", ["line 1: 0.970 name(s) no result file"]),
        ("Reaches **0.962**\non held-out boards (`bench/results/run.json`).", []),  # named in its paragraph
        ("Reaches **0.971**\non held-out boards (`bench/results/run.json`).", ["line 1: 0.971 is not in"]),
        ("Named here: `bench/results/run.json`.\n\nReaches **0.962**.", ["line 3: 0.962 name(s) no result"]),
        # code blocks, code spans and plain prose hold no checked figures
        ("```\n| nano | 0.971 |\n```\nplain text 0.971, `**0.971**`", []),
    ],
)
def test_checker_catches_unheld_figures(readme: str, expected: list[str]) -> None:
    results = {
        "run.json": set(numbers_in({"mAP50": 0.96229, "time_to_mAP50_0.9_s": 452.08, "escape": 0.125})),
        "latency.json": set(numbers_in({"ort_p50_ms": 6.29})),
    }
    problems = unheld_figures(readme, results)
    assert len(problems) == len(expected), problems
    for problem, needle in zip(problems, expected, strict=True):
        assert needle in problem


def test_a_wrong_figure_in_the_readme_fails() -> None:
    """The real README with one figure changed (0.771 -> 0.717 in the side-by-side's first row) no longer passes."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    row = next(line for line in readme.splitlines() if line.startswith("| surface family (600 images"))
    assert "| **0.771** |" in row
    problems = unheld_figures(
        readme.replace(row, row.replace("| **0.771** |", "| **0.717** |", 1)), load_results(RESULTS)
    )
    assert len(problems) == 1 and "0.717 is not in scaling_surface_nano_10min.json" in problems[0]

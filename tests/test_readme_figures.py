"""Figures come from bench/results/, through the generated benchmark pages.

1. docs/benchmarks/*.md are exactly what `python -m bench.pages` writes from the result files: a page edited by
   hand, or a result file changed without regenerating, fails here.
2. Every number with a decimal point in README.md (outside fenced code and code spans; metric names such as
   `mAP@0.5` and comparison targets such as `<= 15.0` skipped) sits in a table row, or a paragraph, that links to
   a benchmark page (`docs/benchmarks/<page>.md`; for a table row, the row or its table's header row), and that
   page shows the figure: some number on the page, rounded to the figure's decimals, equals it.
3. Every result file a page names exists, and so does the bench script that wrote it.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from bench import pages

ROOT = Path(__file__).resolve().parents[1]
PAGES_DIR = ROOT / "docs" / "benchmarks"
RESULTS = ROOT / "bench" / "results"

_DECIMAL = re.compile(r"\d+\.\d+(?!\.?\d)")
_CODE_SPAN = re.compile(r"`[^`]*`")
_HTML_COMMENT = re.compile(r"<!--.*?-->")  # not shown to the reader (the docs tests' rules live there)
_LINK_TARGET = re.compile(r"\]\([^)]*\)")
_PAGE_LINK = re.compile(r"benchmarks/([\w-]+)(?:\.md|/)")
_NOT_A_FIGURE_AFTER = ("@", ":", "<", ">", "=", "≤", "≥", "~")


def figures_in(text: str) -> list[str]:
    """Decimal figures in `text` (code spans, HTML comments, link targets, metric names and comparison targets
    skipped)."""
    text = _LINK_TARGET.sub("]", _CODE_SPAN.sub(" ", _HTML_COMMENT.sub(" ", text)))
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
    pages: list[str]  # benchmark pages the figures must be on


def _blocks(readme: str) -> Iterator[list[tuple[int, str]]]:
    """Tables and paragraphs (runs of non-blank lines; a heading stands alone), outside fenced code."""
    block: list[tuple[int, str]] = []
    fenced = False
    for number, line in enumerate(readme.splitlines(), start=1):
        stripped = line.strip()
        starts_other_kind = block and block[-1][1].startswith("|") != stripped.startswith("|")
        if (
            stripped.startswith("```")
            or fenced
            or not stripped
            or stripped.startswith("#")
            or starts_other_kind
        ):
            if block:
                yield block
            block = []
        if stripped.startswith("```"):
            fenced = not fenced
            continue
        if fenced or not stripped:
            continue
        if stripped.startswith("#"):
            yield [(number, stripped)]
            continue
        block.append((number, stripped))
    if block:
        yield block


def claims(readme: str) -> Iterator[Claim]:
    """Every line with a decimal figure, with the benchmark pages it must be on."""
    for block in _blocks(readme):
        if block[0][1].startswith("|"):
            header_pages = _PAGE_LINK.findall(block[0][1])
            for number, row in block:
                yield Claim(number, row, figures_in(row), _PAGE_LINK.findall(row) or header_pages)
            continue
        paragraph_pages = _PAGE_LINK.findall(" ".join(line for _, line in block))
        for number, line in block:
            yield Claim(number, line, figures_in(line), paragraph_pages)


def page_numbers(markdown: str) -> set[float]:
    """Every decimal number a page shows outside code spans."""
    return {float(found) for found in _DECIMAL.findall(_CODE_SPAN.sub(" ", markdown))}


def holds(figure: str, numbers: set[float]) -> bool:
    decimals = len(figure.split(".")[1])
    target = float(figure)
    return any(abs(round(number, decimals) - target) <= 0.5 * 10**-decimals * 1e-3 for number in numbers)


def unheld_figures(readme: str, shown: dict[str, set[float]]) -> list[str]:
    """Messages for README figures that link no benchmark page, or that the linked pages do not show."""
    problems = []
    for claim in claims(readme):
        if not claim.figures:
            continue
        where = f"README line {claim.line_number}"
        if not claim.pages:
            problems.append(
                f"{where}: {', '.join(claim.figures)} link(s) no benchmark page (link docs/benchmarks/<page>.md "
                f"in the row, the table's header row or the paragraph): {claim.line}"
            )
            continue
        missing = [page for page in claim.pages if page not in shown]
        if missing:
            problems.append(f"{where}: links missing benchmark page(s) {missing}: {claim.line}")
            continue
        pool = set().union(*(shown[page] for page in claim.pages))
        problems += [
            f"{where}: {figure} is not on {', '.join(claim.pages)}.md: {claim.line}"
            for figure in claim.figures
            if not holds(figure, pool)
        ]
    return problems


@pytest.fixture(scope="module")
def built() -> dict[str, str]:
    if not RESULTS.is_dir():
        pytest.skip("bench/results/ is absent")
    generated, _plots = pages.build()
    return generated


def test_benchmark_pages_are_generated_from_the_result_files(built: dict[str, str]) -> None:
    stale = [
        name
        for name, text in built.items()
        if not (PAGES_DIR / name).is_file() or (PAGES_DIR / name).read_text(encoding="utf-8") != text
    ]
    assert not stale, (
        f"stale benchmark page(s) {stale}: run `.venv/bin/python -m bench.pages` and commit them"
    )
    for name, text in built.items():
        for image in re.findall(r"\]\(img/([\w.-]+\.png)\)", text):
            assert (PAGES_DIR / "img" / image).is_file(), f"{name} shows img/{image}, which is missing"


def test_every_readme_figure_is_on_the_benchmark_page_it_links(built: dict[str, str]) -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    shown = {name.removesuffix(".md"): page_numbers(text) for name, text in built.items()}
    problems = unheld_figures(readme, shown)
    assert not problems, "\n".join(problems)


def test_every_cited_result_file_and_its_script_exist(built: dict[str, str]) -> None:
    results = pages.load_results()
    built_pages, _plots = pages.build_pages(results)
    for slug, page in built_pages.items():
        text = built[f"{slug}.md"]
        for name in page.cited:
            file = f"{name}.json"
            assert (RESULTS / file).is_file(), (
                f"docs/benchmarks/{slug}.md cites {file}, not in bench/results/"
            )
            assert f"`{file}`" in text, f"docs/benchmarks/{slug}.md cites {file} without naming it"
            script = pages.script_of(results[name])
            if script is not None:
                assert (ROOT / script).is_file(), (
                    f"{file} (cited on {slug}) was written by {script}, now missing"
                )


def test_a_result_made_from_uncommitted_code_cannot_be_cited() -> None:
    dirty = pages.Result("run", {"environment": {"uncommitted_code": ["src/defectdet/x.py"]}})
    output_only = pages.Result("weights", {"environment": {"uncommitted_code": ["src/defectdet/model/w.pt"]}})
    page = pages.Page("accuracy", "Accuracy", {"run": dirty, "weights": output_only})
    with pytest.raises(SystemExit, match="uncommitted code"):
        page.cite("run")
    assert page.cite("weights") == "`weights.json`"
    with pytest.raises(SystemExit, match="not in"):
        page.cite("absent")


_SHOWN = {"accuracy": {0.962, 0.8861}, "inference": {8.52}}


@pytest.mark.parametrize(
    ("readme", "expected"),
    [
        ("| tiny | 20 min | **0.962** | [accuracy](docs/benchmarks/accuracy.md) |", []),
        ("| tiny | 20 min | 0.89 | [accuracy](docs/benchmarks/accuracy.md) |", []),  # 0.8861 rounded
        (
            "| tiny | 20 min | 0.971 | [accuracy](docs/benchmarks/accuracy.md) |",
            ["0.971 is not on accuracy.md"],
        ),
        ("| nano | 8.52 ms | [accuracy](docs/benchmarks/accuracy.md) |", ["8.52 is not on accuracy.md"]),
        ("| nano | 8.52 ms | [latency](docs/benchmarks/inference.md) |", []),
        ("| nano | 8.52 ms | |", ["line 1: 8.52 link(s) no benchmark page"]),
        ("| nano | 0.962 | [x](docs/benchmarks/nowhere.md) |", ["missing benchmark page(s) ['nowhere']"]),
        # rows take the header row's page
        ("| what ([pages](docs/benchmarks/accuracy.md)) | mAP |\n| --- | --- |\n| tiny | 0.962 |", []),
        ("| what | mAP |\n| --- | --- |\n| tiny | 0.962 |", ["line 3: 0.962 link(s) no benchmark page"]),
        # a paragraph's link holds for each of its lines; plain prose is checked too
        ("Reaches 0.962\non held-out boards ([accuracy](docs/benchmarks/accuracy.md)).", []),
        (
            "Reaches 0.962 on held-out boards.\n\nSee [accuracy](docs/benchmarks/accuracy.md).",
            ["line 1: 0.962"],
        ),
        # code, metric names, targets and link targets hold no figures
        ("```\n| nano | 0.971 |\n```\n`0.971`, mAP@0.5:0.95, at most <= 15.0, [v](https://x.org/1.2)", []),
        # an HTML comment is not shown; a figure beside it still is
        ('<!-- test: "--time 20" -> "--time 0.05" -->\nReaches 0.962.', ["line 2: 0.962"]),
    ],
)
def test_checker_catches_unheld_figures(readme: str, expected: list[str]) -> None:
    problems = unheld_figures(readme, _SHOWN)
    assert len(problems) == len(expected), problems
    for problem, needle in zip(problems, expected, strict=True):
        assert needle in problem


def test_every_result_file_is_cited_or_kept_off_for_uncommitted_code() -> None:
    results = pages.load_results()
    built_pages, _plots = pages.build_pages(results)
    cited = {name for slug, page in built_pages.items() if slug != "manifest" for name in page.cited}
    uncited = [
        result.file
        for name, result in results.items()
        if name not in cited and not result.dirty and name not in pages.DERIVED_FROM_UNCOMMITTED
    ]
    assert not uncited, (
        f"result files cited on no benchmark page: {uncited} (cite them in bench/pages.py or git rm)"
    )

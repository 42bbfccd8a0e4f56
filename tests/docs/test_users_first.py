"""The site is for users first: the navigation starts with whether defectdet fits, the install and a first
model, keeps the contributor pages under "Contributing"; every benchmark page opens with what to conclude and one
plot; and the side by side with YOLO states each side's starting weights wherever its figures appear."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "docs" / "benchmarks"
CONCLUDING_PAGES = ("index", "accuracy", "peers", "inference", "service", "training-speed", "real-data")
_FIGURE = re.compile(r"\b0\.\d{3}\b")


def _nav() -> dict[str, object]:
    class Loader(yaml.SafeLoader):
        pass

    Loader.add_multi_constructor("tag:yaml.org,2002:python/", lambda loader, suffix, node: None)
    config = yaml.load((ROOT / "mkdocs.yml").read_text("utf-8"), Loader=Loader)  # noqa: S506 - a local file
    return {next(iter(entry)): next(iter(entry.values())) for entry in config["nav"]}


def _pages(section: object) -> list[str]:
    return [next(iter(entry.values())) if isinstance(entry, dict) else entry for entry in section]


def test_the_navigation_starts_with_fit_install_and_a_first_model_and_keeps_contributor_pages_apart() -> None:
    nav = _nav()
    assert _pages(nav["Get started"])[:3] == [
        "getting-started/right-for-you.md",
        "getting-started/install.md",
        "getting-started/first-model.md",
    ]
    assert "Design" not in nav
    contributing = _pages(nav["Contributing"])
    assert "design/architecture.md" in contributing and "benchmarks/manifest.md" in contributing
    assert "benchmarks/manifest.md" not in _pages(nav["Benchmarks"])
    assert list(nav)[-1] == "Contributing"


@pytest.mark.parametrize("slug", CONCLUDING_PAGES)
def test_each_benchmark_page_opens_with_what_to_conclude_and_one_plot(slug: str) -> None:
    body = (BENCHMARKS / f"{slug}.md").read_text("utf-8").split("-->", 1)[1].strip()
    first, second = body.split("\n\n")[:2]
    assert first.startswith("What to conclude:"), f"{slug}.md opens with: {first[:80]}"
    assert re.fullmatch(r"!\[[^\]]+\]\(img/[\w-]+\.png\)", second), f"{slug}.md has no plot after it"
    assert (BENCHMARKS / second.split("(")[1].rstrip(")")).is_file()
    assert body.index("\n| ") > body.index(second), f"{slug}.md shows a table before its conclusion"


def test_the_benchmarks_index_links_the_real_data_page() -> None:
    assert "](real-data.md)" in (BENCHMARKS / "index.md").read_text("utf-8")
    assert "](docs/benchmarks/real-data.md)" in (ROOT / "README.md").read_text("utf-8")


def _yolo_claims(text: str) -> list[str]:
    """Table rows and paragraphs that give an mAP figure for YOLO."""
    blocks = [line for line in text.splitlines() if line.startswith("|")]
    blocks += [block for block in text.split("\n\n") if not block.lstrip().startswith("|")]
    return [block for block in blocks if "YOLO" in block and _FIGURE.search(block)]


@pytest.mark.parametrize("page", ["README.md", "docs/benchmarks/index.md", "docs/benchmarks/peers.md"])
def test_the_yolo_comparison_states_each_sides_starting_weights(page: str) -> None:
    claims = _yolo_claims((ROOT / page).read_text("utf-8"))
    assert claims, f"{page} gives no YOLO figure: the test would pass vacuously"
    for claim in claims:
        assert "random weights" in claim, f"{page}: YOLO's starting weights are not stated: {claim[:160]}"
        if "against" in claim or "defectdet" in claim.lower():
            assert "shipped" in claim or "random weights)" in claim, (
                f"{page}: ours are not stated: {claim[:160]}"
            )


def test_the_python_api_reference_is_on_the_public_names() -> None:
    """Every `:::` entry of the Python API page is `defectdet.NAME` for a name of `defectdet.__all__` (no internal
    module path), and the package's type-checking imports, which the documentation reads, are its lazy exports."""
    import ast

    import defectdet

    page = (ROOT / "docs" / "reference" / "python-api.md").read_text("utf-8")
    entries = re.findall(r"^::: (\S+)", page, re.M)
    assert len(entries) >= 10
    assert [e for e in entries if e.count(".") != 1 or e.split(".")[1] not in defectdet.__all__] == []
    tree = ast.parse((ROOT / "src" / "defectdet" / "__init__.py").read_text("utf-8"))
    guarded = next(n for n in tree.body if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING")
    imported = {alias.name: node.module for node in guarded.body for alias in node.names}
    assert imported == defectdet._EXPORTS

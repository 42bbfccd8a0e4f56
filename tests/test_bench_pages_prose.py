"""bench/benchpages/prose/: the pages' text lives in Markdown beside the generator, filled with its figures."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bench import pages
from bench.benchpages import core

PROSE = """<!-- what this file is -->

<!-- section: intro -->
A wrapped paragraph
on {count} lines.

## A heading

Code keeps its braces: `{{"a": 1}}` stays, `{not_a_slot` too.

<!-- section: other -->
Other text.
"""


def test_a_section_gives_one_line_per_block_with_its_values_filled(tmp_path: Path) -> None:
    (tmp_path / "page.md").write_text(PROSE)
    assert core.prose_blocks("page", "intro", {"count": 2}, tmp_path) == [
        "A wrapped paragraph on 2 lines.",
        "## A heading",
        'Code keeps its braces: `{{"a": 1}}` stays, `{not_a_slot` too.',
    ]
    assert core.prose_blocks("page", "other", {}, tmp_path) == ["Other text."]


def test_a_missing_section_or_value_stops_the_build(tmp_path: Path) -> None:
    (tmp_path / "page.md").write_text(PROSE)
    with pytest.raises(SystemExit, match="no section 'outro'"):
        core.prose_blocks("page", "outro", {}, tmp_path)
    with pytest.raises(SystemExit, match=r"needs a value for \{count\}"):
        core.prose_blocks("page", "intro", {}, tmp_path)


def test_every_section_of_every_prose_file_is_used_and_every_page_builds() -> None:
    """A section no generator names is text no page shows (a page's conditional sections count as used)."""
    source = "\n".join(path.read_text(encoding="utf-8") for path in Path(pages.__file__).parent.rglob("*.py"))
    named = set(re.findall(r"\.prose\(\s*\"([\w-]+)\"", source))
    written = {
        section
        for path in core.PROSE.glob("*.md")
        for section in re.findall(r"^<!-- section: ([\w-]+) -->$", path.read_text(encoding="utf-8"), re.M)
    }
    assert written and written <= named, f"sections no page uses: {sorted(written - named)}"
    assert set(pages.build_pages()[0]) >= {path.stem for path in core.PROSE.glob("*.md")}

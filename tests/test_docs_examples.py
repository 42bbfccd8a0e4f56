"""The Python examples of the documentation run, so they cannot rot.

A ```python block right after the line `<!-- run -->` in any page under docs/ runs; the marked blocks of one
page run in order, in one fresh interpreter, in an empty folder (they make their own small synthetic data).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
MARKER = "<!-- run -->"
_BLOCK = re.compile(r"^" + re.escape(MARKER) + r"[ \t]*\n+```python\n(.*?)^```", re.S | re.M)


def runnable_blocks(text: str) -> list[str]:
    """The code of each ```python block that follows the run marker (blank lines between are allowed)."""
    return [match.group(1) for match in _BLOCK.finditer(text)]


def _pages() -> list[Path]:
    return sorted(path for path in DOCS.rglob("*.md") if MARKER in path.read_text("utf-8"))


def test_the_marker_finds_exactly_the_marked_blocks() -> None:
    text = "x\n<!-- run -->\n```python\nprint(1)\n```\n\n```python\nprint(2)\n```\n<!-- run -->\n\n```python\nprint(3)\n```\n"
    assert runnable_blocks(text) == ["print(1)\n", "print(3)\n"]
    api = (DOCS / "reference" / "python-api.md").read_text("utf-8")
    assert len(runnable_blocks(api)) >= 7 and api.count(MARKER) == len(runnable_blocks(api))


@pytest.mark.parametrize("page", _pages(), ids=lambda path: str(path.relative_to(DOCS)))
def test_the_marked_examples_of_a_page_run(page: Path, tmp_path: Path) -> None:
    blocks = runnable_blocks(page.read_text("utf-8"))
    assert blocks, f"{page}: the run marker is not followed by a ```python block"
    script = tmp_path / "examples.py"
    script.write_text("\n".join(f"# --- block {n}\n{code}" for n, code in enumerate(blocks, 1)), "utf-8")
    done = subprocess.run(
        [sys.executable, "-W", "error::DeprecationWarning:__main__", str(script)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, f"{page.relative_to(ROOT)}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"

"""README.md stays a landing page: at most 10,000 characters, names the test command, and every relative link in
it (file and #anchor) resolves, so install, training on VOC images, serving and the label-and-fine-tune loop stay
within two clicks."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
LINK = re.compile(r"\]\(([^)\s]+)\)")
MAX_CHARS = 10_000


def _anchors(markdown: str) -> set[str]:
    """The ids MkDocs' toc gives the headings of a page (lower case, punctuation dropped, spaces to '-')."""
    headings = re.findall(r"^#{1,6}\s+(.+?)\s*$", markdown, re.M)
    return {re.sub(r"[\s]+", "-", re.sub(r"[^\w\s-]", "", h.strip().lower())) for h in headings}


def test_readme_is_short_and_names_the_test_command() -> None:
    text = README.read_text(encoding="utf-8")
    assert len(text) <= MAX_CHARS, f"README.md has {len(text)} characters (at most {MAX_CHARS})"
    assert "make test" in text and "make install" in text and "make demo" in text


def test_every_relative_link_of_the_readme_resolves() -> None:
    text = README.read_text(encoding="utf-8")
    broken = []
    for target in LINK.findall(text):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        path, _, anchor = target.partition("#")
        file = ROOT / path
        if not file.exists():
            broken.append(target)
        elif anchor and anchor not in _anchors(file.read_text(encoding="utf-8")):
            broken.append(target)
    assert not broken, f"README links that do not resolve: {broken}"


def test_the_first_tasks_are_one_link_away() -> None:
    text = README.read_text(encoding="utf-8")
    for page, must_hold in {
        "docs/getting-started/install.md": "pip install",
        "docs/getting-started/your-data.md#pascal-voc": "defectdet train",
        "docs/guides/serve.md": "curl",
        "docs/guides/line-loop.md": "--from",
        "docs/getting-started/right-for-you.md": "anomalib",
        "docs/getting-started/first-model.md": "curl",
    }.items():
        assert f"]({page})" in text, f"README does not link {page}"
        target = (ROOT / page.partition("#")[0]).read_text(encoding="utf-8")
        assert must_hold in target, f"{page} no longer shows {must_hold!r}"


def test_the_install_is_from_a_clone_until_a_release_exists() -> None:
    """Nothing is published: no page presents `pip install defectdet` as working, none has a placeholder URL,
    and the README and the install page set up with the three make targets in the clone."""
    pages = [README, *sorted((ROOT / "docs").rglob("*.md"))]
    for page in pages:
        if page.name == "changelog.md":
            continue
        text = page.read_text(encoding="utf-8")
        for unpublished in ("pip install defectdet", "pip install 'defectdet", "<your clone URL>"):
            assert unpublished not in text, f"{page.relative_to(ROOT)} shows {unpublished!r}"
    for page in (README, ROOT / "docs" / "getting-started" / "install.md"):
        text = page.read_text(encoding="utf-8")
        assert "No release is published yet" in text and "clone" in text, page
        for target in ("make install", "make demo", "make test"):
            assert f"\n{target} " in text, f"{page.relative_to(ROOT)} does not show {target!r} as a command"

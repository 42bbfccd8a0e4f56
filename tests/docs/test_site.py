"""The documentation site: `mkdocs build --strict` passes (no broken link, missing anchor or page left out of the
navigation), and the built home page and a guide render in headless Chromium with every request answered by the
local server (no web font, no CDN).

Skipped with the reason when mkdocs, playwright or a Chromium binary is missing.
"""

from __future__ import annotations

import functools
import http.server
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlparse

import pytest

ROOT = Path(__file__).resolve().parents[2]
MKDOCS = shutil.which("mkdocs", path=str(Path(sys.executable).parent)) or shutil.which("mkdocs")
CHROMIUM = next((p for p in ("/usr/bin/chromium", shutil.which("chromium")) if p and Path(p).exists()), None)
BROWSER_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
pytestmark = pytest.mark.skipif(
    MKDOCS is None, reason="mkdocs is not installed (pip install defectdet[docs])"
)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site built with --strict into a temporary folder; a warning fails the build and shows here."""
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run(
        [MKDOCS, "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        env={"NO_MKDOCS_2_WARNING": "1", "PATH": str(Path(sys.executable).parent)},
    )
    warnings = [line for line in done.stderr.splitlines() if line.startswith(("WARNING", "ERROR"))]
    assert done.returncode == 0 and not warnings, f"mkdocs build --strict failed:\n{done.stderr[-4000:]}"
    return out


def test_strict_build_writes_every_page_of_the_nav(site: Path) -> None:
    for page in (
        "index.html",
        "getting-started/right-for-you/index.html",
        "getting-started/first-model/index.html",
        "guides/train/index.html",
        "glossary/index.html",
        "changelog/index.html",
    ):
        assert (site / page).is_file(), f"{page} missing from the built site"
    changelog = (site / "changelog" / "index.html").read_text()
    assert "--8&lt;--" not in changelog and "Unreleased" in changelog, "CHANGELOG.md was not included"


@pytest.fixture
def served(site: Path) -> Iterator[str]:
    handler = functools.partial(_QuietHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    thread.join(10)


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
        pass


@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium binary (apt-get install chromium)")
def test_home_and_a_guide_render_offline(served: str) -> None:
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    requests: list[str] = []
    failed: list[str] = []
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=BROWSER_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.on("request", lambda request: requests.append(request.url))
            page.on("requestfailed", lambda request: failed.append(request.url))
            page.on("response", lambda r: failed.append(f"{r.status} {r.url}") if r.status >= 400 else None)
            page.goto(served + "/", wait_until="networkidle")
            assert page.title().startswith("defectdet")
            tabs = page.locator(".md-tabs__link").all_text_contents()
            assert {"Get started", "Guides", "Reference", "Benchmarks", "Contributing"} <= {
                t.strip() for t in tabs
            }
            assert "Design" not in {t.strip() for t in tabs}, tabs
            page.goto(served + "/guides/train/", wait_until="networkidle")
            assert page.locator("article h1").first.text_content().rstrip("¶ \n") == "Train"
            assert page.title().startswith("Train - defectdet")
            assert page.locator("nav.md-nav--primary a[href$='../evaluate/']").count() >= 1
        finally:
            browser.close()
    remote = [url for url in requests if urlparse(url).hostname not in ("127.0.0.1", None)]
    assert not remote, f"the site asked hosts other than the local server: {remote}"
    assert not failed, f"failed requests: {failed}"

"""Save a PNG of a local HTML page (a run's report.html) as headless Chromium renders it, for the documentation.

    python scripts/screenshot.py runs/val/first-best/report.html docs/assets/screenshots/first-model-report.png

Needs playwright (the `dev` extra) and a Chromium binary (Debian: apt-get install chromium); nothing is fetched
from the network.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path


def screenshot(page_file: Path, out: Path, width: int = 1200, height: int = 900) -> Path:
    """Render `page_file` at `width` x `height` CSS pixels and write the visible part to `out`."""
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    out.parent.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page(viewport={"width": width, "height": height})
            page.route("http*://**", lambda route: route.abort())  # the report is self-contained
            page.goto(page_file.resolve().as_uri(), wait_until="load")
            page.screenshot(path=str(out))
        finally:
            browser.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("page", type=Path, help="the HTML file to render")
    parser.add_argument("out", type=Path, help="the PNG to write")
    parser.add_argument("--width", type=int, default=1200, help="viewport width in CSS pixels")
    parser.add_argument("--height", type=int, default=900, help="viewport height in CSS pixels")
    args = parser.parse_args()
    print(screenshot(args.page, args.out, args.width, args.height))


if __name__ == "__main__":
    main()

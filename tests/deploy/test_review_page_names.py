"""The review page in headless Chromium shows the name each kept image was uploaded as, and lists the images by
capture time. Skipped with the reason when playwright or a Chromium binary is missing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from server_fakes import board, encode
from test_review_page import BROWSER_ARGS, CHROMIUM, _open, _serve

sync_api = pytest.importorskip(
    "playwright.sync_api", reason="playwright is not installed (pip install playwright)"
)
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no Chromium binary (apt-get install chromium)")


def test_the_page_shows_the_uploaded_name_and_lists_by_capture_time(tmp_path: Path) -> None:
    root = tmp_path / "kept"
    for sub in ("images", "predictions"):
        (root / sub).mkdir(parents=True)
    kept = {"a.png": (1_700_000_200.0, "part-0042.png"), "b.png": (1_700_000_100.0, "part-0041 <b>.png")}
    for name, (when, uploaded) in kept.items():
        (root / "images" / name).write_bytes(encode(board(1)))
        sidecar = {"time": when, "upload_name": uploaded, "reasons": ["flagged"], "verdict": "defective"}
        (root / "predictions" / f"{Path(name).stem}.json").write_text(json.dumps(sidecar))
    for url in _serve(root):
        with sync_api.sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=BROWSER_ARGS)
            page = _open(browser, url, "b.png")  # the earlier capture first, though its file name sorts later
            info = page.text_content("#item-info")
            assert "uploaded as part-0041 <b>.png" in info and "captured 2023-11-14T22:15:00Z" in info, info
            assert page.locator("#items li .name").all_text_contents() == ["b.png", "a.png"]
            assert "uploaded as part-0042.png" in page.get_attribute("#items li:nth-child(2)", "title")
            browser.close()

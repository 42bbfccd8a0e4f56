"""The review page in headless Chromium (Debian's `chromium` through playwright): shortcuts, drawing a box with
the mouse, assigning a class, the saved YOLO label file; a broken image shown as an error and skipped.

Skipped with the reason when playwright or a Chromium binary is missing.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvicorn
from test_review import BAD_LABEL, make_folder
from test_server_page import BROWSER_ARGS, CHROMIUM

from defectdet.runtime.review import ReviewFolder
from defectdet.runtime.review_app import create_review_app
from defectdet.runtime.server import ServeSettings

sync_api = pytest.importorskip(
    "playwright.sync_api", reason="playwright is not installed (pip install playwright)"
)
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no Chromium binary (apt-get install chromium)")
TOKEN = "review-secret"


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    folder = make_folder(tmp_path / "kept")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    app = create_review_app(ReviewFolder(folder), ServeSettings(token=TOKEN))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline, "the review app did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}", folder
    server.should_exit = True
    thread.join(10)


def _saved(page, count: int) -> None:
    """Wait until the page saved `count` decisions; on a timeout say what its status line shows."""
    try:
        page.wait_for_function(f"() => Number(document.body.dataset.saved || 0) >= {count}", timeout=15_000)
    except sync_api.TimeoutError:
        raise AssertionError(
            f"decision {count} not saved; the page says: {page.text_content('#status')}"
        ) from None


def test_shortcuts_and_a_box_drawn_with_the_mouse_become_yolo_labels(
    served: tuple[str, Path], tmp_path: Path
) -> None:
    url, folder = served
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=BROWSER_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.on("dialog", lambda dialog: dialog.accept(TOKEN))
            requests: list[str] = []
            page.on("request", lambda request: requests.append(request.url))
            page.goto(url + "/review")
            # a.png opens first (pending) with the model's box
            page.wait_for_function(
                "() => document.getElementById('item-name').textContent === 'a.png'", timeout=15_000
            )
            page.wait_for_function(
                "() => document.getElementById('canvas').dataset.boxes === '1'", timeout=15_000
            )
            assert "a accept" in page.text_content("#shortcuts").replace("\n", " ")
            page.fill("#operator", "anna")
            # draw a second box with the mouse on the 200x100 image, then make it class 3. The page enlarges a
            # small image (here 3.8x, to its 760 px display side) so boxes can be drawn on it.
            canvas = page.locator("#canvas").bounding_box()
            scale = canvas["width"] / 200
            assert round(scale, 2) == 3.8 and round(canvas["height"]) == round(100 * scale)
            page.mouse.move(canvas["x"] + 10 * scale, canvas["y"] + 20 * scale)
            page.mouse.down()
            page.mouse.move(canvas["x"] + 30 * scale, canvas["y"] + 40 * scale, steps=5)
            page.mouse.move(canvas["x"] + 50 * scale, canvas["y"] + 60 * scale, steps=5)
            page.mouse.up()
            _saved(page, 1)
            page.wait_for_function("() => document.getElementById('canvas').dataset.boxes === '2'")
            page.keyboard.press("3")  # the drawn box is selected: it becomes 'mousebite'
            _saved(page, 2)
            lines = (folder / "labels" / "a.txt").read_text().splitlines()
            assert lines[0] == "1 0.350000 0.550000 0.200000 0.300000"  # the model's box, kept
            class_id, cx, cy, w, h = lines[1].split()
            assert class_id == "2"
            assert abs(float(cx) - 0.15) < 0.02 and abs(float(cy) - 0.4) < 0.04
            assert abs(float(w) - 0.2) < 0.02 and abs(float(h) - 0.4) < 0.04
            page.keyboard.press("a")  # accept -> next usable image: b.png with its bad label file
            _saved(page, 3)
            page.wait_for_function("() => document.getElementById('item-name').textContent === 'b.png'")
            assert "labels/b.txt line 2" in page.text_content("#label-error")
            assert (folder / "labels" / "b.txt").read_text() == BAD_LABEL
            page.keyboard.press("n")  # c.png is truncated: shown as an error entry, counted, skipped
            page.wait_for_function(
                "() => document.getElementById('counts').dataset.broken === '2'", timeout=15_000
            )
            assert "c.png" in page.text_content("#item-error")
            page.keyboard.press("n")
            page.wait_for_function("() => document.getElementById('item-name').textContent === 'd.png'")
            page.keyboard.press("c")  # clean
            _saved(page, 4)
            screenshot = Path(os.environ.get("DEFECTDET_REVIEW_SCREENSHOT", tmp_path / "review.png"))
            page.screenshot(path=str(screenshot), full_page=True)
            assert screenshot.stat().st_size > 10_000
            assert all(url_.startswith(url) for url_ in requests), requests
        finally:
            browser.close()
    assert (folder / "labels" / "d.txt").read_text() == ""
    assert (folder / "labels" / "b.txt").read_text() == BAD_LABEL  # never decided on: untouched
    log = [json.loads(line) for line in (folder / "decisions.jsonl").read_text().splitlines()]
    assert [(entry["image"], entry["action"]) for entry in log] == [
        ("images/a.png", "edit"),
        ("images/a.png", "edit"),
        ("images/a.png", "accept"),
        ("images/d.png", "clean"),
    ]
    assert {entry["operator"] for entry in log} == {"anna"}
    assert (folder / "reviewed.txt").read_text() == "./images/a.png\n./images/d.png\n"

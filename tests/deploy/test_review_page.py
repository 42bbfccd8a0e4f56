"""The review page in headless Chromium (Debian's `chromium` through playwright), driven with the real mouse and
keyboard at 1366x768: the class keys set the class of the next box (a drawn box is not re-classed), move and
resize, undo, zoom and pan, clear proposals, the score slider hides near misses and `a` never accepts a hidden
proposal, the saved YOLO label file, the browser download of the labels, the list filters; a bad label file and a
broken image shown as errors; no sideways scroll. At 1366x768, 1920x1080 and 1024x768 the page reads fully (the
header, one line per listed name, the toolbar, box labels apart); box numbers stay put while the operator works.

Skipped with the reason when playwright or a Chromium binary is missing.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import uvicorn
from server_fakes import board, encode
from test_review import BAD_LABEL, CLASSES, make_folder
from test_server_page import BROWSER_ARGS, CHROMIUM

from defectdet.serve.review import ReviewFolder
from defectdet.serve.review_app import create_review_app
from defectdet.serve.settings import ServeSettings

sync_api = pytest.importorskip(
    "playwright.sync_api", reason="playwright is not installed (pip install playwright)"
)
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no Chromium binary (apt-get install chromium)")
TOKEN = "review-secret"
SCREEN = {"width": 1366, "height": 768}
THRESHOLD = 0.5
DETECTION = {"class_id": 1, "score": 0.9, "box": [150, 10, 190, 40]}
NEAR_SHOWN = {"class_id": 0, "score": 0.45, "box": [150, 60, 190, 95]}  # shown once the slider is at 0.4
NEAR_HIDDEN = {"class_id": 2, "score": 0.3, "box": [110, 60, 140, 95]}  # hidden at 0.4 too
EMPTY = {"class_id": 0, "score": 0.7, "box": [120, 10, 120, 50]}  # zero width: never shown


def _serve(folder: Path) -> Iterator[str]:
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
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(10)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    folder = make_folder(tmp_path / "kept")
    for url in _serve(folder):
        yield url, folder


def proposals_folder(root: Path) -> Path:
    """images/a.png (200x100) kept as 'uncertain' with a detection, two near misses and an empty proposal at a
    threshold of 0.5; images/b.png with no proposals."""
    for sub in ("images", "predictions"):
        (root / sub).mkdir(parents=True)
    (root / "images" / "a.png").write_bytes(encode(board(1, size=200)[:100]))
    (root / "images" / "b.png").write_bytes(encode(board(2, size=120)))
    sidecar = {
        "reasons": ["uncertain"],
        "verdict": "defective",
        "class_names": CLASSES,
        "threshold": THRESHOLD,
        "detections": [DETECTION, NEAR_SHOWN, NEAR_HIDDEN, EMPTY],
    }
    (root / "predictions" / "a.json").write_text(json.dumps(sidecar))
    return root


@pytest.fixture
def proposals(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    folder = proposals_folder(tmp_path / "kept")
    for url in _serve(folder):
        yield url, folder


def _saved(page, count: int) -> None:
    """Wait until the page saved `count` decisions and takes keys again (a decision that moves on keeps the page
    busy until the next image is shown: keys pressed before are ignored); on a timeout say what its status line
    shows."""
    try:
        page.wait_for_function(
            f"() => Number(document.body.dataset.saved || 0) >= {count} && !document.body.dataset.busy",
            timeout=15_000,
        )
    except sync_api.TimeoutError:
        raise AssertionError(
            f"decision {count} not saved; the page says: {page.text_content('#status')}"
        ) from None


def _canvas(page, name: str) -> str:
    return page.get_attribute("#canvas", f"data-{name}") or ""


def _point(page, x: float, y: float) -> tuple[float, float]:
    """Image pixel (x, y) -> page coordinates, through the page's current zoom and pan."""
    view = json.loads(_canvas(page, "view"))
    rect = page.locator("#canvas").bounding_box()
    return rect["x"] + x * view["s"] + view["tx"], rect["y"] + y * view["s"] + view["ty"]


def _drag(page, start: tuple[float, float], end: tuple[float, float]) -> None:
    """Press at image pixel `start`, move in steps, release at image pixel `end`."""
    page.mouse.move(*_point(page, *start))
    page.mouse.down()
    page.mouse.move(*_point(page, *end), steps=6)
    page.mouse.up()


def _labels(path: Path) -> list[tuple[int, list[float]]]:
    """The YOLO label file as (class, [x1, y1, x2, y2] in pixels of the 200x100 image)."""
    rows = []
    for line in path.read_text().splitlines():
        class_id, cx, cy, w, h = (float(v) for v in line.split())
        box = [(cx - w / 2) * 200, (cy - h / 2) * 100, (cx + w / 2) * 200, (cy + h / 2) * 100]
        rows.append((int(class_id), box))
    return rows


def _close(box: list[float], expected: list[float], tolerance: float = 1.0) -> bool:
    return all(abs(a - b) <= tolerance for a, b in zip(box, expected, strict=True))


def _open(browser, url: str, first: str):
    page = browser.new_page(viewport=SCREEN, accept_downloads=True)
    page.on("dialog", lambda dialog: dialog.accept(TOKEN))
    page.goto(url + "/review")
    page.wait_for_function(
        f"() => document.getElementById('item-name').textContent === {first!r}"
        " && document.getElementById('canvas').dataset.view !== undefined",
        timeout=15_000,
    )
    return page


def test_class_keys_move_undo_slider_accept_and_download(proposals: tuple[str, Path], tmp_path: Path) -> None:
    url, folder = proposals
    label = folder / "labels" / "a.txt"
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=BROWSER_ARGS)
        try:
            page = _open(browser, url, "a.png")
            assert page.evaluate("document.scrollingElement.scrollWidth") <= SCREEN["width"]
            # below the threshold: hidden; the empty proposal is never shown
            assert (_canvas(page, "boxes"), _canvas(page, "hidden")) == ("1", "2")
            assert "0.500" in page.text_content("#threshold-note")
            assert "Esc" in page.text_content("#shortcuts") and "next box" in page.text_content("#class-rule")
            page.fill("#operator", "anna")
            page.keyboard.press("Enter")  # leaves the name field: the keys are shortcuts again
            # class first, then draw: '3' is the class of the next box; the drawn box is not selected, so '2'
            # sets the class of the box after it and leaves the first one alone
            page.keyboard.press("3")
            _drag(page, (10, 10), (40, 40))
            _saved(page, 1)
            page.keyboard.press("2")
            page.mouse.wheel(0, -300)  # zoom in around the cursor: drawing still lands on the image pixels
            assert json.loads(_canvas(page, "view"))["s"] > 4
            _drag(page, (60, 50), (90, 80))
            _saved(page, 2)
            assert [row[0] for row in _labels(label)] == [2, 1]
            page.keyboard.press("0")  # fit again
            # move the first box: click selects it, dragging its body moves it 20 px right
            page.mouse.click(*_point(page, 25, 25))
            page.wait_for_function("() => document.querySelector('#boxes tr.selected') !== null")
            _drag(page, (25, 25), (45, 25))
            _saved(page, 3)
            assert _close(_labels(label)[0][1], [30, 10, 60, 40])
            page.keyboard.press("Escape")
            page.keyboard.press("Control+z")  # undo the move
            _saved(page, 4)
            first, second = _labels(label)
            assert first[0] == 2 and _close(first[1], [10, 10, 40, 40])
            assert second[0] == 1 and _close(second[1], [60, 50, 90, 80])
            # resize the second box: select it, drag its lower right corner 8 px right and down
            page.mouse.click(*_point(page, 75, 65))
            _drag(page, (90, 80), (98, 88))
            _saved(page, 5)
            assert _close(_labels(label)[1][1], [60, 50, 98, 88])
            page.keyboard.press("Escape")
            # the slider reveals the near misses above it and hides them again
            page.fill("#min-score", "0.4")
            assert (_canvas(page, "boxes"), _canvas(page, "hidden")) == ("4", "1")
            page.fill("#min-score", "0.5")
            assert (_canvas(page, "boxes"), _canvas(page, "hidden")) == ("3", "2")
            page.fill("#min-score", "0.4")
            page.locator("#canvas").focus()
            page.keyboard.press("a")  # accept: the two labels + the proposals shown, never the hidden one
            _saved(page, 6)
            page.wait_for_function("() => document.getElementById('item-name').textContent === 'b.png'")
            saved = sorted((class_id, [round(v) for v in box]) for class_id, box in _labels(label))
            expected = [(2, [10, 10, 40, 40]), (1, [60, 50, 98, 88]), DETECTION, NEAR_SHOWN]
            assert saved == sorted(
                row if isinstance(row, tuple) else (row["class_id"], row["box"]) for row in expected
            )
            page.wait_for_function("() => document.getElementById('canvas').dataset.size === '[120,120]'")
            assert _canvas(page, "hidden") == "0"  # b.png: the slider is back at the threshold
            with page.expect_download() as downloading:
                page.click("#export")
            archive = tmp_path / downloading.value.suggested_filename
            downloading.value.save_as(archive)
            page.wait_for_function(
                "() => document.getElementById('status').textContent.startsWith('downloaded')"
            )
            assert page.evaluate("document.scrollingElement.scrollWidth") <= SCREEN["width"]
        finally:
            browser.close()
    assert archive.name == "kept-labels.zip"
    with zipfile.ZipFile(archive) as opened:
        names = set(opened.namelist())
        assert {"data.yaml", "reviewed.txt", "images/a.png", "labels/a.txt", "annotations.coco.json"} <= names
        assert opened.read("labels/a.txt") == label.read_bytes()
        assert "images/b.png" not in names  # not reviewed
    log = [json.loads(line) for line in (folder / "decisions.jsonl").read_text().splitlines()]
    assert [entry["action"] for entry in log] == ["edit"] * 3 + ["undo", "edit", "accept"]  # the move undone


def test_a_bad_label_file_and_a_broken_image_are_shown_and_the_rest_is_decided(
    served: tuple[str, Path], tmp_path: Path
) -> None:
    url, folder = served
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=BROWSER_ARGS)
        try:
            page = _open(browser, url, "a.png")
            requests: list[str] = []
            page.on("request", lambda request: requests.append(request.url))
            assert _canvas(page, "boxes") == "1"  # no threshold recorded: the model's box is shown
            page.click("#clear-proposals")
            assert _canvas(page, "boxes") == "0"
            page.click("#undo")
            assert _canvas(page, "boxes") == "1"
            fitted = json.loads(_canvas(page, "view"))
            page.keyboard.down(" ")  # space + drag pans
            _drag(page, (100, 50), (120, 60))
            page.keyboard.up(" ")
            panned = json.loads(_canvas(page, "view"))
            assert panned["s"] == fitted["s"] and abs(panned["tx"] - fitted["tx"] - 20 * fitted["s"]) < 2
            assert _canvas(page, "labels") == "0"  # panning drew nothing
            page.click("#zoom-reset")
            reset = json.loads(_canvas(page, "view"))
            assert all(abs(reset[key] - fitted[key]) < 1 for key in ("s", "tx", "ty"))
            page.fill("#operator", "anna")
            page.keyboard.press("Enter")
            page.keyboard.press("a")  # accept -> next usable image: b.png with its bad label file
            _saved(page, 1)
            page.wait_for_function("() => document.getElementById('item-name').textContent === 'b.png'")
            assert "labels/b.txt line 2" in page.text_content("#label-error")
            page.keyboard.press("n")  # c.png is truncated: shown as an error entry, counted, skipped
            page.wait_for_function(
                "() => document.getElementById('counts').dataset.broken === '2'", timeout=15_000
            )
            assert "c.png" in page.text_content("#item-error")
            page.keyboard.press("n")
            page.wait_for_function("() => document.getElementById('item-name').textContent === 'd.png'")
            page.keyboard.press("c")  # clean
            _saved(page, 2)
            # the list filters by status: two decided, the broken ones under their own status
            page.select_option("#filter-status", "accept")
            assert page.locator("#items li[data-status='accept']").count() == 1
            page.select_option("#filter-status", "error")
            assert page.locator("#items li[data-status='error']").count() == 2
            page.select_option("#filter-status", "")
            page.select_option("#filter-reason", "flagged")
            assert page.locator("#items li").count() in (1, 2)  # a.png, and the current item stays listed
            screenshot = Path(os.environ.get("DEFECTDET_REVIEW_SCREENSHOT", tmp_path / "review.png"))
            page.screenshot(path=str(screenshot))
            assert screenshot.stat().st_size > 10_000
            assert all(url_.startswith(url) for url_ in requests), requests
        finally:
            browser.close()
    assert (folder / "labels" / "a.txt").read_text() == "1 0.350000 0.550000 0.200000 0.300000\n"
    assert (folder / "labels" / "d.txt").read_text() == ""
    assert (folder / "labels" / "b.txt").read_text() == BAD_LABEL  # never decided on: untouched
    log = [json.loads(line) for line in (folder / "decisions.jsonl").read_text().splitlines()]
    assert [(entry["image"], entry["action"]) for entry in log] == [
        ("images/a.png", "accept"),
        ("images/d.png", "clean"),
    ]
    assert {entry["operator"] for entry in log} == {"anna"}
    assert (folder / "reviewed.txt").read_text() == "./images/a.png\n./images/d.png\n"


def test_two_tabs_on_one_image_the_stale_save_is_refused_and_the_page_reloads_it(
    served: tuple[str, Path],
) -> None:
    """Tab 1 decides a.png clean; tab 2, opened before that, accepts a.png: the server refuses it (409), the
    page says so, stays on a.png and shows what is saved now; the label file is tab 1's."""
    url, folder = served
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=BROWSER_ARGS)
        try:
            first, second = _open(browser, url, "a.png"), _open(browser, url, "a.png")
            for page in (first, second):
                page.fill("#operator", "anna")
                page.keyboard.press("Enter")
            first.keyboard.press("c")
            _saved(first, 1)
            second.keyboard.press("a")
            second.wait_for_function("() => document.body.dataset.stale === 'a.png'", timeout=15_000)
            second.wait_for_function(
                "() => document.getElementById('status').textContent.startsWith('not saved')", timeout=15_000
            )
            assert "changed since you opened it" in second.text_content("#status")
            assert second.text_content("#item-name") == "a.png"
            second.wait_for_function("() => document.getElementById('item-status').textContent === 'clean'")
            assert second.evaluate("document.body.dataset.saved || '0'") == "0"
        finally:
            browser.close()
    assert (folder / "labels" / "a.txt").read_text() == ""
    log = [json.loads(line) for line in (folder / "decisions.jsonl").read_text().splitlines()]
    assert [(entry["image"], entry["action"]) for entry in log] == [("images/a.png", "clean")]


def test_v_switches_the_view_between_the_image_and_its_companion_capture(tmp_path: Path) -> None:
    """A kept item with a companion capture L2: the page shows the key and the view buttons, `v` shows the L2
    capture (its pixels, not the image's) and `v` again the image."""
    root = tmp_path / "kept"
    for sub in ("images", "predictions", "companions/L2"):
        (root / sub).mkdir(parents=True)
    (root / "images" / "a.png").write_bytes(encode(np.full((60, 80), 30, np.uint8)))
    (root / "companions" / "L2" / "a.png").write_bytes(encode(np.full((60, 80), 220, np.uint8)))
    sidecar = {
        "class_names": CLASSES,
        "threshold": THRESHOLD,
        "detections": [],
        "companions": {"L2": "companions/L2/a.png"},
    }
    (root / "predictions" / "a.json").write_text(json.dumps(sidecar))
    centre = "() => { const c = document.getElementById('canvas'); const v = JSON.parse(c.dataset.view);" \
        " return c.getContext('2d').getImageData(v.tx + 40 * v.s, v.ty + 30 * v.s, 1, 1).data[0]; }"  # fmt: skip
    for url in _serve(root):
        with sync_api.sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=BROWSER_ARGS)
            try:
                page = _open(browser, url, "a.png")
                assert "view" in page.text_content("#shortcuts") and page.is_visible("#views")
                assert page.text_content("#view-buttons") == "image L2" and page.evaluate(centre) == 30
                page.keyboard.press("v")
                page.wait_for_function("() => document.getElementById('canvas').dataset.plane === 'L2'")
                assert page.evaluate(centre) == 220
                page.keyboard.press("v")
                page.wait_for_function("() => document.getElementById('canvas').dataset.plane === 'image'")
                assert page.evaluate(centre) == 30
            finally:
                browser.close()


def _showing(page, name: str, status: str | None = None) -> None:
    """Wait until the page shows image `name` loaded (and with the status badge `status`)."""
    condition = (
        f"document.getElementById('item-name').textContent === {name!r}"
        " && document.getElementById('canvas').dataset.size !== undefined"
    )
    if status is not None:
        condition += f" && document.getElementById('item-status').textContent === {status!r}"
    try:
        page.wait_for_function(f"() => {condition}", timeout=15_000)
    except sync_api.TimeoutError:
        raise AssertionError(
            f"not showing {name} ({status}): {page.text_content('#item-name')} "
            f"({page.text_content('#item-status')}); the page says: {page.text_content('#status')}"
        ) from None


def test_a_key_pressed_again_while_saving_is_ignored_and_the_filters_never_take_the_keys(
    served: tuple[str, Path],
) -> None:
    """`a` pressed twice while the first accept waits for the folder's lock (another process deciding): one
    accept, and the next image is shown, not passed over. A filter dropdown with the focus never takes a
    decision key as a choice; once a filter is picked the keys decide again."""
    from defectdet.serve.capture import folder_lock
    from defectdet.serve.review import REVIEW_LOCK

    url, folder = served
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=BROWSER_ARGS)
        try:
            page = _open(browser, url, "a.png")
            keys = {"#do-accept": "a", "#do-clean": "c", "#do-skip": "s", "#do-next": "n"}
            for button, key in keys.items():
                assert page.is_visible(button) and page.text_content(f"{button} kbd") == key
            assert "Ctrl" in page.text_content("#undo") and page.is_visible("#reset")
            page.fill("#operator", "anna")
            page.keyboard.press("Enter")
            with folder_lock(folder / REVIEW_LOCK):  # the accept waits in the service
                with page.expect_request("**/v1/review/decide"):
                    page.keyboard.press("a")
                page.keyboard.press("a")  # again, while the first is being saved
                page.click("#do-accept")  # and once more with the button
            _saved(page, 1)
            _showing(page, "b.png")
            page.keyboard.press("c")  # b.png is decided, not passed over
            _saved(page, 2)
            page.wait_for_function("() => document.getElementById('item-name').textContent === 'c.png'")
            page.focus("#filter-status")
            page.keyboard.press("ArrowDown")  # the filter: unreviewed
            assert page.input_value("#filter-status") == "pending"
            page.keyboard.press("n")  # the keys work again: the next unreviewed image that can be shown
            _showing(page, "d.png")
            page.focus("#filter-status")
            page.keyboard.press("c")  # a decision, not the option starting with 'c' ("clean")
            _saved(page, 3)
            assert page.input_value("#filter-status") == "pending"
            assert page.evaluate("document.activeElement === document.body")
        finally:
            browser.close()
    log = [json.loads(line) for line in (folder / "decisions.jsonl").read_text().splitlines()]
    assert [(entry["image"], entry["action"]) for entry in log] == [
        ("images/a.png", "accept"),
        ("images/b.png", "clean"),
        ("images/d.png", "clean"),
    ]


def test_a_stray_accept_is_undone_cleared_proposals_stay_cleared_and_reset_brings_them_back(
    proposals: tuple[str, Path],
) -> None:
    """A stray `a` saves the shown proposal; Ctrl+Z takes it back (the page returns to the image, unreviewed,
    the proposal shown again, no label file). Clear proposals is saved: after a reload they stay cleared; Ctrl+Z
    after the reload takes the clear back. Reset this image undoes an accept; Undo restores it."""
    url, folder = proposals
    label = folder / "labels" / "a.txt"
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=BROWSER_ARGS)
        try:
            page = _open(browser, url, "a.png")
            page.fill("#operator", "anna")
            page.keyboard.press("Enter")
            page.keyboard.press("a")  # stray
            _saved(page, 1)
            _showing(page, "b.png")
            assert len(_labels(label)) == 1
            page.keyboard.press("Control+z")
            _saved(page, 2)
            _showing(page, "a.png", "unreviewed")
            assert _canvas(page, "boxes") == "1" and not label.exists()
            page.click("#clear-proposals")
            _saved(page, 3)
            assert _canvas(page, "boxes") == "0" and label.read_text() == ""
            page.reload()
            page.wait_for_function("() => document.getElementById('item-name').textContent === 'b.png'")
            page.click("#items li[data-index='0']")
            _showing(page, "a.png", "edited")
            assert (_canvas(page, "boxes"), _canvas(page, "hidden")) == ("0", "0")  # still cleared
            page.keyboard.press("Control+z")  # after a reload: the image's last decision, the clear
            page.wait_for_function("() => Number(document.body.dataset.saved || 0) >= 1")
            _showing(page, "a.png", "unreviewed")
            assert _canvas(page, "boxes") == "1" and not label.exists()
            page.click("#do-accept")
            page.wait_for_function("() => Number(document.body.dataset.saved || 0) >= 2")
            _showing(page, "b.png")
            page.click("#do-previous")
            _showing(page, "a.png", "accepted")
            page.click("#reset")
            page.wait_for_function("() => Number(document.body.dataset.saved || 0) >= 3")
            _showing(page, "a.png", "unreviewed")
            assert _canvas(page, "boxes") == "1" and _canvas(page, "labels") == "0" and not label.exists()
            page.click("#undo")
            page.wait_for_function("() => Number(document.body.dataset.saved || 0) >= 4")
            _showing(page, "a.png", "accepted")
            assert _canvas(page, "labels") == "1" and len(_labels(label)) == 1
        finally:
            browser.close()
    log = [json.loads(line) for line in (folder / "decisions.jsonl").read_text().splitlines()]
    assert [entry["action"] for entry in log] == ["accept", "undo", "edit", "undo", "accept", "reset", "undo"]
    assert log[2]["proposals_cleared"] is True


LONG_NAMES = ("20261208T002304Z-3656-509191d3.png", "20261208T002304Z-3656-594f7658.png")
# three boxes on one spot (their labels would fall on each other) and two near misses under the threshold
CROWD = [
    {"class_id": 1, "score": 0.7, "box": [60, 30, 90, 60]},
    {"class_id": 1, "score": 0.9, "box": [61, 31, 91, 61]},
    {"class_id": 0, "score": 0.8, "box": [60, 31, 90, 60]},
    {"class_id": 2, "score": 0.3, "box": [10, 60, 30, 90]},
    {"class_id": 0, "score": 0.4, "box": [140, 20, 170, 50]},
]
SCREENS = [SCREEN, {"width": 1920, "height": 1080}, {"width": 1024, "height": 768}]


def crowd_folder(root: Path) -> Path:
    """Two kept images with long capture names, kept as flagged and uncertain, the first with the CROWD of
    proposals at a threshold of 0.5."""
    for sub in ("images", "predictions"):
        (root / sub).mkdir(parents=True)
    for i, name in enumerate(LONG_NAMES):
        (root / "images" / name).write_bytes(encode(board(i, size=200)[:100]))
        sidecar = {
            "time": 1_796_689_384.0 + i,
            "upload_name": f"line3-000{i}.png",
            "reasons": ["flagged", "uncertain"],
            "verdict": "defective",
            "class_names": CLASSES,
            "threshold": THRESHOLD,
            "detections": CROWD if i == 0 else [],
        }
        (root / "predictions" / f"{Path(name).stem}.json").write_text(json.dumps(sidecar))
    return root


# True when the element is inside the viewport and both ends of it are what the page shows there (nothing
# clips or covers it)
SEEN = """(selector) => {
  const element = document.querySelector(selector);
  const r = element.getBoundingClientRect();
  if (r.width === 0 || r.left < 0 || r.top < 0 || r.right > innerWidth || r.bottom > innerHeight) return false;
  const y = (r.top + r.bottom) / 2;
  return [r.left + 2, r.right - 2].every((x) => element.contains(document.elementFromPoint(x, y)));
}"""
# the toolbar's parts shown: [top, bottom, left, right, height of one line of its text]
TOOLBAR = """() => [...document.querySelectorAll('#toolbar > *')].filter((e) => e.offsetParent !== null).map((e) => {
  const r = e.getBoundingClientRect();
  return [r.top, r.bottom, r.left, r.right, parseFloat(getComputedStyle(e).fontSize) * 2];
})"""


def _label_rects(page) -> list[dict[str, float]]:
    return json.loads(_canvas(page, "label-rects"))


def _numbers(page) -> dict[str, str]:
    """The box table, which lists the shown boxes by number: the index of each on the page -> its number."""
    rows = page.evaluate(
        "() => [...document.querySelectorAll('#boxes tbody tr')].map((r) => [r.dataset.index, r.cells[0].textContent])"
    )
    assert [int(number) for _, number in rows] == sorted(int(number) for _, number in rows)
    return dict(rows)


def _check_layout(page, screen: dict[str, int]) -> None:
    """What the operator needs reads at this screen size: the whole header, one line per listed name, the
    toolbar within the viewer (on one line where the screen is wide enough), box labels apart from each other."""
    page.set_viewport_size(screen)
    page.wait_for_function(
        "() => { const c = document.getElementById('canvas'); return c.width === c.parentElement.clientWidth"
        " && c.height === c.parentElement.clientHeight; }"
    )
    assert page.evaluate("document.scrollingElement.scrollWidth") <= screen["width"]
    for part in ("verdict", "kept", "decided", "uploaded", "captured"):
        assert page.evaluate(SEEN, f"#item-info [data-part='{part}']"), (screen, part)
    assert "kept: flagged, uncertain" in page.text_content("#item-info [data-part='kept']")
    # the end of a long name, which tells it apart from the others
    assert page.evaluate(SEEN, "#items li.current .name .tail")
    for name in page.locator("#items li .name").element_handles():
        box, size = name.bounding_box(), name.evaluate("(e) => parseFloat(getComputedStyle(e).fontSize)")
        assert box["height"] < 2 * size and name.get_attribute("title").startswith(name.text_content())
    parts = page.evaluate(TOOLBAR)
    right = page.locator("#viewer").bounding_box()
    assert all(part[3] <= right["x"] + right["width"] and part[1] - part[0] < part[4] for part in parts)
    if screen["width"] >= 1366:  # one line: every part spans the middle of every other
        assert max(top for top, *_ in parts) < min(bottom for _, bottom, *_ in parts), parts
    rects = _label_rects(page)
    canvas = page.locator("#canvas").bounding_box()
    for i, a in enumerate(rects):
        assert a["x"] >= 0 and a["y"] >= 0 and a["x"] + a["w"] <= canvas["width"] + 0.5
        for b in rects[i + 1 :]:
            apart = a["x"] + a["w"] <= b["x"] or b["x"] + b["w"] <= a["x"] or a["y"] + a["h"] <= b["y"]
            assert apart or b["y"] + b["h"] <= a["y"], (a, b)


def test_the_page_reads_fully_at_common_screen_sizes_and_box_numbers_stay_put(tmp_path: Path) -> None:
    """At 1366x768, 1920x1080 and 1024x768: the header's parts (why the image was kept, who decided it) are in
    view, listed names take one line (the full name in the tooltip), the toolbar fits, and the labels of three
    boxes on one spot do not overlap. Box numbers: the shown boxes are numbered 1.. (the highest score first), a
    drawn box takes the next number (hidden proposals take none), the slider never renumbers a box, and the
    numbers are the same on the canvas, in the table and when the operator comes back to the image."""
    for url in _serve(crowd_folder(tmp_path / "kept")):
        with sync_api.sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=BROWSER_ARGS)
            try:
                page = _open(browser, url, LONG_NAMES[0])
                page.fill("#operator", "anna")
                page.keyboard.press("Enter")
                # the three boxes on one spot, by score: 0.9, 0.8, 0.7
                assert _numbers(page) == {"1": "1", "2": "2", "0": "3"}
                assert sorted(rect["n"] for rect in _label_rects(page)) == [1, 2, 3]
                _drag(page, (110, 60), (130, 80))  # a drawn box: 4, not 6 (two proposals hidden)
                _saved(page, 1)
                assert _numbers(page)["5"] == "4" and page.locator("#boxes tbody tr").count() == 4
                page.fill("#min-score", "0")  # the near misses shown: the next numbers, by score
                assert _numbers(page) == {"1": "1", "2": "2", "0": "3", "5": "4", "4": "5", "3": "6"}
                page.fill("#min-score", "0.35")
                assert _numbers(page) == {"1": "1", "2": "2", "0": "3", "5": "4", "4": "5"}
                assert sorted(rect["n"] for rect in _label_rects(page)) == [1, 2, 3, 4, 5]
                stage = page.locator("#stage").bounding_box()
                page.click("#boxes tr[data-index='4']")
                assert "Box 5 (open)" in page.text_content("#selected-rule")
                assert page.locator("#stage").bounding_box() == stage  # selecting a box never moves the image
                page.keyboard.press("Escape")
                page.keyboard.press("n")
                _showing(page, LONG_NAMES[1])
                page.keyboard.press("c")  # decided: the header says by whom
                _saved(page, 2)
                page.keyboard.press("p")
                _showing(page, LONG_NAMES[0])
                page.fill("#min-score", "0")
                assert _numbers(page) == {"1": "1", "2": "2", "0": "3", "5": "4", "4": "5", "3": "6"}
                page.keyboard.press("n")
                _showing(page, LONG_NAMES[1], "clean")
                page.keyboard.press("p")
                _showing(page, LONG_NAMES[0])
                for screen in SCREENS:
                    _check_layout(page, screen)
            finally:
                browser.close()

"""Day one to week two, walked end to end: a model fitted on good parts only -> served, keeping what it flags ->
reviewed in headless Chromium with the anomaly map under the boxes (each "anomaly" box clicked and re-classed to a
real class name, then accepted) -> the reviewed dataset downloaded -> `train --from` the anomaly bundle (a
detector from the standard start) -> export -> `compare` the detector with the anomaly model (class-agnostic).

Skipped with the reason when playwright or Chromium is missing.
"""

from __future__ import annotations

import io
import json
import socket
import threading
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import cv2
import httpx
import numpy as np
import pytest
import uvicorn
import yaml
from test_review_page import _point
from test_server_page import BROWSER_ARGS, CHROMIUM
from typer.testing import CliRunner

from defectdet.cli import app
from defectdet.serve.server import create_app
from defectdet.serve.settings import ServeSettings

sync_api = pytest.importorskip(
    "playwright.sync_api", reason="playwright is not installed (pip install playwright)"
)
pytestmark = [
    pytest.mark.skipif(CHROMIUM is None, reason="no Chromium binary (apt-get install chromium)"),
    pytest.mark.slow,
]
TOKEN = "good-parts-secret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
SIZE = 96
DEFECT = (24, 24, 48, 44)  # x1, y1, x2, y2: a bright patch painted on a good surface
DEFECTIVE = 4


def _surface(index: int, defective: bool) -> bytes:
    from defectdet.data.synth import generate_surface

    image = generate_surface(7, index, SIZE, SIZE, materials=("cast",), clean=True).clean.copy()
    if defective:
        x1, y1, x2, y2 = DEFECT
        image[y1:y2, x1:x2] = 255
    return cv2.imencode(".png", image)[1].tobytes()


@pytest.fixture
def line(good_only_bundle: Path, tmp_path: Path) -> Iterator[dict]:
    """The anomaly bundle served with a token, keeping what it flags; classes.txt names the real classes."""
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "classes.txt").write_text("scratch\nblob\n", encoding="utf-8")
    settings = ServeSettings(token=TOKEN, keep=("flagged",), keep_dir=str(kept), threads=1)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(good_only_bundle, settings), host="127.0.0.1", port=port, log_level="warning"
        )
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started or httpx.get(f"http://127.0.0.1:{port}/readyz").status_code != 200:
        assert time.monotonic() < deadline, "the service did not get ready"
        time.sleep(0.05)
    yield {"url": f"http://127.0.0.1:{port}", "kept": kept, "bundle": good_only_bundle}
    server.should_exit = True
    thread.join(10)


def _items(url: str) -> dict[str, dict]:
    listing = httpx.get(url + "/v1/review/items", headers=AUTH).json()
    return {item["name"]: item for item in listing["items"]}


def _wait(condition, what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def _on_defect(item: dict) -> bool:
    x, y = (DEFECT[0] + DEFECT[2]) / 2, (DEFECT[1] + DEFECT[3]) / 2
    return any(
        p["box"][0] <= x <= p["box"][2] and p["box"][1] <= y <= p["box"][3] for p in item["predictions"]
    )


def _review(url: str) -> None:
    """Check the anomaly map layer (shown, m hides it, m shows it again); then on every kept image click the
    "anomaly" box on the defect, press 2 (scratch), clear the other proposals and accept with 'a'; an image
    flagged elsewhere is decided clean with 'c'."""
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=BROWSER_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.on("dialog", lambda dialog: dialog.accept(TOKEN))
            page.goto(url + "/review")
            page.wait_for_function("() => document.getElementById('item-name').textContent !== 'no item'")
            page.fill("#operator", "olga")
            page.keyboard.press("Enter")
            page.wait_for_function("() => document.getElementById('canvas').dataset.anomalyMap === 'shown'")
            assert page.is_visible("#map-toggle") and page.is_checked("#show-map")
            page.keyboard.press("m")
            assert page.get_attribute("#canvas", "data-anomaly-map") == "off"
            page.keyboard.press("m")
            assert page.get_attribute("#canvas", "data-anomaly-map") == "shown"
            items = _items(url)
            for _ in range(len(items)):
                page.wait_for_function("() => document.getElementById('canvas').dataset.size !== undefined")
                name = page.text_content("#item-name")
                if _on_defect(items[name]):
                    centre = ((DEFECT[0] + DEFECT[2]) / 2, (DEFECT[1] + DEFECT[3]) / 2)
                    page.mouse.click(*_point(page, *centre))  # select the anomaly box
                    page.keyboard.press("2")  # re-class it: scratch
                    page.click("#clear-proposals")
                    page.keyboard.press("a")
                    _wait(
                        lambda name=name: _items(url)[name]["status"] == "accept", f"{name} was not accepted"
                    )
                else:
                    page.keyboard.press("c")
                    _wait(
                        lambda name=name: _items(url)[name]["status"] == "clean", f"{name} not decided clean"
                    )
                page.wait_for_function(
                    f"() => document.getElementById('item-name').textContent !== {json.dumps(name)}"
                    " || document.querySelectorAll('#items li[data-status=pending]').length === 0"
                )
        finally:
            browser.close()


def test_good_parts_only_to_a_detector(line: dict, tmp_path: Path) -> None:
    url, kept = line["url"], line["kept"]
    with httpx.Client(base_url=url, headers=AUTH, timeout=30) as client:
        for index in range(300, 302):
            answer = client.post("/v1/detect", files={"image": (f"c{index}.png", _surface(index, False))})
            assert answer.status_code == 200
        for index in range(400, 400 + DEFECTIVE):
            answer = client.post("/v1/detect", files={"image": (f"d{index}.png", _surface(index, True))})
            assert answer.status_code == 200 and answer.json()["verdict"] == "defective", answer.text
            assert {d["class_name"] for d in answer.json()["detections"]} == {"anomaly"}
    _wait(
        lambda: len(list((kept / "predictions").glob("*.json"))) >= DEFECTIVE,
        "the flagged parts were not kept",
    )
    assert httpx.get(url + "/v1/review/items", headers=AUTH).json()["class_names"] == [
        "anomaly",
        "scratch",
        "blob",
    ]

    _review(url)
    accepted = [name for name, item in _items(url).items() if item["status"] == "accept"]
    assert len(accepted) == DEFECTIVE
    for name in accepted:
        rows = [
            line.split() for line in (kept / "labels" / f"{Path(name).stem}.txt").read_text().splitlines()
        ]
        assert [row[0] for row in rows] == ["1"]  # one box, scratch
        cx, cy = float(rows[0][1]) * SIZE, float(rows[0][2]) * SIZE
        assert DEFECT[0] <= cx <= DEFECT[2] + 8 and DEFECT[1] <= cy <= DEFECT[3] + 8

    download = httpx.get(url + "/v1/review/download", headers=AUTH, timeout=60)
    assert download.status_code == 200
    dataset = tmp_path / "reviewed"
    zipfile.ZipFile(io.BytesIO(download.content)).extractall(dataset)
    data_yaml = dataset / "data.yaml"
    assert yaml.safe_load(data_yaml.read_text())["names"] == {0: "anomaly", 1: "scratch", 2: "blob"}

    runner, run = CliRunner(), tmp_path / "detector_run"
    done = runner.invoke(
        app, ["train", str(data_yaml), "--from", str(line["bundle"]), "--epochs", "2", "--batch", "2",
              "--workers", "0", "--device", "cpu", "--out", str(run), "--set", "max_steps=4",
              "--set", "warmup_steps=1", "--set", "progress=false"],
    )  # fmt: skip
    assert done.exit_code == 0, done.output
    assert "good-parts-only model" in (run / "config.yaml").read_text()  # the start row, recorded
    detector = tmp_path / "detector.onnx"
    done = runner.invoke(app, ["export", str(run / "last.pt"), "--out", str(detector)])
    assert done.exit_code == 0, done.output

    out = tmp_path / "compare"
    done = runner.invoke(
        app, ["compare", str(line["bundle"]), str(detector), str(data_yaml), "--out", str(out)]
    )
    assert done.exit_code in (0, 1), done.output
    assert "class-agnostic" in done.output
    document = json.loads((out / "compare.json").read_text())
    assert document["classes"]["class_agnostic"] is True
    assert document["models"]["new"]["class_names"] == ["anomaly", "scratch", "blob"]
    assert np.isfinite(document["models"]["old"]["mAP50"])

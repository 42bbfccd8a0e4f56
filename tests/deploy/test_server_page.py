"""The page at `/` in headless Chromium (Debian's `chromium` through playwright): upload, boxes, verdict, charts.

Skipped with the reason when playwright or a Chromium binary is missing.
"""

from __future__ import annotations

import os
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import cv2
import pytest
import uvicorn
from server_fakes import FakePredictor, board

from defectdet.serve.server import create_app
from defectdet.serve.settings import ServeSettings

sync_api = pytest.importorskip(
    "playwright.sync_api", reason="playwright is not installed (pip install playwright)"
)
CHROMIUM = next(
    (
        path
        for path in (shutil.which("chromium"), shutil.which("chromium-browser"), "/usr/bin/chromium")
        if path and Path(path).exists()
    ),
    None,
)
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no Chromium binary (apt-get install chromium)")
BROWSER_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    yield from _serve(ServeSettings())


@pytest.fixture(scope="module")
def token_url() -> Iterator[str]:
    yield from _serve(ServeSettings(token=PAGE_TOKEN))


PAGE_TOKEN = "line-7-secret"


def _serve(settings: ServeSettings) -> Iterator[str]:
    yield from _serve_app(create_app(FakePredictor(), settings))


def _serve_app(app) -> Iterator[str]:  # noqa: ANN001
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not (server.started and app.state.service.ready.is_set()):
        assert time.monotonic() < deadline, "the service did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(10)


@contextmanager
def _page(image_path: Path, seed: int) -> Iterator:
    """A Chromium page (1280 x 900) and a synthetic board written to `image_path`."""
    cv2.imwrite(str(image_path), board(seed, size=320))
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=BROWSER_ARGS)
        try:
            yield browser.new_page(viewport={"width": 1280, "height": 900})
        finally:
            browser.close()


def _inspect(page, url: str, image_path: Path) -> None:
    """Open the page, wait until the service is ready, upload the image and wait for its boxes."""
    page.goto(url + "/")
    page.wait_for_function("() => document.getElementById('ready').textContent === 'ready'", timeout=15_000)
    page.set_input_files("#image", str(image_path))
    page.click("#submit")
    page.wait_for_function(
        "() => Number(document.getElementById('canvas').dataset.boxes || 0) > 0", timeout=15_000
    )


def test_page_uploads_and_draws_boxes(base_url: str, tmp_path: Path) -> None:
    with _page(tmp_path / "board.png", 11) as page:
        requests: list[str] = []
        page.on("request", lambda request: requests.append(request.url))
        _inspect(page, base_url, tmp_path / "board.png")
        assert "short" in page.text_content("#model")
        assert page.text_content("#verdict").startswith("defective")
        red = page.evaluate(
            """() => { const c = document.getElementById('canvas');
                       const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
                       let n = 0; for (let i = 0; i < d.length; i += 4)
                         if (d[i] > 200 && d[i + 1] < 80 && d[i + 2] < 80) n++; return n; }"""
        )
        assert red > 100, f"only {red} box-coloured pixels on the canvas"
        assert "short" in page.text_content("#detections")
        page.wait_for_function(
            "() => document.querySelectorAll('#results tbody tr').length >= 1", timeout=10_000
        )
        page.wait_for_function(
            "() => document.querySelectorAll('#drift-charts svg polyline').length >= 4", timeout=10_000
        )
        assert page.text_content("#drift-level") in ("ok", "warn", "alert")
        screenshot = Path(os.environ.get("DEFECTDET_PAGE_SCREENSHOT", tmp_path / "page.png"))
        page.screenshot(path=str(screenshot), full_page=True)
        assert screenshot.stat().st_size > 10_000
        assert all(url.startswith(base_url) or url.startswith("blob:") for url in requests), requests


def test_with_a_token_the_page_asks_for_it_once_and_then_inspects(token_url: str, tmp_path: Path) -> None:
    with _page(tmp_path / "board.png", 12) as page:
        prompts: list[str] = []

        def answer(dialog) -> None:
            prompts.append(dialog.message)
            dialog.accept(PAGE_TOKEN)

        page.on("dialog", answer)
        statuses: list[tuple[str, int]] = []
        page.on("response", lambda response: statuses.append((response.url, response.status)))
        _inspect(page, token_url, tmp_path / "board.png")
        assert page.text_content("#verdict").startswith("defective")
        assert len(prompts) == 1 and "token" in prompts[0]
        assert any(status == 401 for _, status in statuses)  # refused until the token was given
        assert any(url.endswith("/v1/detect") and status == 200 for url, status in statuses)


def _weak_predictor() -> FakePredictor:
    predictor = FakePredictor()
    predictor.metadata = predictor.metadata.model_copy(update={"metrics": {"mAP50": 0.0003, "split": "val"}})
    return predictor


def test_a_model_with_a_near_zero_validation_map_is_flagged_everywhere(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from fastapi.testclient import TestClient

    with caplog.at_level("WARNING", logger="defectdet.serve.service"):
        app = create_app(_weak_predictor(), ServeSettings(models_dir=str(tmp_path)))
    assert "validation mAP50 0.0003 on its val split is near zero" in caplog.text
    with TestClient(app, base_url="http://localhost") as client:
        quality = client.get("/v1/model").json()["quality"]
        assert (
            quality["near_zero"] is True
            and quality["value"] == 0.0003
            and "do not put it" in quality["warning"]
        )
        assert client.get("/v1/models").json()["live"]["quality"]["near_zero"] is True
    good = FakePredictor()
    good.metadata = good.metadata.model_copy(update={"metrics": {"mAP50": 0.91, "split": "val"}})
    with TestClient(create_app(good), base_url="http://localhost") as client:
        assert client.get("/v1/model").json()["quality"] == {
            "metric": "mAP50", "value": 0.91, "split": "val", "near_zero": False, "warning": None
        }  # fmt: skip
    served = _serve_app(create_app(_weak_predictor(), ServeSettings(models_dir=str(tmp_path))))
    url = next(served)
    try:
        with _page(tmp_path / "board.png", 13) as page:
            page.goto(url + "/")
            page.wait_for_selector("#model-warning:not([hidden])", timeout=15_000)
            assert "near zero" in page.text_content("#model-warning")
            page.wait_for_selector("#models-panel:not([hidden])", timeout=15_000)
            page.wait_for_function(
                "() => document.querySelector('#models tbody').textContent.includes('near zero')",
                timeout=15_000,
            )
    finally:
        next(served, None)

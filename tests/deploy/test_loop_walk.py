"""The closed loop, walked end to end with the live service answering all along (issue 22):

serve (keep every answer, a models folder, a token) -> kept images -> review in headless Chromium (a box drawn
with the mouse, accepted with the keyboard) -> data.yaml of the reviewed labels -> fine-tune from the served
bundle on old + new data (a few steps) -> export -> compare old and new -> shadow -> promote (the main page's
models panel, clicked in Chromium) -> roll back.

A client thread posts images the whole time; every answer must be 200, and the versions it sees must go
old -> new -> old. Skipped with the reason when playwright or Chromium is missing.
"""

from __future__ import annotations

import json
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import uvicorn
import yaml
from test_review_page import _drag, _point, _saved
from test_server_page import BROWSER_ARGS, CHROMIUM

from defectdet.export.compare_score import KEEP, PROMOTE
from defectdet.serve.server import create_app
from defectdet.serve.settings import ServeSettings

sync_api = pytest.importorskip(
    "playwright.sync_api", reason="playwright is not installed (pip install playwright)"
)
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no Chromium binary (apt-get install chromium)")
TOKEN = "line-secret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
CHANGE = {**AUTH, "X-Defectdet-Request": "1"}


class Client(threading.Thread):
    """Posts the dataset's images (with their templates) one after the other until stopped."""

    def __init__(self, url: str, pairs: list[tuple[Path, Path]]) -> None:
        super().__init__(daemon=True)
        self.url, self.pairs = url, pairs
        self.answers: list[tuple[int, str | None]] = []  # (status, model_version)
        self.stop = threading.Event()

    def run(self) -> None:
        with httpx.Client(base_url=self.url, headers=AUTH, timeout=30) as client:
            index = 0
            while not self.stop.is_set():
                image, template = self.pairs[index % len(self.pairs)]
                files = {
                    "image": (image.name, image.read_bytes()),
                    "template": (template.name, template.read_bytes()),
                }
                try:
                    answer = client.post("/v1/detect", files=files)
                    self.answers.append((answer.status_code, answer.json().get("model_version")))
                except (httpx.HTTPError, ValueError) as error:  # recorded, so the test fails with it
                    self.answers.append((0, repr(error)))
                index += 1
                time.sleep(0.05)

    def versions(self) -> list[str]:
        """The model versions seen, in order, with repeats collapsed."""
        seen: list[str] = []
        for _, version in self.answers:
            if version and (not seen or seen[-1] != version):
                seen.append(version)
        return seen


@pytest.fixture
def line(bundle_path: Path, tiny_dataset: Path, tmp_path: Path) -> Iterator[dict]:
    """The served bundle (a copy of the fixture's), a models folder and a kept folder, served with a token."""
    served = tmp_path / "line" / "model.onnx"
    served.parent.mkdir()
    shutil.copyfile(bundle_path, served)
    folders = {
        "served": served,
        "models": tmp_path / "models",
        "kept": tmp_path / "kept",
        "data": tiny_dataset,
    }
    folders["models"].mkdir()
    settings = ServeSettings(
        token=TOKEN,
        keep=("all",),
        keep_dir=str(folders["kept"]),
        models_dir=str(folders["models"]),
        threads=1,
    )
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(create_app(served, settings), host="127.0.0.1", port=port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started or httpx.get(f"http://127.0.0.1:{port}/readyz").status_code != 200:
        assert time.monotonic() < deadline, "the service did not get ready"
        time.sleep(0.05)
    folders["url"] = f"http://127.0.0.1:{port}"
    yield folders
    server.should_exit = True
    thread.join(10)


def _pairs(data_yaml: Path) -> list[tuple[Path, Path]]:
    from defectdet.data.formats import load_dataset

    split = load_dataset(data_yaml, "val")
    return [(sample.image_path, sample.template_path) for sample in split.samples]


def _review_in_the_browser(url: str, kept: Path, accept: int) -> None:
    """On the first kept image: choose class 2 with its key, draw a box with the mouse, click it and drag it a
    tenth of the image to the right; then accept it and `accept - 1` more images with 'a'."""
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=BROWSER_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.on("dialog", lambda dialog: dialog.accept(TOKEN))
            page.goto(url + "/review")
            page.wait_for_function(
                "() => document.getElementById('item-name').textContent !== ''", timeout=15_000
            )
            page.fill("#operator", "olga")
            page.keyboard.press("Enter")
            page.wait_for_function("() => document.getElementById('canvas').dataset.size !== undefined")
            width, height = json.loads(page.get_attribute("#canvas", "data-size"))
            page.keyboard.press("2")  # the class of the next box
            _drag(page, (width * 0.2, height * 0.2), (width * 0.4, height * 0.45))
            _saved(page, 1)
            page.mouse.click(*_point(page, width * 0.3, height * 0.3))  # select it
            _drag(page, (width * 0.3, height * 0.3), (width * 0.4, height * 0.3))  # and move it
            _saved(page, 2)
            page.keyboard.press("Escape")
            for count in range(accept):
                page.keyboard.press("a")
                _saved(page, count + 3)
        finally:
            browser.close()


def _promote_in_the_browser(url: str, screenshot: Path) -> str:
    """On the main page: the models panel shows the shadow's disagreement rate; press 'Promote the shadow' and
    accept the confirmation. Returns the panel's status line."""
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=BROWSER_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1100})
            # the token prompt, the confirmation, then the name recorded with the change
            page.on("dialog", lambda dialog: dialog.accept("olga" if "name" in dialog.message else TOKEN))
            page.goto(url + "/")
            page.wait_for_function(
                "() => document.getElementById('shadow-rate').textContent.startsWith('disagree')",
                timeout=15_000,
            )
            assert "candidate.onnx" in page.text_content("#models")
            page.click("#promote")
            page.wait_for_function(
                "() => document.getElementById('models-status').textContent.startsWith('promote')",
                timeout=30_000,
            )
            page.screenshot(path=str(screenshot), full_page=True)
            return page.text_content("#models-status")
        finally:
            browser.close()


def _more_answers(client: Client, count: int, timeout_s: float = 60.0) -> None:
    answered, deadline = len(client.answers), time.monotonic() + timeout_s
    while len(client.answers) < answered + count:
        assert client.is_alive() and time.monotonic() < deadline, "the client stopped getting answers"
        time.sleep(0.05)


def _post(url: str, route: str, body: dict) -> dict:
    answer = httpx.post(url + route, json=body, headers=CHANGE, timeout=120)
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_serve_keep_review_finetune_compare_shadow_promote_rollback(line: dict, tmp_path: Path) -> None:
    from defectdet.engine.config import TrainConfig
    from defectdet.engine.trainer import train
    from defectdet.export.compare import compare_models
    from defectdet.export.exporter import export_bundle

    url, kept = line["url"], line["kept"]
    client = Client(url, _pairs(line["data"]))
    client.start()
    try:
        deadline = time.monotonic() + 60  # keep: the answered images land in the kept folder
        while len(list((kept / "predictions").glob("*.json"))) < 4:
            assert time.monotonic() < deadline, "serve --keep all kept nothing"
            time.sleep(0.1)
        _review_in_the_browser(url, kept, accept=3)
        reviewed = (kept / "reviewed.txt").read_text().splitlines()
        assert len(reviewed) == 3
        decisions = [json.loads(row) for row in (kept / "decisions.jsonl").read_text().splitlines()]
        assert {entry["operator"] for entry in decisions} == {"olga"}
        first_label = kept / "labels" / f"{Path(reviewed[0]).stem}.txt"
        drawn = [[float(v) for v in row.split()] for row in first_label.read_text().splitlines()]
        assert any(  # the drawn box, class 2 (index 1), moved a tenth of the width to the right
            row[0] == 1 and abs(row[1] - 0.4) < 0.02 and abs(row[2] - 0.325) < 0.02 for row in drawn
        ), drawn
        data = yaml.safe_load((kept / "data.yaml").read_text())
        assert data["train"] == "reviewed_train.txt" and data["templates"] == "templates"

        config = TrainConfig(
            data=kept / "data.yaml", start_from=line["served"], old_data=line["data"], epochs=1, batch=2,
            workers=0, progress=False, warmup_steps=1, device="cpu", out=tmp_path / "finetune", max_steps=3,
        )  # fmt: skip
        checkpoint = train(config).last_checkpoint
        candidate = export_bundle(checkpoint, line["models"] / "candidate.onnx", data=line["data"]).bundle
        document = compare_models(line["served"], candidate, line["data"], out=tmp_path / "compare")
        assert document["verdict"]["decision"] in (PROMOTE, KEEP)  # after 3 steps either may come out
        assert document["verdict"]["checks"] and (tmp_path / "compare" / "compare.json").is_file()

        old_version = httpx.get(url + "/v1/models", headers=AUTH).json()["live"]["model_version"]
        _post(url, "/v1/models/shadow", {"bundle": "candidate.onnx"})
        deadline = time.monotonic() + 60
        while (httpx.get(url + "/v1/models", headers=AUTH).json()["shadow"] or {}).get("images", 0) < 3:
            assert time.monotonic() < deadline, "the shadow compared no images"
            time.sleep(0.1)
        status = _promote_in_the_browser(url, tmp_path / "models_panel.png")
        assert status == "promote: candidate.onnx is live"
        promoted = httpx.get(url + "/v1/models", headers=AUTH).json()
        assert (
            promoted["live"]["name"] == "candidate.onnx" and promoted["history"][0]["shadow"]["images"] >= 3
        )
        _more_answers(client, 5)
        _post(url, "/v1/models/rollback", {"by": "olga"})
        _more_answers(client, 5)
    finally:
        client.stop.set()
        client.join(30)
    statuses = {status for status, _ in client.answers}
    assert statuses == {200}, f"answers while the loop ran: {sorted(statuses)}"
    new_version = promoted["live"]["model_version"]
    assert client.versions() == [old_version, new_version, old_version]
    history = [json.loads(row) for row in (line["models"] / "promotions.jsonl").read_text().splitlines()]
    assert [entry["action"] for entry in history] == ["shadow", "promote", "rollback"]
    assert [entry["by"] for entry in history] == ["token", "olga", "olga"]  # the page sends the name
    history = history[1:]
    assert line["served"].read_bytes() == (line["models"] / history[0]["previous_file"]).read_bytes()

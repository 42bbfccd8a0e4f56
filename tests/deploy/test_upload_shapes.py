"""An upload whose decoded size is out of proportion to its bytes: a 58 KB PNG of 20,000,000 x 1 pixels (inside
--max-pixels) is refused from its header with a JSON 422 naming the field, before any decoder allocates."""

from __future__ import annotations

import httpx
from fastapi.testclient import TestClient
from image_files import png
from server_fakes import FakePredictor, board, encode

from defectdet.serve.server import create_app
from defectdet.serve.settings import ServeSettings


def _client(predictor: FakePredictor) -> TestClient:
    return TestClient(
        create_app(predictor, ServeSettings(max_pixels=25_000_000)), base_url="http://localhost"
    )


def _refused(response: httpx.Response, field: str) -> None:
    assert response.status_code == 422, response.text
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert body["status"] == 422 and body["error"].startswith(f"{field}: "), body
    assert "20000000x1 pixels, an aspect ratio of 20,000,000:1" in body["error"], body


def test_a_twenty_million_by_one_png_is_a_422_naming_the_field_and_an_ordinary_image_works() -> None:
    strip = png(20_000_000, 1, color=True)
    ordinary = encode(board(1))
    with _client(FakePredictor()) as client:
        assert client.app.state.service.ready.wait(10)
        _refused(client.post("/v1/detect", files={"image": ("strip.png", strip)}), "image")
        answer = client.post("/v1/detect", files={"image": ("board.png", ordinary)})
        assert answer.status_code == 200 and answer.json()["image_size"] == [160, 160], answer.text
    with _client(FakePredictor(template=True)) as client:
        assert client.app.state.service.ready.wait(10)
        files = {"image": ("board.png", ordinary), "template": ("strip.png", strip)}
        _refused(client.post("/v1/detect", files=files), "template")
        files = {"image": ("board.png", ordinary), "template": ("golden.png", encode(board(2)))}
        assert client.post("/v1/detect", files=files).status_code == 200

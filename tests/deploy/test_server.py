"""The inspection service through httpx (no sockets): detect, every 4xx path, overload, readiness, metrics."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import cv2
import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient
from server_fakes import FakePredictor, board, encode
from torch_blocker import BLOCK_TORCH

from defectdet.serve.server import create_app
from defectdet.serve.settings import ServeSettings


def _client(predictor: FakePredictor, **settings: int) -> TestClient:
    app = create_app(predictor, ServeSettings(**settings))
    return TestClient(app, base_url="http://localhost", raise_server_exceptions=False)


def _wait_ready(client: TestClient, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while client.get("/readyz").status_code != 200:
        assert time.monotonic() < deadline, "service never became ready"
        time.sleep(0.02)


async def _until(condition: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    """Poll `condition` on the event loop until it holds; the generous deadline only stops a broken test."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        await asyncio.sleep(0.005)


@pytest.fixture
def client() -> Iterator[TestClient]:
    with _client(FakePredictor()) as client:
        _wait_ready(client)
        yield client


@pytest.fixture
def template_client() -> Iterator[TestClient]:
    with _client(FakePredictor(template=True)) as client:
        _wait_ready(client)
        yield client


def _refusal(response: httpx.Response, status: int, words: str) -> None:
    assert response.status_code == status, response.text
    body = response.json()
    assert "\n" not in body["error"] and body["status"] == status
    assert words.lower() in body["error"].lower(), body["error"]


def test_detect_answers_boxes_verdict_timings_drift(client: TestClient) -> None:
    response = client.post("/v1/detect", files={"image": ("board.png", encode(board(1)), "image/png")})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["verdict"] == "defective"
    (detection,) = body["detections"]
    assert detection["class_name"] == "short" and detection["box"] == [50, 40, 90, 70]
    assert {"receive", "queue", "decode", "model", "postprocess", "drift", "total"} <= set(body["timings_ms"])
    assert body["drift"]["level"] == "ok" and body["drift"]["images"] == 1
    assert len(body["model_version"]) == 12
    clean = client.post("/v1/detect", files={"image": ("b.jpg", encode(board(2, blob=False), ".jpg"))})
    assert clean.status_code == 200 and clean.json()["verdict"] == "clean"
    strict = client.post("/v1/detect", files={"image": encode(board(1))}, data={"threshold": "0.95"})
    assert strict.json()["verdict"] == "clean" and strict.json()["threshold"] == 0.95
    old_name = client.post("/v1/detect", files={"image": encode(board(1))}, data={"conf": "0.95"})
    assert old_name.json()["threshold"] == 0.95  # 'conf', the deprecated name, still works
    both = {"threshold": "0.5", "conf": "0.5"}
    _refusal(client.post("/v1/detect", files={"image": encode(board(1))}, data=both), 422, "'threshold' only")
    results = client.get("/v1/results").json()["results"]
    assert [result["verdict"] for result in results] == ["clean", "clean", "clean", "defective"]


def test_every_bad_input_is_a_4xx_with_a_reason(client: TestClient) -> None:
    png = encode(board(3))
    post = client.post
    _refusal(post("/v1/detect", files={"image": ("x.png", b"hello, not an image")}), 422, "image")
    _refusal(post("/v1/detect", files={"image": ("x.jpg", encode(board(3), ".jpg")[:300])}), 422, "image")
    _refusal(post("/v1/detect", files={"image": ("x.png", b"")}), 422, "empty")
    high = post("/v1/detect", files={"image": png}, data={"threshold": "high"})
    _refusal(high, 422, "threshold must be a number")
    _refusal(post("/v1/detect", files={"image": png}, data={"threshold": "1.5"}), 422, "threshold")
    _refusal(post("/v1/detect", files={"image": png}, data={"conf": "nan"}), 422, "conf")
    _refusal(post("/v1/detect", files={"image": png, "extra": b"x"}), 422, "unknown form field 'extra'")
    _refusal(post("/v1/detect", files={"threshold": (None, "0.5")}), 422, "missing form field 'image'")
    _refusal(post("/v1/detect", files={"image": png, "template": png}), 422, "takes no template")
    _refusal(
        post("/v1/detect", content=png, headers={"content-type": "image/png"}), 415, "multipart/form-data"
    )
    _refusal(
        post("/v1/detect", content=b"--x\r\nnonsense", headers={"content-type": "multipart/form-data"}),
        400,
        "boundary",
    )
    truncated = b'--b\r\nContent-Disposition: form-data; name="image"; filename="a.png"\r\n\r\n' + png[:50]
    _refusal(
        post("/v1/detect", content=truncated, headers={"content-type": "multipart/form-data; boundary=b"}),
        400,
        "ended",
    )
    twice = (
        b'--b\r\nContent-Disposition: form-data; name="threshold"\r\n\r\n0.5\r\n'
        b'--b\r\nContent-Disposition: form-data; name="threshold"\r\n\r\n0.6\r\n--b--\r\n'
    )
    _refusal(
        post("/v1/detect", content=twice, headers={"content-type": "multipart/form-data; boundary=b"}),
        422,
        "more than once",
    )
    _refusal(client.get("/v1/detect"), 405, "not allowed")
    _refusal(client.get("/nowhere"), 404, "not found")


def test_template_paths(template_client: TestClient) -> None:
    image = encode(board(4))
    _refusal(template_client.post("/v1/detect", files={"image": image}), 422, "template")
    other_size = encode(board(5, size=120))
    _refusal(
        template_client.post("/v1/detect", files={"image": image, "template": other_size}), 422, "template"
    )
    ok = template_client.post("/v1/detect", files={"image": image, "template": encode(board(6, blob=False))})
    assert ok.status_code == 200 and ok.json()["verdict"] == "defective"


def test_byte_and_pixel_limits() -> None:
    with _client(FakePredictor(), max_bytes=20_000, max_pixels=150 * 150) as client:
        _wait_ready(client)
        small = encode(board(7))  # 160 x 160: over the pixel limit, under the byte limit
        assert len(small) < 20_000
        _refusal(client.post("/v1/detect", files={"image": small}), 413, "pixels")
        header = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x01\x86\xa0\x00\x01\x86\xa0\x08\x00\x00\x00\x00"
        bomb = client.post("/v1/detect", files={"image": header + b"\x00" * 20})  # claims 100000 x 100000
        _refusal(bomb, 413, "10,000,000,000")
        assert "read_image" not in bomb.json()["error"]
        noise = np.random.default_rng(0).integers(0, 255, (200, 200), np.uint8)
        big = encode(noise)  # > 20 kB
        _refusal(client.post("/v1/detect", files={"image": big}), 413, "limit is 20,000")

        app = client.app
        sent = []

        async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: the limit holds while counting
            yield b'--b\r\nContent-Disposition: form-data; name="image"; filename="a.png"\r\n\r\n'
            for _ in range(100):
                sent.append(1000)
                yield b"\0" * 1000

        async def stream() -> httpx.Response:
            async with httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://localhost"
            ) as http:
                headers = {"content-type": "multipart/form-data; boundary=b"}
                return await http.post("/v1/detect", content=chunks(), headers=headers)

        _refusal(asyncio.run(stream()), 413, "exceeds the limit")
        assert sum(sent) <= 21_000  # it stopped reading right after the limit
        ok = client.post("/v1/detect", files={"image": encode(board(8, size=140))})
        assert ok.status_code == 200


def test_overload_answers_503_at_once_and_the_rest_complete() -> None:
    predictor = FakePredictor()
    app = create_app(predictor, ServeSettings(max_concurrency=1, max_queue=1))
    service = app.state.service
    service.start()
    assert service.ready.wait(10)
    image = encode(board(9))

    async def scenario() -> tuple[list[int], httpx.Response, bool]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as client:
            predictor.gate.clear()
            held = [asyncio.create_task(client.post("/v1/detect", files={"image": image})) for _ in range(2)]
            await _until(lambda: service.admitted == 2, "both requests hold their places")
            # "at once": the refusal arrives while the gate is still shut, i.e. without waiting for a place
            refused = await asyncio.wait_for(client.post("/v1/detect", files={"image": image}), 30)
            held_meanwhile = not any(task.done() for task in held)
            predictor.gate.set()
            statuses = [response.status_code for response in await asyncio.gather(*held)]
            return statuses, refused, held_meanwhile

    statuses, refused, held_meanwhile = asyncio.run(scenario())
    assert statuses == [200, 200]
    _refusal(refused, 503, "overloaded")
    assert refused.headers["retry-after"] == "1"
    assert held_meanwhile
    assert service.admitted == 0


def test_readiness_only_after_warm_up() -> None:
    predictor = FakePredictor()
    predictor.gate.clear()  # the warm-up inference blocks
    with _client(predictor) as client:
        assert client.get("/healthz").status_code == 200
        not_ready = client.get("/readyz")
        assert not_ready.status_code == 503 and not_ready.json()["reason"] == "warming up"
        assert "retry-after" in not_ready.headers
        _refusal(client.post("/v1/detect", files={"image": encode(board(1))}), 503, "not ready")
        assert "defectdet_ready 0.0" in client.get("/metrics").text
        predictor.gate.set()
        _wait_ready(client)
        assert client.get("/readyz").json()["ready"] is True
        assert predictor.calls == 1  # exactly one warm-up inference
        assert "defectdet_ready 1.0" in client.get("/metrics").text


def test_metrics_after_traffic(client: TestClient) -> None:
    for seed in range(3):
        client.post("/v1/detect", files={"image": encode(board(seed))})
    client.post("/v1/detect", files={"image": b"junk"})
    text = client.get("/metrics").text
    assert 'defectdet_requests_total{route="/v1/detect",status="200"} 3.0' in text
    assert 'defectdet_requests_total{route="/v1/detect",status="422"} 1.0' in text
    assert 'defectdet_verdicts_total{verdict="defective"} 3.0' in text
    assert 'defectdet_detections_total{class_name="short"} 3.0' in text
    assert "defectdet_queue_seconds_count 3.0" in text and "defectdet_compute_seconds_count 3.0" in text
    assert 'defectdet_request_seconds_bucket{le="0.5",route="/v1/detect"}' in text
    assert 'defectdet_drift_z{statistic="sharpness"}' in text and "defectdet_drift_level 0.0" in text
    other = create_app(FakePredictor())  # a second app: its own registry, no duplicate-metric error
    with TestClient(other, base_url="http://localhost") as second:
        assert "defectdet_requests_total{" not in second.get("/metrics").text.split("/metrics")[0]


def test_drift_alert_reaches_response_metrics_and_page_data(client: TestClient) -> None:
    blurred = encode(cv2.GaussianBlur(board(10, blob=False), (0, 0), 3))
    levels = [client.post("/v1/detect", files={"image": blurred}).json()["drift"] for _ in range(12)]
    assert levels[0]["level"] in ("ok", "warn") and levels[-1]["level"] == "alert"
    assert levels[-1]["statistic"] in ("sharpness", "detail", "contrast")
    assert "outside" in levels[-1]["message"]
    assert "defectdet_drift_level 2.0" in client.get("/metrics").text
    report = client.get("/v1/drift").json()
    assert report["state"]["level"] == "alert" and len(report["history"]) == 12
    assert report["limits"]["features"]["two_sided"] is False
    reset = client.post("/v1/drift/reset", json={}, headers={"X-Defectdet-Request": "1"}).json()
    assert reset["state"]["level"] == "ok" and reset["history"] == []


def test_model_docs_and_page(client: TestClient) -> None:
    model = client.get("/v1/model").json()
    assert model["metadata"]["class_names"][1] == "short" and model["settings"]["max_queue"] == 8
    assert client.get("/docs").status_code == 404  # Swagger UI needs a CDN: off; the schema stays
    schema = client.get("/openapi.json").json()
    assert "multipart/form-data" in schema["paths"]["/v1/detect"]["post"]["requestBody"]["content"]
    page = client.get("/")
    assert page.status_code == 200 and "<canvas" in page.text and "/static/app.js" in page.text
    assert "http" not in page.text.replace("http-equiv", "")  # no CDN
    assert client.get("/static/app.js").status_code == 200


def test_no_drift_reference_is_reported_not_fatal() -> None:
    with _client(FakePredictor(reference=False)) as client:
        _wait_ready(client)
        body = client.post("/v1/detect", files={"image": encode(board(1))}).json()
        assert body["drift"]["level"] == "unknown" and "no drift reference" in body["drift"]["message"]
        assert "defectdet_drift_level -1.0" in client.get("/metrics").text


def test_real_bundle_end_to_end(bundle_path: Path, tiny_dataset: Path) -> None:
    from defectdet.data.formats import load_dataset

    sample = load_dataset(tiny_dataset, "val").samples[0]
    with TestClient(create_app(bundle_path), base_url="http://localhost") as client:
        _wait_ready(client, timeout=60)
        response = client.post(
            "/v1/detect",
            files={"image": sample.image_path.read_bytes(), "template": sample.template_path.read_bytes()},
            data={"threshold": "0.01"},
        )
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["image_size"] == list(cv2.imread(str(sample.image_path)).shape[1::-1])
        assert body["drift"]["level"] in ("ok", "warn", "alert", "unknown")
        for detection in body["detections"]:
            x1, y1, x2, y2 = detection["box"]
            assert 0 <= x1 <= x2 <= body["image_size"][0] and 0 <= y1 <= y2 <= body["image_size"][1]
            assert detection["score"] >= 0.01
        _refusal(client.post("/v1/detect", files={"image": sample.image_path.read_bytes()}), 422, "template")


def test_serve_command_runs_uvicorn_with_the_limits(
    bundle_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from defectdet.cli import app as cli
    from defectdet.serve import launch

    calls = []
    monkeypatch.setattr(launch, "run_uvicorn", calls.append)
    result = CliRunner().invoke(
        cli, ["serve", str(bundle_path), "--port", "8123", "--max-concurrency", "1", "--max-queue", "3"]
    )
    assert result.exit_code == 0, result.output
    (config,) = calls
    served = config.app
    assert config.host == "127.0.0.1" and config.port == 8123 and config.workers == 1
    settings = served.state.service.settings
    assert (settings.max_concurrency, settings.max_queue, settings.threads) == (1, 3, settings.threads or 1)
    assert config.http.keywords["max_connections"] > settings.max_concurrency + settings.max_queue
    assert config.timeout_keep_alive == settings.keep_alive_s
    refused = CliRunner().invoke(cli, ["serve", str(bundle_path), "--max-concurrency", "0"])
    assert refused.exit_code == 2 and "max_concurrency" in refused.output


def test_answer_json_handles_numpy_and_non_finite_values() -> None:
    from defectdet.serve.answers import FastJSON

    body = json.loads(
        FastJSON({"a": np.float32(0.5), "b": [np.int64(3)], "c": float("nan"), "d": np.ones(2)}).body
    )
    assert body == {"a": 0.5, "b": [3], "c": None, "d": [1.0, 1.0]}


def test_service_runs_with_torch_unimportable(bundle_path: Path, tiny_dataset: Path) -> None:
    import subprocess
    import sys

    from defectdet.data.formats import load_dataset

    sample = load_dataset(tiny_dataset, "val").samples[0]
    script = (
        BLOCK_TORCH
        + f"""
import time
from fastapi.testclient import TestClient
from defectdet.serve.server import create_app
with TestClient(create_app({str(bundle_path)!r}), base_url="http://localhost") as client:
    while client.get("/readyz").status_code != 200:
        time.sleep(0.05)
    files = {{"image": open({str(sample.image_path)!r}, "rb").read(), "template": open({str(sample.template_path)!r}, "rb").read()}}
    response = client.post("/v1/detect", files=files)
    assert response.status_code == 200, response.text
    assert "defectdet_verdicts_total" in client.get("/metrics").text
assert "torch" not in sys.modules
print(response.json()["verdict"])
"""
    )
    done = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", script], capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-1] in ("clean", "defective")


def test_a_client_that_hangs_up_keeps_its_place_until_the_work_ends() -> None:
    predictor = FakePredictor()
    app = create_app(predictor, ServeSettings(max_concurrency=1, max_queue=1))
    service = app.state.service
    service.start()
    assert service.ready.wait(10)

    async def scenario() -> list[int]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as client:
            predictor.gate.clear()
            predictor.entered.clear()
            running = asyncio.create_task(client.post("/v1/detect", files={"image": encode(board(1))}))
            await _until(lambda: service.admitted == 1, "the request holds its place")
            await _until(predictor.entered.is_set, "the worker runs its inference")
            running.cancel()
            await asyncio.gather(running, return_exceptions=True)
            held = service.admitted  # still counted: its inference is still running
            predictor.gate.set()
            await _until(lambda: service.admitted == 0, "the place is given back")
            return [held, service.admitted]

    assert asyncio.run(scenario()) == [1, 0]


def test_a_trickling_upload_times_out_with_408() -> None:
    app = create_app(FakePredictor(), ServeSettings(body_timeout_s=0.3))
    service = app.state.service
    service.start()
    assert service.ready.wait(10)

    async def scenario() -> httpx.Response:
        answered = asyncio.Event()

        async def slow() -> AsyncIterator[bytes]:  # the rest of the body comes only after the answer
            yield b'--b\r\nContent-Disposition: form-data; name="image"; filename="a.png"\r\n\r\n'
            await answered.wait()
            yield b"never read"

        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://localhost"
        ) as client:
            headers = {"content-type": "multipart/form-data; boundary=b"}
            response = await asyncio.wait_for(client.post("/v1/detect", content=slow(), headers=headers), 30)
            answered.set()
            return response

    _refusal(asyncio.run(scenario()), 408, "longer than 0.3 s")
    assert service.admitted == 0


def test_real_bundle_takes_degenerate_but_valid_images(bundle_path: Path) -> None:
    shapes = [np.zeros((1, 1), np.uint8), np.zeros((1, 700), np.uint8), np.full((700, 2), 255, np.uint8)]
    shapes.append(np.full((40, 60), 3000, np.uint16))  # 12-bit data in a 16-bit PNG
    shapes.append(np.zeros((30, 30, 4), np.uint8))  # RGBA
    app = create_app(bundle_path)
    with TestClient(app, base_url="http://localhost", raise_server_exceptions=False) as client:
        _wait_ready(client, timeout=60)
        for array in shapes:
            png = encode(array)
            response = client.post("/v1/detect", files={"image": png, "template": png})
            assert response.status_code == 200, (array.shape, response.text)
            assert response.json()["image_size"] == [array.shape[1], array.shape[0]]


def test_the_answer_is_the_results_own_serializer() -> None:
    """`/v1/detect` answers `PredictionResult.to_dict()` (what `predict --json` and the Python API give) plus the
    model version, the drift state and the server's own timings: a registration with a NaN correlation is
    JSON-safe (null) and rounded there, not re-spelled by the server."""

    class Registering(FakePredictor):
        def predict(self, *args, **kwargs):
            self.last = super().predict(*args, **kwargs)
            self.last.registration = {
                "dx": 1.234567,
                "dy": -0.5,
                "correlation": float("nan"),
                "applied": True,
            }
            return self.last

    predictor = Registering()
    with _client(predictor) as client:
        _wait_ready(client)
        response = client.post("/v1/detect", files={"image": ("board.png", encode(board(1)), "image/png")})
    assert response.status_code == 200, response.text
    body = response.json()
    expected = json.loads(json.dumps(predictor.last.to_dict()))
    assert set(body) == set(expected) | {"model_version", "drift"}
    assert {
        key: value for key, value in body.items() if key not in ("model_version", "drift", "timings_ms")
    } == {key: value for key, value in expected.items() if key != "timings_ms"}
    assert body["registration"] == {"dx": 1.2346, "dy": -0.5, "correlation": None, "applied": True}
    assert {"receive", "queue", "compute", "total"} <= set(body["timings_ms"]) and "drift" in body


def test_drift_gauges_show_the_newest_answer_when_scraped(client: TestClient) -> None:
    charts = [
        client.post("/v1/detect", files={"image": encode(board(seed))}).json()["drift"]["charts"]
        for seed in range(3)
    ]
    text = client.get("/metrics").text
    shown = re.search(r'defectdet_drift_value\{statistic="sharpness"\} (\S+)', text)
    assert shown is not None and float(shown.group(1)) == pytest.approx(charts[-1]["sharpness"]["value"])
    assert charts[-1]["sharpness"]["value"] != charts[0]["sharpness"]["value"]  # the newest, not the first
    client.post("/v1/drift/reset", json={}, headers={"X-Defectdet-Request": "1"})
    assert (
        'defectdet_drift_z{statistic="sharpness"} 0.0' in client.get("/metrics").text
    )  # not the old answer's

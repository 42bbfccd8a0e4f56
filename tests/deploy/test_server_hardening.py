"""Hardening of the inspection service (issue 23): access control, JSON errors everywhere and no 500,
idle and stalled connections, no leaks in answers, and several worker processes behind one /metrics.

Event-driven: stalled uploads wait on an Event, servers are polled until they answer; no fixed sleeps.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import cv2
import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient
from PIL import Image
from server_fakes import FakePredictor, board, encode, uvicorn_on_loopback

from defectdet.serve import launch
from defectdet.serve.server import create_app
from defectdet.serve.settings import ServeSettings

BASE = "http://127.0.0.1"
ROOT = Path(__file__).resolve().parents[2]


def _ready_app(predictor: FakePredictor | None = None, **settings: object):  # noqa: ANN202
    app = create_app(predictor or FakePredictor(), ServeSettings(**settings))
    app.state.service.start()
    assert app.state.service.ready.wait(10)
    return app


def _client(app) -> TestClient:  # noqa: ANN001
    return TestClient(app, base_url=BASE, raise_server_exceptions=False)


def _json_error(response: httpx.Response, status: int, words: str = "") -> dict:
    assert response.status_code == status, (response.status_code, response.text)
    assert response.headers["content-type"].startswith("application/json"), response.headers
    body = response.json()
    assert body["status"] == status and body["error"] and "\n" not in body["error"]
    assert words.lower() in body["error"].lower(), body["error"]
    return body


# ------------------------------------------------------------------ item 2: access control
def test_a_token_guards_every_route_but_the_health_probes() -> None:
    app = _ready_app(token="s3cret-token")
    png = encode(board(1))
    with _client(app) as client:
        for method, path in [
            ("GET", "/v1/model"), ("GET", "/metrics"), ("GET", "/v1/drift"), ("GET", "/v1/results"),
            ("GET", "/openapi.json"), ("POST", "/v1/detect"), ("POST", "/v1/drift/reset"),
        ]:  # fmt: skip
            response = client.request(method, path)
            _json_error(response, 401, "token")
            assert response.headers["www-authenticate"].startswith("Bearer")
            wrong = client.request(method, path, headers={"Authorization": "Bearer s3cret-tokeX"})
            _json_error(wrong, 401, "token")
        assert client.get("/healthz").status_code == 200
        assert client.get("/readyz").status_code == 200
        auth = {"Authorization": "Bearer s3cret-token"}
        assert client.get("/v1/model", headers=auth).status_code == 200
        ok = client.post("/v1/detect", files={"image": png}, headers=auth)
        assert ok.status_code == 200, ok.text
        reset = client.post("/v1/drift/reset", json={}, headers={**auth, "X-Defectdet-Request": "1"})
        assert reset.status_code == 200, reset.text
        # the page and its assets hold no data: they load, and the page asks for the token
        assert client.get("/").status_code == 200
        assert "Authorization" in client.get("/static/app.js").text


def test_state_changing_routes_refuse_cross_site_requests() -> None:
    app = _ready_app()
    with _client(app) as client:
        form_post = client.post(
            "/v1/drift/reset", content=b"x=1", headers={"Content-Type": "text/plain"}
        )  # what a web page's <form enctype="text/plain"> sends
        _json_error(form_post, 403, "X-Defectdet-Request")
        _json_error(client.post("/v1/drift/reset"), 403, "X-Defectdet-Request")
        no_json = client.post(
            "/v1/drift/reset",
            content=b"{}",
            headers={"X-Defectdet-Request": "1", "Content-Type": "text/plain"},
        )
        _json_error(no_json, 415, "application/json")
        mark = {"X-Defectdet-Request": "1"}
        _json_error(
            client.post("/v1/drift/reset", json={}, headers={**mark, "Origin": "http://evil.example"}),
            403,
            "cross-site",
        )
        _json_error(
            client.post("/v1/drift/reset", json={}, headers={**mark, "Sec-Fetch-Site": "cross-site"}),
            403,
            "cross-site",
        )
        png = encode(board(2))
        cross = client.post("/v1/detect", files={"image": png}, headers={"Origin": "null"})
        _json_error(cross, 403, "cross-site")
        assert app.state.service.monitor.state().images == 0  # the cross-site image never reached the charts
        same = {"Origin": BASE, "Sec-Fetch-Site": "same-origin"}
        assert client.post("/v1/drift/reset", json={}, headers={**mark, **same}).status_code == 200
        assert client.post("/v1/detect", files={"image": png}, headers=same).status_code == 200
        assert client.post("/v1/detect", files={"image": png}).status_code == 200  # curl: no Origin


def test_only_trusted_host_names_are_served() -> None:
    app = _ready_app(allowed_hosts=("localhost", "127.0.0.1", "::1", "inspect.line3"))
    with _client(app) as client:
        _json_error(client.get("/v1/model", headers={"Host": "evil.example"}), 400, "host")
        _json_error(client.get("/", headers={"Host": "evil.example:8000"}), 400, "host")
        for host in ("localhost:8000", "127.0.0.1", "[::1]:8000", "INSPECT.line3:80", "10.1.2.3:8000"):
            assert client.get("/v1/model", headers={"Host": host}).status_code == 200, host
        assert client.get("/healthz", headers={"Host": "evil.example"}).status_code == 200
    with _client(_ready_app(allowed_hosts=("*",))) as anywhere:
        assert anywhere.get("/v1/model", headers={"Host": "evil.example"}).status_code == 200


def test_serve_reads_the_token_warns_beyond_loopback_and_trusts_the_bind_host(
    bundle_path: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from typer.testing import CliRunner

    from defectdet.cli import app as cli

    calls: list[ServeSettings] = []
    monkeypatch.setattr(launch, "run_uvicorn", lambda config: calls.append(config.app.state.service.settings))
    monkeypatch.delenv("DEFECTDET_TOKEN", raising=False)

    def run(*args: str) -> str:
        result = CliRunner().invoke(cli, ["serve", str(bundle_path), "--port", str(_free_port()), *args])
        assert result.exit_code == 0, result.output
        return " ".join(result.output.split())

    assert "without a token" in run("--host", "0.0.0.0")
    assert calls[-1].token is None and "0.0.0.0" in calls[-1].allowed_hosts
    assert "without a token" not in run()
    token_file = tmp_path / "token"
    token_file.write_text("file-token-of-20-chars\n")
    token_file.chmod(0o600)
    output = run("--host", "10.0.0.5", "--token-file", str(token_file), "--allowed-host", "inspect.line3")
    assert "without a token" not in output and "file-token-of-20-chars" not in output
    settings = calls[-1]
    assert settings.token == "file-token-of-20-chars"
    assert {"10.0.0.5", "inspect.line3", "localhost", "127.0.0.1"} <= set(settings.allowed_hosts)
    assert "file-token-of-20-chars" not in repr(settings)
    monkeypatch.setenv("DEFECTDET_TOKEN", "env-token-of-20-chars")
    run()
    assert calls[-1].token == "env-token-of-20-chars"
    (tmp_path / "empty").write_text("  \n")
    refused = CliRunner().invoke(cli, ["serve", str(bundle_path), "--token-file", str(tmp_path / "empty")])
    assert refused.exit_code == 2 and "empty" in refused.output


def test_serve_warns_on_a_token_file_others_can_read_and_refuses_a_short_token(
    bundle_path: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from typer.testing import CliRunner

    from defectdet.cli import app as cli

    calls: list[ServeSettings] = []
    monkeypatch.setattr(launch, "run_uvicorn", lambda config: calls.append(config.app.state.service.settings))
    monkeypatch.delenv("DEFECTDET_TOKEN", raising=False)
    token_file = tmp_path / "token"
    token_file.write_text("a-token-long-enough-to-keep\n")
    token_file.chmod(0o644)
    args = ["serve", str(bundle_path), "--port", str(_free_port()), "--token-file", str(token_file)]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert "can be read by its group or others (mode 644): chmod 600 it" in " ".join(result.output.split())
    token_file.chmod(0o600)
    assert "chmod" not in CliRunner().invoke(cli, args).output
    assert calls[-1].token == "a-token-long-enough-to-keep"
    token_file.write_text("short-token\n")
    refused = CliRunner().invoke(cli, args)
    assert refused.exit_code == 2 and "has 11 characters; use at least 16" in _text(refused.output)
    monkeypatch.setenv("DEFECTDET_TOKEN", "tiny")
    refused = CliRunner().invoke(cli, ["serve", str(bundle_path), "--port", str(_free_port())])
    assert refused.exit_code == 2 and "DEFECTDET_TOKEN has 4 characters" in _text(refused.output)
    assert len(calls) == 2  # nothing served with a short token


def test_serve_on_a_busy_port_is_one_clear_line_and_exit_2(bundle_path: Path, tmp_path: Path) -> None:
    """The real command in its own process: a port another process listens on ends it before the bundle
    loads, with the reason, exit 2, no traceback and no abort."""
    import socket
    import subprocess
    import sys

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-c", "from defectdet.cli import main; main()", "serve", str(bundle_path),
             "--port", str(port)],
            capture_output=True, text=True, timeout=120, env={**os.environ, "DEFECTDET_TOKEN": ""},
        )  # fmt: skip
    output = " ".join((done.stdout + done.stderr).split())
    assert done.returncode == 2, output
    assert f"cannot listen on 127.0.0.1:{port}" in output and "--port" in output
    assert "Traceback" not in output


def _text(output: str) -> str:
    """The words of a CLI output, without the borders of rich's error box."""
    return " ".join(re.sub("[│╭╮╰╯─]", " ", output).split())


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


# ------------------------------------------------------------------ item 4: JSON errors, no 500
class _Exploding(FakePredictor):
    def predict(self, image, template=None, threshold=None):  # noqa: ANN001, ANN201
        if self.calls >= 1:  # after the warm-up
            raise RuntimeError(f"session failed on {object()!r}")
        return super().predict(image, template, threshold)


def test_an_unexpected_exception_is_a_logged_json_500_without_addresses(
    caplog: pytest.LogCaptureFixture,
) -> None:
    predictor = _Exploding()
    app = _ready_app(predictor)
    predictor.calls = 1
    with _client(app) as client, caplog.at_level(logging.ERROR):
        body = _json_error(client.post("/v1/detect", files={"image": encode(board(1))}), 500, "internal")
    assert "0x" not in body["error"] and "session failed" in body["error"]
    assert "session failed" in caplog.text


def test_error_lines_drop_addresses_but_keep_sizes() -> None:
    from defectdet.serve.answers import one_line

    assert one_line(f"bad {object()!r} here") == "bad <object object> here"
    assert one_line("ptr 0x7f3a2b1c4d5e\nnext") == "ptr next"
    assert one_line("image is 100000x100000 pixels") == "image is 100000x100000 pixels"


@pytest.mark.parametrize("error", [NotImplementedError("no codec"), TypeError("bad"), AttributeError("x")])
def test_any_decoder_failure_is_a_4xx(monkeypatch: pytest.MonkeyPatch, error: Exception) -> None:
    app = _ready_app()

    def broken(*args: object, **kwargs: object) -> None:
        raise error

    monkeypatch.setattr("defectdet.serve.service.load_planes", broken)
    with _client(app) as client:
        _json_error(client.post("/v1/detect", files={"image": encode(board(1))}), 422, "image")


def test_starlette_errors_are_json_and_docs_are_off() -> None:
    with _client(_ready_app()) as client:
        _json_error(client.get("/static/nothing.js"), 404, "not found")
        _json_error(client.get("/docs"), 404, "not found")
        _json_error(client.get("/redoc"), 404, "not found")
        _json_error(client.put("/healthz"), 405, "not allowed")
        assert client.get("/openapi.json").status_code == 200


def _samples() -> dict[str, bytes]:
    """One small valid file per format a decoder here accepts."""
    gray = board(5, size=48)
    color = cv2.cvtColor(gray, cv2.COLOR_GRAY2BGR)
    files = {
        ext: encode(gray, ext) for ext in (".png", ".jpg", ".bmp", ".tif", ".webp", ".pgm", ".pbm", ".sr")
    }
    files[".jp2"] = encode(color, ".jp2")
    files[".ppm"] = encode(color, ".ppm")
    files[".hdr"] = encode(color.astype(np.float32) / 255, ".hdr")
    files[".pfm"] = encode(color.astype(np.float32) / 255, ".pfm")
    for fmt, mode in (("DDS", "RGB"), ("SPIDER", "F"), ("TGA", "L"), ("GIF", "L"), ("PCX", "L"),
                      ("SGI", "L"), ("IM", "L"), ("ICO", "L")):  # fmt: skip
        buffer = io.BytesIO()
        Image.fromarray(gray).convert(mode).save(buffer, format=fmt)
        files[fmt.lower()] = buffer.getvalue()
    return files


def _mutants(data: bytes, rng: np.random.Generator, count: int) -> Iterator[bytes]:
    """Bit flips, byte runs overwritten with extremes, truncations and header fields set to huge values."""
    for index in range(count):
        array = bytearray(data)
        kind = index % 4
        head = min(len(array), 64)
        if kind == 0:
            for at in rng.integers(0, len(array), 1 + index % 8):
                array[at] ^= 1 << int(rng.integers(0, 8))
        elif kind == 1:
            at = int(rng.integers(0, head))
            array[at : at + 4] = bytes([0xFF, 0xFF, 0x7F, 0xFF][: len(array[at : at + 4])])
        elif kind == 2:
            array = array[: int(rng.integers(1, len(array)))]
        else:
            at = int(rng.integers(0, head))
            array[at : at + 2] = bytes([0, 0])
        yield bytes(array)


def test_fuzzed_files_of_every_format_never_give_a_500() -> None:
    rng = np.random.default_rng(23)
    app = _ready_app(max_pixels=4_000_000)
    seen: dict[int, int] = {}
    with _client(app) as client:
        for name, data in _samples().items():
            for mutant in _mutants(data, rng, 12):
                response = client.post("/v1/detect", files={"image": (f"f{name}", mutant)})
                seen[response.status_code] = seen.get(response.status_code, 0) + 1
                assert response.status_code < 500, (name, response.status_code, response.text[:200])
                assert response.headers["content-type"].startswith("application/json"), (name, response.text)
                if response.status_code != 200:
                    assert "Traceback" not in response.text and "0x" not in response.json()["error"]
    assert seen.get(200, 0) > 0 and sum(seen.values()) > 200


# ------------------------------------------------------------------ item 5: stalled and idle connections
def test_uploads_being_read_take_no_compute_slot() -> None:
    app = _ready_app(max_concurrency=1, max_queue=1)
    service = app.state.service
    image = encode(board(9))
    head = b'--b\r\nContent-Disposition: form-data; name="image"; filename="a.png"\r\n\r\n'

    async def scenario() -> tuple[list[int], int, int, httpx.Response]:
        release = asyncio.Event()
        reading = [asyncio.Event() for _ in range(4)]

        def stalled(event: asyncio.Event) -> AsyncIterator[bytes]:
            async def chunks() -> AsyncIterator[bytes]:
                yield head
                event.set()  # the server asked for more: it is reading this upload
                await release.wait()
                yield image + b"\r\n--b--\r\n"

            return chunks()

        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url=BASE, timeout=30) as client:
            headers = {"content-type": "multipart/form-data; boundary=b"}
            held = [
                asyncio.create_task(client.post("/v1/detect", content=stalled(event), headers=headers))
                for event in reading
            ]
            await asyncio.gather(*(event.wait() for event in reading))
            ok = await client.post("/v1/detect", files={"image": image})
            health = (await client.get("/healthz")).status_code
            release.set()
            statuses = [response.status_code for response in await asyncio.gather(*held)]
            return statuses, health, ok.status_code, ok

    statuses, health, status, ok = asyncio.run(scenario())
    assert status == 200, ok.text  # 4 uploads still arriving did not fill 1 running + 1 waiting
    assert health == 200
    assert all(code in (200, 503) for code in statuses), statuses
    assert service.admitted == 0


def test_overload_message_counts_only_inferences() -> None:
    predictor = FakePredictor()
    app = _ready_app(predictor, max_concurrency=1, max_queue=1)
    service = app.state.service
    image = encode(board(9))

    async def scenario() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url=BASE, timeout=30) as client:
            predictor.gate.clear()
            held = [asyncio.create_task(client.post("/v1/detect", files={"image": image})) for _ in range(2)]
            while service.admitted < 2:
                await asyncio.sleep(0)
            refused = await client.post("/v1/detect", files={"image": image})
            predictor.gate.set()
            await asyncio.gather(*held)
            return refused

    body = _json_error(asyncio.run(scenario()), 503, "1 running")
    assert "1 waiting" in body["error"]


_uvicorn = uvicorn_on_loopback  # the app under uvicorn as `serve` runs it, on a free loopback port


def _raw(host: str, port: int, data: bytes) -> bytes:
    with socket.create_connection((host, port), timeout=10) as sock:
        sock.sendall(data)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def test_uvicorn_level_refusals_are_json_and_health_outlives_idle_sockets() -> None:
    settings = ServeSettings(max_connections=4, header_timeout_s=60)
    app = _ready_app(max_connections=4, header_timeout_s=60)
    with _uvicorn(app, settings) as (host, port, server):
        answer = _raw(host, port, b"NOT HTTP AT ALL\r\n\r\n")
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 400") and b"application/json" in head.lower(), answer
        assert json.loads(body)["status"] == 400
        idle = [socket.create_connection((host, port), timeout=10) for _ in range(6)]
        try:
            while len(server.server_state.connections) < 6:
                time.sleep(0.01)
            with httpx.Client(base_url=f"http://{host}:{port}") as client:
                assert client.get("/healthz").status_code == 200
                assert client.get("/readyz").status_code == 200
                busy = client.get("/v1/model")
            _json_error(busy, 503, "connections")
            assert "retry-after" in busy.headers
        finally:
            for sock in idle:
                sock.close()


def test_connections_that_send_no_complete_request_are_closed() -> None:
    settings = ServeSettings(header_timeout_s=0.2)
    app = _ready_app(header_timeout_s=0.2)
    with _uvicorn(app, settings) as (host, port, _server):
        assert _raw(host, port, b"") == b""  # an idle socket: closed by the server, not by our timeout
        assert _raw(host, port, b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n") == b""  # headers trickle
        with httpx.Client(base_url=f"http://{host}:{port}") as client:
            assert client.get("/healthz").status_code == 200


# ------------------------------------------------------------------ item 9: leaks
def test_model_answer_names_files_not_paths() -> None:
    predictor = FakePredictor()
    predictor.metadata = predictor.metadata.model_copy(
        update={
            "train_config": {"data": "/home/alice/secret/line3/data.yaml", "out": "/srv/runs/exp7",
                             "windows": "C:\\Users\\bob\\data.yaml", "preset": "nano", "lr": 0.01},
            "metrics": {"checkpoint": "/home/alice/runs/best.pt", "map50": 0.5},
        }
    )  # fmt: skip
    with _client(_ready_app(predictor)) as client:
        text = client.get("/v1/model").text
    assert "/home" not in text and "/srv" not in text and "Users" not in text, text
    body = json.loads(text)
    config = body["metadata"]["train_config"]
    assert config["data"] == "data.yaml" and config["out"] == "exp7" and config["windows"] == "data.yaml"
    assert config["preset"] == "nano" and body["metadata"]["metrics"]["checkpoint"] == "best.pt"


# ------------------------------------------------------------------ item 12: several workers
def _get(url: str) -> httpx.Response | None:
    try:
        return httpx.get(url, timeout=5)
    except httpx.TransportError:
        return None


def test_two_workers_share_one_metrics_view(bundle_path: Path, tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    base = f"http://127.0.0.1:{port}"
    env = {**os.environ, "TMPDIR": str(tmp_path), "PYTHONWARNINGS": "ignore"}
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    command = [sys.executable, "-m", "defectdet.cli", "serve", str(bundle_path), "--port", str(port),
               "--workers", "2", "--threads", "1"]  # fmt: skip
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    healthy = 0
    try:
        deadline = time.monotonic() + 120
        while (response := _get(base + "/healthz")) is None or response.status_code != 200:
            assert process.poll() is None, process.stdout.read().decode()[-3000:]
            assert time.monotonic() < deadline, "the service never answered /healthz"
            time.sleep(0.1)
        healthy = 1
        pids: set[str] = set()
        for _ in range(200):  # each on a new connection, so the kernel spreads them over the workers
            response = httpx.get(base + "/healthz", timeout=10)
            assert response.status_code == 200
            healthy += 1
            text = httpx.get(base + "/metrics", timeout=10).text
            pids |= set(re.findall(r'defectdet_drift_z\{pid="(\d+)"', text))
            if len(pids) >= 2 and healthy >= 20:
                break
        text = httpx.get(base + "/metrics", timeout=10).text
        assert len(pids) == 2, pids  # both workers' gauges, whichever worker answered
        total = re.search(r'defectdet_requests_total\{route="/healthz",status="200"\} (\S+)', text)
        assert total is not None and float(total.group(1)) == healthy, text[:3000]
    finally:
        process.send_signal(signal.SIGINT)
        try:
            output = process.communicate(timeout=30)[0].decode()
        except subprocess.TimeoutExpired:
            process.kill()
            output = process.communicate()[0].decode()
    flat = " ".join(output.lower().split())
    assert "drift state" in flat and "per worker" in flat, output[-3000:]
    assert not [path for path in tmp_path.iterdir() if path.name.startswith("defectdet-metrics")]


# ------------------------------------------------------------------ JSON bodies: size and nesting
def test_json_depth_counts_brackets_outside_strings_only() -> None:
    from defectdet.serve.json_body import json_depth

    assert json_depth(b"3") == 0 and json_depth(b'{"a": [1, {"b": []}]}') == 4
    assert json_depth(b'{"a": "[[[[\\"[[[", "b": ["]]]"]}') == 2
    assert json_depth(b"[" * 5000) == 5000  # unterminated: still counted, never parsed


def test_deeply_nested_or_huge_json_is_a_4xx_on_every_json_route(tmp_path: Path) -> None:
    from defectdet.serve.review_app import create_review_app

    (tmp_path / "images").mkdir()
    cv2.imwrite(str(tmp_path / "images" / "a.png"), board(1))
    headers = {"X-Defectdet-Request": "1", "Content-Type": "application/json"}
    nested = b'{"image": "a.png", "action": "accept", "boxes": ' + b"[" * 20000 + b"]" * 20000 + b"}"
    service_app = _ready_app(keep_dir=str(tmp_path))
    for app in (service_app, create_review_app(tmp_path)):
        client = _client(app)
        routes = ["/v1/review/decide", "/v1/review/export"]
        routes += ["/v1/models/promote", "/v1/models/shadow", "/v1/drift/reset"] if app is service_app else []
        for route in routes:
            _json_error(client.post(route, content=nested, headers=headers), 400, "nests 20001 levels")
            huge = b'{"by": "' + b"x" * (2 << 20) + b'"}'
            _json_error(client.post(route, content=huge, headers=headers), 413, "at most")
        untyped = client.post("/v1/detect", content=b"x" * (2 << 20), headers={"X-Defectdet-Request": "1"})
        if app is service_app:  # an upload without a Content-Type is read as JSON, and says so
            _json_error(untyped, 413, "without a Content-Type")
        fine = {
            "image": "a.png",
            "action": "edit",
            "operator": "op",
            "boxes": [{"class_id": 0, "box": [1, 2, 30, 40]}],
        }
        answer = client.post("/v1/review/decide", json=fine, headers={"X-Defectdet-Request": "1"})
        assert answer.status_code == 200, answer.text


def _text(output: str) -> str:
    """The words of a CLI output, without the borders of rich's error box."""
    return " ".join(re.sub("[│╭╮╰╯─]", " ", output).split())


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def _workers_of(pid: int) -> list[int]:
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return [int(c) for c in children if "resource_tracker" not in Path(f"/proc/{c}/cmdline").read_text()]


def _start_workers(bundle: Path, port: int, env: dict, *options: str) -> subprocess.Popen:
    command = [sys.executable, "-m", "defectdet.cli", "serve", str(bundle), "--port", str(port),
               "--workers", "2", "--threads", "1", *options]  # fmt: skip
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while (response := _get(f"http://127.0.0.1:{port}/readyz")) is None or response.status_code != 200:
        assert process.poll() is None, process.stdout.read().decode()[-3000:]
        assert time.monotonic() < deadline, "the service never became ready"
        time.sleep(0.1)
    return process


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads /proc (Linux)")
def test_kill_9_of_the_parent_takes_its_workers_and_the_next_start_cleans_up(
    bundle_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    port = _free_port()
    env = {**os.environ, "TMPDIR": str(tmp_path), "PYTHONWARNINGS": "ignore"}
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    process = _start_workers(bundle_path, port, env)
    try:
        workers = _workers_of(process.pid)
        assert len(workers) == 2, workers
        process.kill()  # SIGKILL: the parent cannot stop its workers itself
        process.wait(10)
        killed = time.monotonic()
        while _listening(port) or any(_running(pid) for pid in workers):
            assert time.monotonic() - killed < 5, "workers still serve 5 s after their parent was killed"
            time.sleep(0.05)
    finally:
        if process.poll() is None:
            process.kill()
        process.stdout.close()
    (left,) = [path for path in tmp_path.iterdir() if path.name.startswith("defectdet-metrics-")]
    monkeypatch.setattr(launch.tempfile, "tempdir", str(tmp_path))
    seen: list[list[str]] = []
    monkeypatch.setattr(
        launch, "run_uvicorn", lambda config: seen.append(sorted(p.name for p in tmp_path.iterdir()))
    )
    launch.serve_bundle(bundle_path, port=port, workers=2)
    assert left.name not in seen[0] and not left.exists()  # removed before the new workers started
    assert not [path for path in tmp_path.iterdir() if path.name.startswith("defectdet-metrics-")]


def _post_samples(base: str, dataset: Path, count: int, brighten: int = 0) -> list[dict]:
    """`count` detect requests on new connections (the kernel spreads them over the workers)."""
    from defectdet.data.formats import load_dataset

    samples = load_dataset(dataset, "val").samples
    answers = []
    for index in range(count):
        sample = samples[index % len(samples)]
        image = cv2.imread(str(sample.image_path), cv2.IMREAD_GRAYSCALE)
        image = cv2.add(image, brighten)
        files = {"image": encode(image), "template": sample.template_path.read_bytes()}
        response = httpx.post(base + "/v1/detect", files=files, timeout=30)
        assert response.status_code == 200, response.text
        answers.append(response.json())
    return answers


def _drift_z_by_pid(base: str) -> dict[str, list[float]]:
    found: dict[str, list[float]] = {}
    for pid, value in re.findall(
        r'defectdet_drift_z\{pid="(\d+)",[^}]*\} (\S+)', httpx.get(base + "/metrics").text
    ):
        found.setdefault(pid, []).append(float(value))
    return found


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads /proc (Linux)")
def test_a_drift_reset_on_one_worker_reaches_every_worker(
    bundle_path: Path, tiny_dataset: Path, tmp_path: Path
) -> None:
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    env = {**os.environ, "TMPDIR": str(tmp_path), "PYTHONWARNINGS": "default::UserWarning"}
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    process = _start_workers(bundle_path, port, env)
    try:
        for _ in range(10):
            _post_samples(base, tiny_dataset, 6, brighten=60)
            moved = {pid for pid, values in _drift_z_by_pid(base).items() if any(values)}
            if len(moved) == 2:
                break
        assert len(moved) == 2, _drift_z_by_pid(base)  # both workers' charts moved
        headers = {"X-Defectdet-Request": "1", "Content-Type": "application/json"}
        response = httpx.post(base + "/v1/drift/reset", content=b"{}", headers=headers)
        assert response.status_code == 200 and response.json()["state"]["images"] == 0
        reset = time.monotonic()
        while any(any(values) for values in _drift_z_by_pid(base).values()):
            assert time.monotonic() - reset < 3, _drift_z_by_pid(base)
            time.sleep(0.1)
        for _ in range(6):  # whichever worker answers, its charts start afresh
            assert httpx.get(base + "/v1/drift").json()["state"]["images"] == 0
    finally:
        process.send_signal(signal.SIGINT)
        try:
            output = process.communicate(timeout=30)[0].decode()
        except subprocess.TimeoutExpired:
            process.kill()
            output = process.communicate()[0].decode()
    assert "not been implemented in multi-process mode" not in output, output[-3000:]  # resets log no warning


def _after(seconds: float, folder: Path) -> list[Path]:
    time.sleep(seconds)
    return sorted(folder.iterdir())


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads /proc (Linux)")
def test_workers_keep_into_one_folder_under_one_cap_reviewed_from_any_of_them(
    bundle_path: Path, tiny_dataset: Path, tmp_path: Path
) -> None:
    from defectdet.runtime.bundle import read_metadata, write_metadata
    from defectdet.serve.review_app import create_review_app

    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    kept = tmp_path / "kept"
    env = {**os.environ, "TMPDIR": str(tmp_path), "PYTHONWARNINGS": "ignore"}
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    models = tmp_path / "models"
    models.mkdir()
    shutil.copy(bundle_path, models / "candidate.onnx")  # another bundle (other bytes) of the same model
    meta = read_metadata(models / "candidate.onnx")
    write_metadata(models / "candidate.onnx", meta.model_copy(update={"created": "2000-01-01T00:00:00Z"}))
    options = ("--keep", "all", "--keep-dir", str(kept), "--keep-max-mb", "0.25")
    options += ("--models-dir", str(models), "--shadow", "candidate.onnx")
    process = _start_workers(bundle_path, port, env, *options)
    try:
        workers = {str(pid) for pid in _workers_of(process.pid)}
        for _ in range(4):  # every worker runs the shadow
            assert httpx.get(base + "/v1/models").json()["shadow"]["name"] == "candidate.onnx"
        writers: set[str] = set()
        for _ in range(10):  # until both workers kept something
            assert all(answer["kept"] for answer in _post_samples(base, tiny_dataset, 6))
            time.sleep(0.3)  # the writer threads
            writers = {path.stem.split("-")[1] for path in (kept / "predictions").glob("*.json")}
            if writers == workers:
                break
        assert writers == workers, (writers, workers)
        while sorted((kept / "predictions").iterdir()) != _after(0.5, kept / "predictions"):
            pass  # until the writer threads are done
        files = [path for path in kept.rglob("*") if path.is_file()]
        assert sum(path.stat().st_size for path in files) <= 0.25 * 2**20
        on_disk = sorted(path.name for path in (kept / "images").iterdir())
        for _ in range(4):  # whichever worker answers lists the same queue
            listed = [item["name"] for item in httpx.get(base + "/v1/review/items").json()["items"]]
            assert listed == on_disk
        headers = {"X-Defectdet-Request": "1"}
        decision = {"image": on_disk[0], "action": "clean", "operator": "ann"}
        assert httpx.post(base + "/v1/review/decide", json=decision, headers=headers).status_code == 200
        for _ in range(4):
            items = httpx.get(base + "/v1/review/items").json()["items"]
            assert {item["name"]: item["status"] for item in items}[on_disk[0]] == "clean"
        with TestClient(create_review_app(kept), base_url=BASE) as review:  # `defectdet review` on the folder
            items = review.get("/v1/review/items").json()["items"]
            assert {item["name"]: item["status"] for item in items}[on_disk[0]] == "clean"
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()

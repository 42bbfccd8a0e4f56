"""Request bodies that trickle in: cut off with a JSON 408 on every route, so that a few slow sockets cannot
hold the connection slots. Raw sockets against a real uvicorn server on loopback, configured as `serve` does.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator

import httpx
import uvicorn
from server_fakes import FakePredictor, uvicorn_on_loopback

from defectdet.serve.protocol import BODY_GRACE_S
from defectdet.serve.server import create_app
from defectdet.serve.settings import ServeSettings

TOKEN = "a-token-long-enough-for-the-tests"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@contextlib.contextmanager
def _uvicorn(settings: ServeSettings) -> Iterator[tuple[str, int, uvicorn.Server]]:
    app = create_app(FakePredictor(), settings)
    app.state.service.start()
    assert app.state.service.ready.wait(10)
    with uvicorn_on_loopback(app, settings) as served:
        yield served


def _trickle(host: str, port: int, head: bytes, every_s: float, stop_after_s: float) -> tuple[bytes, float]:
    """Send `head`, then one body byte every `every_s` until the server answers or closes (or `stop_after_s`
    passes); (what the server sent, seconds until it did)."""
    started = time.monotonic()
    with socket.create_connection((host, port), timeout=5) as sock:
        sock.sendall(head)
        sock.settimeout(every_s)
        received = b""
        while time.monotonic() - started < stop_after_s:
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                try:
                    sock.sendall(b"x")
                except OSError:  # closed by the server
                    break
                continue
            except OSError:
                break
            if not chunk:
                break
            received += chunk
        return received, time.monotonic() - started


def _head(method_path: str, *extra: str, length: int = 100_000, body: bytes = b"") -> bytes:
    """A request head, and the first bytes of its body."""
    lines = [f"{method_path} HTTP/1.1", "Host: 127.0.0.1", f"Content-Length: {length}", *extra, "", ""]
    return "\r\n".join(lines).encode() + body


def _answer_408(received: bytes) -> dict:
    head, _, body = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408"), received[:300]
    assert b"application/json" in head.lower() and b"connection: close" in head.lower(), head
    answer = json.loads(body)
    assert answer["status"] == 408 and "too slowly" in answer["error"], answer
    return answer


def test_a_body_at_one_byte_per_second_gets_408_on_every_route() -> None:
    settings = ServeSettings(token=TOKEN)
    heads = [
        _head("POST /healthz"),  # no token needed, no route reads it
        _head(
            "POST /v1/detect",
            "Content-Type: multipart/form-data; boundary=b",
            f"Authorization: Bearer {TOKEN}",
            body=b'--b\r\nContent-Disposition: form-data; name="image"; filename="a.png"\r\n\r\n',
        ),
        _head("POST /v1/detect", "Content-Type: multipart/form-data; boundary=b"),  # 401 at once, body unread
        _head(
            "POST /v1/drift/reset",
            "Content-Type: application/json",
            "X-Defectdet-Request: 1",
            f"Authorization: Bearer {TOKEN}",
        ),
    ]
    with _uvicorn(settings) as (host, port, _server):
        results: list[tuple[bytes, float]] = [(b"", 0.0)] * len(heads)

        def run(index: int) -> None:
            results[index] = _trickle(host, port, heads[index], 1.0, 40)

        threads = [threading.Thread(target=run, args=(index,)) for index in range(len(heads))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    for (received, seconds), head in zip(results, heads, strict=True):
        assert seconds < BODY_GRACE_S + 4, (head, seconds, received[:200])  # cut, not held for 30 s or more
        if b"Authorization" in head or b"healthz" in head:
            _answer_408(received)
        else:  # refused at once (401), then closed when its body fell behind
            assert received.startswith(b"HTTP/1.1 401"), received[:200]


def test_five_slow_bodies_do_not_lock_out_authenticated_requests() -> None:
    settings = ServeSettings(token=TOKEN, max_connections=4)
    with _uvicorn(settings) as (host, port, server):
        threads = [
            threading.Thread(target=_trickle, args=(host, port, _head("POST /healthz"), 2.0, 40), daemon=True)
            for _ in range(5)
        ]
        for thread in threads:
            thread.start()
        while len(server.server_state.connections) < 5:
            time.sleep(0.01)
        started = time.monotonic()
        with httpx.Client(base_url=f"http://{host}:{port}", headers=AUTH) as client:
            assert client.get("/healthz").status_code == 200  # the probes always answer
            assert client.get("/v1/model").status_code == 503  # five slow bodies hold the slots ...
            while (status := client.get("/v1/model").status_code) == 503:
                assert time.monotonic() - started < BODY_GRACE_S + 5, "still 503: slow bodies hold the slots"
                time.sleep(0.25)
            assert status == 200  # ... only until they fall behind
        for thread in threads:
            thread.join(10)


def test_a_steady_upload_is_not_cut() -> None:
    settings = ServeSettings(token=TOKEN)
    body = b'{"a": "' + b"x" * 20_000 + b'"}'
    with _uvicorn(settings) as (host, port, _server):
        head = _head(
            "POST /v1/drift/reset",
            "Content-Type: application/json",
            "X-Defectdet-Request: 1",
            f"Authorization: Bearer {TOKEN}",
            length=len(body),
        )
        with socket.create_connection((host, port), timeout=10) as sock:
            sock.sendall(head)
            for start in range(0, len(body), 1500):  # 3 KB/s, for longer than the grace period
                sock.sendall(body[start : start + 1500])
                time.sleep(0.5)
            answer = sock.recv(65536)
    assert answer.startswith(b"HTTP/1.1 200"), answer[:300]

"""Abuse probes against `defectdet serve`: what the service answers, and whether /healthz still answers meanwhile.

Starts the service on loopback in a child process (`python -m defectdet.cli serve`, small limits:
--max-concurrency 1 --max-queue 2, so the default connection limit is 67) and runs:
1. idle sockets: N raw connections that send nothing -> /healthz, /v1/model and a detect while they are
   open, and how long until the server closes them (its request-head timeout);
2. stalled uploads: N uploads that send their headers and part of the body, then stop -> /healthz and a
   normal detect meanwhile, and what a stalled upload is finally answered (the body timeout);
3. oversize by format: PNG, JPEG, Radiance HDR and TIFF headers claiming huge sizes in a few kB;
4. cross-site POSTs: a text/plain form post to /v1/drift/reset, a detect with a foreign Origin;
5. malformed HTTP (uvicorn's own 400), an unknown route, /docs;
6. a second service started with --token-file: routes without, with a wrong and with the right token;
7. the line's probes (`serve_abuse_line.py`): the review under load with the keep cap deleting, two tabs and a
   held review lock, long names; two processes on one models store promoting and rolling back; slow bodies
   against a connection limit; a huge thin image; a busy port.
Each probe records the status and body of the answer and the /healthz status seen during it; `summary` counts
the 500s of every probe, the labels lost and whether the fleet converged.

Run: python -m bench.serve_abuse [--bundle model.onnx] [--line-only] (without a bundle: a tiny one is trained
and exported once into runs/serve_abuse/, about a minute). Loopback only; about three minutes.
"""

from __future__ import annotations

import argparse
import os
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import cv2
import httpx
import numpy as np

from bench.common import print_table, wait_until_ready, write_result

ROOT = Path(__file__).resolve().parents[1]
BOUNDARY = "abuse"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def tiny_bundle(folder: Path, size: int = 192, epochs: int = 3) -> Path:
    """A few training steps on 8 synthetic boards with templates, exported (what tests/deploy/conftest.py
    builds). `size`: the bundle's input size; the boards are 5/6 of it to all of it."""
    bundle = folder / "model.onnx"
    if bundle.is_file():
        return bundle
    from defectdet.data.synth import synthesize_dataset
    from defectdet.engine.config import TrainConfig
    from defectdet.engine.trainer import train
    from defectdet.export.exporter import export_bundle

    data = synthesize_dataset(
        folder / "data", boards=8, seed=3, template=True, min_size=size * 5 // 6, max_size=size
    )
    config = TrainConfig(
        data=data, imgsz=size, crop_size=None, epochs=epochs, batch=2, workers=0, out=folder / "run",
        progress=False, warmup_steps=2, preset="nano",
    )  # fmt: skip
    result = train(config)
    return export_bundle(Path(result.best_checkpoint or result.last_checkpoint), bundle).bundle


ABUSE_LIMITS = ("--max-concurrency", "1", "--max-queue", "2", "--threads", "1")


@contextmanager
def service(
    bundle: Path, *extra: str, limits: tuple[str, ...] = ABUSE_LIMITS, started: list | None = None
) -> Iterator[str]:
    """`defectdet serve` in a child process on loopback (a free port); yields its base URL once /readyz
    answers 200. `limits`: the serve options before `extra` (() for serve's defaults); `started`: a list the
    child process is appended to."""
    port = free_port()
    command = [sys.executable, "-m", "defectdet.cli", "serve", str(bundle), "--port", str(port),
               *limits, *extra]  # fmt: skip
    log = tempfile.TemporaryFile()
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    if started is not None:
        started.append(process)
    base = f"http://127.0.0.1:{port}"
    try:
        try:
            wait_until_ready(process, base)
        except RuntimeError as error:
            log.seek(0)
            raise RuntimeError(f"{error}: {log.read().decode()[-2000:]}") from None
        yield base
    finally:
        process.terminate()
        process.wait(30)


def healthz(base: str) -> int | str:
    try:
        return httpx.get(base + "/healthz", timeout=10).status_code
    except httpx.HTTPError as error:
        return type(error).__name__


def answer(response: httpx.Response) -> dict[str, Any]:
    try:
        body: Any = response.json()
    except ValueError:
        body = response.text[:200]
    return {
        "status": response.status_code,
        "content_type": response.headers.get("content-type"),
        "body": body,
    }


def multipart(fields: dict[str, bytes]) -> tuple[bytes, dict[str, str]]:
    body = b""
    for name, data in fields.items():
        body += (
            f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="{name}"; filename="{name}.bin"\r\n\r\n'.encode()
            + data
            + b"\r\n"
        )
    body += f"--{BOUNDARY}--\r\n".encode()
    return body, {"content-type": f"multipart/form-data; boundary={BOUNDARY}"}


def detect(base: str, image: bytes, template: bytes, headers: dict[str, str] | None = None) -> httpx.Response:
    body, content = multipart({"image": image, "template": template})
    return httpx.post(base + "/v1/detect", content=body, headers={**content, **(headers or {})}, timeout=60)


def during(base: str, action: Callable[[], Any]) -> tuple[Any, list[int | str]]:
    """Run `action` in a thread and poll /healthz until it ends (at least once)."""
    result: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: result.setdefault("value", action()), daemon=True)
    thread.start()
    seen = [healthz(base)]
    while thread.is_alive():
        seen.append(healthz(base))
        thread.join(0.05)
    return result.get("value"), seen


def board_pair() -> tuple[bytes, bytes]:
    rng = np.random.default_rng(0)
    template = np.clip(rng.normal(90, 12, (192, 192)), 0, 255).astype(np.uint8)
    image = template.copy()
    image[60:90, 70:110] = 250
    return cv2.imencode(".png", image)[1].tobytes(), cv2.imencode(".png", template)[1].tobytes()


# ------------------------------------------------------------------ oversize headers
def png_header(width: int, height: int) -> bytes:
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    chunk = b"IHDR" + ihdr
    raw = b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13) + chunk + struct.pack(">I", zlib.crc32(chunk))
    scanline = zlib.compress(b"\x00" * 4096)
    idat = b"IDAT" + scanline
    return raw + struct.pack(">I", len(scanline)) + idat + struct.pack(">I", zlib.crc32(idat))


def jpeg_header(width: int, height: int) -> bytes:
    data = bytearray(cv2.imencode(".jpg", np.full((16, 16), 128, np.uint8))[1].tobytes())
    at = data.find(b"\xff\xc0")
    data[at + 5 : at + 9] = struct.pack(">HH", height, width)
    return bytes(data)


def hdr_header(width: int, height: int) -> bytes:
    """Radiance RGBE: header + a few RLE scanlines (the rest missing)."""
    header = f"#?RADIANCE\nFORMAT=32-bit_rle_rgbe\n\n-Y {height} +X {width}\n".encode()
    line = bytes([2, 2, width >> 8, width & 0xFF])
    runs = b"".join(bytes([128 + min(127, width - start), 128]) for start in range(0, width, 127))
    return header + (line + runs * 4) * 4


def tiff_header(width: int, height: int) -> bytes:
    """Little-endian TIFF, 8-bit gray, one uncompressed strip that is not there."""
    entries = [(256, 4, 1, width), (257, 4, 1, height), (258, 3, 1, 8), (259, 3, 1, 1), (262, 3, 1, 1),
               (273, 4, 1, 8 + 2 + 9 * 12 + 4), (277, 3, 1, 1), (278, 4, 1, height),
               (279, 4, 1, width * height)]  # fmt: skip
    ifd = struct.pack("<H", len(entries))
    for tag, kind, count, value in entries:
        ifd += struct.pack("<HHI", tag, kind, count) + (
            struct.pack("<HH", value, 0) if kind == 3 else struct.pack("<I", value)
        )
    return b"II*\x00" + struct.pack("<I", 8) + ifd + struct.pack("<I", 0) + b"\x00" * 1024


# ------------------------------------------------------------------ probes
def probe_idle_sockets(base: str, port: int, count: int, image: bytes, template: bytes) -> dict[str, Any]:
    sockets = [socket.create_connection(("127.0.0.1", port), timeout=60) for _ in range(count)]
    opened = time.perf_counter()
    try:
        health = [healthz(base)]
        model = answer(httpx.get(base + "/v1/model", timeout=10))
        inspected = answer(detect(base, image, template))
        health.append(healthz(base))
        closed_after: list[float] = []
        for sock in sockets:  # the server closes them: recv returns b""
            try:
                while sock.recv(4096):
                    pass
                closed_after.append(time.perf_counter() - opened)
            except OSError:
                closed_after.append(float("nan"))
    finally:
        for sock in sockets:
            sock.close()
    return {
        "what": f"{count} connections that send nothing",
        "healthz_during": health,
        "answer": model,
        "detect_during": {"status": inspected["status"]},
        "closed_by_server_after_s": round(max(closed_after), 2),
        "closed_by_server": sum(1 for value in closed_after if value == value),
    }


def probe_stalled_uploads(base: str, port: int, count: int, image: bytes, template: bytes) -> dict[str, Any]:
    body, headers = multipart({"image": image, "template": template})
    head = (
        f"POST /v1/detect HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: {headers['content-type']}\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    sockets = []
    for _ in range(count):
        sock = socket.create_connection(("127.0.0.1", port), timeout=90)
        sock.sendall(head + body[: len(body) // 2])  # half the body, then silence
        sockets.append(sock)
    try:
        inspected, health = during(base, lambda: answer(detect(base, image, template)))
        if isinstance(inspected["body"], dict) and "verdict" in inspected["body"]:
            inspected["body"] = {"verdict": inspected["body"]["verdict"]}
        started = time.perf_counter()
        reply = b""
        while chunk := sockets[0].recv(65536):
            reply += chunk
        waited = time.perf_counter() - started
    finally:
        for sock in sockets:
            sock.close()
    status_line, _, rest = reply.partition(b"\r\n")
    return {
        "what": f"{count} uploads that stop half-way (max-concurrency 1, max-queue 2)",
        "healthz_during": sorted(set(health), key=str),
        "detect_during": inspected,
        "answer": {
            "status_line": status_line.decode(errors="replace"),
            "body": rest.split(b"\r\n\r\n", 1)[-1][:200].decode(errors="replace"),
        },
        "stalled_answered_after_s": round(waited, 1),
    }


def probe_oversize(base: str) -> list[dict[str, Any]]:
    rows = []
    for name, data, claim in [
        ("png", png_header(100_000, 100_000), "100000x100000"),
        ("jpeg", jpeg_header(60_000, 60_000), "60000x60000"),
        ("hdr", hdr_header(8_000, 8_000), "8000x8000"),
        ("tiff", tiff_header(50_000, 50_000), "50000x50000"),
    ]:
        started = time.perf_counter()
        result, health = during(base, lambda data=data: answer(detect(base, data, data)))
        rows.append({
            "what": f"{name} header claiming {claim} in {len(data):,} bytes",
            "answer": result,
            "answer_ms": round((time.perf_counter() - started) * 1e3, 1),
            "healthz_during": sorted(set(health), key=str),
        })  # fmt: skip
    return rows


def probe_requests(base: str, image: bytes, template: bytes) -> dict[str, dict[str, Any]]:
    port = int(base.rsplit(":", 1)[1])
    garbage = b""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(b"NOT HTTP AT ALL\r\n\r\n")
        while chunk := sock.recv(4096):
            garbage += chunk
    status_line, _, rest = garbage.partition(b"\r\n")
    return {
        "cross_site_form_reset": {
            "what": "POST /v1/drift/reset, Content-Type text/plain, Origin http://evil.example (a web page's form)",
            "answer": answer(httpx.post(base + "/v1/drift/reset", content=b"x=1", timeout=10,
                                        headers={"Content-Type": "text/plain", "Origin": "http://evil.example"})),
        },
        "reset_without_header": {
            "what": "POST /v1/drift/reset with no custom header (curl -X POST)",
            "answer": answer(httpx.post(base + "/v1/drift/reset", timeout=10)),
        },
        "reset_same_origin": {
            "what": "POST /v1/drift/reset, JSON body and X-Defectdet-Request: 1 (the page)",
            "answer": {"status": httpx.post(base + "/v1/drift/reset", json={}, timeout=10,
                                            headers={"X-Defectdet-Request": "1"}).status_code},
        },
        "cross_site_detect": {
            "what": "POST /v1/detect with Origin http://evil.example",
            "answer": answer(detect(base, image, template, {"Origin": "http://evil.example"})),
        },
        "rebinding_host": {
            "what": "GET /v1/model with Host: evil.example (DNS rebinding)",
            "answer": answer(httpx.get(base + "/v1/model", headers={"Host": "evil.example"}, timeout=10)),
        },
        "malformed_http": {
            "what": "raw bytes that are not HTTP (uvicorn's own 400)",
            "answer": {"status_line": status_line.decode(errors="replace"),
                       "body": rest.split(b"\r\n\r\n", 1)[-1][:200].decode(errors="replace")},
        },
        "unknown_route": {"what": "GET /nowhere", "answer": answer(httpx.get(base + "/nowhere", timeout=10))},
        "docs": {"what": "GET /docs (Swagger UI needs a CDN: off)", "answer": answer(httpx.get(base + "/docs", timeout=10))},
        "model_paths": {
            "what": "GET /v1/model: absolute paths in the answer",
            "answer": {"absolute_paths": str(ROOT) in httpx.get(base + "/v1/model", timeout=10).text},
        },
    }  # fmt: skip


def probe_token(bundle: Path, folder: Path) -> dict[str, Any]:
    token_file = folder / "token"
    token_file.write_text("abuse-probe-token-0123456789abcdef\n")
    token_file.chmod(0o600)
    with service(bundle, "--token-file", str(token_file)) as base:
        return {
            "what": "serve --token-file: GET /v1/model without, with a wrong and with the right token",
            "answer": answer(httpx.get(base + "/v1/model", timeout=10)),
            "wrong_token": httpx.get(base + "/v1/model", headers={"Authorization": "Bearer nope"}, timeout=10).status_code,
            "right_token": httpx.get(base + "/v1/model",
                                     headers={"Authorization": "Bearer abuse-probe-token-0123456789abcdef"},
                                     timeout=10).status_code,
            "healthz_during": [healthz(base)],
        }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--bundle", type=Path, default=None, help="default: a tiny one in runs/serve_abuse/")
    parser.add_argument("--idle", type=int, default=200, help="idle sockets (default connection limit: 67)")
    parser.add_argument("--stalled", type=int, default=20, help="stalled uploads")
    parser.add_argument(
        "--review-seconds", type=float, default=20.0, help="the review-under-load probe's time"
    )
    parser.add_argument(
        "--line-only", action="store_true", help="only the line's probes (serve_abuse_line.py)"
    )
    args = parser.parse_args()
    from bench.serve_abuse_line import run_line_probes, summary  # it imports this module's helpers

    folder = ROOT / "runs" / "serve_abuse"
    folder.mkdir(parents=True, exist_ok=True)
    bundle = (args.bundle or tiny_bundle(folder)).resolve()
    probes = {} if args.line_only else service_probes(bundle, folder, args.idle, args.stalled)
    probes["line"] = run_line_probes(bundle, folder, args.review_seconds)
    outcome = summary(probes)
    rows = []
    for name, probe in probes.items():
        if name == "line":
            continue
        result = probe.get("answer", {})
        status = result.get("status", result.get("status_line", ""))
        body = result.get("body", "")
        reason = body.get("error", "") if isinstance(body, dict) else str(body)
        health = probe.get("healthz_during", "")
        rows.append(
            [name, str(status), reason[:70], ",".join(str(value) for value in health) if health else ""]
        )
    for name, probe in probes["line"].items():
        rows.append(
            [f"line/{name}", ",".join(f"{k}x{v}" for k, v in probe.get("statuses", {}).items()), "", ""]
        )
    print_table("serve abuse probes", ["probe", "answer", "reason", "/healthz during"], rows)
    print(f"500 answers: {outcome['status_500']}; labels lost: {outcome['labels_lost']}; "
          f"fleet converged: {outcome['fleet_converged']}")  # fmt: skip
    path = write_result(
        "serve_abuse",
        {"bundle": bundle.name, "settings": {"max_concurrency": 1, "max_queue": 2, "connection_limit": 67,
                                             "header_timeout_s": 10, "body_timeout_s": 30},
         "summary": outcome, "probes": probes},
    )  # fmt: skip
    print(f"-> {path}")


def service_probes(bundle: Path, folder: Path, idle: int, stalled: int) -> dict[str, Any]:
    """Probes 1-6: one service with small limits, then one with a token."""
    image, template = board_pair()
    with service(bundle) as base:
        port = int(base.rsplit(":", 1)[1])
        probes: dict[str, Any] = {
            "idle_sockets": probe_idle_sockets(base, port, idle, image, template),
            "stalled_uploads": probe_stalled_uploads(base, port, stalled, image, template),
        }
        for row in probe_oversize(base):
            probes[f"oversize_{row['what'].split()[0]}"] = row
        probes.update(probe_requests(base, image, template))
        probes["health_after"] = {
            "what": "GET /healthz after all probes",
            "answer": {"status": healthz(base)},
        }
    probes["missing_token"] = probe_token(bundle, folder)
    return probes


if __name__ == "__main__":
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    main()

"""The line's probes for `bench/serve_abuse.py`: a busy operator and an attacker against the review and the fleet.

Each probe runs real `defectdet serve` processes on loopback (never another address) and is bounded in time:
1. review under load: `--keep all` with a small cap (the cap deletes images all the time) while a client keeps
   posting images under their own file names, an operator accepts or decides clean every image listed, a second
   tab sends each decision again on the version it read, and decisions wait on a held review lock; then the
   folder is checked: every decision answered 200 still has its image, its label file and its reviewed.txt
   line, no label file lost its image (`labels_lost`). Long names on the review routes too;
2. fleet: two processes on one models store; a promotion through one and a roll-back through the other, while a
   client posts to both: both serve the store's generation within `CONVERGE_S` (`fleet_converged`);
3. slow bodies: uploads that trickle one byte a second to /healthz and /v1/detect against
   `--max-connections 4`: how long until the service closes them, and what an authenticated request meanwhile
   gets;
4. a huge thin image: two small PNGs of 20,000,000 x 1 pixels at once: the answers and the service's peak
   resident memory;
5. a busy port: `serve` on a port already taken: the exit status and its last line.
Every HTTP answer's status is counted (`statuses`); the summary counts the 500s.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from bench.serve_abuse import ROOT, board_pair, healthz, service

CHANGE = {"X-Defectdet-Request": "1"}  # the header every state-changing request carries
CONVERGE_S = 10.0


class Counted:
    """An httpx client that counts every answer's status (and transport errors by name)."""

    def __init__(self, timeout: float = 30.0) -> None:
        self.statuses: Counter[str] = Counter()
        self._lock = threading.Lock()
        self.client = httpx.Client(timeout=timeout, event_hooks={"response": [self._count]})

    def _count(self, response: httpx.Response) -> None:
        with self._lock:
            self.statuses[str(response.status_code)] += 1

    def request(self, method: str, url: str, **kwargs: Any) -> httpx.Response | None:
        try:
            return self.client.request(method, url, **kwargs)
        except httpx.HTTPError as error:
            with self._lock:
                self.statuses[type(error).__name__] += 1
            return None


class Poster(threading.Thread):
    """Posts the board to every URL in turn, each under a numbered file name, until stopped."""

    def __init__(self, urls: list[str], counted: Counted) -> None:
        super().__init__(daemon=True)
        self.urls, self.counted = urls, counted
        self.image, self.template = board_pair()
        self.halt = threading.Event()
        self.sent = 0

    def run(self) -> None:
        while not self.halt.is_set():
            for url in self.urls:
                files = {
                    "image": (f"part-{self.sent:05d}.png", self.image, "image/png"),
                    "template": ("template.png", self.template, "image/png"),
                }
                self.counted.request("POST", url + "/v1/detect", files=files)
                self.sent += 1
            time.sleep(0.01)


@contextmanager
def held(path: Path, seconds: float) -> Iterator[None]:
    """Hold the exclusive file lock on `path` (as another process deciding would) for `seconds`."""
    import fcntl

    descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        yield
        time.sleep(seconds)
    finally:
        os.close(descriptor)


# ------------------------------------------------------------------ 1. review under load
def probe_review(bundle: Path, folder: Path, seconds: float) -> dict[str, Any]:
    kept = folder / "kept"
    shutil.rmtree(kept, ignore_errors=True)
    counted = Counted()
    decided: dict[str, str] = {}  # image -> the action answered 200 last
    answers: Counter[str] = Counter()
    stale: Counter[str] = Counter()
    lock_wait: dict[str, Any] = {}
    extra = ("--keep", "all", "--keep-dir", str(kept), "--keep-max-mb", "1.5")
    with service(bundle, *extra) as base:
        poster = Poster([base], counted)
        poster.start()
        deadline = time.monotonic() + seconds
        rounds = 0
        while time.monotonic() < deadline:
            listing = counted.request("GET", base + "/v1/review/items")
            items = listing.json()["items"] if listing is not None and listing.status_code == 200 else []
            for item in [item for item in items if item["status"] == "pending"][:2]:
                action = "accept" if rounds % 2 == 0 else "clean"
                body = {
                    "image": item["name"],
                    "action": action,
                    "operator": "abuse",
                    "version": item["version"],
                }
                if action == "accept":
                    body["boxes"] = [{"class_id": 0, "box": [60, 50, 120, 100]}]
                answer = counted.request("POST", base + "/v1/review/decide", json=body, headers=CHANGE)
                status = answer.status_code if answer is not None else 0
                answers[f"{action}:{status}"] += 1
                if status == 200:
                    decided[item["name"]] = action
                    again = counted.request(  # the second tab, on the version it read before
                        "POST", base + "/v1/review/decide", json={**body, "action": "clean"}, headers=CHANGE
                    )
                    stale[str(again.status_code if again is not None else 0)] += 1
            if rounds == 3:  # a decision waits on the review lock another process holds
                lock_wait = decision_behind_a_held_lock(base, kept, items, counted)
            rounds += 1
            time.sleep(0.05)
        poster.halt.set()
        poster.join(30)
        long_names = {
            str(length): [
                status_of(counted.request("GET", f"{base}/v1/review/image/{'x' * length}.png")),
                status_of(counted.request(
                    "POST", base + "/v1/review/decide", headers=CHANGE,
                    json={"image": "x" * length + ".png", "action": "clean", "operator": "abuse"},
                )),
            ]
            for length in (300, 10_000)
        }  # fmt: skip
        time.sleep(1.0)  # the keep writer finishes its queue
        listing = counted.request("GET", base + "/v1/review/items")
        named = sum(1 for item in listing.json()["items"] if item.get("upload_name")) if listing else 0
    check = check_folder(kept, decided)
    return {
        "what": f"{seconds:g} s: --keep all under a 1.5 MB cap, a client posting, an operator deciding "
        "listed images, a second tab resending each decision on its old version, a decision behind a held lock",
        "posted": poster.sent,
        "decisions": dict(answers),
        "second_tab": dict(stale),
        "decision_behind_held_lock": lock_wait,
        "long_names": long_names,
        "listed_with_upload_name": named,
        "folder": check,
        "statuses": dict(counted.statuses),
    }


def status_of(response: httpx.Response | None) -> int:
    return response.status_code if response is not None else 0


def decision_behind_a_held_lock(base: str, kept: Path, items: list[dict], counted: Counted) -> dict[str, Any]:
    """Hold FOLDER/.review.lock for 3 s while a decision is sent; /healthz latency meanwhile."""
    pending = [item for item in items if item["status"] == "pending"]
    if not pending:
        return {"skipped": "no pending image"}
    body = {"image": pending[-1]["name"], "action": "clean", "operator": "abuse"}
    result: dict[str, Any] = {}
    latencies = []
    with held(kept / ".review.lock", 3.0):
        thread = threading.Thread(
            target=lambda: result.setdefault(
                "status",
                status_of(counted.request("POST", base + "/v1/review/decide", json=body, headers=CHANGE)),
            ),
            daemon=True,
        )
        thread.start()
        for _ in range(10):
            started = time.perf_counter()
            healthz(base)
            latencies.append((time.perf_counter() - started) * 1e3)
            time.sleep(0.2)
    thread.join(30)
    return {"decision_status": result.get("status"), "healthz_max_ms": round(max(latencies), 1)}


def check_folder(kept: Path, decided: dict[str, str]) -> dict[str, Any]:
    """Labels lost: a decision answered 200 (accept or clean) whose image, label file or reviewed.txt line is
    gone, and label files whose image is gone."""
    reviewed = (
        set((kept / "reviewed.txt").read_text().split()) if (kept / "reviewed.txt").is_file() else set()
    )
    images = {path.name for path in (kept / "images").iterdir()}
    lost = []
    for name in decided:
        stem = Path(name).stem
        if name not in images or not (kept / "labels" / f"{stem}.txt").is_file():
            lost.append(f"{name}: image or label file gone")
        elif f"./images/{name}" not in reviewed:
            lost.append(f"{name}: not in reviewed.txt")
    labels = kept / "labels"
    orphans = [
        path.name for path in (labels.iterdir() if labels.is_dir() else []) if not any(
            image.startswith(path.stem + ".") for image in images
        )
    ]  # fmt: skip
    return {
        "decided": len(decided),
        "images_left": len(images),
        "labels_lost": len(lost) + len(orphans),
        "lost": lost[:10],
        "orphan_labels": orphans[:10],
    }


# ------------------------------------------------------------------ 2. fleet
def variant(bundle: Path, out: Path, threshold: float) -> Path:
    """A copy of `bundle` with another verdict threshold (another sha256, the same model)."""
    from defectdet.runtime.bundle import read_metadata, write_metadata

    shutil.copyfile(bundle, out)
    meta = read_metadata(out)
    thresholds = meta.thresholds.model_copy(update={"threshold": threshold})
    write_metadata(out, meta.model_copy(update={"thresholds": thresholds}))
    return out


def probe_fleet(bundle: Path, folder: Path) -> dict[str, Any]:
    from defectdet.serve.deployment import file_sha256

    models = folder / "models"
    shutil.rmtree(models, ignore_errors=True)
    models.mkdir(parents=True)
    served = variant(bundle, folder / "served.onnx", 0.5)
    candidate = variant(bundle, models / "candidate.onnx", 0.0)
    shas = {"served": file_sha256(served), "candidate": file_sha256(candidate)}
    counted = Counted()
    steps: dict[str, Any] = {}
    with (
        service(served, "--models-dir", str(models)) as first,
        service(served, "--models-dir", str(models)) as second,
    ):
        poster = Poster([first, second], counted)
        poster.start()
        try:
            change = {"bundle": "candidate.onnx", "force": True, "by": "abuse"}
            steps["promote"] = converge(
                counted, first, [first, second], "/v1/models/promote", change, shas["candidate"]
            )
            steps["promote_shadow_elsewhere"] = status_of(  # no shadow on that process: refused, never a 500
                counted.request("POST", second + "/v1/models/promote", json={}, headers=CHANGE)
            )
            steps["rollback"] = converge(counted, second, [first, second], "/v1/models/rollback", {"by": "abuse"},
                                         shas["served"])  # fmt: skip
            steps["readyz"] = [
                status_of(counted.request("GET", base + "/readyz")) for base in (first, second)
            ]
        finally:
            poster.halt.set()
            poster.join(30)
    converged = all(step.get("converged") for step in (steps["promote"], steps["rollback"]))
    return {
        "what": "two processes on one models store: promote through one, roll back through the other, a client "
        "posting to both",
        "steps": steps,
        "posted": poster.sent,
        "converged": converged,
        "statuses": dict(counted.statuses),
    }


def converge(
    counted: Counted, through: str, everyone: list[str], route: str, body: dict, sha: str
) -> dict[str, Any]:
    started = time.monotonic()
    answer = counted.request("POST", through + route, json=body, headers=CHANGE)
    waiting = set(everyone)
    while waiting and time.monotonic() - started < CONVERGE_S:
        for base in list(waiting):
            models = counted.request("GET", base + "/v1/models")
            if models is not None and models.status_code == 200 and models.json()["live"]["sha256"] == sha:
                waiting.discard(base)
        time.sleep(0.05)
    return {
        "status": status_of(answer),
        "converged": not waiting,
        "seconds": round(time.monotonic() - started, 2),
    }


# ------------------------------------------------------------------ 3. slow bodies
def probe_slow_bodies(bundle: Path, folder: Path, sockets: int = 5, limit_s: float = 45.0) -> dict[str, Any]:
    token = folder / "token"
    token.write_text("abuse-probe-token-0123456789abcdef\n")
    token.chmod(0o600)
    auth = {"Authorization": "Bearer abuse-probe-token-0123456789abcdef"}
    counted = Counted()
    with service(bundle, "--token-file", str(token), "--max-connections", "4") as base:
        port = int(base.rsplit(":", 1)[1])
        opened = []
        for index in range(sockets):
            route = "/healthz" if index % 2 == 0 else "/v1/detect"
            sock = socket.create_connection(("127.0.0.1", port), timeout=limit_s + 5)
            sock.sendall(
                f"POST {route} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: 100000\r\n"
                f"Authorization: {auth['Authorization']}\r\nContent-Type: application/octet-stream\r\n\r\n".encode()
            )
            sock.setblocking(False)
            opened.append(sock)
        started = time.monotonic()
        closed: dict[int, float] = {}
        meanwhile = []
        while len(closed) < len(opened) and time.monotonic() - started < limit_s:
            for index, sock in enumerate(opened):
                if index in closed:
                    continue
                try:
                    sock.send(b"x")
                    if sock.recv(4096) == b"":
                        closed[index] = time.monotonic() - started
                except BlockingIOError:
                    continue
                except OSError:
                    closed[index] = time.monotonic() - started
            if len(meanwhile) < 5 and time.monotonic() - started > 3 * (len(meanwhile) + 1):
                meanwhile.append(status_of(counted.request("GET", base + "/v1/model", headers=auth)))
            time.sleep(1.0)
        for sock in opened:
            sock.close()
    return {
        "what": f"{sockets} uploads (to /healthz and /v1/detect, Content-Length 100000) trickling 1 byte a second "
        "against --max-connections 4; an authenticated GET /v1/model every 3 s meanwhile",
        "closed_by_server": len(closed),
        "closed_after_s": sorted(round(value, 1) for value in closed.values()),
        "still_open_after_s": limit_s if len(closed) < len(opened) else None,
        "authenticated_meanwhile": meanwhile,
        "statuses": dict(counted.statuses),
    }


# ------------------------------------------------------------------ 4. a huge thin image
def thin_png(width: int) -> bytes:
    """A valid gray PNG of `width` x 1 pixels: a few kB that decode to `width` bytes."""
    header = struct.pack(">IIBBBBB", width, 1, 8, 0, 0, 0, 0)
    data = zlib.compress(b"\x00" + bytes(width), 9)

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", data) + chunk(b"IEND", b"")


def peak_rss_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        return None
    return None


def probe_thin_image(bundle: Path) -> dict[str, Any]:
    image = thin_png(20_000_000)
    _, template = board_pair()
    counted = Counted(timeout=60)
    started: list[subprocess.Popen] = []
    with service(bundle, started=started) as base:
        before = peak_rss_mib(started[0].pid)
        results: list[int] = []
        files = {"image": ("thin.png", image, "image/png"), "template": ("t.png", template, "image/png")}
        threads = [
            threading.Thread(
                target=lambda: results.append(
                    status_of(counted.request("POST", base + "/v1/detect", files=files))
                )
            )
            for _ in range(2)
        ]
        began = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        seconds = time.perf_counter() - began
        after = peak_rss_mib(started[0].pid)
    return {
        "what": f"two {len(image):,}-byte PNGs of 20,000,000 x 1 pixels at once",
        "answers": sorted(results),
        "seconds": round(seconds, 2),
        "peak_rss_mib_before": before,
        "peak_rss_mib_after": after,
        "statuses": dict(counted.statuses),
    }


# ------------------------------------------------------------------ 5. a busy port
def probe_busy_port(bundle: Path) -> dict[str, Any]:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        command = [
            sys.executable,
            "-m",
            "defectdet.cli",
            "serve",
            str(bundle),
            "--port",
            str(port),
            "--threads",
            "1",
        ]
        with tempfile.TemporaryFile() as log:
            try:
                code = subprocess.run(
                    command, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, timeout=120
                ).returncode
            except subprocess.TimeoutExpired:
                code = None
            log.seek(0)
            lines = [line for line in log.read().decode(errors="replace").splitlines() if line.strip()]
    return {
        "what": "serve on a port already taken",
        "exit_status": code,
        "last_line": lines[-1][:200] if lines else "",
    }


# ------------------------------------------------------------------ all of them
def run_line_probes(bundle: Path, folder: Path, review_s: float = 20.0) -> dict[str, Any]:
    """The probes above, in turn (each in its own service processes)."""
    probes = {
        "review_under_load": probe_review(bundle, folder, review_s),
        "fleet": probe_fleet(bundle, folder),
        "slow_bodies": probe_slow_bodies(bundle, folder),
        "thin_image": probe_thin_image(bundle),
        "busy_port": probe_busy_port(bundle),
    }
    return probes


def count_500(value: Any) -> int:
    """Answers with status 500 anywhere in a probe's record (`status`, `statuses`, `status_line`, lists)."""
    if isinstance(value, dict):
        total = 0
        for key, item in value.items():
            if key == "statuses" and isinstance(item, dict):
                total += int(item.get("500", 0))
            elif key in ("status", "decision_status") and item == 500:
                total += 1
            elif key == "status_line" and " 500 " in f"{item} ":
                total += 1
            else:
                total += count_500(item)
        return total
    if isinstance(value, list):
        return sum(1 for item in value if item == 500) + sum(count_500(item) for item in value)
    return 0


def summary(probes: dict[str, Any]) -> dict[str, Any]:
    line = probes.get("line", {})
    review = line.get("review_under_load", {}).get("folder", {})
    return {
        "status_500": count_500(probes),
        "labels_lost": review.get("labels_lost"),
        "fleet_converged": line.get("fleet", {}).get("converged"),
    }


if __name__ == "__main__":  # the line's probes alone: python -m bench.serve_abuse_line BUNDLE
    out = ROOT / "runs" / "serve_abuse"
    out.mkdir(parents=True, exist_ok=True)
    print(json.dumps(run_line_probes(Path(sys.argv[1]), out, float(sys.argv[2]) if len(sys.argv) > 2 else 10.0),
                     indent=1))  # fmt: skip

"""Several `serve` processes on one models store (serve.store): a promotion or roll-back through any of them
reaches all of them within 5 s while a client keeps posting images to every one; a process restarted later
serves the store's current generation; two promotions at once: one wins, the other gets 409; the workers of
`serve --workers 2 --keep all` follow the store too. Real processes on loopback, real bundles (the fixture's
bundle with its verdict threshold rewritten)."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from server_fakes import board, encode
from test_deployment import variant

from defectdet.runtime.bundle import read_metadata
from defectdet.serve.deployment import file_sha256

CHANGE = {"X-Defectdet-Request": "1"}
CONVERGE_S = 5.0


def _port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Serve:
    """One `defectdet serve` process on loopback."""

    def __init__(self, bundle: Path, models: Path, logs: Path, name: str, *extra: str) -> None:
        self.args = [
            sys.executable, "-c", "from defectdet.cli import app; app()", "serve", str(bundle),
            "--models-dir", str(models), "--threads", "1", "--max-concurrency", "1", *extra,
        ]  # fmt: skip
        self.log = logs / f"{name}.log"
        self.name = name
        self.process: subprocess.Popen | None = None
        self.url = ""

    def start(self) -> Serve:
        port = _port()
        self.url = f"http://127.0.0.1:{port}"
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen([*self.args, "--port", str(port)], stdout=log, stderr=log)
        return self

    def ready(self, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.process is not None and self.process.poll() is None, self.log.read_text()[-2000:]
            try:
                if httpx.get(self.url + "/readyz", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"{self.name} did not get ready: {self.log.read_text()[-2000:]}")

    def models(self) -> dict:
        return httpx.get(self.url + "/v1/models", timeout=10).json()

    def change(self, route: str, body: dict) -> httpx.Response:
        return httpx.post(self.url + route, json=body, headers=CHANGE, timeout=60)

    def stop(self, kill: bool = False) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL if kill else signal.SIGINT)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)


class Client(threading.Thread):
    """Posts images to every process in `up` in turn until stopped; records (process, status, version)."""

    def __init__(self, up: dict[str, Serve], template: bool) -> None:
        super().__init__(daemon=True)
        self.up = up
        self.files = {"image": ("a.png", encode(board(1, size=160)))}
        if template:
            self.files["template"] = ("t.png", encode(board(1, size=160, blob=False)))
        self.answers: list[tuple[str, int, str | None]] = []
        self.halt = threading.Event()

    def run(self) -> None:
        with httpx.Client(timeout=30) as client:
            while not self.halt.is_set():
                for name, process in list(self.up.items()):
                    try:
                        answer = client.post(process.url + "/v1/detect", files=self.files)
                        self.answers.append((name, answer.status_code, answer.json().get("model_version")))
                    except (httpx.HTTPError, ValueError) as error:
                        if name in self.up:  # a process taken down on purpose meanwhile does not count
                            self.answers.append((name, 0, repr(error)))
                time.sleep(0.02)


def _converge(processes: list[Serve], sha: str, since: float) -> float:
    """Seconds from `since` until every process's /v1/models says `sha` is live (fails beyond CONVERGE_S)."""
    waiting = {process.name: process for process in processes}
    while waiting:
        for name, process in list(waiting.items()):
            if process.models()["live"]["sha256"] == sha:
                del waiting[name]
        elapsed = time.monotonic() - since
        assert elapsed < CONVERGE_S, f"{sorted(waiting)} still not on {sha[:12]} after {elapsed:.1f} s"
        time.sleep(0.05)
    return time.monotonic() - since


def _workers_serving(process: Serve, sha: str) -> set[str]:
    """The worker pids whose defectdet_model_serving gauge says `sha` (serve --workers: one line per pid)."""
    text = httpx.get(process.url + "/metrics", timeout=10).text
    pattern = re.compile(r"^defectdet_model_serving\{(.*)\} 1\.0$", re.MULTILINE)
    return {
        re.search(r'pid="(\d+)"', labels).group(1)  # type: ignore[union-attr]
        for labels in pattern.findall(text)
        if f'sha256="{sha}"' in labels
    }


@pytest.mark.skipif(not hasattr(os, "fork"), reason="POSIX processes")
def test_three_processes_and_two_workers_follow_one_store(bundle_path: Path, tmp_path: Path) -> None:
    began = time.monotonic()
    models, logs = tmp_path / "models", tmp_path / "logs"
    models.mkdir()
    logs.mkdir()
    served = variant(bundle_path, tmp_path / "model.onnx", 1.0)
    shas = {"A": file_sha256(served)}
    for name, threshold in (("B", 0.0), ("C", 0.3), ("D", 0.4), ("E", 0.6)):
        shas[name] = file_sha256(variant(bundle_path, models / f"{name}.onnx", threshold))
    fleet = [Serve(served, models, logs, f"p{index}").start() for index in range(3)]
    kept = tmp_path / "kept"
    workers = Serve(
        served, models, logs, "workers", "--workers", "2", "--keep", "all", "--keep-dir", str(kept)
    )
    workers.start()
    everyone = [*fleet, workers]
    client = Client({}, read_metadata(bundle_path).template)
    timings: dict[str, float] = {}
    try:
        for process in everyone:
            process.ready()
        assert {process.models()["live"]["sha256"] for process in everyone} == {shas["A"]}
        client.up.update({process.name: process for process in everyone})
        client.start()

        started = time.monotonic()
        promoted = fleet[0].change("/v1/models/promote", {"bundle": "B.onnx", "force": True, "by": "anna"})
        assert promoted.status_code == 200, promoted.text
        timings["answered"] = (
            time.monotonic() - started
        )  # the promoting process loaded B and wrote generation 2
        timings["promote"] = _converge(everyone, shas["B"], started)
        deadline = time.monotonic() + CONVERGE_S
        while len(_workers_serving(workers, shas["B"])) < 2:
            assert time.monotonic() < deadline, "the two workers of serve --workers 2 did not both follow"
            time.sleep(0.1)

        del client.up["p2"]
        fleet[2].stop(kill=True)  # down while the line moves on
        started = time.monotonic()
        back = fleet[1].change("/v1/models/rollback", {"by": "olga"})
        assert back.status_code == 200, back.text
        timings["rollback"] = _converge([fleet[0], fleet[1], workers], shas["A"], started)
        again = fleet[0].change("/v1/models/promote", {"bundle": "C.onnx", "force": True})
        assert again.status_code == 200, again.text
        generation = again.json()["done"]["generation"]

        fleet[2].start().ready()  # restarted: comes up on the store's current generation
        report = fleet[2].models()
        assert report["live"]["sha256"] == shas["C"] and report["live"]["generation"] == generation
        assert report["store"]["generation"] == generation
        client.up["p2"] = fleet[2]

        answers: dict[str, httpx.Response] = {}
        gate = threading.Barrier(2)

        def promote(process: Serve, name: str) -> None:
            gate.wait()
            body = {"bundle": f"{name}.onnx", "force": True, "generation": generation}
            answers[name] = process.change("/v1/models/promote", body)

        racers = [threading.Thread(target=promote, args=pair) for pair in ((fleet[0], "D"), (fleet[1], "E"))]
        for racer in racers:
            racer.start()
        for racer in racers:
            racer.join(60)
        statuses = sorted(answer.status_code for answer in answers.values())
        assert statuses == [200, 409], {name: answer.text for name, answer in answers.items()}
        winner = next(name for name, answer in answers.items() if answer.status_code == 200)
        loser = next(answer for answer in answers.values() if answer.status_code == 409)
        assert f"generation {generation + 1} is live" in loser.json()["error"]
        _converge(everyone, shas[winner], time.monotonic())
        time.sleep(0.3)  # the client answers once more on every process
    finally:
        client.halt.set()
        client.join(30)
        for process in everyone:
            process.stop()
    failed = [answer for answer in client.answers if answer[1] != 200]
    assert not failed, failed[:5]
    assert any((kept / "images").iterdir())  # the workers kept what they answered
    seen = {version for _, _, version in client.answers}
    assert {shas[name][:12] for name in "ABC"} <= seen
    print(
        f"every process on the new model {timings['promote']:.2f} s after the promotion was sent (answered after "
        f"{timings['answered']:.2f} s), {timings['rollback']:.2f} s after the roll-back; {len(client.answers)} answers; {time.monotonic() - began:.0f} s in all"
    )

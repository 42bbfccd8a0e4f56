"""Load test of `defectdet serve`: throughput, latency, errors, 503s under overload, and memory.

Starts the service on loopback in a child process (`python -m defectdet.cli serve`), posts DeepPCB
validation pairs (640x640 JPEG image + template) with httpx async clients:
1. warm-up (--warmup requests, not counted);
2. steady load below the limit: --requests requests from --clients clients -> req/s, p50/p99, statuses,
   the server's RSS after warm-up and at the end (sampled every 0.5 s in between);
3. deliberate overload: --overload-clients clients (far beyond max_concurrency + max_queue) for
   --overload-requests requests -> how many 503s and that nothing else fails; meanwhile a separate
   sequential client process (40 probes) times detect (200 or 503) and /healthz: the load generator's own
   timings include its queueing behind 48 coroutines on a starved CPU.
The clients run on the same machine as the server and take CPU from it.

Run: python -m bench.serve_load [--bundle runs/deeppcb_nano/model.onnx] [--requests 5000]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from bench.common import print_table, summarize, wait_until_ready, write_result
from defectdet.data.formats import load_dataset

ROOT = Path(__file__).resolve().parents[1]


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def percentile(values: list[float], q: float) -> float | None:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else None


def encode(image: Path, template: Path) -> tuple[bytes, dict[str, str]]:
    """The multipart body once, up front (the clients share the server's cores: keep their work small)."""
    files = {"image": (image.name, image.read_bytes(), "image/jpeg")}
    files["template"] = (template.name, template.read_bytes(), "image/jpeg")
    request = httpx.Request("POST", "http://unused/v1/detect", files=files)
    return request.read(), {"content-type": request.headers["content-type"]}


async def drive(
    url: str, payloads: list[tuple[bytes, dict[str, str]]], requests: int, clients: int, timeout_s: float
) -> dict[str, Any]:
    """`clients` coroutines post payloads round-robin until `requests` were sent or `timeout_s` passed."""
    statuses: collections.Counter[str] = collections.Counter()
    latencies: dict[str, list[float]] = collections.defaultdict(list)
    server_timings: dict[str, list[float]] = collections.defaultdict(list)
    sent = 0
    deadline = time.perf_counter() + timeout_s
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)

    async def client(http: httpx.AsyncClient) -> None:
        nonlocal sent
        while sent < requests and time.perf_counter() < deadline:
            body, headers = payloads[sent % len(payloads)]
            sent += 1
            started = time.perf_counter()
            try:
                response = await http.post(url, content=body, headers=headers)
                status = str(response.status_code)
                if response.status_code == 200:
                    for key, value in response.json()["timings_ms"].items():
                        server_timings[key].append(value)
            except httpx.HTTPError as error:
                status = type(error).__name__
            statuses[status] += 1
            latencies[status].append((time.perf_counter() - started) * 1e3)

    started = time.perf_counter()
    async with httpx.AsyncClient(limits=limits, timeout=60.0) as http:
        await asyncio.gather(*(client(http) for _ in range(clients)))
    elapsed = time.perf_counter() - started
    ok = latencies.get("200", [])
    return {
        "requests": sum(statuses.values()),
        "clients": clients,
        "seconds": round(elapsed, 2),
        "requests_per_s": round(sum(statuses.values()) / elapsed, 1),
        "ok_per_s": round(len(ok) / elapsed, 1),
        "statuses": dict(statuses),
        "latency_ms_200": {"p50": percentile(ok, 0.5), "p99": percentile(ok, 0.99), **summarize(ok)},
        "latency_ms_503": {
            "p50": percentile(latencies.get("503", []), 0.5),
            "max": max(latencies.get("503", [0])),
        },
        "server_timings_ms_p50": {key: percentile(values, 0.5) for key, values in server_timings.items()},
        "server_total_ms_p99": percentile(server_timings.get("total", []), 0.99),
    }


def probe(url: str, payload_path: Path, template_path: Path, count: int, period_s: float) -> dict[str, Any]:
    """One sequential client in its own process (the load generator's own CPU queueing is not in its
    timings): how fast detect answers (200 or 503) and /healthz answers while the server is overloaded."""
    body, headers = encode(payload_path, template_path)
    timings: dict[str, list[float]] = collections.defaultdict(list)
    with httpx.Client(timeout=60.0) as http:
        for _ in range(count):
            started = time.perf_counter()
            status = http.post(url + "/v1/detect", content=body, headers=headers).status_code
            timings[str(status)].append((time.perf_counter() - started) * 1e3)
            started = time.perf_counter()
            http.get(url + "/healthz")
            timings["healthz"].append((time.perf_counter() - started) * 1e3)
            time.sleep(period_s)
    return {
        key: {"count": len(values), "p50": percentile(values, 0.5), "max": max(values)}
        for key, values in timings.items()
    }


class RssSampler(threading.Thread):
    def __init__(self, pid: int, period_s: float = 0.5) -> None:
        super().__init__(daemon=True)
        self.pid, self.period_s = pid, period_s
        self.samples: list[float] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(self.period_s):
            self.samples.append(rss_mib(self.pid))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--bundle", type=Path, default=ROOT / "runs/deeppcb_nano/model.onnx")
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared/datasets/deeppcb")
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--overload-requests", type=int, default=1500)
    parser.add_argument("--overload-clients", type=int, default=48)
    parser.add_argument("--max-concurrency", type=int, default=2)
    parser.add_argument("--max-queue", type=int, default=8)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--time-limit", type=float, default=300.0, help="seconds per phase at most")
    parser.add_argument(
        "--pairs", type=int, default=32, help="distinct image/template pairs to cycle through"
    )
    parser.add_argument("--name", default="serve_load")
    parser.add_argument("--probe", default=None, help=argparse.SUPPRESS)  # internal: run as the probe process
    args = parser.parse_args()
    split = load_dataset(args.data, "val")
    if args.probe:
        sample = split.samples[0]
        print(json.dumps(probe(args.probe, sample.image_path, sample.template_path, 40, 0.1)))
        return

    spread = split.samples[:: max(1, len(split.samples) // args.pairs)][: args.pairs]  # across board groups
    payloads = [encode(sample.image_path, sample.template_path) for sample in spread]
    port = free_port()
    command = [
        sys.executable, "-m", "defectdet.cli", "serve", str(args.bundle), "--port", str(port),
        "--max-concurrency", str(args.max_concurrency), "--max-queue", str(args.max_queue),
    ] + (["--threads", str(args.threads)] if args.threads else [])  # fmt: skip
    log = open(ROOT / "bench/results" / f"{args.name}.server.log", "w")  # noqa: SIM115
    server = subprocess.Popen(
        command, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "COLUMNS": "200"}
    )
    base = f"http://127.0.0.1:{port}"
    try:
        try:
            wait_until_ready(server, base, log_path=log.name)
        except RuntimeError as error:
            raise SystemExit(str(error)) from None
        rss_ready = rss_mib(server.pid)
        url = base + "/v1/detect"
        warm = asyncio.run(drive(url, payloads, args.warmup, args.clients, args.time_limit))
        rss_start = rss_mib(server.pid)
        sampler = RssSampler(server.pid)
        sampler.start()
        steady = asyncio.run(drive(url, payloads, args.requests, args.clients, args.time_limit))
        sampler.stop.set()
        sampler.join()
        rss_end = rss_mib(server.pid)
        prober = subprocess.Popen(
            [sys.executable, "-m", "bench.serve_load", "--probe", base, "--data", str(args.data)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )
        overload = asyncio.run(
            drive(url, payloads, args.overload_requests, args.overload_clients, args.time_limit)
        )
        probed = json.loads(prober.communicate(timeout=300)[0])
        rss_after_overload = rss_mib(server.pid)
        metrics = httpx.get(base + "/metrics", timeout=10).text
        model = httpx.get(base + "/v1/model", timeout=10).json()
    finally:
        server.terminate()
        try:
            server.wait(20)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()

    rows = [
        ["warm-up", warm["requests"], warm["clients"], warm["requests_per_s"], warm["latency_ms_200"]["p50"],
         warm["latency_ms_200"]["p99"], str(warm["statuses"])],
        ["steady (below the limit)", steady["requests"], steady["clients"], steady["requests_per_s"],
         steady["latency_ms_200"]["p50"], steady["latency_ms_200"]["p99"], str(steady["statuses"])],
        ["overload", overload["requests"], overload["clients"], overload["requests_per_s"],
         overload["latency_ms_200"]["p50"], overload["latency_ms_200"]["p99"], str(overload["statuses"])],
    ]  # fmt: skip
    from rich.console import Console

    console = Console(width=150)
    print_table(
        f"defectdet serve {args.bundle.name}: concurrency {args.max_concurrency}, queue {args.max_queue}",
        ["phase", "requests", "clients", "req/s", "p50 ms (200)", "p99 ms (200)", "statuses"],
        rows,
        console=console,
    )
    console.print(
        f"RSS: ready {rss_ready:.1f} MiB, after warm-up {rss_start:.1f}, after {steady['requests']} requests "
        f"{rss_end:.1f} (growth {rss_end - rss_start:+.1f}), max sampled {max(sampler.samples, default=rss_end):.1f}, "
        f"after overload {rss_after_overload:.1f}"
    )
    console.print(f"during overload, a separate sequential client saw: {probed}")
    scraped = [line for line in metrics.splitlines() if line.startswith("defectdet_requests_total{")]
    path = write_result(
        args.name,
        {
            "note": "2-core machine shared with other engineers' jobs while this ran; the load clients run "
            "on the same cores as the server",
            "bundle": str(args.bundle),
            "model_version": model["model_version"],
            "settings": model["settings"],
            "threads": args.threads or "default (cores / concurrency)",
            "payload": f"{len(payloads)} DeepPCB val pairs, 640x640 JPEG image + template",
            "warmup": warm,
            "steady": steady,
            "overload": overload,
            "overload_probe": probed,
            "rss_mib": {
                "ready": round(rss_ready, 1),
                "start_after_warmup": round(rss_start, 1),
                "end": round(rss_end, 1),
                "growth": round(rss_end - rss_start, 1),
                "max_sampled": round(max(sampler.samples, default=rss_end), 1),
                "after_overload": round(rss_after_overload, 1),
                "samples": [
                    round(value, 1) for value in sampler.samples[:: max(1, len(sampler.samples) // 60)]
                ],
            },
            "server_request_counters": scraped,
        },
    )
    console.print(f"wrote {path}")


if __name__ == "__main__":
    main()

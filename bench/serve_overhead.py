"""The service's own cost: `defectdet serve` against the in-process `Predictor`, side by side in one run.

The same bundle and the same 640 x 640 JPEG pair (an image and its template) go to a `Predictor` in this
process (its default threads) and to `defectdet serve` on 127.0.0.1 (a free port, a child process started
and stopped here), at 1, 2, 4 and 8 concurrent callers. Each level alternates blocks of the two sides
(in-process, served, served, in-process, ...) so that other work on a shared machine slows both alike;
throughput is requests over the seconds of a side's blocks, latency the p50 over its requests. Served
configurations: serve's defaults; `--keep flagged --keep-dir DIR --models-dir DIR` (the pair is flagged, so
every answer is written to the keep folder: the most the keep writer does); `--workers 2`. Not `uncertain`:
the default bundle is barely trained and its stored threshold is near 0, so `uncertain` would ask the model
for every detection down to 0 (300 per image), which no trained bundle does.
The clients are threads with keep-alive `http.client` connections posting a body encoded once (little CPU
taken from the server on the same cores); a request that does not answer 200 is counted as an error.

The floor of serving over HTTP from Python: a bare ASGI app under uvicorn's h11 protocol (`FLOOR_APP`: reads the
same body, answers a JSON of the service's answer's length, no framework, no form parsing, no model) at one
client, its CPU per request and p50 round trip (`http_floor`).

Reported per level: throughput ratio (served / in-process; also the median of the ratios of each pair of
neighbouring blocks, less moved by a neighbour's job starting mid-level), p50 overhead in ms (served p50 -
in-process p50), CPU milliseconds per request of each side (the in-process side: this process; served: the
server's processes and the clients; the least moved by other jobs on the machine), the part of it the server's
event loop spent (its main thread: HTTP, the form, the guards, the answer) and the server's own p50 timings
(receive, queue, decode, model, ...). Targets: a ratio of at least
0.95 at 4 clients and at most 2 ms of p50 overhead at 1 client, with no error.

Run: python -m bench.serve_overhead [--bundle model.onnx] [--requests 96] (without --bundle: a nano template
bundle with a 640 px input is trained for a few steps and exported once into runs/serve_overhead/, about a
minute). Writes bench/results/serve_overhead.json; about 3-5 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import http.client
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common import print_table, summarize, wait_until_ready, write_result
from bench.serve_abuse import free_port, service
from bench.serve_load import encode, percentile

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_BUNDLE_DIR = ROOT / "runs/serve_overhead"
DEFAULT_DATA = ROOT.parent / "shared/datasets/deeppcb"
KEEP_POLICY = "flagged"  # the pair is flagged: every answer is kept (written to disk)
TARGET_RATIO_AT_4 = 0.95
TARGET_P50_OVERHEAD_AT_1_MS = 2.0
BUILD_BUNDLE = (
    "from pathlib import Path; from bench.serve_abuse import tiny_bundle; "
    "print(tiny_bundle(Path({folder!r}), size=640, epochs=1))"
)


def default_bundle(folder: Path) -> Path:
    """A nano template bundle with a 640 px input (`serve_abuse.tiny_bundle`), built in a child process so
    that torch is never imported here."""
    bundle = folder / "model.onnx"
    if not bundle.is_file():
        code = BUILD_BUNDLE.format(folder=str(folder))
        subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
    return bundle


def the_pair(data: Path, bundle_dir: Path) -> tuple[Path, Path]:
    """The first DeepPCB validation pair (640 x 640 JPEG), or a synthetic board of the bundle's data resized
    to 640 x 640 when DeepPCB is not there."""
    from defectdet.data.formats import load_dataset

    if data.exists():
        sample = load_dataset(data, "val").samples[0]
        return Path(sample.image_path), Path(sample.template_path)
    import cv2

    sample = load_dataset(bundle_dir / "data/data.yaml", "val").samples[0]
    pair = []
    for kind, source in (("image", sample.image_path), ("template", sample.template_path)):
        target = bundle_dir / f"pair_{kind}.jpg"
        board = cv2.imread(str(source), cv2.IMREAD_GRAYSCALE)
        cv2.imwrite(str(target), cv2.resize(board, (640, 640)), [cv2.IMWRITE_JPEG_QUALITY, 90])
        pair.append(target)
    return pair[0], pair[1]


def process_cpu_s(pid: int, main_thread: bool = False) -> float:
    """CPU seconds (user + system) of process `pid` and its descendants (the workers of `--workers N`);
    `main_thread`: of each one's main thread only (the service's event loop)."""
    tick = os.sysconf("SC_CLK_TCK")
    try:
        stat = Path(f"/proc/{pid}/task/{pid}/stat" if main_thread else f"/proc/{pid}/stat").read_text()
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:  # it ended
        return 0.0
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / tick + sum(
        process_cpu_s(int(child), main_thread) for child in children
    )


def run_threads(
    clients: int, count: int, call: Callable[[], float | None], server_pid: int | None = None
) -> dict[str, Any]:
    """`clients` threads run `call` until `count` calls were made: latencies (ms), errors, seconds, and the
    CPU seconds this process and the server (`server_pid`) spent meanwhile."""
    counter = itertools.count()
    latencies: list[float] = []
    server_totals: list[float] = []
    errors: list[str] = []

    def worker() -> None:
        while next(counter) < count:
            started = time.perf_counter()
            try:
                total = call()
            except Exception as error:  # counted, never raised: the level goes on
                errors.append(f"{type(error).__name__}: {error}"[:200])
                continue
            latencies.append((time.perf_counter() - started) * 1e3)
            if total is not None:
                server_totals.append(total)

    threads = [threading.Thread(target=worker) for _ in range(clients)]
    cpu, server_cpu, loop_cpu, started = (
        time.process_time(),
        process_cpu_s(server_pid) if server_pid else 0.0,
        process_cpu_s(server_pid, main_thread=True) if server_pid else 0.0,
        time.perf_counter(),
    )
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return {
        "seconds": time.perf_counter() - started, "latencies": latencies, "errors": errors, "totals": server_totals,
        "cpu_s": time.process_time() - cpu,
        "server_cpu_s": process_cpu_s(server_pid) - server_cpu if server_pid else 0.0,
        "server_loop_cpu_s": process_cpu_s(server_pid, main_thread=True) - loop_cpu if server_pid else 0.0,
    }  # fmt: skip


class Poster:
    """One keep-alive connection per client thread, posting the same encoded body; returns the server's
    timings of each answer (kept for the breakdown)."""

    def __init__(self, port: int, body: bytes, headers: dict[str, str], pid: int) -> None:
        self.port, self.body, self.pid = port, body, pid
        self.headers = {**headers, "Content-Length": str(len(body))}
        self.local = threading.local()
        self.timings: list[dict[str, float]] = []
        self.answer_bytes = 0  # the last answer's length

    def __call__(self) -> None:
        connection = getattr(self.local, "connection", None)
        if connection is None:
            connection = self.local.connection = http.client.HTTPConnection(
                "127.0.0.1", self.port, timeout=60
            )
        connection.request("POST", "/v1/detect", self.body, self.headers)
        response = connection.getresponse()
        payload = response.read()
        if response.status != 200:
            connection.close()
            self.local.connection = None
            raise RuntimeError(f"status {response.status}: {payload[:120]!r}")
        self.answer_bytes = len(payload)
        self.timings.append(json.loads(payload)["timings_ms"])

    def close(self) -> None:
        self.local = threading.local()  # the threads that held connections have ended


def measure_level(
    clients: int, requests: int, rounds: int, in_process: Callable[[], Any], served: Poster
) -> dict[str, Any]:
    """Both sides at `clients`, in `rounds` alternating blocks of requests / rounds each."""
    block = max(clients, requests // rounds)
    sides: dict[str, list[dict[str, Any]]] = {"in_process": [], "served": []}
    served.timings.clear()
    for index in range(rounds):
        order = ("in_process", "served") if index % 2 == 0 else ("served", "in_process")
        for side in order:
            if side == "in_process":
                sides[side].append(run_threads(clients, block, in_process))
            else:
                sides[side].append(run_threads(clients, block, served, served.pid))
    row = {side: side_summary(blocks) for side, blocks in sides.items()}
    row["clients"] = clients
    row["throughput_ratio"] = round(row["served"]["requests_per_s"] / row["in_process"]["requests_per_s"], 3)
    row["paired_ratio_median"] = round(paired_ratio(sides["served"], sides["in_process"]), 3)
    row["p50_overhead_ms"] = round(row["served"]["p50_ms"] - row["in_process"]["p50_ms"], 2)
    row["cpu_overhead_ms_per_request"] = round(
        row["served"]["cpu_ms_per_request"] - row["in_process"]["cpu_ms_per_request"], 2
    )
    row["server_timings_ms_p50"] = {
        key: round(percentile([timing[key] for timing in served.timings], 0.5), 2)
        for key in (served.timings[0] if served.timings else {})
    }
    return row


def paired_ratio(served: list[dict[str, Any]], in_process: list[dict[str, Any]]) -> float:
    """The median over rounds of (served throughput / in-process throughput) of the same round."""

    def rate(block: dict[str, Any]) -> float:
        return len(block["latencies"]) / block["seconds"]

    return statistics.median(
        rate(ours) / rate(theirs) for ours, theirs in zip(served, in_process, strict=True)
    )


def side_summary(blocks: list[dict[str, Any]]) -> dict[str, Any]:
    latencies = [value for block in blocks for value in block["latencies"]]
    seconds = sum(block["seconds"] for block in blocks)
    errors = [error for block in blocks for error in block["errors"]]
    stats = summarize(latencies)
    cpu, server_cpu, loop_cpu = (
        sum(block[key] for block in blocks) for key in ("cpu_s", "server_cpu_s", "server_loop_cpu_s")
    )
    return {
        # CPU of every process involved per answered request: this one (the in-process side, or the
        # clients) and the server's; less moved by other jobs on the machine than the seconds are
        "cpu_ms_per_request": round((cpu + server_cpu) * 1e3 / max(1, len(latencies)), 2),
        "server_cpu_ms_per_request": round(server_cpu * 1e3 / max(1, len(latencies)), 2),
        "server_loop_cpu_ms_per_request": round(loop_cpu * 1e3 / max(1, len(latencies)), 2),
        "requests": len(latencies) + len(errors),
        "errors": len(errors),
        "first_errors": errors[:3],
        "seconds": round(seconds, 3),
        "requests_per_s": round(len(latencies) / seconds, 2) if seconds else 0.0,
        "p50_ms": round(percentile(latencies, 0.5) or 0.0, 2),
        # the in-process side: the pipeline's own p50 (its `total`); the served side's is `compute` below
        "pipeline_p50_ms": round(percentile([t for block in blocks for t in block["totals"]], 0.5) or 0.0, 2),
        "p90_ms": round(stats.get("p90", 0.0), 2),
        "mean_ms": round(stats.get("mean", 0.0), 2),
    }


def configurations(scratch: Path, workers: bool) -> dict[str, tuple[str, ...]]:
    """Served configurations by name -> serve options (defaults otherwise)."""
    found = {
        "default": (),
        "keep_and_models_dir": (
            "--keep", KEEP_POLICY, "--keep-dir", str(scratch / "keep"), "--models-dir", str(scratch / "models"),
        ),
    }  # fmt: skip
    if workers:
        found["workers_2"] = ("--workers", "2")
    return found


def measure_configuration(
    bundle: Path, options: tuple[str, ...], payload: tuple[bytes, dict[str, str]], args: argparse.Namespace
) -> dict[str, Any]:
    """Start the service with `options`, warm both sides, then every level."""
    from defectdet.runtime.predictor import Predictor

    predictor = Predictor(bundle)
    image, template = args.image.read_bytes(), args.template.read_bytes()

    def in_process() -> float:  # the pipeline's own time (decode to postprocess), as the server reports it
        return predictor.predict(image, template=template).timings["total"]

    started: list[subprocess.Popen] = []
    with service(bundle, *options, limits=(), started=started) as base:
        poster = Poster(int(base.rsplit(":", 1)[1]), *payload, pid=started[0].pid)
        run_threads(1, args.warmup, in_process)
        run_threads(2, args.warmup, poster)  # --workers 2: both processes warm
        levels = [
            measure_level(clients, args.requests, args.rounds, in_process, poster) for clients in args.clients
        ]
        poster.close()
    return {
        "options": list(options), "in_process_threads": predictor.threads, "levels": levels,
        "answer_bytes": poster.answer_bytes,
    }  # fmt: skip


FLOOR_APP = """
import sys, uvicorn
ANSWER = b'{"timings_ms":{},"pad":"' + b"x" * int(sys.argv[2]) + b'"}'
HEAD = {"type": "http.response.start", "status": 200, "headers": [
    (b"content-type", b"application/json"), (b"content-length", str(len(ANSWER)).encode())]}
async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    more = True
    while more:
        more = (await receive()).get("more_body", False)
    await send(HEAD)
    await send({"type": "http.response.body", "body": ANSWER})
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), http="h11", log_config=None, access_log=False)
"""


def measure_floor(
    payload: tuple[bytes, dict[str, str]], answer_bytes: int, args: argparse.Namespace
) -> dict[str, Any]:
    """The bare ASGI app (`FLOOR_APP`) under uvicorn's h11 protocol at one client: what serving the same body
    and an answer of the same length over HTTP from Python costs with no framework, form parsing or model."""
    port = free_port()
    process = subprocess.Popen([sys.executable, "-c", FLOOR_APP, str(port), str(max(0, answer_bytes - 24))])
    try:
        wait_until_ready(process, f"http://127.0.0.1:{port}", timeout_s=30)
        poster = Poster(port, *payload, pid=process.pid)
        run_threads(1, args.warmup, poster)
        summary = side_summary([run_threads(1, args.requests, poster, process.pid)])
    finally:
        process.terminate()
        process.wait(30)
    keys = (
        "requests",
        "errors",
        "requests_per_s",
        "p50_ms",
        "cpu_ms_per_request",
        "server_cpu_ms_per_request",
    )
    return {"clients": 1, "answer_bytes": answer_bytes, **{key: summary[key] for key in keys}}


def verdicts(configs: dict[str, Any]) -> dict[str, Any]:
    """Per configuration: the targets' two numbers and whether they are met (with no error)."""
    found = {}
    for name, config in configs.items():
        levels = {level["clients"]: level for level in config["levels"]}
        ratio = levels.get(4, {}).get("throughput_ratio")
        overhead = levels.get(1, {}).get("p50_overhead_ms")
        errors = sum(level["served"]["errors"] + level["in_process"]["errors"] for level in levels.values())
        found[name] = {
            "throughput_ratio_at_4": ratio,
            "p50_overhead_ms_at_1": overhead,
            "errors": errors,
            "met": ratio is not None
            and overhead is not None
            and ratio >= TARGET_RATIO_AT_4
            and overhead <= TARGET_P50_OVERHEAD_AT_1_MS
            and errors == 0,
        }
    return found


def show(configs: dict[str, Any]) -> None:
    from rich.console import Console

    rows = []
    for name, config in configs.items():
        for level in config["levels"]:
            ours, theirs = level["served"], level["in_process"]
            rows.append([
                name, level["clients"], theirs["requests_per_s"], ours["requests_per_s"], level["throughput_ratio"],
                level["paired_ratio_median"], theirs["p50_ms"], ours["p50_ms"], level["p50_overhead_ms"],
                theirs["cpu_ms_per_request"], ours["cpu_ms_per_request"], ours["errors"],
            ])  # fmt: skip
    columns = ["served as", "clients", "in-process req/s", "served req/s", "ratio", "paired ratio",
               "in-process p50 ms", "served p50 ms", "p50 overhead ms", "in-process CPU ms/req",
               "served CPU ms/req", "errors"]  # fmt: skip
    print_table("defectdet serve against the in-process Predictor", columns, rows, console=Console(width=200))


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--bundle", type=Path, default=None, help="default: built once in runs/serve_overhead/"
    )
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="the pair: its first val sample")
    parser.add_argument("--requests", type=int, default=192, help="requests per side and level")
    parser.add_argument("--rounds", type=int, default=8, help="alternating blocks per side and level")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--no-workers", action="store_true", help="skip the --workers 2 configuration")
    parser.add_argument("--only", nargs="+", default=None, help="configurations to run (default: all)")
    parser.add_argument("--name", default="serve_overhead")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    bundle = args.bundle or default_bundle(DEFAULT_BUNDLE_DIR)
    args.image, args.template = the_pair(args.data, DEFAULT_BUNDLE_DIR)
    payload = encode(args.image, args.template)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="serve_overhead_") as scratch:
        wanted = configurations(Path(scratch), not args.no_workers)
        configs = {
            name: measure_configuration(bundle, options, payload, args)
            for name, options in wanted.items()
            if args.only is None or name in args.only
        }
    answer_bytes = next(iter(configs.values()))["answer_bytes"] if configs else 3000
    floor = measure_floor(payload, answer_bytes, args)
    show(configs)
    print(f"HTTP floor (bare ASGI app, 1 client): {json.dumps(floor)}")
    found = verdicts(configs)
    print(json.dumps(found, indent=1))
    path = write_result(args.name, {
        "note": "2-core machine shared with other long CPU jobs while this ran: absolute numbers are noisy; "
        "both sides run interleaved in the same run, so the ratios and overheads compare like with like",
        "bundle": str(bundle), "pair": [str(args.image), str(args.template)],
        "requests_per_side_and_level": args.requests, "rounds": args.rounds, "keep_policy": KEEP_POLICY,
        "targets": {"throughput_ratio_at_4": TARGET_RATIO_AT_4, "p50_overhead_ms_at_1": TARGET_P50_OVERHEAD_AT_1_MS},
        "verdicts": found, "configurations": configs, "http_floor": floor, "seconds": round(time.perf_counter() - started, 1),
    })  # fmt: skip
    print(f"wrote {path}")


if __name__ == "__main__":
    main()

"""Shared helpers for the benchmarks: machine/version info, JSON results, a rich table.

Benchmarks run from the repository root as `python -m bench.<name>` and import `from bench.common import ...`.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import os
import platform
import statistics
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from bench.result_schema import SCHEMA_VERSION, check

# BENCH_RESULTS_DIR: where a smoke run (`python -m bench run --suite quick`) writes, away from the committed files
RESULTS_DIR = Path(os.environ.get("BENCH_RESULTS_DIR") or Path(__file__).resolve().parent / "results")
DEFAULT_PACKAGES = ("torch", "numpy", "opencv-python-headless", "albumentations", "onnxruntime", "defectdet")


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def machine_info() -> dict[str, Any]:
    """CPU model, cores, memory, OS and the current load (other work on the box skews timings)."""
    info: dict[str, Any] = {
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "usable_cores": usable_cores(),
        "platform": platform.platform(),
        "python": platform.python_version(),
    }
    try:
        meminfo = Path("/proc/meminfo").read_text().splitlines()
        total_kb = next(int(line.split()[1]) for line in meminfo if line.startswith("MemTotal"))
        info["memory_gib"] = round(total_kb / 2**20, 1)
    except (OSError, StopIteration, ValueError):
        pass
    if hasattr(os, "getloadavg"):
        info["load_average"] = [round(value, 2) for value in os.getloadavg()]
    return info


def versions(packages: Sequence[str] = DEFAULT_PACKAGES) -> dict[str, str | None]:
    """Installed versions of `packages` (distribution names); None when not installed."""
    found: dict[str, str | None] = {"python": platform.python_version()}
    for package in packages:
        try:
            found[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            found[package] = None
    return found


def _git(*args: str) -> str | None:
    """stdout of `git ARGS` run at the repository root, or None when git cannot run."""
    try:
        result = subprocess.run(
            ["git", *args],
            cwd=Path(__file__).resolve().parents[1],
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return result.stdout


def git_commit() -> str | None:
    # a copy of the tree on another machine (a lent GPU machine) names the commit it was made from: its own
    # .git, if any, need not be this checkout's
    if os.environ.get("BENCH_GIT_COMMIT"):
        return os.environ["BENCH_GIT_COMMIT"]
    output = _git("rev-parse", "--short", "HEAD")
    return (output or "").strip() or None


def uncommitted_code(produced: Sequence[Path] = ()) -> list[str] | None:
    """Tracked files under src/ and bench/ that differ from HEAD: a result measured on them is not HEAD's.

    `produced`: files the bench itself wrote (bench/pretrain.py writes the package's weights); they are its
    output, not the code it ran, so they do not count."""
    if os.environ.get("BENCH_GIT_COMMIT"):
        return None  # unknown there: the caller vouches for the commit
    output = _git("status", "--porcelain", "--untracked-files=no", "--", "src", "bench/*.py")
    if output is None:
        return None
    root = Path(__file__).resolve().parents[1]
    outputs = {Path(path).resolve() for path in produced}
    changed = [line[3:] for line in output.splitlines() if line.strip()]
    return [path for path in changed if (root / path).resolve() not in outputs]


def refuse_uncommitted(allow: bool) -> bool:
    """Stop a benchmark run from a tree with uncommitted code unless `allow` (--allow-dirty); returns whether
    the tree is dirty, for the result file's `dirty` field."""
    changed = uncommitted_code()
    if changed and not allow:
        raise SystemExit(f"uncommitted code ({', '.join(changed)}): commit it, or pass --allow-dirty")
    return bool(changed)


def environment(packages: Sequence[str] = DEFAULT_PACKAGES, produced: Sequence[Path] = ()) -> dict[str, Any]:
    return {
        "timestamp": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "git_commit": git_commit(),
        "uncommitted_code": uncommitted_code(produced),
        "machine": machine_info(),
        "versions": versions(packages),
    }


def invoked_command(argv: Sequence[str] | None = None) -> str:
    """The command line that ran this benchmark, as run from the repository root: `python -m bench.<name> ARGS`."""
    argv = list(sys.argv if argv is None else argv)
    script = Path(argv[0]) if argv else Path("?")
    module = f"bench.{script.stem}" if script.parent.name == "bench" else script.stem
    return " ".join(["python", "-m", module, *argv[1:]])


def write_result(
    name: str, payload: dict[str, Any], directory: Path = RESULTS_DIR, produced: Sequence[Path] = ()
) -> Path:
    """Write a result file (bench/result_schema.py) to `<directory>/<name>.json`; returns the path.

    `payload`: the measurements, with `command` and `settings` when the benchmark names them (else the command
    that ran and no settings). `produced`: tracked files the bench wrote (not counted as uncommitted code)."""
    document = {
        "schema_version": SCHEMA_VERSION,
        "name": name,
        "command": payload.get("command") or invoked_command(),
        "environment": environment(produced=produced),
        "settings": payload.get("settings") or {},
        **{key: value for key, value in payload.items() if key not in ("command", "settings")},
    }
    document = json.loads(json.dumps(document, default=str))
    check(document, name)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.json"
    path.write_text(json.dumps(document, indent=2) + "\n")
    return path


def summarize(values: Sequence[float]) -> dict[str, float]:
    """mean / p50 / p90 / min / max of a list of timings (same unit in, same unit out)."""
    ordered = sorted(values)
    if not ordered:
        return {}
    return {
        "mean": statistics.fmean(ordered),
        "p50": ordered[len(ordered) // 2],
        "p90": ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))],
        "min": ordered[0],
        "max": ordered[-1],
    }


def print_table(
    title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]], console: Console | None = None
) -> None:
    """Print rows as a rich table; floats get 1-3 significant decimals."""
    table = Table(title=title)
    for index, column in enumerate(columns):
        table.add_column(column, justify="left" if index == 0 else "right")
    for row in rows:
        table.add_row(*(_format(value) for value in row))
    (console or Console()).print(table)


def _format(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.1f}" if abs(value) >= 10 else f"{value:.3g}"
    return str(value)


def wait_until_ready(
    process: Any, base_url: str, timeout_s: float = 120.0, log_path: str | None = None
) -> None:
    """Polls `base_url`/readyz until 200; raises RuntimeError when the server process exits or the time runs out."""
    import time

    import httpx

    deadline = time.monotonic() + timeout_s
    while True:
        if process.poll() is not None:
            where = f"; see {log_path}" if log_path else ""
            raise RuntimeError(f"the server exited with {process.returncode}{where}")
        try:
            if httpx.get(base_url + "/readyz", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"the server did not become ready in {timeout_s:g} s")
        time.sleep(0.2)


def limit_threads(threads: int | None) -> None:
    """With `threads`: torch's intra-op threads and OMP_NUM_THREADS (for workers and libraries started later)."""
    if threads:
        import torch

        os.environ["OMP_NUM_THREADS"] = str(threads)
        torch.set_num_threads(threads)

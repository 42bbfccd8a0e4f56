"""Running the service: `serve_bundle` (what `defectdet serve` runs) under uvicorn with the service's protocol
(`uvicorn_config`), in one process or as `--workers N` processes on one socket (`worker_app` builds each
worker's app from the environment). No torch import.
"""

from __future__ import annotations

import functools
import ipaddress
import json
import logging
import os
import shutil
import tempfile
from dataclasses import asdict, replace
from pathlib import Path

import uvicorn
from fastapi import FastAPI
from starlette.types import ASGIApp
from uvicorn.supervisors import Multiprocess

from defectdet.serve.protocol import ServiceProtocol
from defectdet.serve.server import create_app
from defectdet.serve.settings import TOKEN_ENV, ServeSettings
from defectdet.serve.workers import bind_to_parent, remove_stale_state, state_folder_name

logger = logging.getLogger(__name__)

WORKER_ENV = "DEFECTDET_SERVE_WORKER"
WORKER_APP = "defectdet.serve.launch:worker_app"


def uvicorn_config(
    app: ASGIApp | str,
    host: str = "127.0.0.1",
    port: int = 8000,
    settings: ServeSettings | None = None,
    workers: int = 1,
) -> uvicorn.Config:
    """The uvicorn.Config `serve` runs: our protocol and timeouts; `app` may be an import string (workers)."""
    settings = settings or ServeSettings()
    protocol = functools.partial(
        ServiceProtocol,
        header_timeout_s=settings.header_timeout_s,
        max_connections=settings.connection_limit,
        retry_after_s=settings.retry_after_s,
        body_timeout_s=settings.body_timeout_s,
    )
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        http=protocol,  # type: ignore[arg-type]
        timeout_keep_alive=settings.keep_alive_s,
        workers=workers,
        factory=isinstance(app, str),
        access_log=False,
        log_config=None,
    )


def run_uvicorn(config: uvicorn.Config) -> None:
    """Run `config` until interrupted: one process, or `config.workers` processes on one socket."""
    if config.workers > 1:
        Multiprocess(config, sockets=[config.bind_socket()]).run()
    else:
        uvicorn.Server(config).run()


WORKER_ENV = "DEFECTDET_SERVE_WORKER"


def worker_app() -> FastAPI:
    """The app of one worker process of `serve --workers N` (bundle and settings from the environment)."""
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(message)s")
    spec = json.loads(os.environ[WORKER_ENV])
    values = spec["settings"]
    values["allowed_hosts"] = tuple(values["allowed_hosts"])
    values["keep"] = tuple(values["keep"])
    values["token"] = os.environ.get(TOKEN_ENV) if spec["token_from_env"] else None
    if spec.get("parent"):
        bind_to_parent(spec["parent"])  # a killed parent takes its workers with it
    return create_app(spec["bundle"], ServeSettings(**values), state_dir=spec.get("state_dir"))


def is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def serve_bundle(
    bundle: str | Path,
    host: str = "127.0.0.1",
    port: int = 8000,
    settings: ServeSettings | None = None,
    workers: int = 1,
) -> None:
    """Serve a bundle over HTTP until interrupted; what `defectdet serve` runs. `POST /v1/detect` answers
    with the detections and the verdict; the HTTP API reference lists every route.

    Example:
        ```python
        from defectdet import serve_bundle
        from defectdet.serve.settings import ServeSettings

        serve_bundle("model.onnx", host="0.0.0.0", port=8000, settings=ServeSettings(token="a-long-secret"))
        ```

    `create_app(bundle, settings)` builds the same FastAPI app without running it (tests, your own server).
    `workers` > 1: that many processes share the port; /metrics sums them (Prometheus multiprocess mode,
    in `PROMETHEUS_MULTIPROC_DIR` or a temporary folder made and removed here). Drift state, the results
    list and readiness are kept per worker process; a drift reset reaches all of them. `keep_dir` is one
    folder for every worker (and every replica on a shared volume): one cap, one review queue.
    """
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    settings = _served_settings(settings or ServeSettings(), host, workers)
    _warn_about_exposure(settings, host)
    logger.info(
        "serving %s on http://%s:%d: %d process(es) x %d inference worker(s) x %d thread(s), queue %d, "
        "token %s, hosts %s",
        bundle,
        host,
        port,
        workers,
        settings.max_concurrency,
        settings.threads,
        settings.max_queue,
        "on" if settings.token else "off",
        ", ".join(settings.allowed_hosts),
    )
    if workers == 1:
        app = create_app(bundle, settings)
        run_uvicorn(uvicorn_config(app, host, port, settings))
        return
    _serve_workers(bundle, host, port, settings, workers)


def _served_settings(settings: ServeSettings, host: str, workers: int) -> ServeSettings:
    """`settings` with the threads per worker process filled in and `host` (and, off loopback, this
    machine's name) added to the allowed hosts."""
    from defectdet.runtime.predictor import MAX_DEFAULT_THREADS, physical_cores

    if settings.threads is None:  # share the cores between the worker processes, each with one session
        # whose intra-op pool its concurrent inferences share (cores split per inference left a lone request
        # on one core: about 1.5x its latency on 2 cores, and less throughput at every concurrency)
        cores = min(physical_cores(), MAX_DEFAULT_THREADS)
        settings = replace(settings, threads=max(1, cores // workers))
    names = [host.lower().strip("[]")]
    if not is_loopback(host):
        import socket

        names.append(socket.gethostname().lower())
    hosts = tuple(dict.fromkeys([*settings.allowed_hosts, *names]))
    return replace(settings, allowed_hosts=hosts)


def _warn_about_exposure(settings: ServeSettings, host: str) -> None:
    """Warn when the service answers beyond loopback without a token, or keeps answers with no disk cap."""
    if not is_loopback(host) and settings.token is None:
        logger.warning(
            "serving on %s without a token: anyone who can reach the port can inspect images and reset "
            "the drift charts; pass --token-file (or set %s), and put TLS in front (docs/guides/serve.md, Security)",
            host,
            TOKEN_ENV,
        )
    if settings.keep and not settings.keep_max_mb:
        logger.warning(
            "--keep-max-mb 0: the keep folder %s has no disk cap and grows until the disk is full",
            settings.keep_dir,
        )


def _serve_workers(bundle: str | Path, host: str, port: int, settings: ServeSettings, workers: int) -> None:
    """`serve --workers N`: the state folder (a killed run's left-over removed first), the workers' spec in
    the environment, uvicorn's supervisor; the folder removed at the end."""
    logger.info(
        "%d worker processes: drift state, readiness and /v1/results are kept per worker process "
        "(each sees its share of the images), a drift reset reaches every worker within a second; /metrics "
        "sums counters and histograms over the workers",
        workers,
    )
    own_dir = not os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if own_dir:
        remove_stale_state(tempfile.gettempdir())
    metrics_dir = (
        tempfile.mkdtemp(prefix=state_folder_name(os.getpid()))
        if own_dir
        else os.environ["PROMETHEUS_MULTIPROC_DIR"]
    )
    values = asdict(settings)
    values.pop("token")
    spec = {
        "bundle": str(Path(bundle).resolve()),
        "settings": values,
        "token_from_env": bool(settings.token),
        "parent": os.getpid(),
        "state_dir": metrics_dir,
    }
    saved = {key: os.environ.get(key) for key in ("PROMETHEUS_MULTIPROC_DIR", WORKER_ENV, TOKEN_ENV)}
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir
    os.environ[WORKER_ENV] = json.dumps(spec)
    if settings.token:
        os.environ[TOKEN_ENV] = settings.token
    try:
        run_uvicorn(uvicorn_config(WORKER_APP, host, port, settings, workers=workers))
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        if own_dir:
            shutil.rmtree(metrics_dir, ignore_errors=True)

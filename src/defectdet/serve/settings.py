"""The service's limits and access settings (`ServeSettings`), checked when they are made. No torch import."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from defectdet.cli_option import CliOption
from defectdet.serve.capture import DEFAULT_KEEP_MAX_MB, parse_keep

LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")
TOKEN_ENV = "DEFECTDET_TOKEN"


@dataclass(frozen=True)
class ServeSettings:
    """Service limits and access. `max_bytes` bounds a whole request body, `max_pixels` each decoded image.

    `token`: when set, every route but /healthz and /readyz (and the static page) needs
    `Authorization: Bearer <token>`. `allowed_hosts`: Host header names served ("*": any; IP literals
    always). `header_timeout_s`: a connection that sends no complete request head in this time is closed.
    `max_connections`: open connections beyond it get 503 (health probes excepted); None: concurrency +
    queue + 64.
    """

    max_concurrency: int = 2
    max_queue: int = 8
    max_bytes: int = 20 * 2**20
    max_pixels: int = 25_000_000
    threads: int | None = None  # onnxruntime intra-op threads of the process's one session (its concurrent
    # inferences share that pool) when the app loads the bundle itself
    retry_after_s: int = 1
    body_timeout_s: float = 30.0  # a request body (any route) not whole by then gets 408, as does one that
    # arrives slower than serve.protocol.MIN_BODY_RATE after its first seconds
    history: int = 50  # results kept for the page
    token: str | None = field(default=None, repr=False)
    allowed_hosts: tuple[str, ...] = LOOPBACK_HOSTS
    header_timeout_s: float = 10.0
    keep_alive_s: int = 5
    max_connections: int | None = None
    keep: tuple[str, ...] = ()  # capture policies (serve.capture); () keeps nothing
    keep_dir: str | None = None  # kept items, and the folder /review works on
    keep_margin: float = 0.1
    keep_max_mb: float | None = DEFAULT_KEEP_MAX_MB  # None: the default; 0: no cap (serve warns)
    models_dir: str | None = None  # candidate bundles for shadow / promote; the models store in store/
    models_keep: int = 5  # models the store keeps for roll-back behind the live one
    shadow: str | None = None  # a bundle in models_dir to run in shadow from the start

    def __post_init__(self) -> None:
        object.__setattr__(self, "keep", parse_keep(tuple(self.keep)))
        if self.models_keep < 1:
            raise ValueError(f"models_keep must be >= 1, got {self.models_keep}")
        if self.shadow and not self.models_dir:
            raise ValueError("--shadow needs --models-dir DIR (the folder the candidate bundle is in)")
        if self.keep and not self.keep_dir:
            raise ValueError("--keep needs --keep-dir DIR (where the kept images go)")
        if not 0.0 <= self.keep_margin <= 1.0:
            raise ValueError(f"keep_margin must be in [0, 1], got {self.keep_margin}")
        if self.keep_max_mb is None:
            object.__setattr__(self, "keep_max_mb", DEFAULT_KEEP_MAX_MB)
        if not (math.isfinite(self.keep_max_mb) and self.keep_max_mb >= 0):
            raise ValueError(f"keep_max_mb must be >= 0 (0: no cap), got {self.keep_max_mb}")
        for name in ("max_concurrency", "max_bytes", "max_pixels", "history"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_queue < 0:
            raise ValueError(f"max_queue must be >= 0, got {self.max_queue}")
        if self.max_connections is not None and self.max_connections < 1:
            raise ValueError(f"max_connections must be >= 1, got {self.max_connections}")
        if self.header_timeout_s <= 0 or self.keep_alive_s <= 0 or self.body_timeout_s <= 0:
            raise ValueError("header_timeout_s, body_timeout_s and keep_alive_s must be > 0")
        if self.token is not None and not self.token.strip():
            raise ValueError("the token is empty")
        object.__setattr__(self, "allowed_hosts", tuple(host.lower() for host in self.allowed_hosts))

    @property
    def connection_limit(self) -> int:
        """Open connections served before new requests (not health probes) get 503."""
        if self.max_connections is not None:
            return self.max_connections
        return self.max_concurrency + self.max_queue + 64


# `defectdet serve`'s options, in the order its help lists them. The limits default to not given (None): the
# defaults above, which their help states.
SERVE_OPTIONS: dict[str, CliOption] = {
    "max_concurrency": CliOption(help="Inferences at once, in worker threads (default 2).", default=None),
    "max_queue": CliOption(
        help="Inferences that may wait; beyond, 503 + Retry-After (default 8); uploads do not count.",
        default=None,
    ),
    "max_bytes": CliOption(
        help="Largest request body in bytes, checked while reading: 413 (default 20 MiB).", default=None
    ),
    "max_pixels": CliOption(
        help="Largest image in pixels, from its header: 413 (default 25,000,000).", default=None
    ),
    "threads": CliOption(
        help="onnxruntime threads per process, shared by its inferences (default: cores / workers)."
    ),
    "max_connections": CliOption(
        help="Connections before requests get 503, health probes excepted (default: concurrency + queue + 64)."
    ),
    "keep": CliOption(
        help="Keep answered images in --keep-dir: none (default), all, flagged (verdict defective), uncertain "
        "(a detection within --keep-margin of the bundle's threshold), drift (while the drift monitor warns). "
        "Repeatable or comma-separated.",
        type=list[str],
        default=[],
        to_setting=tuple,
    ),
    "keep_dir": CliOption(
        help="Folder for kept images (images/, templates/, predictions/*.json sidecars) and of the page at "
        "/review: one folder, one cap and one review queue for every worker and every replica sharing it.",
        type=Path,
        to_setting=str,
    ),
    "keep_margin": CliOption(help="'uncertain': score within this of the bundle's threshold."),
    "keep_max_mb": CliOption(
        help="Disk cap of the kept files in MB (default 2000; 0: no cap, warned at start): the oldest unreviewed "
        "items go first, logged; with only reviewed items left, new answers are not kept (keep_dropped{why=cap}).",
        default=None,
    ),
    "models_dir": CliOption(
        help="Candidate bundles for /v1/models/shadow, /promote, /rollback; DIR/store/ says which bundle every "
        "process on DIR serves (BUNDLE while it is empty; a shared volume across machines).",
        type=Path,
        to_setting=str,
    ),
    "models_keep": CliOption(help="Models the store keeps for roll-back behind the live one."),
    "shadow": CliOption(
        help="A bundle in --models-dir to run beside the live model from the start (GET /v1/models)."
    ),
}

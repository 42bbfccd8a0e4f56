"""The inspection service: FastAPI app serving one bundle through `Predictor`, with the drift monitor.

`create_app(bundle_or_predictor, settings)` builds the app; `defectdet serve` runs it under uvicorn
(`uvicorn_config`: our h11 protocol, which closes connections that send no complete request head in
`header_timeout_s`, keeps the health probes answering past `max_connections`, and answers its own
refusals in JSON). Bodies are read as a stream with a byte limit (413 as soon as it is exceeded) before
the request takes a place: inference runs in a thread pool of `max_concurrency` workers, off the event
loop; at most `max_queue` more inferences wait, beyond that the answer is 503 with Retry-After at once.
Access: an optional bearer token, a trusted Host list and cross-site refusals (`_Guard`). Every error is
JSON `{"error": one line, "status": N}`; an unexpected exception is logged and answered 500 in JSON.
No torch import.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import hmac
import ipaddress
import json
import logging
import math
import os
import re
import shutil
import tempfile
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any
from urllib.parse import urlsplit

import h11
import numpy as np
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from uvicorn.protocols.http.h11_impl import H11Protocol

from defectdet.errors import DefectDetError, ImageReadError, ImageTooLargeError
from defectdet.runtime.model_quality import validation_quality
from defectdet.runtime.pipeline import Planes, load_planes
from defectdet.runtime.predictor import PredictionResult, Predictor
from defectdet.serve.capture import DEFAULT_KEEP_MAX_MB, Capture, KeptItem, keep_reasons, parse_keep
from defectdet.serve.deployment import Deployment, ServedModel, predict_planes, warm_up
from defectdet.serve.json_body import JSONBodyLimit
from defectdet.serve.metrics import ServiceMetrics
from defectdet.serve.model_routes import models_router
from defectdet.serve.review import PAGE_HEADERS, ReviewFolder, review_router
from defectdet.serve.upload import UploadError, read_form
from defectdet.serve.workers import DriftBroadcast, bind_to_parent, remove_stale_state, state_folder_name

logger = logging.getLogger(__name__)

STATIC_DIR = Path(__file__).resolve().parent / "static"
FORM_FIELDS = ("image", "template", "threshold")
RENAMED_FORM_FIELDS = {"conf": "threshold"}  # still read, logged as deprecated
CONF_FIELD_BYTES = 64
DETECT_BODY_SCHEMA = {
    "requestBody": {
        "required": True,
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": ["image"],
                    "properties": {
                        "image": {"type": "string", "format": "binary", "description": "the tested image"},
                        "template": {
                            "type": "string",
                            "format": "binary",
                            "description": "its defect-free template (template bundles only)",
                        },
                        # one more binary field per companion capture the bundle takes (detect_body_schema)
                        "threshold": {
                            "type": "number",
                            "description": "the threshold in [0, 1]: an image with a detection scoring at or above "
                            "it is defective (default: the bundle's)",
                        },
                    },
                }
            }
        },
    }
}


def detect_body_schema(metadata: Any) -> dict[str, Any]:
    """`DETECT_BODY_SCHEMA` for this bundle: a file field per input plane it takes (`image`, `template` for a
    template bundle, each companion capture by its name, required), then `threshold`."""
    schema = copy.deepcopy(DETECT_BODY_SCHEMA)
    body = schema["requestBody"]["content"]["multipart/form-data"]["schema"]
    properties = body["properties"]
    threshold = properties.pop("threshold")
    for name in getattr(metadata, "companions", ()):
        properties[name] = {
            "type": "string",
            "format": "binary",
            "description": f"the aligned companion capture {name!r} of the same part (another lighting, focus "
            "or band), at the image's size",
        }
    properties["threshold"] = threshold
    body["required"] = ["image", *getattr(metadata, "companions", ())]
    return schema


@dataclass(frozen=True)
class Upload:
    """One /v1/detect request's planes as received: the image, its template and its companion captures."""

    image: bytes
    template: bytes | None = None
    companions: Mapping[str, bytes] = field(default_factory=dict)


LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")
HEALTH_ROUTES = frozenset({"/healthz", "/readyz"})
STATE_CHANGING_ROUTES = frozenset({"/v1/drift/reset"})
STATE_CHANGING_PREFIXES = ("/v1/review/", "/v1/models/")  # every POST under these: review decisions, export,
# shadow, promotion and roll-back
PUBLIC_PAGES = frozenset({"/", "/review"})  # HTML without data (its script asks for the token)
REQUEST_MARK = "X-Defectdet-Request"  # the custom header a state-changing request must carry
TOKEN_ENV = "DEFECTDET_TOKEN"
_ADDRESS = re.compile(r"\s*\bat 0x[0-9a-fA-F]+|\b0x[0-9a-fA-F]{6,}")  # not the 0x in '100000x100000'


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
    body_timeout_s: float = 30.0  # a client that trickles its upload longer than this gets 408
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
        if self.header_timeout_s <= 0 or self.keep_alive_s <= 0:
            raise ValueError("header_timeout_s and keep_alive_s must be > 0")
        if self.token is not None and not self.token.strip():
            raise ValueError("the token is empty")
        object.__setattr__(self, "allowed_hosts", tuple(host.lower() for host in self.allowed_hosts))

    @property
    def connection_limit(self) -> int:
        """Open connections served before new requests (not health probes) get 503."""
        if self.max_connections is not None:
            return self.max_connections
        return self.max_concurrency + self.max_queue + 64


class Service:
    """The app's state: the predictor, its readiness, admission control, the monitor and recent results."""

    def __init__(
        self,
        predictor: Predictor,
        settings: ServeSettings,
        live_path: Path | None = None,
        state_dir: str | None = None,
    ) -> None:
        self.settings = settings
        live = ServedModel.of(predictor)
        self.metrics = ServiceMetrics(live.metadata.class_names, live.monitor)
        self.deployment = Deployment(
            live,
            self.metrics,
            models_dir=settings.models_dir,
            live_path=live_path,
            load=self.load_bundle if live_path is not None else None,
            on_swap=self._swapped,
            keep=settings.models_keep,
        )
        self.executor = ThreadPoolExecutor(settings.max_concurrency, thread_name_prefix="defectdet-infer")
        self.admitted = 0  # inferences queued or running (uploads still arriving do not count)
        self.reading = 0  # uploads being read
        self.ready = threading.Event()
        self.readiness = "not started"
        self._warm_up_started = False
        self._lock = threading.Lock()
        self._places = threading.Lock()  # admitted: taken on the event loop, given back on a worker thread
        self.results: deque[dict[str, Any]] = deque(maxlen=settings.history)
        self.capture: Capture | None = None
        self.review: ReviewFolder | None = None
        self.broadcast: DriftBroadcast | None = None  # serve --workers: a reset reaches every worker
        if state_dir is not None:
            self.broadcast = DriftBroadcast(state_dir, self.reset_drift)
        if settings.keep_dir:
            cap = int(settings.keep_max_mb * 2**20) if settings.keep_max_mb else None
            if settings.keep:
                self.capture = Capture(settings.keep_dir, cap, self.metrics)
            self.review = ReviewFolder(Path(settings.keep_dir), list(self.metadata.class_names))

    # ---------------------------------------------------------------- the live model (it may change)
    @property
    def live(self) -> ServedModel:
        return self.deployment.live

    @property
    def predictor(self) -> Any:
        return self.live.predictor

    @property
    def metadata(self) -> Any:
        return self.live.metadata

    @property
    def monitor(self) -> Any:
        return self.live.monitor

    @property
    def version(self) -> str:
        return self.live.version

    def _swapped(self, model: ServedModel) -> None:
        """Another model went live: the drift gauges follow its charts, the review page offers its classes."""
        self.metrics.set_drift_charts(model.monitor)
        _warn_quality(model.name, model.metadata)
        if self.review is not None:
            self.review.class_names = list(model.metadata.class_names)

    def reset_drift(self) -> None:
        """Restart this process's drift charts and their gauges."""
        if self.monitor is not None:
            self.monitor.reset()
        self.metrics.set_drift_charts(self.monitor)

    def load_bundle(self, path: Path) -> Predictor:
        return Predictor(path, threads=self.settings.threads, max_pixels=self.settings.max_pixels)

    # ---------------------------------------------------------------- readiness
    def start(self) -> None:
        """Run one warm-up inference in the background (idempotent); /readyz answers 200 after it."""
        with self._lock:
            if self._warm_up_started:
                return
            self._warm_up_started = True
            self.readiness = "warming up"
        threading.Thread(target=self._warm_up, name="defectdet-warm-up", daemon=True).start()

    def _warm_up(self) -> None:
        try:
            started = time.perf_counter()
            warm_up(self.predictor)
        except Exception as error:  # a bundle that cannot run stays not-ready, with the reason
            self.readiness = f"warm-up failed: {' '.join(str(error).split())}"
            logger.error("warm-up inference failed: %s", error)
            return
        self.readiness = "ready"
        self.metrics.ready.set(1)
        self.ready.set()
        logger.info("warm-up inference took %.0f ms; ready", (time.perf_counter() - started) * 1e3)

    # ---------------------------------------------------------------- admission
    def check_ready(self) -> None:
        """503 until the warm-up inference ran."""
        if not self.ready.is_set():
            self.start()
            raise UploadError(
                503, f"not ready: {self.readiness}", {"Retry-After": str(self.settings.retry_after_s)}
            )

    def admit(self) -> None:
        """Take an inference place or refuse: 503 when max_concurrency run and max_queue already wait."""
        concurrency, queue = self.settings.max_concurrency, self.settings.max_queue
        with self._places:
            full = self.admitted >= concurrency + queue
            if not full:
                self.admitted += 1
                self.metrics.admitted.set(self.admitted)
        if full:
            raise UploadError(
                503,
                f"overloaded: {concurrency} running and {queue} waiting (serve --max-concurrency "
                f"{concurrency} --max-queue {queue}); retry after {self.settings.retry_after_s} s",
                {"Retry-After": str(self.settings.retry_after_s)},
            )

    def leave(self, _: Any = None) -> None:
        """Give a place back (any thread; also a future's done callback)."""
        with self._places:
            self.admitted -= 1
            self.metrics.admitted.set(self.admitted)

    # ---------------------------------------------------------------- one request
    def decode(self, upload: Upload, meta: Any) -> tuple[Planes, float]:
        """(planes, milliseconds): every uploaded plane decoded within the pixel limit, one intensity mapping
        for all (`runtime.pipeline.load_planes`)."""
        started = time.perf_counter()
        limit = self.settings.max_pixels
        try:  # each plane's header size is checked against the limit before any decoder runs
            planes = load_planes(upload.image, upload.template, meta.channels, limit, upload.companions)
        except (DefectDetError, UploadError):
            raise
        except MemoryError:
            raise UploadError(413, "the image is too large to decode in the memory available") from None
        except Exception as error:  # any decoder's own failure on hostile bytes is the input's fault
            logger.info("decoder failed on an upload: %r", error)
            several = upload.template is not None or upload.companions
            which = "image (or its template or a companion capture)" if several else "image"
            raise ImageReadError(
                f"{which}: not a decodable image ({type(error).__name__}: {_one_line(error)})"
            ) from None
        named = {"image": planes.image, "template": planes.template, **planes.companions}
        for name, array in named.items():
            if array is not None and array.shape[2:] != ((3,) if meta.channels == 3 else ()):
                raise ImageReadError(f"{name}: decoded to an unexpected shape {array.shape}")
        return planes, (time.perf_counter() - started) * 1e3

    def infer(self, live: ServedModel, planes: Planes, conf: float | None) -> tuple[PredictionResult, dict]:
        """Predict with `live` and update its drift charts (runs in a worker thread)."""
        options: dict[str, Any] = {"threshold": conf}
        if self.capture is not None and "uncertain" in self.settings.keep:  # see near misses too
            floor = max(0.0, live.metadata.thresholds.threshold - self.settings.keep_margin)
            # never above the request's own threshold: keeping must not change the verdict
            options["score_floor"] = floor if conf is None else min(floor, conf)
        result = predict_planes(live.predictor, planes.image, planes.template, planes.companions, **options)
        drift_started = time.perf_counter()
        monitor = live.monitor
        drift = monitor.update(result.image_stats, result.features).to_dict() if monitor else _NO_DRIFT
        result.timings["drift"] = (time.perf_counter() - drift_started) * 1e3
        return result, drift

    def _timed_infer(
        self, upload: Upload, conf: float | None
    ) -> tuple[PredictionResult, dict, float, bool, str]:
        """(result, drift, started, kept, model version). The live model is taken once, here: a promotion
        while this runs changes the model of the next request, not of this one."""
        started = time.perf_counter()  # a worker took it: the wait in the executor's queue ends here
        live = self.live
        planes, decode_ms = self.decode(upload, live.metadata)
        result, drift = self.infer(live, planes, conf)
        result.timings["decode"] = result.timings.get("decode", 0.0) + decode_ms
        kept = self.keep(live, upload, result, drift)
        if conf is None:  # the shadow is compared at both models' own thresholds
            self.deployment.observe(planes.image, planes.template, result, planes.companions)
        return result, drift, started, kept, live.version

    def keep(self, live: ServedModel, upload: Upload, result: PredictionResult, drift: dict) -> bool:
        """Queue the answer for keeping when a policy says so (never raises); drop the detections below the
        verdict threshold that only the `uncertain` policy asked for. True when queued."""
        if self.capture is None:
            return False
        kept = False
        try:
            stored = live.metadata.thresholds.threshold
            level = drift.get("level")
            reasons = keep_reasons(self.settings.keep, result, level, stored, self.settings.keep_margin)
            if reasons:
                sidecar = {
                    "time": time.time(),
                    "reasons": reasons,
                    "model_version": live.version,
                    "bundle_sha256": live.sha256,
                    "bundle": live.name if live.source is not None else None,
                    "class_names": list(live.metadata.class_names),
                    "stored_threshold": stored,
                    "keep_margin": self.settings.keep_margin,
                    **result.to_dict(),
                    "drift": drift,
                }
                kept = self.capture.submit(
                    KeptItem(upload.image, upload.template, sidecar, dict(upload.companions))
                )
        except Exception as error:  # capture never fails a request
            logger.warning("could not keep an answer: %s", error)
            self.metrics.keep_errors.inc()
        result.detections = [d for d in result.detections if d.score >= result.threshold]
        return kept

    async def detect(self, request: Request) -> dict[str, Any]:
        """Read the upload (no place taken yet), then take an inference place and run it."""
        self.check_ready()
        arrived = time.perf_counter()
        form = await self._read_upload(request)
        upload, conf = self._fields(form)
        received = time.perf_counter()
        result, drift, queued, kept, version = await self._run(upload, conf)
        finished = time.perf_counter()
        timings = {
            "receive": (received - arrived) * 1e3,
            "queue": (queued - received) * 1e3,
            **{key: value for key, value in result.timings.items() if key != "total"},
            "compute": (finished - queued) * 1e3,
            "total": (finished - arrived) * 1e3,
        }
        self.metrics.observe_detection(result, drift, queue_s=queued - received, compute_s=finished - queued)
        # the one serializer (`PredictionResult.to_dict`: the Python API and `predict --json` answer the same),
        # with the server's own timings (receive, queue, compute) and the drift state
        answer = {
            "model_version": version,
            **result.to_dict(),
            "timings_ms": {key: round(value, 3) for key, value in timings.items()},
            "drift": drift,
        }
        if self.capture is not None:
            answer["kept"] = kept
        self.results.appendleft(_recent(result, drift, timings["total"]))
        return answer

    async def _read_upload(self, request: Request) -> dict[str, Any]:
        """The multipart form, read as a stream within `body_timeout_s` (408 beyond)."""
        self.reading += 1
        self.metrics.reading.set(self.reading)
        try:
            fields = {
                "image": self.settings.max_bytes,
                "template": self.settings.max_bytes,
                **{name: self.settings.max_bytes for name in self.metadata.companions},
                "threshold": CONF_FIELD_BYTES,
                "conf": CONF_FIELD_BYTES,
            }
            reading = read_form(
                {key.lower(): value for key, value in request.headers.items()},
                _stream(request),
                self.settings.max_bytes,
                fields,
            )
            try:
                return await asyncio.wait_for(reading, self.settings.body_timeout_s)
            except asyncio.TimeoutError:
                raise UploadError(
                    408, f"the upload took longer than {self.settings.body_timeout_s:g} s"
                ) from None
        finally:
            self.reading -= 1
            self.metrics.reading.set(self.reading)

    def _fields(self, form: dict[str, Any]) -> tuple[Upload, float | None]:
        """(planes, threshold) from the form; 422 for a missing image, template or companion capture, or a
        template the bundle does not take. The field `conf` (the threshold's name before one name per concept)
        is read as `threshold`."""
        if "image" not in form:
            raise UploadError(422, "missing form field 'image' (the image file to inspect)")
        conf = _threshold_field(form)
        template = bytes(form["template"].data) if "template" in form else None
        if self.metadata.template and template is None:
            raise UploadError(
                422,
                "this bundle compares each image to its defect-free template: send the 'template' field",
            )
        if not self.metadata.template and template is not None:
            raise UploadError(422, "this bundle takes no template: drop the 'template' field")
        for name in self.metadata.companions:
            if name not in form:
                raise UploadError(
                    422,
                    f"this bundle also takes the aligned capture {name!r}: send it as the form field {name!r}",
                )
        companions = {name: bytes(form[name].data) for name in self.metadata.companions}
        return Upload(bytes(form["image"].data), template, companions), conf

    async def _run(self, upload: Upload, conf: float | None) -> tuple[Any, ...]:
        """Take a place (503 when full) and infer on a worker thread: (result, drift, queued, kept)."""
        self.admit()
        submitted = False
        try:
            job = self.executor.submit(self._timed_infer, upload, conf)
            submitted = True
            # the place is given back when the work ends, not when this coroutine does: a client that
            # hangs up cannot leave work behind that the queue limit no longer counts. Given back on the
            # worker thread itself: one wake-up of the event loop per request (the answer's), not two
            job.add_done_callback(self.leave)
            return await asyncio.wrap_future(job)
        finally:
            if not submitted:
                self.leave()

    def drift_report(self) -> dict[str, Any]:
        if self.monitor is None:
            return {"state": _NO_DRIFT, "limits": {}, "history": [], "skipped": {}}
        return {
            "state": self.monitor.state().to_dict(),
            "limits": self.monitor.limits(),
            "history": self.monitor.history(),
            "skipped": self.monitor.skipped,
            "lambda": self.monitor.lam,
            "alert_run_length": self.monitor.alert_run_length,
        }


_NO_DRIFT: dict[str, Any] = {
    "level": "unknown",
    "statistic": None,
    "value": None,
    "band": None,
    "images": 0,
    "message": "the bundle carries no drift reference (metadata.drift_reference is null)",
    "charts": {},
}


def _recent(result: PredictionResult, drift: dict[str, Any], total_ms: float) -> dict[str, Any]:
    """One row of `/v1/results` (the page's last results)."""
    return {
        "time": time.time(),
        "verdict": result.verdict,
        "detections": len(result.detections),
        "classes": sorted({detection.class_name for detection in result.detections}),
        "top_score": max((detection.score for detection in result.detections), default=0.0),
        "drift": drift["level"],
        "total_ms": round(total_ms, 1),
        "image_size": list(result.image_size),
    }


async def _stream(request: Request) -> AsyncIterator[bytes]:
    try:
        async for chunk in request.stream():
            yield chunk
    except ClientDisconnect:
        raise UploadError(400, "client disconnected during the upload") from None


def _threshold_field(form: dict[str, Any]) -> float | None:
    """The form's `threshold` (or its deprecated name `conf`), None when absent; 422 for both or a bad value."""
    given = [name for name in ("threshold", *RENAMED_FORM_FIELDS) if name in form]
    if not given:
        return None
    if len(given) > 1:
        raise UploadError(422, "send 'threshold' only ('conf' is its deprecated name)")
    if given[0] in RENAMED_FORM_FIELDS:
        logger.warning("form field 'conf' is deprecated: send 'threshold'")
    return _parse_threshold(form[given[0]].data, given[0])


def _parse_threshold(data: bytes, name: str = "threshold") -> float:
    text = data.decode("utf-8", "replace").strip()
    try:
        value = float(text)
    except ValueError:
        raise UploadError(422, f"{name} must be a number in [0, 1], got {text[:30]!r}") from None
    if not math.isfinite(value) or not 0.0 <= value <= 1.0:
        raise UploadError(422, f"{name} must be a number in [0, 1], got {text[:30]!r}")
    return value


class _FastJSON(Response):
    """json.dumps straight away (FastAPI's jsonable_encoder cost ~0.5 ms per answer on the event loop);
    numpy scalars become Python numbers, a non-finite float becomes null."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        try:
            text = json.dumps(content, default=_native, allow_nan=False, separators=(",", ":"))
        except ValueError:  # a NaN or an infinity somewhere: null it
            text = json.dumps(_finite(content), default=_native, separators=(",", ":"))
        return text.encode("utf-8")


def _native(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def _finite(value: Any) -> Any:
    if isinstance(value, (float, np.floating)):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(item) for item in value]
    return value


def _one_line(reason: object) -> str:
    """One line without object addresses (`<object at 0x7f...>` says nothing to a client)."""
    return " ".join(_ADDRESS.sub("", str(reason)).split())


def _error_body(status: int, reason: object) -> bytes:
    return json.dumps({"error": _one_line(reason) or "error", "status": status}).encode()


def _error(status: int, reason: object, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": _one_line(reason) or "error", "status": status}, status, headers=headers)


async def _send_error(send: Any, status: int, reason: object, headers: dict[str, str] | None = None) -> None:
    """A JSON error answer straight on the ASGI `send` (middlewares, before any route runs)."""
    body = _error_body(status, reason)
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw += [
        (key.lower().encode("latin-1"), value.encode("latin-1")) for key, value in (headers or {}).items()
    ]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


def _looks_like_path(text: str) -> bool:
    if "://" in text or any(char.isspace() for char in text):
        return False
    return text.startswith(("/", "~", "./", "../", "\\\\")) or re.match(r"^[A-Za-z]:[\\/]", text) is not None


def _redact_paths(value: Any) -> Any:
    """File names instead of absolute (or relative) paths, anywhere in a JSON-ready value."""
    if isinstance(value, str) and _looks_like_path(value):
        windows = "\\" in value or re.match(r"^[A-Za-z]:", value) is not None
        return (PureWindowsPath(value) if windows else PurePosixPath(value)).name
    if isinstance(value, dict):
        return {key: _redact_paths(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_redact_paths(item) for item in value]
    return value


def create_app(
    bundle: str | Path | Predictor, settings: ServeSettings | None = None, state_dir: str | None = None
) -> FastAPI:
    """The service for one bundle (a path, loaded here, or a ready `Predictor`). `state_dir`: the folder the
    processes of `serve --workers` share (a drift reset there reaches all of them)."""
    settings = settings or ServeSettings()
    predictor = (
        bundle
        if not isinstance(bundle, (str, Path))
        else Predictor(bundle, threads=settings.threads, max_pixels=settings.max_pixels)
    )
    live_path = Path(bundle) if isinstance(bundle, (str, Path)) else None
    service = Service(predictor, settings, live_path, state_dir)
    _warn_quality(service.live.name, service.metadata)
    if settings.shadow:
        service.deployment.start_shadow(settings.shadow, unless_live=True)  # a bad name stops serve here

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        service.start()
        service.deployment.watch()  # follow the models store's generations
        if service.capture is not None:
            service.capture.start()
        if service.broadcast is not None:
            service.broadcast.start()
        yield
        if service.broadcast is not None:
            service.broadcast.stop()
        service.executor.shutdown(wait=False, cancel_futures=True)
        service.deployment.close()
        if service.capture is not None:
            service.capture.stop()
        service.metrics.close()

    app = FastAPI(
        title="defectdet inspection service",
        version=service.version,
        description="POST an image (and its template) to /v1/detect; scrape /metrics; open / for the page.",
        lifespan=lifespan,
        docs_url=None,  # Swagger UI and ReDoc load their assets from a CDN: blank offline; /openapi.json stays
        redoc_url=None,
    )
    app.state.service = service
    # outermost last: errors (any exception -> JSON 500) > metrics (counts every answer) > guard (access)
    # > JSON body limits (size and nesting, before any route parses a body)
    app.add_middleware(JSONBodyLimit)
    app.add_middleware(_Guard, settings=settings)
    app.add_middleware(_MetricsMiddleware, metrics=service.metrics)
    app.add_middleware(_JSONErrors)
    _add_error_handlers(app)
    _add_inspection_routes(app, service, settings)
    _add_monitoring_routes(app, service)
    if service.review is not None:
        app.include_router(review_router(service.review))
    app.include_router(models_router(service.deployment))

    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
    return app


def _warn_quality(name: str, metadata: Any) -> None:
    """Log a loud warning when the served model's validation mAP is near zero."""
    warning = validation_quality(metadata)["warning"]
    if warning:
        logger.warning("MODEL %s: %s", name, warning)


def _add_error_handlers(app: FastAPI) -> None:
    """Every refusal as `{"error": one line, "status": N}`."""

    @app.exception_handler(UploadError)
    async def upload_error(request: Request, error: UploadError) -> JSONResponse:
        return _error(error.status, error.reason, error.headers)

    @app.exception_handler(ImageReadError)
    async def image_error(request: Request, error: ImageReadError) -> JSONResponse:
        reason = str(error)
        if not isinstance(error, ImageTooLargeError):
            return _error(422, reason)
        return _error(413, reason.split("; pass a larger")[0].replace("(max_pixels)", "(serve --max-pixels)"))

    @app.exception_handler(DefectDetError)
    async def input_error(request: Request, error: DefectDetError) -> JSONResponse:
        return _error(422, str(error))

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, error: RequestValidationError) -> JSONResponse:
        first = error.errors()[0] if error.errors() else {"loc": (), "msg": "invalid request"}
        where = ".".join(str(part) for part in first.get("loc", ()))
        return _error(422, f"{where}: {first.get('msg')}")

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, error: StarletteHTTPException) -> JSONResponse:
        return _error(error.status_code, str(error.detail), getattr(error, "headers", None))


def _add_inspection_routes(app: FastAPI, service: Service, settings: ServeSettings) -> None:
    """/v1/detect, the health and readiness probes and /v1/model."""

    @app.post(
        "/v1/detect",
        openapi_extra=detect_body_schema(service.metadata),
        summary="Detect defects in one image",
    )
    async def detect(request: Request) -> Response:
        """multipart/form-data: `image` (file), `template` (file, template bundles), one file per companion
        capture the bundle takes (the field named as the capture, e.g. `L2`), `threshold` (number)."""
        return _FastJSON(await service.detect(request))

    @app.get("/healthz", summary="The process is alive")
    async def healthz() -> dict[str, Any]:
        return {"status": "alive"}

    @app.get("/readyz", summary="200 once the model is loaded and one warm-up inference ran")
    async def readyz() -> Response:
        behind = service.deployment.not_ready()  # serving another generation than the models store's
        if service.ready.is_set() and behind is None:
            return JSONResponse({"ready": True, "model_version": service.version})
        service.start()
        headers = {"Retry-After": str(settings.retry_after_s)}
        reason = service.readiness if not service.ready.is_set() else behind
        return JSONResponse({"ready": False, "reason": reason}, 503, headers=headers)

    @app.get("/v1/model", summary="The bundle's metadata")
    async def model() -> dict[str, Any]:
        return {
            "model_version": service.version,
            "metadata": _redact_paths(service.metadata.model_dump(mode="json")),
            "quality": validation_quality(service.metadata),
            "settings": {
                "max_concurrency": settings.max_concurrency,
                "max_queue": settings.max_queue,
                "max_bytes": settings.max_bytes,
                "max_pixels": settings.max_pixels,
            },
        }


def _add_monitoring_routes(app: FastAPI, service: Service) -> None:
    """Drift, the last results, /metrics and the page."""

    @app.get("/v1/drift", summary="Drift state, chart limits and recent chart values")
    async def drift() -> dict[str, Any]:
        return service.drift_report()

    @app.post("/v1/drift/reset", summary="Restart the drift charts (after cleaning the lens, a new lamp)")
    async def drift_reset() -> dict[str, Any]:
        """Needs `Content-Type: application/json` and `X-Defectdet-Request: 1` (no cross-site form can send them).
        Under `serve --workers N` every worker restarts its charts (within a second)."""
        if service.broadcast is not None:
            service.broadcast.announce()
        else:
            service.reset_drift()
        return service.drift_report()

    @app.get("/v1/results", summary="The last results, newest first")
    async def results() -> dict[str, Any]:
        return {"results": list(service.results)}

    @app.get("/metrics", summary="Prometheus metrics")
    async def metrics() -> Response:
        body, content_type = service.metrics.render()
        return Response(body, media_type=content_type)

    @app.get("/", include_in_schema=False)
    async def page() -> FileResponse:
        return FileResponse(STATIC_DIR / "index.html", media_type="text/html", headers=PAGE_HEADERS)


class _MetricsMiddleware:
    """Pure ASGI: counts requests by route and status and times them (does not touch the body)."""

    def __init__(self, app: Any, metrics: ServiceMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = {"code": 500}

        async def send_status(message: dict) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            self.metrics.observe_request(scope.get("path", ""), status["code"], time.perf_counter() - started)


class _JSONErrors:
    """Pure ASGI, outermost: an exception no handler took is logged and answered as a JSON 500."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def send_tracked(message: dict) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, send_tracked)
        except Exception as error:
            logger.exception("unexpected error on %s %s", scope.get("method"), scope.get("path"))
            if not started:
                reason = f"internal error ({type(error).__name__}: {_one_line(error)[:200]}); it is logged"
                await _send_error(send, 500, reason)


class _Guard:
    """Pure ASGI access control in front of every route but the health probes.

    1. Host: the Host header's name must be in `allowed_hosts` (or an IP literal): a DNS-rebinding page
       names its own domain. 400 otherwise.
    2. Token: with `settings.token`, `Authorization: Bearer <token>` (constant-time compare); 401
       otherwise. The pages (`/`, `/review`, `/static/`) hold no data and stay open: their scripts ask
       for the token.
    3. Cross-site: a request that is not GET/HEAD with an `Origin` of another origin, or
       `Sec-Fetch-Site` other than same-origin/none, is refused (403). State-changing routes
       (`/v1/drift/reset`, every POST under `/v1/review/`) also need `X-Defectdet-Request` and a JSON body, which no cross-site form can
       send without a CORS preflight (never granted here).
    """

    def __init__(self, app: Any, settings: ServeSettings) -> None:
        self.app = app
        self.any_host = "*" in settings.allowed_hosts
        self.hosts = frozenset(host.strip("[]") for host in settings.allowed_hosts)
        self.token = settings.token.strip().encode() if settings.token else None

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope.get("path", "") in HEALTH_ROUTES:
            await self.app(scope, receive, send)
            return
        refusal = self.refusal(scope)
        if refusal is None:
            await self.app(scope, receive, send)
            return
        status, reason, headers = refusal
        await _send_error(send, status, reason, headers)

    def refusal(self, scope: dict) -> tuple[int, str, dict[str, str] | None] | None:
        """(status, reason, headers) when the request is refused, else None."""
        headers: dict[bytes, bytes] = {}
        for key, value in scope.get("headers", []):
            headers.setdefault(key.lower(), value)
        host = headers.get(b"host", b"").decode("latin-1").strip()
        if not self.any_host and not self.host_allowed(host):
            shown = host[:80] or "(none)"
            return 400, f"Host {shown!r} is not served here; start serve with --allowed-host NAME", None
        path = scope.get("path", "")
        public = path in PUBLIC_PAGES or path.startswith("/static/")
        if self.token is not None and not public:
            given = headers.get(b"authorization", b"")
            scheme, _, credential = given.partition(b" ")
            if scheme.lower() != b"bearer" or not hmac.compare_digest(credential.strip(), self.token):
                reason = "missing or wrong token: send 'Authorization: Bearer <token>' (serve --token-file)"
                return 401, reason, {"WWW-Authenticate": 'Bearer realm="defectdet"'}
        if scope.get("method", "GET") in ("GET", "HEAD", "OPTIONS"):
            return None
        origin = headers.get(b"origin")
        if origin is not None:
            text = origin.decode("latin-1").strip()
            if text == "null" or urlsplit(text).netloc.lower() != host.lower():
                return 403, f"cross-site request refused (Origin {text[:80]!r} is not this service)", None
        fetch_site = headers.get(b"sec-fetch-site", b"").decode("latin-1").strip().lower()
        if fetch_site and fetch_site not in ("same-origin", "none"):
            return 403, f"cross-site request refused (Sec-Fetch-Site: {fetch_site[:30]})", None
        if path in STATE_CHANGING_ROUTES or path.startswith(STATE_CHANGING_PREFIXES):
            if not headers.get(REQUEST_MARK.lower().encode(), b"").strip():
                return (
                    403,
                    f"this route changes state: send the header '{REQUEST_MARK}: 1' and a JSON body",
                    None,
                )
            content_type = headers.get(b"content-type", b"").split(b";")[0].strip().lower()
            if content_type != b"application/json":
                shown = content_type.decode("latin-1")[:60] or "none"
                return (
                    415,
                    f"this route takes a JSON body (Content-Type: application/json), got {shown}",
                    None,
                )
        return None

    def host_allowed(self, host: str) -> bool:
        if not host:
            return False
        name = host
        if host.startswith("["):  # [::1]:8000
            name = host[1 : host.find("]")] if "]" in host else host
        elif host.count(":") == 1:
            name = host.split(":")[0]
        name = name.lower().rstrip(".")
        if name in self.hosts:
            return True
        try:
            ipaddress.ip_address(name)  # an IP literal: no DNS name a rebinding page could have chosen
        except ValueError:
            return False
        return True


def _internal_error(error: BaseException) -> JSONResponse:
    return _error(500, f"internal error ({type(error).__name__}: {_one_line(error)[:200]})")


class _ConnectionLimit:
    """Pure ASGI, in uvicorn's protocol: beyond `limit` open connections (or running requests), requests
    get a JSON 503 — except the health probes, which always answer."""

    def __init__(self, app: Any, protocol: H11Protocol, limit: int, retry_after_s: int) -> None:
        self.app = app
        self.protocol = protocol
        self.limit = limit
        self.retry_after_s = retry_after_s

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        connections, tasks = len(self.protocol.connections), len(self.protocol.tasks)
        busy = connections > self.limit or tasks > self.limit
        if scope["type"] != "http" or not busy or scope.get("path", "") in HEALTH_ROUTES:
            await self.app(scope, receive, send)
            return
        logger.warning("%d connections open, limit %d: 503", connections, self.limit)
        reason = (
            f"server busy: {connections} connections open, {tasks} requests in progress, the limit is "
            f"{self.limit} (serve --max-connections); retry after {self.retry_after_s} s"
        )
        headers = {"Retry-After": str(self.retry_after_s), "Connection": "close"}
        await _send_error(send, 503, reason, headers)


class ServiceProtocol(H11Protocol):
    """uvicorn's h11 protocol with: a request-head timeout (h11 has none: a socket that sends nothing, or
    trickles its headers, is closed after `header_timeout_s`), the connection limit of `_ConnectionLimit`
    (health probes exempt) and a JSON body on its own 400 for malformed HTTP."""

    def __init__(
        self,
        config: Any,
        server_state: Any,
        app_state: dict[str, Any] | None = None,
        _loop: asyncio.AbstractEventLoop | None = None,
        *,
        header_timeout_s: float = 10.0,
        max_connections: int = 74,
        retry_after_s: int = 1,
    ) -> None:
        super().__init__(config, server_state, app_state if app_state is not None else {}, _loop)
        self.limit_concurrency = None  # ours below: JSON, health probes exempt
        self.app = _ConnectionLimit(self.app, self, max_connections, retry_after_s)
        self.header_timeout_s = header_timeout_s
        self.head_timer: asyncio.TimerHandle | None = None

    def _arm_head_timer(self) -> None:
        self._cancel_head_timer()
        self.head_timer = self.loop.call_later(self.header_timeout_s, self._head_timeout)

    def _cancel_head_timer(self) -> None:
        if self.head_timer is not None:
            self.head_timer.cancel()
            self.head_timer = None

    def _head_timeout(self) -> None:
        self.head_timer = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            logger.debug("closing a connection that sent no complete request in %g s", self.header_timeout_s)
            self.transport.close()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        super().connection_lost(exc)

    def handle_events(self) -> None:
        super().handle_events()
        if self.conn.their_state is not h11.IDLE:  # a request head arrived
            self._cancel_head_timer()

    def on_response_complete(self) -> None:
        self._arm_head_timer()  # the next request's head must come in time too (keep-alive)
        super().on_response_complete()

    def send_400_response(self, msg: str) -> None:
        body = _error_body(400, f"malformed HTTP request: {msg}")
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
        ]
        for event in (
            h11.Response(status_code=400, headers=headers, reason=b"Bad Request"),
            h11.Data(data=body),
        ):
            self.transport.write(self.conn.send(event))
        self.transport.write(self.conn.send(h11.EndOfMessage()))
        self.transport.close()


def uvicorn_config(
    app: Any,
    host: str = "127.0.0.1",
    port: int = 8000,
    settings: ServeSettings | None = None,
    workers: int = 1,
) -> Any:
    """The uvicorn.Config `serve` runs: our protocol and timeouts; `app` may be an import string (workers)."""
    import uvicorn

    settings = settings or ServeSettings()
    protocol = functools.partial(
        ServiceProtocol,
        header_timeout_s=settings.header_timeout_s,
        max_connections=settings.connection_limit,
        retry_after_s=settings.retry_after_s,
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


def _run_uvicorn(app: Any, config: Any) -> None:
    """Run `config` until interrupted: one process, or `config.workers` processes on one socket."""
    import uvicorn
    from uvicorn.supervisors import Multiprocess

    if config.workers > 1:
        Multiprocess(config, sockets=[config.bind_socket()]).run()
    else:
        uvicorn.Server(config).run()


_WORKER_ENV = "DEFECTDET_SERVE_WORKER"


def worker_app() -> FastAPI:
    """The app of one worker process of `serve --workers N` (bundle and settings from the environment)."""
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(message)s")
    spec = json.loads(os.environ[_WORKER_ENV])
    values = spec["settings"]
    values["allowed_hosts"] = tuple(values["allowed_hosts"])
    values["keep"] = tuple(values["keep"])
    values["token"] = os.environ.get(TOKEN_ENV) if spec["token_from_env"] else None
    if spec.get("parent"):
        bind_to_parent(spec["parent"])  # a killed parent takes its workers with it
    return create_app(spec["bundle"], ServeSettings(**values), state_dir=spec.get("state_dir"))


def _loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def serve(
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
        from defectdet import serve
        from defectdet.serve.server import ServeSettings

        serve("model.onnx", host="0.0.0.0", port=8000, settings=ServeSettings(token="a-long-secret"))
        ```

    `create_app(bundle, settings)` builds the same FastAPI app without running it (tests, your own server).
    `workers` > 1: that many processes share the port; /metrics sums them (Prometheus multiprocess mode,
    in `PROMETHEUS_MULTIPROC_DIR` or a temporary folder made and removed here). Drift state, the results
    list and readiness are kept per worker process; a drift reset reaches all of them. `keep_dir` is one
    folder for every worker (and every replica on a shared volume): one cap, one review queue.
    """
    from defectdet.runtime.predictor import MAX_DEFAULT_THREADS, physical_cores

    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    settings = settings or ServeSettings()
    if settings.threads is None:  # share the cores between the worker processes, each with one session
        # whose intra-op pool its concurrent inferences share (cores split per inference left a lone request
        # on one core: about 1.5x its latency on 2 cores, and less throughput at every concurrency)
        cores = min(physical_cores(), MAX_DEFAULT_THREADS)
        settings = replace(settings, threads=max(1, cores // workers))
    names = [host.lower().strip("[]")]
    if not _loopback(host):
        import socket

        names.append(socket.gethostname().lower())
    hosts = tuple(dict.fromkeys([*settings.allowed_hosts, *names]))
    settings = replace(settings, allowed_hosts=hosts)
    if not _loopback(host) and settings.token is None:
        logger.warning(
            "serving on %s without a token: anyone who can reach the port can inspect images and reset "
            "the drift charts; pass --token-file (or set %s), and put TLS in front (docs/guides/serve.md, Security)",
            host, TOKEN_ENV,
        )  # fmt: skip
    if settings.keep and not settings.keep_max_mb:
        logger.warning(
            "--keep-max-mb 0: the keep folder %s has no disk cap and grows until the disk is full",
            settings.keep_dir,
        )
    logger.info(
        "serving %s on http://%s:%d: %d process(es) x %d inference worker(s) x %d thread(s), queue %d, "
        "token %s, hosts %s",
        bundle, host, port, workers, settings.max_concurrency, settings.threads, settings.max_queue,
        "on" if settings.token else "off", ", ".join(settings.allowed_hosts),
    )  # fmt: skip
    if workers == 1:
        app = create_app(bundle, settings)
        _run_uvicorn(app, uvicorn_config(app, host, port, settings))
        return
    _serve_workers(bundle, host, port, settings, workers)


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
    saved = {key: os.environ.get(key) for key in ("PROMETHEUS_MULTIPROC_DIR", _WORKER_ENV, TOKEN_ENV)}
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir
    os.environ[_WORKER_ENV] = json.dumps(spec)
    if settings.token:
        os.environ[TOKEN_ENV] = settings.token
    try:
        target = "defectdet.serve.server:worker_app"
        _run_uvicorn(target, uvicorn_config(target, host, port, settings, workers=workers))
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        if own_dir:
            shutil.rmtree(metrics_dir, ignore_errors=True)

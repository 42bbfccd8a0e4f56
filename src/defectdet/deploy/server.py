"""The inspection service: FastAPI app serving one bundle through `Predictor`, with the drift monitor.

`create_app(bundle_or_predictor, settings)` builds the app; `defectdet serve` runs it under uvicorn.
Inference runs in a thread pool of `max_concurrency` workers, off the event loop; at most `max_queue`
more requests wait, beyond that the answer is 503 with Retry-After at once. Bodies are read as a stream
with a byte limit (413 as soon as it is exceeded). Every refusal is a 4xx JSON `{"error": one line}`.
No torch import.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import logging
import math
import threading
import time
from collections import deque
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from defectdet.data.imageio import decode_image, decode_pair
from defectdet.deploy.metrics import ServiceMetrics
from defectdet.deploy.monitor import DriftMonitor
from defectdet.deploy.runtime import PredictionResult, Predictor
from defectdet.deploy.upload import UploadError, read_form
from defectdet.errors import DefectDetError, ImageReadError, ImageTooLargeError

logger = logging.getLogger(__name__)

STATIC_DIR = Path(__file__).resolve().parent / "static"
FORM_FIELDS = ("image", "template", "conf")
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
                        "conf": {"type": "number", "description": "verdict threshold in [0, 1]"},
                    },
                }
            }
        },
    }
}


@dataclass(frozen=True)
class ServeSettings:
    """Service limits. `max_bytes` bounds a whole request body, `max_pixels` each decoded image."""

    max_concurrency: int = 2
    max_queue: int = 8
    max_bytes: int = 20 * 2**20
    max_pixels: int = 25_000_000
    threads: int | None = None  # onnxruntime intra-op threads when the app loads the bundle itself
    retry_after_s: int = 1
    body_timeout_s: float = 30.0  # a client that trickles its upload longer than this gets 408
    history: int = 50  # results kept for the page

    def __post_init__(self) -> None:
        for name in ("max_concurrency", "max_bytes", "max_pixels", "history"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_queue < 0:
            raise ValueError(f"max_queue must be >= 0, got {self.max_queue}")


class Service:
    """The app's state: the predictor, its readiness, admission control, the monitor and recent results."""

    def __init__(self, predictor: Predictor, settings: ServeSettings) -> None:
        self.predictor = predictor
        self.settings = settings
        self.metadata = predictor.metadata
        self.version = _bundle_version(predictor)
        reference = self.metadata.drift_reference
        self.monitor = DriftMonitor(reference) if reference else None
        self.metrics = ServiceMetrics(self.metadata.class_names, self.monitor)
        self.executor = ThreadPoolExecutor(settings.max_concurrency, thread_name_prefix="defectdet-infer")
        self.admitted = 0  # requests inside /v1/detect: reading, queued or running
        self.ready = threading.Event()
        self.readiness = "not started"
        self._warm_up_started = False
        self._lock = threading.Lock()
        self.results: deque[dict[str, Any]] = deque(maxlen=settings.history)

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
        size = self.metadata.input_size
        shape = (size, size) if self.metadata.channels == 1 else (size, size, 3)
        image = np.full(shape, 114, np.uint8)
        image[size // 4 : size // 2, size // 4 : size // 2] = 200
        try:
            started = time.perf_counter()
            self.predictor.predict(image, template=image if self.metadata.template else None)
        except Exception as error:  # a bundle that cannot run stays not-ready, with the reason
            self.readiness = f"warm-up failed: {' '.join(str(error).split())}"
            logger.error("warm-up inference failed: %s", error)
            return
        self.readiness = "ready"
        self.metrics.ready.set(1)
        self.ready.set()
        logger.info("warm-up inference took %.0f ms; ready", (time.perf_counter() - started) * 1e3)

    # ---------------------------------------------------------------- admission
    def admit(self) -> None:
        """Take a place in the service or refuse: 503 when not ready or more than max_queue would wait."""
        if not self.ready.is_set():
            self.start()
            raise UploadError(
                503, f"not ready: {self.readiness}", {"Retry-After": str(self.settings.retry_after_s)}
            )
        capacity = self.settings.max_concurrency + self.settings.max_queue
        if self.admitted >= capacity:
            raise UploadError(
                503,
                f"overloaded: {self.settings.max_concurrency} running and {self.settings.max_queue} waiting",
                {"Retry-After": str(self.settings.retry_after_s)},
            )
        self.admitted += 1
        self.metrics.admitted.set(self.admitted)

    def leave(self) -> None:
        self.admitted -= 1
        self.metrics.admitted.set(self.admitted)

    # ---------------------------------------------------------------- one request
    def infer(
        self, image: bytes, template: bytes | None, conf: float | None
    ) -> tuple[PredictionResult, dict]:
        """Decode, predict and update the monitor (runs in a worker thread)."""
        meta = self.metadata
        started = time.perf_counter()
        limit = self.settings.max_pixels
        _check_pixels(image, "image", limit)
        if template is not None:
            _check_pixels(template, "template", limit)
            decoded, decoded_template = decode_pair(
                image, template, "image", "template", meta.channels, limit
            )
        else:
            decoded, decoded_template = decode_image(image, "image", meta.channels, limit), None
        decode_ms = (time.perf_counter() - started) * 1e3
        result = self.predictor.predict(decoded, template=decoded_template, conf=conf)
        result.timings["decode"] = result.timings.get("decode", 0.0) + decode_ms
        drift_started = time.perf_counter()
        drift = (
            self.monitor.update(result.image_stats, result.features).to_dict() if self.monitor else _NO_DRIFT
        )
        result.timings["drift"] = (time.perf_counter() - drift_started) * 1e3
        return result, drift

    def _timed_infer(
        self, image: bytes, template: bytes | None, conf: float | None
    ) -> tuple[PredictionResult, dict, float]:
        started = time.perf_counter()  # a worker took it: the wait in the executor's queue ends here
        result, drift = self.infer(image, template, conf)
        return result, drift, started

    async def detect(self, request: Request) -> dict[str, Any]:
        self.admit()
        submitted = False
        try:
            arrived = time.perf_counter()
            fields = {
                "image": self.settings.max_bytes,
                "template": self.settings.max_bytes,
                "conf": CONF_FIELD_BYTES,
            }
            reading = read_form(
                {key.lower(): value for key, value in request.headers.items()},
                _stream(request),
                self.settings.max_bytes,
                fields,
            )
            try:
                form = await asyncio.wait_for(reading, self.settings.body_timeout_s)
            except asyncio.TimeoutError:
                raise UploadError(
                    408, f"the upload took longer than {self.settings.body_timeout_s:g} s"
                ) from None
            if "image" not in form:
                raise UploadError(422, "missing form field 'image' (the image file to inspect)")
            conf = _parse_conf(form["conf"].data) if "conf" in form else None
            template = bytes(form["template"].data) if "template" in form else None
            if self.metadata.template and template is None:
                raise UploadError(
                    422,
                    "this bundle compares each image to its defect-free template: send the 'template' field",
                )
            if not self.metadata.template and template is not None:
                raise UploadError(422, "this bundle takes no template: drop the 'template' field")
            received = time.perf_counter()
            job = self.executor.submit(self._timed_infer, bytes(form["image"].data), template, conf)
            submitted = True
            # the place is given back when the work ends, not when this coroutine does: a client that
            # hangs up cannot leave work behind that the queue limit no longer counts
            job.add_done_callback(_release_on(asyncio.get_running_loop(), self.leave))
            result, drift, queued = await asyncio.wrap_future(job)
            finished = time.perf_counter()
        finally:
            if not submitted:
                self.leave()
        timings = {
            "receive": (received - arrived) * 1e3,
            "queue": (queued - received) * 1e3,
            **{key: value for key, value in result.timings.items() if key != "total"},
            "compute": (finished - queued) * 1e3,
            "total": (finished - arrived) * 1e3,
        }
        self.metrics.observe_detection(result, drift, queue_s=queued - received, compute_s=finished - queued)
        answer = {
            "model_version": self.version,
            "verdict": result.verdict,
            "threshold": result.threshold,
            "image_size": list(result.image_size),
            "detections": [detection.to_dict() for detection in result.detections],
            "timings_ms": {key: round(value, 3) for key, value in timings.items()},
            "drift": drift,
            "image_stats": {key: round(float(value), 5) for key, value in result.image_stats.items()},
            "registration": result.registration,
            "tiles": result.tiles,
        }
        self.results.appendleft(
            {
                "time": time.time(),
                "verdict": result.verdict,
                "detections": len(result.detections),
                "classes": sorted({detection.class_name for detection in result.detections}),
                "top_score": max((detection.score for detection in result.detections), default=0.0),
                "drift": drift["level"],
                "total_ms": round(timings["total"], 1),
                "image_size": list(result.image_size),
            }
        )
        return answer

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


def _release_on(loop: asyncio.AbstractEventLoop, release: Any) -> Any:
    """A future callback (any thread) that runs `release` on the event loop's thread."""

    def callback(_: Any) -> None:
        try:
            loop.call_soon_threadsafe(release)
        except RuntimeError:  # the loop is closed: the app is shutting down
            pass

    return callback


def _bundle_version(predictor: Predictor) -> str:
    """sha256 (12 hex) of the bundle file when there is one, else of its metadata."""
    path = getattr(predictor, "path", None)
    digest = hashlib.sha256()
    if path is not None and Path(path).is_file():
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    else:
        digest.update(predictor.metadata.to_json().encode())
    return digest.hexdigest()[:12]


async def _stream(request: Request) -> AsyncIterator[bytes]:
    try:
        async for chunk in request.stream():
            yield chunk
    except ClientDisconnect:
        raise UploadError(400, "client disconnected during the upload") from None


def _parse_conf(data: bytes) -> float:
    text = data.decode("utf-8", "replace").strip()
    try:
        value = float(text)
    except ValueError:
        raise UploadError(422, f"conf must be a number in [0, 1], got {text[:30]!r}") from None
    if not math.isfinite(value) or not 0.0 <= value <= 1.0:
        raise UploadError(422, f"conf must be a number in [0, 1], got {text[:30]!r}")
    return value


def _check_pixels(data: bytes, name: str, limit: int) -> None:
    """Refuse an image whose header declares more than `limit` pixels, before decoding it."""
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as image:
            width, height = image.size
    except Exception:  # not an image Pillow knows: decode_image gives the precise reason
        return
    if width * height > limit:
        raise UploadError(
            413, f"{name} is {width}x{height} = {width * height:,} pixels; the limit is {limit:,}"
        )


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


def _error(status: int, reason: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": " ".join(str(reason).split()), "status": status}, status, headers=headers)


def create_app(bundle: str | Path | Predictor, settings: ServeSettings | None = None) -> FastAPI:
    """The service for one bundle (a path, loaded here, or a ready `Predictor`)."""
    settings = settings or ServeSettings()
    predictor = (
        bundle
        if not isinstance(bundle, (str, Path))
        else Predictor(bundle, threads=settings.threads, max_pixels=settings.max_pixels)
    )
    service = Service(predictor, settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        service.start()
        yield
        service.executor.shutdown(wait=False, cancel_futures=True)

    app = FastAPI(
        title="defectdet inspection service",
        version=service.version,
        description="POST an image (and its template) to /v1/detect; scrape /metrics; open / for the page.",
        lifespan=lifespan,
    )
    app.state.service = service
    app.add_middleware(_MetricsMiddleware, metrics=service.metrics)

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

    @app.post("/v1/detect", openapi_extra=DETECT_BODY_SCHEMA, summary="Detect defects in one image")
    async def detect(request: Request) -> Response:
        """multipart/form-data: `image` (file), `template` (file, template bundles), `conf` (number)."""
        return _FastJSON(await service.detect(request))

    @app.get("/healthz", summary="The process is alive")
    async def healthz() -> dict[str, Any]:
        return {"status": "alive"}

    @app.get("/readyz", summary="200 once the model is loaded and one warm-up inference ran")
    async def readyz() -> Response:
        if service.ready.is_set():
            return JSONResponse({"ready": True, "model_version": service.version})
        service.start()
        headers = {"Retry-After": str(settings.retry_after_s)}
        return JSONResponse({"ready": False, "reason": service.readiness}, 503, headers=headers)

    @app.get("/v1/model", summary="The bundle's metadata")
    async def model() -> dict[str, Any]:
        return {
            "model_version": service.version,
            "metadata": service.metadata.model_dump(mode="json"),
            "settings": {
                "max_concurrency": settings.max_concurrency,
                "max_queue": settings.max_queue,
                "max_bytes": settings.max_bytes,
                "max_pixels": settings.max_pixels,
            },
        }

    @app.get("/v1/drift", summary="Drift state, chart limits and recent chart values")
    async def drift() -> dict[str, Any]:
        return service.drift_report()

    @app.post("/v1/drift/reset", summary="Restart the drift charts (after cleaning the lens, a new lamp)")
    async def drift_reset() -> dict[str, Any]:
        if service.monitor is not None:
            service.monitor.reset()
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
        return FileResponse(STATIC_DIR / "index.html", media_type="text/html")

    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
    return app


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


def serve(
    bundle: str | Path, host: str = "127.0.0.1", port: int = 8000, settings: ServeSettings | None = None
) -> None:
    """Run the service under uvicorn until interrupted (what `defectdet serve` does)."""
    import uvicorn

    from defectdet.deploy.runtime import MAX_DEFAULT_THREADS, physical_cores

    settings = settings or ServeSettings()
    if settings.threads is None:  # share the cores between the concurrent inferences
        cores = min(physical_cores(), MAX_DEFAULT_THREADS)
        settings = replace(settings, threads=max(1, cores // settings.max_concurrency))
    app = create_app(bundle, settings)
    service: Service = app.state.service
    logger.info(
        "serving %s (version %s) on http://%s:%d: %d worker(s) x %d thread(s), queue %d, drift monitor %s",
        bundle, service.version, host, port, settings.max_concurrency, settings.threads, settings.max_queue,
        "on" if service.monitor else "off (no reference in the bundle)",
    )  # fmt: skip
    # uvicorn's own cap answers 503 for connections far beyond ours (probes and the page keep headroom)
    limit = settings.max_concurrency + settings.max_queue + 64
    uvicorn.run(app, host=host, port=port, limit_concurrency=limit, access_log=False, log_config=None)

"""The service's state and one /v1/detect request: `Service` holds the live model (through `Deployment`),
readiness, admission control (at most `max_concurrency` inferences run on a thread pool, off the event loop,
and `max_queue` more wait; beyond that 503 with Retry-After at once), capture, the drift charts and the last
results. An upload is read as a stream (`serve.detect_form`) before it takes an inference place. No torch
import.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from starlette.requests import Request

from defectdet.errors import DefectDetError, ImageReadError
from defectdet.runtime.bundle import BundleMetadata
from defectdet.runtime.model_quality import validation_quality
from defectdet.runtime.monitor import DriftMonitor
from defectdet.runtime.pipeline import Planes, load_planes
from defectdet.runtime.predictor import PredictionResult, Predictor
from defectdet.serve.answers import one_line
from defectdet.serve.capture import Capture, KeptItem, keep_reasons
from defectdet.serve.deployment import Deployment, ServedModel, predict_planes, warm_up
from defectdet.serve.detect_form import Upload, read_detect_form, upload_of
from defectdet.serve.metrics import ServiceMetrics
from defectdet.serve.review import ReviewFolder
from defectdet.serve.servable import ServablePredictor
from defectdet.serve.settings import ServeSettings
from defectdet.serve.upload import Part, UploadError, upload_name
from defectdet.serve.workers import DriftBroadcast

logger = logging.getLogger(__name__)


class Service:
    """The app's state: the predictor, its readiness, admission control, the monitor and recent results."""

    def __init__(
        self,
        predictor: ServablePredictor,
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
    def predictor(self) -> ServablePredictor:
        return self.live.predictor

    @property
    def metadata(self) -> BundleMetadata:
        return self.live.metadata

    @property
    def monitor(self) -> DriftMonitor | None:
        return self.live.monitor

    @property
    def version(self) -> str:
        return self.live.version

    def _swapped(self, model: ServedModel) -> None:
        """Another model went live: the drift gauges follow its charts, the review page offers its classes."""
        self.metrics.set_drift_charts(model.monitor)
        warn_quality(model.name, model.metadata)
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

    def leave(self, _: Future | None = None) -> None:
        """Give a place back (any thread; also a future's done callback)."""
        with self._places:
            self.admitted -= 1
            self.metrics.admitted.set(self.admitted)

    # ---------------------------------------------------------------- one request
    def decode(self, upload: Upload, meta: BundleMetadata) -> tuple[Planes, float]:
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
                f"{which}: not a decodable image ({type(error).__name__}: {one_line(error)})"
            ) from None
        named = {"image": planes.image, "template": planes.template, **planes.companions}
        for name, array in named.items():
            if array is not None and array.shape[2:] != ((3,) if meta.channels == 3 else ()):
                raise ImageReadError(f"{name}: decoded to an unexpected shape {array.shape}")
        return planes, (time.perf_counter() - started) * 1e3

    def infer(
        self, live: ServedModel, planes: Planes, threshold: float | None
    ) -> tuple[PredictionResult, dict]:
        """Predict with `live` and update its drift charts (runs in a worker thread)."""
        options: dict[str, Any] = {"threshold": threshold}
        if self.capture is not None and "uncertain" in self.settings.keep:  # see near misses too
            floor = max(0.0, live.metadata.thresholds.threshold - self.settings.keep_margin)
            # never above the request's own threshold: keeping must not change the verdict
            options["score_floor"] = floor if threshold is None else min(floor, threshold)
        result = predict_planes(live.predictor, planes.image, planes.template, planes.companions, **options)
        drift_started = time.perf_counter()
        monitor = live.monitor
        drift = monitor.update(result.image_stats, result.features).to_dict() if monitor else NO_DRIFT
        result.timings["drift"] = (time.perf_counter() - drift_started) * 1e3
        return result, drift

    def _timed_infer(
        self, upload: Upload, threshold: float | None
    ) -> tuple[PredictionResult, dict, float, bool, str]:
        """(result, drift, started, kept, model version). The live model is taken once, here: a promotion
        while this runs changes the model of the next request, not of this one."""
        started = time.perf_counter()  # a worker took it: the wait in the executor's queue ends here
        live = self.live
        planes, decode_ms = self.decode(upload, live.metadata)
        result, drift = self.infer(live, planes, threshold)
        result.timings["decode"] = result.timings.get("decode", 0.0) + decode_ms
        kept = self.keep(live, upload, result, drift)
        if threshold is None:  # the shadow is compared at both models' own thresholds
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
                    "upload_name": upload_name(upload.filename),
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
        upload, threshold = upload_of(form, self.metadata)
        received = time.perf_counter()
        result, drift, queued, kept, version = await self._run(upload, threshold)
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

    async def _read_upload(self, request: Request) -> dict[str, Part]:
        """The multipart form (`read_detect_form`), counted as an upload being read."""
        self.reading += 1
        self.metrics.reading.set(self.reading)
        try:
            return await read_detect_form(request, self.metadata, self.settings)
        finally:
            self.reading -= 1
            self.metrics.reading.set(self.reading)

    async def _run(
        self, upload: Upload, threshold: float | None
    ) -> tuple[PredictionResult, dict, float, bool, str]:
        """Take a place (503 when full) and infer on a worker thread: (result, drift, queued, kept)."""
        self.admit()
        submitted = False
        try:
            job = self.executor.submit(self._timed_infer, upload, threshold)
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
            return {"state": NO_DRIFT, "limits": {}, "history": [], "skipped": {}}
        return {
            "state": self.monitor.state().to_dict(),
            "limits": self.monitor.limits(),
            "history": self.monitor.history(),
            "skipped": self.monitor.skipped,
            "lambda": self.monitor.lam,
            "alert_run_length": self.monitor.alert_run_length,
        }


NO_DRIFT: dict[str, Any] = {
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


def warn_quality(name: str, metadata: BundleMetadata) -> None:
    """Log a loud warning when the served model's validation mAP is near zero."""
    warning = validation_quality(metadata)["warning"]
    if warning:
        logger.warning("MODEL %s: %s", name, warning)

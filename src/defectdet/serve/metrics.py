"""Prometheus metrics of the inspection service, in a registry of its own (one per app).

Under `serve --workers N` (`PROMETHEUS_MULTIPROC_DIR` set before the workers start) every worker writes its
values to that folder and /metrics, whichever worker answers, reads them all: counters and histograms sum
over the workers, `defectdet_ready` is the least ready live worker, drift levels the worst, and the drift
EWMAs carry a `pid` label (each worker keeps its own charts).
"""

from __future__ import annotations

import os
import warnings
from typing import TYPE_CHECKING, Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from defectdet.runtime.monitor import LEVELS, DriftMonitor

if TYPE_CHECKING:
    from defectdet.runtime.predictor import PredictionResult

ROUTES = frozenset(
    {
        "/",
        "/v1/detect",
        "/healthz",
        "/readyz",
        "/v1/model",
        "/v1/drift",
        "/v1/drift/reset",
        "/v1/results",
        "/metrics",
        "/openapi.json",
        "/review",
        "/v1/models",
        "/v1/models/shadow",
        "/v1/models/promote",
        "/v1/models/rollback",
    }
)
LATENCY_BUCKETS = (0.002, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5, 5.0)


class ServiceMetrics:
    """Requests by route and status, queue and compute latency, detections, verdicts and the drift charts."""

    def __init__(self, class_names: list[str], monitor: DriftMonitor | None) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.multiprocess = bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))
        self._service_metrics(self.registry)
        self._drift_metrics(self.registry)
        self._keep_metrics(self.registry)
        self._model_metrics(self.registry)
        self._store_metrics(self.registry)
        for name in class_names:
            self.detections.labels(name)
        for verdict in ("defective", "clean"):
            self.verdicts.labels(verdict)
        self.set_drift_charts(monitor)

    def set_drift_charts(self, monitor: DriftMonitor | None) -> None:
        """Start the drift gauges from the charts of `monitor` (at start, and when another model goes live)."""
        for gauge in (self.drift_limit, self.drift_z, self.drift_chart_level, self.drift_value):
            _clear(gauge)
        self._chart_gauges: dict[str, tuple[Any, Any, Any]] = {}  # statistic -> its value, z and level gauges
        # the newest answer's drift, not yet in the gauges (one process: set when /metrics is read)
        self._drift_unrendered: dict[str, Any] | None = None
        if monitor is None:
            self.drift_level.set(-1)
            return
        self.drift_level.set(0)
        for name, limits in monitor.limits().items():
            self.drift_limit.labels(name).set(limits["alert_limit"])
            self.drift_z.labels(name).set(0)
            self.drift_chart_level.labels(name).set(0)

    def _chart(self, name: str) -> tuple[Any, Any, Any]:
        """The value, z and level gauges of one drift statistic, looked up once (labels() per answer and
        chart cost more than the rest of the bookkeeping of an answer)."""
        gauges = (
            self.drift_value.labels(name),
            self.drift_z.labels(name),
            self.drift_chart_level.labels(name),
        )
        self._chart_gauges = {**self._chart_gauges, name: gauges}
        return gauges

    def _service_metrics(self, registry: CollectorRegistry) -> None:
        """Requests, latencies, detections, verdicts, places in service and readiness."""
        self.requests = Counter(
            "defectdet_requests", "HTTP requests by route and status", ["route", "status"], registry=registry
        )
        self.latency = Histogram(
            "defectdet_request_seconds",
            "Request latency by route, from the first byte to the answer",
            ["route"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.queue = Histogram(
            "defectdet_queue_seconds",
            "Time a detect request waited for a worker",
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.compute = Histogram(
            "defectdet_compute_seconds",
            "Time a worker spent on a detect request (decode, model, postprocess, drift)",
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.detections = Counter(
            "defectdet_detections", "Detections by class", ["class_name"], registry=registry
        )
        self.verdicts = Counter("defectdet_verdicts", "Image verdicts", ["verdict"], registry=registry)
        self.admitted = Gauge(
            "defectdet_requests_in_service",
            "Detect requests queued or running (an inference place)",
            registry=registry,
            multiprocess_mode="livesum",
        )
        self.reading = Gauge(
            "defectdet_uploads_in_progress",
            "Detect uploads still being read (they hold no place)",
            registry=registry,
            multiprocess_mode="livesum",
        )
        self.ready = Gauge(
            "defectdet_ready",
            "1 once the warm-up inference ran",
            registry=registry,
            multiprocess_mode="livemin",
        )

    def _drift_metrics(self, registry: CollectorRegistry) -> None:
        """The drift monitor's overall level and, per statistic, its EWMA, z, limit and level."""
        self.drift_level = Gauge(
            "defectdet_drift_level",
            "Overall drift state: 0 ok, 1 warn, 2 alert",
            registry=registry,
            multiprocess_mode="livemax",
        )
        self.drift_value = Gauge(
            "defectdet_drift_value",
            "EWMA of each drift statistic, in its own units",
            ["statistic"],
            registry=registry,
            multiprocess_mode="liveall",
        )
        self.drift_z = Gauge(
            "defectdet_drift_z",
            "EWMA of each statistic in reference standard deviations (alert beyond defectdet_drift_limit)",
            ["statistic"],
            registry=registry,
            multiprocess_mode="liveall",
        )
        self.drift_limit = Gauge(
            "defectdet_drift_limit",
            "Alert limit of each chart, in reference standard deviations",
            ["statistic"],
            registry=registry,
            multiprocess_mode="max",
        )
        self.drift_chart_level = Gauge(
            "defectdet_drift_chart_level",
            "Per chart: 0 ok, 1 warn, 2 alert",
            ["statistic"],
            registry=registry,
            multiprocess_mode="livemax",
        )

    def _keep_metrics(self, registry: CollectorRegistry) -> None:
        """What `serve --keep` kept, failed to keep, dropped and evicted, and the bytes it holds."""
        self.kept = Counter(
            "defectdet_kept",
            "Answers kept (serve --keep) by the policy that kept them",
            ["reason"],
            registry=registry,
        )
        self.keep_errors = Counter(
            "defectdet_keep_errors",
            "Answers that could not be kept (a disk error; logged)",
            registry=registry,
        )
        self.keep_dropped = Counter(
            "defectdet_keep_dropped",
            "Answers a policy chose but not kept: queue full or at the disk cap",
            ["why"],
            registry=registry,
        )
        self.keep_evicted = Counter(
            "defectdet_keep_evicted",
            "Unreviewed kept items deleted to stay under --keep-max-mb",
            registry=registry,
        )
        self.kept_bytes = Gauge(
            "defectdet_kept_bytes",
            "Bytes of kept images, templates and sidecars",
            registry=registry,
            multiprocess_mode="livemax",
        )

    def _model_metrics(self, registry: CollectorRegistry) -> None:
        """Which models are live, shadow and previous; the shadow's disagreements; promotions and roll-backs."""
        self.model_info = Gauge(
            "defectdet_model",
            "1 for each served model, by role (live, shadow, previous) and version",
            ["role", "version"],
            registry=registry,
            multiprocess_mode="liveall",
        )
        self.shadow_images = Counter(
            "defectdet_shadow_images",
            "Images the shadow model answered beside the live one",
            registry=registry,
        )
        self.shadow_disagreements = Counter(
            "defectdet_shadow_disagreements",
            "Images where the shadow differed from the live model: any, verdict, or boxes (IoU 0.5, same class)",
            ["kind"],
            registry=registry,
        )
        self.shadow_rate = Gauge(
            "defectdet_shadow_disagreement_rate",
            "Share of the last 500 shadowed images where shadow and live differed",
            registry=registry,
            multiprocess_mode="livemax",
        )
        self.shadow_skipped = Counter(
            "defectdet_shadow_skipped",
            "Images not shadowed because the shadow was still busy",
            registry=registry,
        )
        self.shadow_errors = Counter(
            "defectdet_shadow_errors", "Images the shadow model failed on (logged)", registry=registry
        )
        self.promotions = Counter(
            "defectdet_model_changes", "Promotions and roll-backs", ["action"], registry=registry
        )
        for kind in ("any", "verdict", "boxes"):
            self.shadow_disagreements.labels(kind)
        for action in ("promote", "rollback"):
            self.promotions.labels(action)

    def _store_metrics(self, registry: CollectorRegistry) -> None:
        """The models-store generation served and seen, whether this process lags it, and the bundle served."""
        self.generation = Gauge(
            "defectdet_model_generation",
            "The models-store generation this process serves (0: no store)",
            registry=registry,
            multiprocess_mode="liveall",
        )
        self.store_generation = Gauge(
            "defectdet_store_generation",
            "The models store's newest generation, as this process last read it",
            registry=registry,
            multiprocess_mode="livemax",
        )
        self.model_behind_store = Gauge(
            "defectdet_model_behind_store",
            "1 while this process serves another generation than the store's "
            "current one and failed to load it (or is behind for over a minute): /readyz answers 503",
            registry=registry,
            multiprocess_mode="livemax",
        )
        self.serving = Gauge(
            "defectdet_model_serving",
            "1 for the bundle this process serves, by sha256 and store generation",
            ["sha256", "generation"],
            registry=registry,
            multiprocess_mode="liveall",
        )

    def set_models(self, deployment: Any) -> None:
        """`defectdet_model{role, version}` for the deployment's live, shadow and previous models; the
        generation and sha256 this process serves."""
        for gauge in (self.model_info, self.serving):
            _clear(gauge)
        self.model_info.labels("live", deployment.live.version).set(1)
        generation = getattr(deployment, "generation", None) or 0
        self.generation.set(generation)
        self.serving.labels(deployment.live.sha256, str(generation)).set(1)
        if generation:
            self.store_generation.set(max(generation, getattr(deployment, "store_seen", None) or 0))
        if deployment.shadow is not None:
            self.model_info.labels("shadow", deployment.shadow.model.version).set(1)
        else:
            self.shadow_rate.set(0)
        if deployment.previous is not None:
            self.model_info.labels("previous", deployment.previous.version).set(1)

    def observe_shadow(self, kinds: list[str], rate: float) -> None:
        self.shadow_images.inc()
        if kinds:
            self.shadow_disagreements.labels("any").inc()
        for kind in kinds:
            self.shadow_disagreements.labels(kind).inc()
        self.shadow_rate.set(rate)

    def observe_request(self, path: str, status: int, seconds: float) -> None:
        route = path if path in ROUTES else ("/static" if path.startswith("/static/") else "other")
        if path.startswith("/v1/review/"):
            route = "/v1/review"
        self.requests.labels(route, str(status)).inc()
        self.latency.labels(route).observe(seconds)

    def observe_detection(
        self, result: PredictionResult, drift: dict[str, Any], queue_s: float, compute_s: float
    ) -> None:
        self.queue.observe(queue_s)
        self.compute.observe(compute_s)
        self.verdicts.labels(result.verdict).inc()
        for detection in result.detections:
            self.detections.labels(detection.class_name).inc()
        if drift.get("level") not in LEVELS:
            return
        if self.multiprocess:  # another worker may answer the scrape: its file must hold the values now
            self._set_drift_gauges(drift)
        else:  # one process: the gauges are set when /metrics is read (`render`), not on every answer
            self._drift_unrendered = drift

    def _set_drift_gauges(self, drift: dict[str, Any]) -> None:
        """The overall level and each chart's EWMA, z and level, from an answer's drift state."""
        self.drift_level.set(LEVELS.index(drift["level"]))
        for name, chart in drift["charts"].items():
            value, z, level = self._chart_gauges.get(name) or self._chart(name)
            value.set(chart["value"])
            z.set(chart["z"])
            level.set(LEVELS.index(chart["level"]))

    def render(self) -> tuple[bytes, str]:
        """The exposition text: this app's registry, or every worker's values in multiprocess mode."""
        if not self.multiprocess:
            drift, self._drift_unrendered = self._drift_unrendered, None
            if drift is not None:
                self._set_drift_gauges(drift)
            return generate_latest(self.registry), CONTENT_TYPE_LATEST
        from prometheus_client.multiprocess import MultiProcessCollector

        registry = CollectorRegistry()
        MultiProcessCollector(registry)
        return generate_latest(registry), CONTENT_TYPE_LATEST

    def close(self) -> None:
        """At shutdown: in multiprocess mode, drop this worker's live gauges."""
        if self.multiprocess:
            from prometheus_client.multiprocess import mark_process_dead

            mark_process_dead(os.getpid())


def _clear(gauge: Gauge) -> None:
    """Drop a labelled gauge's children. In multiprocess mode their values stay in this process's file, so
    they are set to 0 first: a label set that no longer holds reads 0, not its old 1."""
    for labels in list(gauge._metrics):  # noqa: SLF001 - prometheus_client keeps no public list of children
        gauge.labels(*labels).set(0)
    with warnings.catch_warnings():  # "not implemented in multi-process mode": the zeros above stand in
        warnings.simplefilter("ignore", UserWarning)
        gauge.clear()

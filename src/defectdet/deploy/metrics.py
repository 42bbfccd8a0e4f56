"""Prometheus metrics of the inspection service, in a registry of its own (one per app)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from defectdet.deploy.monitor import LEVELS, DriftMonitor

if TYPE_CHECKING:
    from defectdet.deploy.runtime import PredictionResult

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
        "/docs",
        "/openapi.json",
    }
)
LATENCY_BUCKETS = (0.002, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5, 5.0)


class ServiceMetrics:
    """Requests by route and status, queue and compute latency, detections, verdicts and the drift charts."""

    def __init__(self, class_names: list[str], monitor: DriftMonitor | None) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        registry = self.registry
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
            "defectdet_queue_seconds", "Time a detect request waited for a worker", buckets=LATENCY_BUCKETS,
            registry=registry,
        )  # fmt: skip
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
            "defectdet_requests_in_service", "Detect requests being read, queued or run", registry=registry
        )
        self.ready = Gauge("defectdet_ready", "1 once the warm-up inference ran", registry=registry)
        self.drift_level = Gauge(
            "defectdet_drift_level", "Overall drift state: 0 ok, 1 warn, 2 alert", registry=registry
        )
        self.drift_value = Gauge(
            "defectdet_drift_value",
            "EWMA of each drift statistic, in its own units",
            ["statistic"],
            registry=registry,
        )
        self.drift_z = Gauge(
            "defectdet_drift_z",
            "EWMA of each statistic in reference standard deviations (alert beyond defectdet_drift_limit)",
            ["statistic"],
            registry=registry,
        )
        self.drift_limit = Gauge(
            "defectdet_drift_limit", "Alert limit of each chart, in reference standard deviations", ["statistic"],
            registry=registry,
        )  # fmt: skip
        self.drift_chart_level = Gauge(
            "defectdet_drift_chart_level",
            "Per chart: 0 ok, 1 warn, 2 alert",
            ["statistic"],
            registry=registry,
        )
        for name in class_names:
            self.detections.labels(name)
        for verdict in ("defective", "clean"):
            self.verdicts.labels(verdict)
        if monitor is not None:
            for name, limits in monitor.limits().items():
                self.drift_limit.labels(name).set(limits["alert_limit"])
                self.drift_z.labels(name).set(0)
                self.drift_chart_level.labels(name).set(0)
        else:
            self.drift_level.set(-1)

    def observe_request(self, path: str, status: int, seconds: float) -> None:
        route = path if path in ROUTES else ("/static" if path.startswith("/static/") else "other")
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
        if drift.get("level") in LEVELS:
            self.drift_level.set(LEVELS.index(drift["level"]))
            for name, chart in drift["charts"].items():
                self.drift_value.labels(name).set(chart["value"])
                self.drift_z.labels(name).set(chart["z"])
                self.drift_chart_level.labels(name).set(LEVELS.index(chart["level"]))

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST

"""The inspection service's FastAPI app: `create_app(bundle_or_predictor, settings)` puts the rooms together.

- `serve.settings`: `ServeSettings`, the limits and access settings.
- `serve.service`: `Service`, the live model, readiness, admission control and one /v1/detect request, whose
  form `serve.detect_form` reads and checks.
- `serve.routes`: the service's routes and the JSON error handlers; `serve.review` and `serve.model_routes`
  add the review and models routes.
- `serve.detect_route`: `POST /v1/detect` answered before the router (the route's own hot path).
- `serve.guards`: the middlewares (JSON 500s, request metrics, Host/token/cross-site access control);
  `serve.json_body` bounds JSON bodies.
- `serve.protocol`: uvicorn's h11 protocol with a request-head timeout and a connection limit.
- `serve.launch`: `serve_bundle`, what `defectdet serve` runs, in one process or several (`serve.workers`).

Every error is JSON `{"error": one line, "status": N}`; an unexpected exception is logged and answered 500 in
JSON. No torch import.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

from defectdet.runtime.predictor import Predictor
from defectdet.serve.detect_route import DetectRoute
from defectdet.serve.guards import AccessGuard, JSONErrors, RequestMetrics
from defectdet.serve.json_body import JSONBodyLimit
from defectdet.serve.model_routes import models_router
from defectdet.serve.review import review_router
from defectdet.serve.review_map import AnomalyMaps, anomaly_map_router
from defectdet.serve.routes import (
    STATIC_DIR,
    add_error_handlers,
    add_inspection_routes,
    add_monitoring_routes,
)
from defectdet.serve.servable import ServablePredictor
from defectdet.serve.service import Service, warn_quality
from defectdet.serve.settings import ServeSettings


def create_app(
    bundle: str | Path | ServablePredictor,
    settings: ServeSettings | None = None,
    state_dir: str | None = None,
) -> FastAPI:
    """The service for one bundle (a path, loaded here, or a ready `Predictor`). `state_dir`: the folder the
    processes of `serve --workers` share (a drift reset there reaches all of them)."""
    settings = settings or ServeSettings()
    service = _start_service(bundle, settings, state_dir)
    app = FastAPI(
        title="defectdet inspection service",
        version=service.version,
        description="POST an image (and its template) to /v1/detect; scrape /metrics; open / for the page.",
        lifespan=_lifespan(service),
        docs_url=None,  # Swagger UI and ReDoc load their assets from a CDN: blank offline; /openapi.json stays
        redoc_url=None,
    )
    app.state.service = service
    _add_middlewares(app, service, settings)
    _add_routes(app, service, settings)
    return app


def _start_service(
    bundle: str | Path | ServablePredictor, settings: ServeSettings, state_dir: str | None
) -> Service:
    """The `Service` of `bundle` (loaded here when a path), its quality warned about and its shadow started."""
    predictor: ServablePredictor
    if isinstance(bundle, (str, Path)):
        predictor = Predictor(bundle, threads=settings.threads, max_pixels=settings.max_pixels)
    else:
        predictor = bundle
    live_path = Path(bundle) if isinstance(bundle, (str, Path)) else None
    service = Service(predictor, settings, live_path, state_dir)
    warn_quality(service.live.name, service.metadata)
    if settings.shadow:
        service.deployment.start_shadow(settings.shadow, unless_live=True)  # a bad name stops serve here
    return service


def _lifespan(service: Service) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    """The app's lifespan: start the service, the store watch, the keep queue and the drift broadcast; stop
    them in turn at shutdown."""

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

    return lifespan


def _add_middlewares(app: FastAPI, service: Service, settings: ServeSettings) -> None:
    # outermost last: errors (any exception -> JSON 500) > metrics (counts every answer) > guard (access)
    # > JSON body limits (size and nesting, before any route parses a body) > POST /v1/detect, before the router
    app.add_middleware(DetectRoute, service=service)
    app.add_middleware(JSONBodyLimit)
    app.add_middleware(AccessGuard, settings=settings)
    app.add_middleware(RequestMetrics, metrics=service.metrics)
    app.add_middleware(JSONErrors)


def _add_routes(app: FastAPI, service: Service, settings: ServeSettings) -> None:
    """The error handlers, the inspection, monitoring, review and models routes, and the page's files."""
    add_error_handlers(app)
    add_inspection_routes(app, service, settings)
    add_monitoring_routes(app, service)
    if service.review is not None:
        app.include_router(review_router(service.review))
        maps = AnomalyMaps(service.review, lambda: service.predictor)
        app.include_router(anomaly_map_router(maps))
    app.include_router(models_router(service.deployment))

    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")

"""`defectdet review FOLDER`: the review page and its API on their own, without a bundle. No torch import.

The same routes as `serve --keep-dir` (`serve.review.review_router`) behind the service's guards: Host check,
the optional token on every route but the page and its static files, cross-site refusals, and on every POST
the `X-Defectdet-Request` header and a JSON body. Errors are JSON `{"error", "status"}`. With a good-parts-only
bundle (`model`), the page also draws its anomaly map under the boxes (`serve.review_map`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException

from defectdet.errors import DefectDetError
from defectdet.runtime.anomaly_map import is_good_only
from defectdet.serve.answers import error_response
from defectdet.serve.guards import AccessGuard, JSONErrors
from defectdet.serve.json_body import JSONBodyLimit
from defectdet.serve.launch import is_loopback, run_uvicorn, uvicorn_config
from defectdet.serve.review import ReviewFolder, review_router
from defectdet.serve.review_map import AnomalyMaps, anomaly_map_router
from defectdet.serve.routes import STATIC_DIR
from defectdet.serve.settings import ServeSettings
from defectdet.serve.upload import UploadError


def create_review_app(
    folder: ReviewFolder | str | Path, settings: ServeSettings | None = None, model: str | Path | None = None
) -> FastAPI:
    """The review app over `folder` (a `ReviewFolder` or a path); `model`: a good-parts-only bundle whose anomaly
    map the page draws (DefectDetError naming it for any other bundle)."""
    settings = settings or ServeSettings()
    review = folder if isinstance(folder, ReviewFolder) else ReviewFolder(Path(folder))
    maps = None if model is None else _anomaly_maps(review, Path(model))
    app = FastAPI(
        title="defectdet review", docs_url=None, redoc_url=None, description="Review kept images into labels."
    )
    app.state.review = review
    app.add_middleware(JSONBodyLimit)
    app.add_middleware(AccessGuard, settings=settings)
    app.add_middleware(JSONErrors)

    @app.exception_handler(UploadError)
    async def uploaderror_response(request: Request, error: UploadError) -> JSONResponse:
        return error_response(error.status, error.reason, error.headers)

    @app.exception_handler(DefectDetError)
    async def inputerror_response(request: Request, error: DefectDetError) -> JSONResponse:
        return error_response(422, str(error))

    @app.exception_handler(StarletteHTTPException)
    async def httperror_response(request: Request, error: StarletteHTTPException) -> JSONResponse:
        return error_response(error.status_code, str(error.detail), getattr(error, "headers", None))

    @app.get("/", include_in_schema=False)
    async def home() -> Any:
        return RedirectResponse("/review")

    app.include_router(review_router(review))
    if maps is not None:
        app.include_router(anomaly_map_router(maps))
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
    return app


def _anomaly_maps(review: ReviewFolder, model: Path) -> AnomalyMaps:
    from defectdet.runtime.predictor import Predictor

    predictor = Predictor(model, threads=1)
    if not is_good_only(predictor.metadata):
        raise DefectDetError(
            f"--model {model}: not a good-parts-only model (defectdet fit); the anomaly map comes from one"
        )
    return AnomalyMaps(review, lambda: predictor)


def run_review(
    folder: ReviewFolder | str | Path,
    host: str = "127.0.0.1",
    port: int = 8001,
    settings: ServeSettings | None = None,
    model: str | Path | None = None,
) -> None:
    """Serve the review page until interrupted (what `defectdet review` does); `model` as `create_review_app`.
    Like `serve`: the bind host (and, beyond loopback, the machine's name) are served Host names, and binding
    beyond loopback without a token warns."""
    import logging
    import socket
    from dataclasses import replace

    logger = logging.getLogger(__name__)
    settings = settings or ServeSettings()
    names = [host.lower().strip("[]")]
    if not is_loopback(host):
        names.append(socket.gethostname().lower())
        if settings.token is None:
            logger.warning(
                "review on %s without a token: anyone who can reach the port can change the labels; "
                "pass --token-file (or set DEFECTDET_TOKEN)",
                host,
            )
    settings = replace(settings, allowed_hosts=tuple(dict.fromkeys([*settings.allowed_hosts, *names])))
    app = create_review_app(folder, settings, model)
    logger.info("review page on http://%s:%d/review", host, port)
    run_uvicorn(uvicorn_config(app, host, port, settings))

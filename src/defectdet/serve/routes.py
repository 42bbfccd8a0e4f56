"""The service's own routes: /v1/detect (with its OpenAPI body per bundle), the health and readiness probes,
/v1/model, drift, the last results, /metrics and the page; and the handlers that answer every refusal as
JSON `{"error": one line, "status": N}`. The review and models routes have their own modules. No torch import.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from defectdet.errors import DefectDetError, ImageTooLargeError
from defectdet.runtime.bundle import BundleMetadata
from defectdet.runtime.model_quality import validation_quality
from defectdet.serve.answers import FastJSON, error_response, redact_paths
from defectdet.serve.review import PAGE_HEADERS
from defectdet.serve.service import Service
from defectdet.serve.settings import ServeSettings
from defectdet.serve.upload import UploadError

STATIC_DIR = Path(__file__).resolve().parent / "static"
DETECT_PATH = "/v1/detect"  # answered before the router by `serve.detect_route`; declared here for OpenAPI
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


def detect_body_schema(metadata: BundleMetadata) -> dict[str, Any]:
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


def refusal_response(error: Exception) -> JSONResponse | None:
    """The JSON answer `{"error": one line, "status": N}` for a refusal (an upload, image, input or HTTP
    error), None for an exception that is not one (a JSON 500 is `JSONErrors`' to give). The one mapping of
    the app's handlers and of the detect route (`serve.detect_route`)."""
    if isinstance(error, UploadError):
        return error_response(error.status, error.reason, error.headers)
    if isinstance(error, ImageTooLargeError):
        reason = str(error).split("; pass a larger")[0].replace("(max_pixels)", "(serve --max-pixels)")
        return error_response(413, reason)
    if isinstance(error, DefectDetError):  # an image that cannot be read, a bad input
        return error_response(422, str(error))
    if isinstance(error, RequestValidationError):
        first = error.errors()[0] if error.errors() else {"loc": (), "msg": "invalid request"}
        where = ".".join(str(part) for part in first.get("loc", ()))
        return error_response(422, f"{where}: {first.get('msg')}")
    if isinstance(error, StarletteHTTPException):
        return error_response(error.status_code, str(error.detail), getattr(error, "headers", None))
    return None


def add_error_handlers(app: FastAPI) -> None:
    """Every refusal as `{"error": one line, "status": N}` (`refusal_response`)."""

    async def refusal(request: Request, error: Exception) -> JSONResponse:
        response = refusal_response(error)
        if response is None:  # only the classes below are registered
            raise error
        return response

    for kind in (UploadError, DefectDetError, RequestValidationError, StarletteHTTPException):
        app.add_exception_handler(kind, refusal)


def add_inspection_routes(app: FastAPI, service: Service, settings: ServeSettings) -> None:
    """/v1/detect, the health and readiness probes and /v1/model."""

    @app.post(
        DETECT_PATH,
        openapi_extra=detect_body_schema(service.metadata),
        summary="Detect defects in one image",
    )
    async def detect(request: Request) -> Response:
        """multipart/form-data: `image` (file), `template` (file, template bundles), one file per companion
        capture the bundle takes (the field named as the capture, e.g. `L2`), `threshold` (number)."""
        return FastJSON(await service.detect(request))

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
            "metadata": redact_paths(service.metadata.model_dump(mode="json")),
            "quality": validation_quality(service.metadata),
            "settings": {
                "max_concurrency": settings.max_concurrency,
                "max_queue": settings.max_queue,
                "max_bytes": settings.max_bytes,
                "max_pixels": settings.max_pixels,
            },
        }


def add_monitoring_routes(app: FastAPI, service: Service) -> None:
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

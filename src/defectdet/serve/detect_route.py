"""`POST /v1/detect` answered in pure ASGI, inside the service's middlewares (errors, metrics, access control)
but before the router: on a 2-core box the route matching and FastAPI's per-request machinery (its request
object, dependency solving and exception middleware) cost a share of every inspection that the model then does
not get. The route stays declared in the app (`serve.routes`) for the OpenAPI schema and for every other method
on its path; the answers and refusals are the same as through the router. No torch import.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from defectdet.serve.answers import FastJSON
from defectdet.serve.routes import DETECT_PATH, refusal_response
from defectdet.serve.service import Service


class DetectRoute:
    """Pure ASGI: `POST /v1/detect` goes straight to `Service.detect`; anything else on to the app."""

    def __init__(self, app: ASGIApp, service: Service) -> None:
        self.app = app
        self.service = service

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != DETECT_PATH or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        try:
            response = FastJSON(await self.service.detect(Request(scope, receive)))
        except Exception as error:
            refusal = refusal_response(error)
            if refusal is None:
                raise  # `JSONErrors` logs it and answers a JSON 500
            response = refusal
        await response(scope, receive, send)

"""The service's ASGI middlewares, in front of every route: `JSONErrors` (an exception no handler took is a
JSON 500), `RequestMetrics` (counts and times every answer) and `AccessGuard` (Host list, bearer token,
cross-site refusals). All answer their refusals as JSON; the connection limit sits in `serve.protocol`.
No torch import.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import time
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from defectdet.serve.answers import one_line, send_error
from defectdet.serve.metrics import ServiceMetrics
from defectdet.serve.settings import ServeSettings

logger = logging.getLogger(__name__)

HEALTH_ROUTES = frozenset({"/healthz", "/readyz"})
STATE_CHANGING_ROUTES = frozenset({"/v1/drift/reset"})
STATE_CHANGING_PREFIXES = ("/v1/review/", "/v1/models/")  # every POST under these: review decisions, export,
# shadow, promotion and roll-back
PUBLIC_PAGES = frozenset({"/", "/review"})  # HTML without data (its script asks for the token)
REQUEST_MARK = "X-Defectdet-Request"  # the custom header a state-changing request must carry


class RequestMetrics:
    """Pure ASGI: counts requests by route and status and times them (does not touch the body)."""

    def __init__(self, app: ASGIApp, metrics: ServiceMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = {"code": 500}

        async def send_status(message: Message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            self.metrics.observe_request(scope.get("path", ""), status["code"], time.perf_counter() - started)


class JSONErrors:
    """Pure ASGI, outermost: an exception no handler took is logged and answered as a JSON 500."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def send_tracked(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, send_tracked)
        except Exception as error:
            logger.exception("unexpected error on %s %s", scope.get("method"), scope.get("path"))
            if not started:
                reason = f"internal error ({type(error).__name__}: {one_line(error)[:200]}); it is logged"
                await send_error(send, 500, reason)


class AccessGuard:
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

    def __init__(self, app: ASGIApp, settings: ServeSettings) -> None:
        self.app = app
        self.any_host = "*" in settings.allowed_hosts
        self.hosts = frozenset(host.strip("[]") for host in settings.allowed_hosts)
        self.token = settings.token.strip().encode() if settings.token else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path", "") in HEALTH_ROUTES:
            await self.app(scope, receive, send)
            return
        refusal = self.refusal(scope)
        if refusal is None:
            await self.app(scope, receive, send)
            return
        status, reason, headers = refusal
        await send_error(send, status, reason, headers)

    def refusal(self, scope: Scope) -> tuple[int, str, dict[str, str] | None] | None:
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

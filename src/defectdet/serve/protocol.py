"""The service's HTTP protocol: uvicorn's h11 protocol with a request-head timeout, a connection limit that
leaves the health probes answering, and JSON bodies on its own refusals. No torch import.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import h11
from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.config import Config
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.server import ServerState

from defectdet.serve.answers import error_body, send_error
from defectdet.serve.guards import HEALTH_ROUTES

logger = logging.getLogger(__name__)


class ConnectionLimit:
    """Pure ASGI, in uvicorn's protocol: beyond `limit` open connections (or running requests), requests
    get a JSON 503 — except the health probes, which always answer."""

    def __init__(self, app: ASGIApp, protocol: H11Protocol, limit: int, retry_after_s: int) -> None:
        self.app = app
        self.protocol = protocol
        self.limit = limit
        self.retry_after_s = retry_after_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
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
        await send_error(send, 503, reason, headers)


class ServiceProtocol(H11Protocol):
    """uvicorn's h11 protocol with: a request-head timeout (h11 has none: a socket that sends nothing, or
    trickles its headers, is closed after `header_timeout_s`), the connection limit of `ConnectionLimit`
    (health probes exempt) and a JSON body on its own 400 for malformed HTTP."""

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any] | None = None,
        _loop: asyncio.AbstractEventLoop | None = None,
        *,
        header_timeout_s: float = 10.0,
        max_connections: int = 74,
        retry_after_s: int = 1,
    ) -> None:
        super().__init__(config, server_state, app_state if app_state is not None else {}, _loop)
        self.limit_concurrency = None  # ours below: JSON, health probes exempt
        self.app = ConnectionLimit(self.app, self, max_connections, retry_after_s)
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
        body = error_body(400, f"malformed HTTP request: {msg}")
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

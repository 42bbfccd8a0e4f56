"""The service's HTTP protocol: uvicorn's h11 protocol with a request-head timeout, a request-body time limit,
a connection limit that leaves the health probes answering, and JSON bodies on its own refusals.

The body limit is here, below every route and middleware, because a slow body holds a connection whatever the
route does with it: a route that answers without reading the body (a 401, a 405) leaves the connection open, and
each trickled byte restarts uvicorn's keep-alive timer. No torch import.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import h11
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.config import Config
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.server import ServerState

from defectdet.serve.answers import error_body, send_error
from defectdet.serve.guards import HEALTH_ROUTES

logger = logging.getLogger(__name__)

BODY_GRACE_S = 5.0  # a request body's first seconds, before its pace is checked
MIN_BODY_RATE = 1024  # bytes per second a body must average after BODY_GRACE_S


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
            await self.app(scope, receive, self._head_with_body(send))
            return
        logger.warning("%d connections open, limit %d: 503", connections, self.limit)
        reason = (
            f"server busy: {connections} connections open, {tasks} requests in progress, the limit is "
            f"{self.limit} (serve --max-connections); retry after {self.retry_after_s} s"
        )
        headers = {"Retry-After": str(self.retry_after_s), "Connection": "close"}
        await send_error(send, 503, reason, headers)

    def _head_with_body(self, send: Send) -> Send:
        """`send`, with the response's head written together with its body (`HeadWithBody`)."""
        transport: HeadWithBody = self.protocol.transport  # type: ignore[assignment]  # ServiceProtocol's

        async def send_joined(message: Message) -> None:
            if message["type"] == "http.response.start":
                transport.hold_head()
            await send(message)

        return send_joined


class HeadWithBody:
    """The connection's transport, writing a response's head together with its first body bytes: one write
    (one system call, one TCP segment, one wake-up of the client) instead of two. `hold_head()` is called just
    before the app sends `http.response.start`; the next write is held and goes out with the one after it, or
    before the connection closes. Everything else is the transport's own."""

    def __init__(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        self.holding = False
        self.held: bytes | None = None

    def hold_head(self) -> None:
        self.holding = True

    def write(self, data: bytes) -> None:
        if self.holding:
            self.holding, self.held = False, bytes(data)
            return
        if self.held is not None:
            data, self.held = self.held + data, None
        self.transport.write(data)

    def _flush(self) -> None:
        self.holding = False
        if self.held is not None:
            held, self.held = self.held, None
            if not self.transport.is_closing():
                self.transport.write(held)

    def close(self) -> None:
        self._flush()
        self.transport.close()

    def __getattr__(self, name: str) -> Any:  # is_closing, abort, get_extra_info, pause_reading, ...
        return getattr(self.transport, name)


class ServiceProtocol(H11Protocol):
    """uvicorn's h11 protocol with: a request-head timeout (h11 has none: a socket that sends nothing, or
    trickles its headers, is closed after `header_timeout_s`), a request-body time limit (a body slower than
    `MIN_BODY_RATE` on average after `BODY_GRACE_S`, or not whole after `body_timeout_s`, gets a JSON 408 and
    the connection is closed), the connection limit of `ConnectionLimit` (health probes exempt) and a JSON
    body on its own 400 for malformed HTTP."""

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
        body_timeout_s: float = 30.0,
    ) -> None:
        super().__init__(config, server_state, app_state if app_state is not None else {}, _loop)
        self.limit_concurrency = None  # ours below: JSON, health probes exempt
        self.app = ConnectionLimit(self.app, self, max_connections, retry_after_s)
        self.header_timeout_s = header_timeout_s
        self.head_timer: asyncio.TimerHandle | None = None
        self.body_timeout_s = body_timeout_s
        self.body_timer: asyncio.TimerHandle | None = None
        self.body_started: float | None = (
            None  # loop time the current request's body began, None: no body due
        )
        self.body_bytes = 0  # bytes received since

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
        self.transport = HeadWithBody(transport)  # type: ignore[assignment]  # the request cycles write here
        self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        self._end_body_watch()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self.body_started is not None:
            self.body_bytes += len(data)
        super().data_received(data)

    def handle_events(self) -> None:
        super().handle_events()
        if self.conn.their_state is not h11.IDLE:  # a request head arrived
            self._cancel_head_timer()
        if self.conn.their_state is h11.SEND_BODY:
            if self.body_started is None:
                self.body_started, self.body_bytes = self.loop.time(), 0
                self.body_timer = self.loop.call_later(
                    min(BODY_GRACE_S, self.body_timeout_s), self._check_body
                )
        elif self.body_started is not None:  # the body is complete (or the connection is gone)
            self._end_body_watch()

    def _end_body_watch(self) -> None:
        if self.body_timer is not None:
            self.body_timer.cancel()
            self.body_timer = None
        self.body_started = None

    def _check_body(self) -> None:
        """Refuse a body behind its pace; else look again when the bytes received so far run out of time."""
        self.body_timer = None
        if self.body_started is None or self.transport.is_closing():
            return
        elapsed = self.loop.time() - self.body_started
        allowed = min(self.body_timeout_s, BODY_GRACE_S + self.body_bytes / MIN_BODY_RATE)
        if elapsed < allowed or (self.flow.read_paused and elapsed < self.body_timeout_s):
            # on time, or uvicorn stopped reading (the app has not taken the bytes yet): not the client's fault
            self.body_timer = self.loop.call_later(max(allowed - elapsed, 0.25), self._check_body)
            return
        reason = (
            f"the request body arrives too slowly: {self.body_bytes:,} bytes in {elapsed:.1f} s (a body must "
            f"arrive at {MIN_BODY_RATE:,} bytes/s or more after its first {BODY_GRACE_S:g} s, and whole within "
            f"{self.body_timeout_s:g} s)"
        )
        logger.info("408: %s", reason)
        self._end_body_watch()
        cycle = self.cycle
        if cycle is not None:  # the app's receive() sees a disconnect, its answer goes nowhere
            cycle.disconnected = True
            cycle.message_event.set()
        if self.conn.our_state is h11.SEND_RESPONSE:
            self._answer_and_close(408, b"Request Timeout", reason)
        else:  # the app answered already
            self.transport.close()

    def on_response_complete(self) -> None:
        self._arm_head_timer()  # the next request's head must come in time too (keep-alive)
        super().on_response_complete()

    def send_400_response(self, msg: str) -> None:
        self._answer_and_close(400, b"Bad Request", f"malformed HTTP request: {msg}")

    def _answer_and_close(self, status: int, phrase: bytes, reason: str) -> None:
        """A JSON error written straight on the connection (no app involved), which is then closed."""
        body = error_body(status, reason)
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
        ]
        for event in (
            h11.Response(status_code=status, headers=headers, reason=phrase),
            h11.Data(data=body),
        ):
            self.transport.write(self.conn.send(event))
        self.transport.write(self.conn.send(h11.EndOfMessage()))
        self.transport.close()

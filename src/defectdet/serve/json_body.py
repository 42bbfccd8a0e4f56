"""A limit on every JSON request body the service reads: its size and how deep its arrays and objects nest.

Python's `json` module recurses once per nesting level, so a small body of ten thousand `[` raises
`RecursionError` inside whichever route parses it. `JSONBodyLimit` (pure ASGI, in front of every route)
reads a JSON body before any route does, refuses it with a JSON 413 beyond `max_bytes` or a JSON 400 beyond
`max_depth` levels, and hands the same bytes on. The depth is counted without parsing: strings are blanked,
then the brackets are summed. No torch import.
"""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np

MAX_JSON_BYTES = 1 << 20
MAX_JSON_DEPTH = 64
BODY_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_OPEN = np.frombuffer(b"[{", np.uint8)
_CLOSE = np.frombuffer(b"]}", np.uint8)


def json_depth(body: bytes) -> int:
    """The deepest nesting of arrays and objects in `body` (0 for a scalar), brackets in strings not counted."""
    data = np.frombuffer(_STRING.sub(b'""', body), np.uint8)
    steps = np.isin(data, _OPEN).astype(np.int64) - np.isin(data, _CLOSE)
    return int(np.cumsum(steps).max(initial=0))


def _is_json(scope: dict) -> bool:
    """A body the routes would parse as JSON: `application/json`, `*+json`, or no Content-Type at all."""
    for key, value in scope.get("headers", []):
        if key.lower() == b"content-type":
            kind = value.split(b";")[0].strip().lower()
            return kind == b"application/json" or kind.endswith(b"+json")
    return True


class JSONBodyLimit:
    """Pure ASGI: a JSON request body over `max_bytes` (413) or nested deeper than `max_depth` (400) is
    refused before a route parses it; any other body is replayed to the app unchanged."""

    def __init__(self, app: Any, max_bytes: int = MAX_JSON_BYTES, max_depth: int = MAX_JSON_DEPTH) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.max_depth = max_depth

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope.get("method") not in BODY_METHODS or not _is_json(scope):
            await self.app(scope, receive, send)
            return
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # nobody left to answer
            body += message.get("body", b"")
            if len(body) > self.max_bytes:
                reason = f"a JSON body (or one without a Content-Type) is at most {self.max_bytes:,} bytes"
                await _refuse(send, 413, reason)
                return
            if not message.get("more_body", False):
                break
        depth = json_depth(bytes(body))
        if depth > self.max_depth:
            reason = f"the JSON body nests {depth} levels deep; at most {self.max_depth} are accepted"
            await _refuse(send, 400, reason)
            return
        await self.app(scope, _replay(bytes(body), receive), send)


def _replay(body: bytes, receive: Any) -> Any:
    """A `receive` that gives the whole body once, then waits on the real one (for the disconnect)."""
    given = False

    async def replay() -> dict:
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


async def _refuse(send: Any, status: int, reason: str) -> None:
    body = json.dumps({"error": reason, "status": status}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})

"""The service's JSON answers: every error is `{"error": one line, "status": N}` (from a route or straight on
an ASGI `send`), answers are serialised without FastAPI's encoder, and paths are shown as file names only.
No torch import.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import PurePosixPath, PureWindowsPath
from typing import Any

import numpy as np
from fastapi.responses import JSONResponse, Response

_ADDRESS = re.compile(r"\s*\bat 0x[0-9a-fA-F]+|\b0x[0-9a-fA-F]{6,}")  # not the 0x in '100000x100000'


class FastJSON(Response):
    """json.dumps straight away (FastAPI's jsonable_encoder cost ~0.5 ms per answer on the event loop);
    numpy scalars become Python numbers, a non-finite float becomes null."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        try:
            text = json.dumps(content, default=_native, allow_nan=False, separators=(",", ":"))
        except ValueError:  # a NaN or an infinity somewhere: null it
            text = json.dumps(_finite(content), default=_native, separators=(",", ":"))
        return text.encode("utf-8")


def _native(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def _finite(value: Any) -> Any:
    if isinstance(value, (float, np.floating)):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(item) for item in value]
    return value


def one_line(reason: object) -> str:
    """One line without object addresses (`<object at 0x7f...>` says nothing to a client)."""
    return " ".join(_ADDRESS.sub("", str(reason)).split())


def error_body(status: int, reason: object) -> bytes:
    return json.dumps({"error": one_line(reason) or "error", "status": status}).encode()


def error_response(status: int, reason: object, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": one_line(reason) or "error", "status": status}, status, headers=headers)


async def send_error(send: Any, status: int, reason: object, headers: dict[str, str] | None = None) -> None:
    """A JSON error answer straight on the ASGI `send` (middlewares, before any route runs)."""
    body = error_body(status, reason)
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw += [
        (key.lower().encode("latin-1"), value.encode("latin-1")) for key, value in (headers or {}).items()
    ]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


def _looks_like_path(text: str) -> bool:
    if "://" in text or any(char.isspace() for char in text):
        return False
    return text.startswith(("/", "~", "./", "../", "\\\\")) or re.match(r"^[A-Za-z]:[\\/]", text) is not None


def redact_paths(value: Any) -> Any:
    """File names instead of absolute (or relative) paths, anywhere in a JSON-ready value."""
    if isinstance(value, str) and _looks_like_path(value):
        windows = "\\" in value or re.match(r"^[A-Za-z]:", value) is not None
        return (PureWindowsPath(value) if windows else PurePosixPath(value)).name
    if isinstance(value, dict):
        return {key: redact_paths(item) for key, item in value.items()}
    if isinstance(value, list):
        return [redact_paths(item) for item in value]
    return value

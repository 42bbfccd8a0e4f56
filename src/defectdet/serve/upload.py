"""Streaming multipart/form-data reader with a byte limit enforced while the body arrives.

The body is fed chunk by chunk to python-multipart's streaming parser; nothing is buffered beyond the
named fields, and the request is refused (413) as soon as the declared Content-Length or the bytes
counted so far exceed the limit. Every refusal is an `UploadError` with an HTTP status and one line.
"""

from __future__ import annotations

import unicodedata
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field

from python_multipart.exceptions import MultipartParseError
from python_multipart.multipart import MultipartParser, parse_options_header


def visible_name(text: object, limit: int = 80) -> str:
    """A person's name as logs record it: control, format (bidi overrides such as U+202E, zero-width) and
    other invisible characters removed, runs of spaces made one, at most `limit` characters."""
    spaced = (" " if char.isspace() else char for char in str(text))
    shown = "".join(char for char in spaced if not unicodedata.category(char).startswith("C"))
    return " ".join(shown.split())[:limit]


MAX_UPLOAD_NAME = 160  # characters of a client's file name kept beside a kept image


def upload_name(filename: object) -> str | None:
    """A client's file name for an upload as it is kept and shown: its last path part (some clients send a
    whole path), no control or invisible characters, at most `MAX_UPLOAD_NAME` characters (the end, with the
    extension, kept); None when nothing is left."""
    if not isinstance(filename, str):
        return None
    last = filename.replace("\\", "/").rsplit("/", 1)[-1]
    shown = visible_name(last, limit=len(last))[-MAX_UPLOAD_NAME:].strip()
    return shown if shown.strip(".") else None


class UploadError(Exception):
    """A request the service refuses: `status` is the HTTP status, the message one line."""

    def __init__(self, status: int, reason: str, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(" ".join(reason.split()))
        self.status = status
        self.reason = str(self)
        self.headers = dict(headers or {})


@dataclass
class Part:
    """One form field as received: its bytes and, for files, the client's file name."""

    name: str
    filename: str | None = None
    content_type: str | None = None
    data: bytearray = field(default_factory=bytearray)


class _FormCollector:
    """python-multipart callbacks that keep only the expected fields, each within its own limit."""

    def __init__(self, fields: Mapping[str, int]) -> None:
        self.fields = fields
        self.parts: dict[str, Part] = {}
        self.current: Part | None = None
        self.header_field = bytearray()
        self.header_value = bytearray()
        self.headers: dict[str, bytes] = {}
        self.finished = False

    def callbacks(self) -> dict:
        return {
            "on_part_begin": self.on_part_begin,
            "on_part_data": self.on_part_data,
            "on_header_field": lambda data, start, end: self.header_field.extend(data[start:end]),
            "on_header_value": lambda data, start, end: self.header_value.extend(data[start:end]),
            "on_header_end": self.on_header_end,
            "on_headers_finished": self.on_headers_finished,
            "on_end": self.on_end,
        }

    def on_part_begin(self) -> None:
        self.current = None
        self.headers = {}

    def on_header_end(self) -> None:
        self.headers[bytes(self.header_field).decode("latin-1").strip().lower()] = bytes(self.header_value)
        self.header_field.clear()
        self.header_value.clear()

    def on_headers_finished(self) -> None:
        disposition = self.headers.get("content-disposition")
        if disposition is None:
            raise UploadError(400, "a multipart part has no Content-Disposition header")
        kind, options = parse_options_header(disposition)
        name = options.get(b"name")
        if kind != b"form-data" or name is None:
            raise UploadError(400, "a multipart part is not 'form-data' with a name")
        text = name.decode("utf-8", "replace")
        if text not in self.fields:
            expected = ", ".join(self.fields)
            raise UploadError(422, f"unknown form field {text[:60]!r}; expected {expected}")
        if text in self.parts:
            raise UploadError(422, f"form field {text!r} is given more than once")
        filename = options.get(b"filename")
        content_type = self.headers.get("content-type")
        self.current = Part(
            text,
            filename.decode("utf-8", "replace") if filename is not None else None,
            content_type.decode("latin-1") if content_type is not None else None,
        )
        self.parts[text] = self.current

    def on_part_data(self, data: bytes, start: int, end: int) -> None:
        if self.current is None:
            return
        self.current.data += memoryview(data)[start:end]  # one copy, not a slice and then a copy
        limit = self.fields[self.current.name]
        if len(self.current.data) > limit:
            raise UploadError(413, f"form field {self.current.name!r} exceeds {limit:,} bytes")

    def on_end(self) -> None:
        self.finished = True


async def read_form(
    headers: Mapping[str, str], chunks: AsyncIterator[bytes], max_bytes: int, fields: Mapping[str, int]
) -> dict[str, Part]:
    """Parse a multipart/form-data body from `chunks`, keeping only `fields` (name -> max bytes each).

    `headers` are the request headers (lower-case names). Raises `UploadError`: 415 not multipart,
    400 malformed, 413 beyond `max_bytes` (declared or counted), 422 unknown or repeated field.
    """
    content_type = headers.get("content-type", "")
    kind, options = parse_options_header(content_type)
    expected = ", ".join(fields)
    if kind != b"multipart/form-data":
        shown = content_type.split(";")[0][:60] or "none"
        raise UploadError(415, f"expected a multipart/form-data body with fields {expected}; got {shown}")
    boundary = options.get(b"boundary")
    if not boundary or len(boundary) > 70:
        raise UploadError(400, "multipart/form-data body without a valid boundary parameter")
    declared = headers.get("content-length")
    if declared is not None:
        if not declared.strip().isdigit():
            raise UploadError(400, f"invalid Content-Length {declared[:30]!r}")
        if int(declared) > max_bytes:
            raise UploadError(413, f"request body is {int(declared):,} bytes; the limit is {max_bytes:,}")
    collector = _FormCollector(fields)
    parser = MultipartParser(boundary, collector.callbacks())
    received = 0
    try:
        async for chunk in chunks:
            received += len(chunk)
            if received > max_bytes:
                raise UploadError(413, f"request body exceeds the limit of {max_bytes:,} bytes")
            if chunk:
                parser.write(chunk)
        parser.finalize()
    except MultipartParseError as error:
        raise UploadError(400, f"malformed multipart body: {error}") from None
    if not collector.finished:
        raise UploadError(400, "multipart body ended before its closing boundary (truncated upload?)")
    return collector.parts

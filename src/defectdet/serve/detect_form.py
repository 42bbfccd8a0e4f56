"""One /v1/detect request's form: read as a stream within the byte and time limits, then checked against the
bundle (the image, its template and companion captures as the bundle takes them, and the threshold). No torch
import.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field

from starlette.requests import ClientDisconnect, Request

from defectdet.compat import Surface, retired_names
from defectdet.runtime.bundle import BundleMetadata
from defectdet.serve.settings import ServeSettings
from defectdet.serve.upload import Part, UploadError, read_form

logger = logging.getLogger(__name__)

THRESHOLD_FIELD_BYTES = 64
# the threshold field under its current name, then its retired ones (still read, logged as deprecated)
THRESHOLD_FIELDS = ("threshold", *retired_names("threshold", Surface.DETECT_FORM))


@dataclass(frozen=True)
class Upload:
    """One /v1/detect request's planes as received: the image, its template and its companion captures (the
    form's own buffers, not copies: nothing writes to them once the form is read)."""

    image: bytes | bytearray
    template: bytes | bytearray | None = None
    companions: Mapping[str, bytes | bytearray] = field(default_factory=dict)
    filename: str | None = None  # the image's file name as the client sent it (kept, sanitised)


async def read_detect_form(
    request: Request, metadata: BundleMetadata, settings: ServeSettings
) -> dict[str, Part]:
    """The multipart form, read as a stream within `max_bytes` (413 beyond) and `body_timeout_s` (408)."""
    fields = {
        "image": settings.max_bytes,
        "template": settings.max_bytes,
        **{name: settings.max_bytes for name in metadata.companions},
        **{name: THRESHOLD_FIELD_BYTES for name in THRESHOLD_FIELDS},
    }
    reading = read_form(
        {key.lower(): value for key, value in request.headers.items()},
        _stream(request),
        settings.max_bytes,
        fields,
    )
    try:
        return await asyncio.wait_for(reading, settings.body_timeout_s)
    except asyncio.TimeoutError:
        raise UploadError(408, f"the upload took longer than {settings.body_timeout_s:g} s") from None


def upload_of(form: dict[str, Part], metadata: BundleMetadata) -> tuple[Upload, float | None]:
    """(planes, threshold) from the form; 422 for a missing image, template or companion capture, or a
    template the bundle does not take. The threshold's retired field name (`defectdet.compat`) is read as
    `threshold`."""
    if "image" not in form:
        raise UploadError(422, "missing form field 'image' (the image file to inspect)")
    threshold = _threshold_field(form)
    template = form["template"].data if "template" in form else None
    if metadata.template and template is None:
        raise UploadError(
            422,
            "this bundle compares each image to its defect-free template: send the 'template' field",
        )
    if not metadata.template and template is not None:
        raise UploadError(422, "this bundle takes no template: drop the 'template' field")
    for name in metadata.companions:
        if name not in form:
            raise UploadError(
                422,
                f"this bundle also takes the aligned capture {name!r}: send it as the form field {name!r}",
            )
    companions = {name: form[name].data for name in metadata.companions}
    image = form["image"]
    return Upload(image.data, template, companions, image.filename), threshold


async def _stream(request: Request) -> AsyncIterator[bytes]:
    try:
        async for chunk in request.stream():
            yield chunk
    except ClientDisconnect:
        raise UploadError(400, "client disconnected during the upload") from None


def _threshold_field(form: dict[str, Part]) -> float | None:
    """The form's `threshold` (or its retired name), None when absent; 422 for both or a bad value."""
    current, *retired = THRESHOLD_FIELDS
    given = [name for name in THRESHOLD_FIELDS if name in form]
    if not given:
        return None
    if len(given) > 1:
        raise UploadError(422, f"send {current!r} only ({given[1]!r} is its deprecated name)")
    if given[0] in retired:
        logger.warning("form field %r is deprecated: send %r", given[0], current)
    return _parse_threshold(form[given[0]].data, given[0])


def _parse_threshold(data: bytes, name: str = "threshold") -> float:
    text = data.decode("utf-8", "replace").strip()
    try:
        value = float(text)
    except ValueError:
        raise UploadError(422, f"{name} must be a number in [0, 1], got {text[:30]!r}") from None
    if not math.isfinite(value) or not 0.0 <= value <= 1.0:
        raise UploadError(422, f"{name} must be a number in [0, 1], got {text[:30]!r}")
    return value

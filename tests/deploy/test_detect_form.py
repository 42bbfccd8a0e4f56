"""Reading one /v1/detect form: the bytes arrive whole however the body is cut into chunks, and the upload
handed to inference is the form's own buffers (no copy on the event loop)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import pytest
from server_fakes import FakePredictor, board, encode

from defectdet.serve.detect_form import THRESHOLD_FIELD_BYTES, upload_of
from defectdet.serve.upload import read_form


def _body() -> tuple[bytes, dict[str, str], bytes, bytes]:
    image, template = encode(board(1)), encode(board(2))
    files = {"image": ("board.png", image, "image/png"), "template": ("golden.png", template, "image/png")}
    request = httpx.Request("POST", "http://unused/v1/detect", files=files, data={"threshold": "0.4"})
    body = request.read()
    headers = {"content-type": request.headers["content-type"], "content-length": str(len(body))}
    return body, headers, image, template


async def _chunks(body: bytes, size: int) -> AsyncIterator[bytes]:
    for start in range(0, len(body), size):
        yield body[start : start + size]


@pytest.mark.parametrize("size", [1, 7, 4096, 10**9])
def test_the_form_is_read_whole_whatever_the_chunks(size: int) -> None:
    body, headers, image, template = _body()
    fields = {"image": 2**24, "template": 2**24, "threshold": THRESHOLD_FIELD_BYTES}
    form = asyncio.run(read_form(headers, _chunks(body, size), 2**25, fields))
    assert form["image"].data == image and form["template"].data == template
    assert form["threshold"].data == b"0.4" and form["image"].filename == "board.png"


def test_the_upload_is_the_forms_own_buffers_not_copies() -> None:
    body, headers, image, template = _body()
    fields = {"image": 2**24, "template": 2**24, "threshold": THRESHOLD_FIELD_BYTES}
    form = asyncio.run(read_form(headers, _chunks(body, 4096), 2**25, fields))
    upload, threshold = upload_of(form, FakePredictor(template=True).metadata)
    assert upload.image is form["image"].data and upload.template is form["template"].data
    assert upload.image == image and threshold == 0.4 and upload.filename == "board.png"

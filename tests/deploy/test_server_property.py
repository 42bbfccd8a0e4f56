"""Property test: whatever bytes arrive at /v1/detect, the answer is 200 or a 4xx with a one-line reason."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from server_fakes import FakePredictor, board, encode

from defectdet.serve.server import create_app
from defectdet.serve.settings import ServeSettings

PNG = encode(board(0, size=64))
JPEG = encode(board(1, size=64), ".jpg")


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    app = create_app(FakePredictor(template=False), ServeSettings(max_bytes=50_000, max_pixels=200 * 200))
    with TestClient(app, base_url="http://localhost", raise_server_exceptions=False) as client:
        deadline = time.monotonic() + 10
        while client.get("/readyz").status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        yield client


def _check(response, allow_ok: bool = True) -> None:  # noqa: ANN001
    assert response.status_code < 500, response.text
    if response.status_code != 200 or not allow_ok:
        assert 400 <= response.status_code < 500
        body = response.json()
        assert isinstance(body["error"], str) and body["error"] and "\n" not in body["error"]


image_bytes = st.one_of(
    st.binary(max_size=2048),
    st.builds(lambda cut: PNG[:cut], st.integers(0, len(PNG))),
    st.builds(lambda cut: JPEG[:cut], st.integers(0, len(JPEG))),
    st.builds(
        lambda data, at, junk: data[:at] + junk + data[at + len(junk) :],
        st.sampled_from([PNG, JPEG]),
        st.integers(0, 600),
        st.binary(min_size=1, max_size=32),
    ),
)
field_names = st.one_of(st.sampled_from(["image", "template", "threshold", "conf"]), st.text(max_size=12))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(image=image_bytes, conf=st.one_of(st.none(), st.text(max_size=12)))
def test_random_image_bytes_never_500(client: TestClient, image: bytes, conf: str | None) -> None:
    files = {"image": ("upload.bin", image, "application/octet-stream")}
    if conf is not None:
        files["threshold"] = (None, conf.encode("utf-8", "replace"))
    _check(client.post("/v1/detect", files=files))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    parts=st.lists(st.tuples(field_names, st.one_of(image_bytes, st.binary(max_size=64))), max_size=4),
    boundary=st.sampled_from(["b", "XyZ123", "----a-b-c"]),
    tail=st.sampled_from([b"--\r\n", b"", b"--", b"\r\n"]),
)
def test_random_multipart_bodies_never_500(
    client: TestClient, parts: list[tuple[str, bytes]], boundary: str, tail: bytes
) -> None:
    body = b""
    for name, data in parts:
        header = f'Content-Disposition: form-data; name="{name}"; filename="f"\r\n\r\n'.encode(
            "utf-8", "replace"
        )
        body += f"--{boundary}\r\n".encode() + header + data + b"\r\n"
    body += f"--{boundary}".encode() + tail
    headers = {"content-type": f"multipart/form-data; boundary={boundary}"}
    _check(client.post("/v1/detect", content=body, headers=headers))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    body=st.binary(max_size=512),
    content_type=st.one_of(st.just("multipart/form-data; boundary=b"), st.text(max_size=40)),
)
def test_random_raw_bodies_never_500(client: TestClient, body: bytes, content_type: str) -> None:
    headers = {"content-type": content_type.encode("ascii", "replace").decode()}
    _check(client.post("/v1/detect", content=body, headers=headers), allow_ok=False)

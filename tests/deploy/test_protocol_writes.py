"""The service's connection writes a response's head together with its body: one write, not two."""

from __future__ import annotations

from defectdet.serve.protocol import HeadWithBody


class RecordingTransport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def get_extra_info(self, name: str) -> str:
        return f"info:{name}"


def test_the_head_goes_out_with_the_first_body_bytes() -> None:
    raw = RecordingTransport()
    transport = HeadWithBody(raw)  # type: ignore[arg-type]
    transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")  # not held: no hold_head() before it
    transport.hold_head()
    transport.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n")
    assert raw.writes == [b"HTTP/1.1 100 Continue\r\n\r\n"]
    transport.write(b"{}")
    transport.write(b"")  # the end of the message adds nothing
    assert raw.writes[1:] == [b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}", b""]
    assert transport.get_extra_info("peername") == "info:peername"  # the rest is the transport's


def test_a_held_head_is_written_before_the_connection_closes() -> None:
    raw = RecordingTransport()
    transport = HeadWithBody(raw)  # type: ignore[arg-type]
    transport.hold_head()
    transport.write(b"HTTP/1.1 500 Internal Server Error\r\n\r\n")
    transport.close()
    assert raw.writes == [b"HTTP/1.1 500 Internal Server Error\r\n\r\n"] and raw.closed

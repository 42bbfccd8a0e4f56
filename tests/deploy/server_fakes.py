"""A fast, controllable stand-in for `Predictor` (same interface) and image helpers for the server tests."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import cv2
import numpy as np

from defectdet.errors import InputError
from defectdet.runtime.bundle import BundleMetadata
from defectdet.runtime.monitor import build_reference, image_statistics
from defectdet.runtime.predictor import Detection, PredictionResult

CLASS_NAMES = ["open", "short", "mousebite", "spur", "copper", "pin-hole"]
FEATURES = 8


def board(seed: int = 0, size: int = 160, blob: bool = True) -> np.ndarray:
    """A gray synthetic board; with `blob`, one bright square the fake detects."""
    rng = np.random.default_rng(seed)
    image = np.clip(rng.normal(90, 12, (size, size)), 0, 255).astype(np.uint8)
    if blob:
        image[40:70, 50:90] = 250
    return image


def encode(image: np.ndarray, ext: str = ".png") -> bytes:
    ok, buffer = cv2.imencode(ext, image)
    assert ok
    return buffer.tobytes()


class FakePredictor:
    """Detects pixels >= 240 as one 'short' (score `score`, 0.9); `gate` blocks predict until set (`entered` tells that a call
    is waiting there); `delay_s` sleeps."""

    def __init__(
        self, template: bool = False, delay_s: float = 0.0, reference: bool = True, score: float = 0.9
    ) -> None:
        self.score = score
        stats = [image_statistics(board(seed, blob=seed % 2 == 0)) for seed in range(30)]
        features = np.random.default_rng(0).normal(1.0, 0.1, (30, FEATURES))
        self.metadata = BundleMetadata(
            defectdet_version="test",
            created="2026-01-01T00:00:00Z",
            preset="nano",
            class_names=CLASS_NAMES,
            input_size=160,
            channels=1,
            template=template,
            drift_reference=build_reference(stats, features) if reference else None,
        )
        self.path = None
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()  # set as a predict call starts, before it waits for the gate
        self.delay_s = delay_s
        self.calls = 0
        self.features = np.ones(FEATURES, np.float32)

    def predict(
        self,
        image: np.ndarray,
        template: np.ndarray | None = None,
        threshold: float | None = None,
        score_floor: float | None = None,
    ) -> PredictionResult:
        self.entered.set()
        self.gate.wait(30)
        if self.delay_s:
            time.sleep(self.delay_s)
        self.calls += 1
        if self.metadata.template and template is not None and template.shape != image.shape:
            raise InputError(
                f"template is {template.shape[1]}x{template.shape[0]}, image {image.shape[1]}x{image.shape[0]}"
            )
        threshold = self.metadata.thresholds.threshold if threshold is None else threshold
        bright = np.argwhere(image >= 240)
        detections = []
        if len(bright):
            (y1, x1), (y2, x2) = bright.min(0), bright.max(0) + 1
            box = (float(x1), float(y1), float(x2), float(y2))
            detections.append(Detection(box, 1, "short", self.score))
        floor = threshold if score_floor is None else score_floor
        detections = [detection for detection in detections if detection.score >= floor]
        return PredictionResult(
            detections=detections,
            verdict="defective" if any(d.score >= threshold for d in detections) else "clean",
            threshold=threshold,
            image_size=(image.shape[1], image.shape[0]),
            timings={"decode": 0.01, "letterbox": 0.1, "model": 1.0, "postprocess": 0.1, "total": 1.21},
            image_stats=image_statistics(image),
            features=self.features,
        )


@contextlib.contextmanager
def uvicorn_on_loopback(app: Any, settings: Any) -> Iterator[tuple[str, int, Any]]:
    """The app under uvicorn, configured as `serve` does (`serve.launch.uvicorn_config`), on a free loopback port
    in a thread: yields (host, port, server)."""
    import uvicorn

    from defectdet.serve.launch import uvicorn_config

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = uvicorn_config(app, "127.0.0.1", port, settings)
    config.log_level = "warning"
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.01)
    try:
        yield "127.0.0.1", port, server
    finally:
        server.should_exit = True
        thread.join(10)

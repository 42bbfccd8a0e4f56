"""The review page's anomaly-map layer: `GET /v1/review/map/{name}` draws the served good-parts-only model's map of
one kept image (`runtime.anomaly_map`), under the boxes.

Computed on demand rather than stored with every kept image: the answer path and the kept folder pay nothing,
and only an image an operator opens with the layer on costs one more inference (one at a time, the last few
cached). With any other model live (a detector), the layer is not offered (`available` false, the image route
404). No torch import.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter
from fastapi import Path as PathParam
from fastapi.responses import Response

from defectdet.errors import DefectDetError
from defectdet.runtime.anomaly_map import anomaly_overlay_png, anomaly_scores, is_good_only
from defectdet.serve.review import ReviewFolder
from defectdet.serve.upload import UploadError

CACHED_MAPS = 16


class AnomalyMaps:
    """The overlays of the live model, one computed at a time, the last `CACHED_MAPS` kept (keyed by the
    model and the image file's size and time, so a new model or a replaced file is drawn again)."""

    def __init__(self, folder: ReviewFolder, predictor_of: Callable[[], Any]) -> None:
        self.folder = folder
        self.predictor_of = predictor_of
        self._lock = threading.Lock()
        self._cache: OrderedDict[tuple[Any, ...], bytes] = OrderedDict()

    def available(self) -> bool:
        return is_good_only(self.predictor_of().metadata)

    def overlay(self, name: str) -> bytes:
        predictor = self.predictor_of()
        if not is_good_only(predictor.metadata):
            raise UploadError(404, "the served model is not a good-parts-only model: it has no anomaly map")
        image = self.folder.image_path(name)
        try:
            stat = image.stat()
        except OSError:  # the keep folder's cap deleted it just now
            raise UploadError(404, f"no image {name[:80]!r} in this folder") from None
        key = (id(predictor), image.name, stat.st_size, stat.st_mtime_ns)
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
            try:
                png = anomaly_overlay_png(anomaly_scores(predictor, image))
            except (DefectDetError, ValueError, OSError) as error:
                raise UploadError(422, f"{image.name}: {' '.join(str(error).split())}") from None
            self._cache[key] = png
            while len(self._cache) > CACHED_MAPS:
                self._cache.popitem(last=False)
        return png


def anomaly_map_router(maps: AnomalyMaps) -> APIRouter:
    """`GET /v1/review/map` (whether the layer is offered) and `GET /v1/review/map/{name}` (the overlay PNG)."""
    router = APIRouter()

    @router.get("/v1/review/map", summary="Whether the live model draws an anomaly map (good-parts-only)")
    def offered() -> dict[str, Any]:
        return {"available": maps.available()}

    @router.get("/v1/review/map/{name}", summary="The anomaly map of one image as a transparent PNG")
    def overlay(
        name: str = PathParam(description="the image's file name, as /v1/review/items lists it"),
    ) -> Response:
        return Response(maps.overlay(name), media_type="image/png", headers={"Cache-Control": "no-store"})

    return router

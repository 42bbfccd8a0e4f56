"""The model routes of `serve`: what is live, shadow a candidate, promote it, roll back (`runtime.deployment`).

    GET  /v1/models            live, shadow (with its disagreement rate), previous, candidates, history
    POST /v1/models/shadow     {"bundle": "candidate.onnx"} starts a shadow; {"bundle": null} stops it
    POST /v1/models/promote    {"bundle": "candidate.onnx"} or {} (the shadow); optional "by": who
    POST /v1/models/rollback   {} brings the previous model back; optional "by"

The POST routes change state: like every such route they need the token (when set), the header
`X-Defectdet-Request: 1` and a JSON body (`server._Guard`). Loading a bundle runs off the event loop, so
/v1/detect keeps answering while a candidate loads.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field

from defectdet.runtime.deployment import Deployment
from defectdet.runtime.upload import UploadError


class ModelChange(BaseModel):
    """The body of a model change: the bundle's file name in the models folder, and who asks."""

    model_config = ConfigDict(extra="forbid")
    bundle: str | None = Field(None, max_length=204)
    by: str | None = Field(None, max_length=80)


def models_router(deployment: Deployment) -> APIRouter:
    router = APIRouter()

    @router.get("/v1/models", summary="The live, shadow and previous models, the candidates and the history")
    async def models() -> dict[str, Any]:
        return deployment.report()

    @router.post("/v1/models/shadow", summary="Run a candidate bundle beside the live model (or stop it)")
    async def shadow(change: ModelChange) -> dict[str, Any]:
        if change.bundle is None:
            return await asyncio.to_thread(deployment.stop_shadow)
        return await asyncio.to_thread(deployment.start_shadow, change.bundle)

    @router.post("/v1/models/promote", summary="Make a candidate (default: the shadow) the live model")
    async def promote(change: ModelChange) -> dict[str, Any]:
        return await asyncio.to_thread(deployment.promote, change.bundle, change.by)

    @router.post("/v1/models/rollback", summary="Bring the previous live model back")
    async def rollback(change: ModelChange) -> dict[str, Any]:
        if change.bundle is not None:
            raise UploadError(422, "rollback takes no bundle: it restores the previous live model")
        return await asyncio.to_thread(deployment.rollback, change.by)

    return router

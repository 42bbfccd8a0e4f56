"""The model routes of `serve`: what is live, shadow a candidate, promote it, roll back (`serve.deployment`).

    GET  /v1/models            live (with the store generation served here), shadow (with its disagreement
                               rate), previous, the roll-back history, the store's current generation,
                               candidates, the store's generations
    POST /v1/models/shadow     {"bundle": "candidate.onnx"} starts a shadow; {"bundle": null} stops it
    POST /v1/models/promote    {"bundle": "candidate.onnx"} or {} (the shadow); optional "by": who,
                               "force": true (promote without a compare verdict of "promote"),
                               "generation": the store generation the decision was made on
    POST /v1/models/rollback   {} brings the model before back; optional "by", "generation"

A promotion or roll-back changes every process serving the models store; one based on a generation that is
no longer current is refused (409, naming the live generation). The POST routes change state: like every
such route they need the token (when set), the header `X-Defectdet-Request: 1` and a JSON body
(`server._Guard`). Loading a bundle runs off the event loop, so /v1/detect keeps answering while a
candidate loads.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field

from defectdet.serve.deployment import Deployment
from defectdet.serve.upload import UploadError


class ModelChange(BaseModel):
    """The body of a model change: the bundle's file name in the models folder, who asks, the override of
    the compare gate and the store generation the change is based on."""

    model_config = ConfigDict(extra="forbid")
    bundle: str | None = Field(
        None,
        max_length=204,
        description="a bundle's file name in the models folder (promote: default the shadow)",
    )
    by: str | None = Field(None, max_length=80, description="who asks (logged with the change)")
    force: bool = Field(False, description="promote without a compare verdict of 'promote'")
    generation: int | None = Field(
        None, ge=0, description="the store generation the decision was made on (refused when it moved on)"
    )


def models_router(deployment: Deployment) -> APIRouter:
    router = APIRouter()

    @router.get("/v1/models", summary="The live, shadow and previous models, the store, candidates, history")
    async def models() -> dict[str, Any]:
        return await asyncio.to_thread(deployment.report)

    @router.post("/v1/models/shadow", summary="Run a candidate bundle beside the live model (or stop it)")
    async def shadow(change: ModelChange) -> dict[str, Any]:
        if change.bundle is None:
            return await asyncio.to_thread(deployment.stop_shadow)
        return await asyncio.to_thread(deployment.start_shadow, change.bundle)

    @router.post("/v1/models/promote", summary="Make a candidate (default: the shadow) the live model")
    async def promote(change: ModelChange) -> dict[str, Any]:
        return await asyncio.to_thread(
            deployment.promote, change.bundle, change.by, change.force, change.generation
        )

    @router.post("/v1/models/rollback", summary="Bring back the model before the live one")
    async def rollback(change: ModelChange) -> dict[str, Any]:
        if change.bundle is not None or change.force:
            raise UploadError(422, "rollback takes no bundle and no force: it restores the model before")
        return await asyncio.to_thread(deployment.rollback, change.by, change.generation)

    return router

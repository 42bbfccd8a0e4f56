"""The model routes of `serve`: what is live, shadow a candidate, promote it, roll back (`serve.deployment`).

    GET  /v1/models            live (with the store generation served here), shadow (with its disagreement
                               rate), previous, the roll-back history, the store's current generation,
                               candidates, the store's generations
    POST /v1/models/shadow     {"bundle": "candidate.onnx"} starts a shadow; {"bundle": null} stops it
    POST /v1/models/promote    {"bundle": "candidate.onnx"} or {} (the shadow this process runs: a shadow is
                               per process, and {} on a replica without it is refused with 409 naming
                               where it runs); optional "by": who,
                               "force": true (promote without a compare verdict of "promote"),
                               "generation": the store generation the decision was made on
    POST /v1/models/rollback   {} brings the model before back; optional "by", "generation"

A promotion or roll-back changes every process serving the models store; one based on a generation that is
no longer current is refused (409, naming the live generation). Each change (and each shadow started or
stopped) is a line in promotions.jsonl: who (the name sent, else "token" or "anonymous"), when, from where
(the host and pid of the process, the client's address), forced or not. The POST routes change state: like every
such route they need the token (when set), the header `X-Defectdet-Request: 1` and a JSON body
(`guards.AccessGuard`). Loading a bundle runs off the event loop, so /v1/detect keeps answering while a
candidate loads.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field

from defectdet.serve.deployment import Deployment, clean_name
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
    async def shadow(change: ModelChange, request: Request) -> dict[str, Any]:
        who = _who(change, request)
        if change.bundle is None:
            return await asyncio.to_thread(deployment.stop_shadow, **who)
        return await asyncio.to_thread(deployment.start_shadow, change.bundle, **who)

    @router.post("/v1/models/promote", summary="Make a candidate (default: the shadow) the live model")
    async def promote(change: ModelChange, request: Request) -> dict[str, Any]:
        who = _who(change, request)
        return await asyncio.to_thread(
            deployment.promote, change.bundle, force=change.force, generation=change.generation, **who
        )

    @router.post("/v1/models/rollback", summary="Bring back the model before the live one")
    async def rollback(change: ModelChange, request: Request) -> dict[str, Any]:
        if change.bundle is not None or change.force:
            raise UploadError(422, "rollback takes no bundle and no force: it restores the model before")
        return await asyncio.to_thread(
            deployment.rollback, generation=change.generation, **_who(change, request)
        )

    return router


def _who(change: ModelChange, request: Request) -> dict[str, str | None]:
    """Who asks, as recorded: the name sent, else the credential the request bore ("token" when it carried the
    service token, "anonymous" without one); and the client's address."""
    named = clean_name(change.by)
    credential = "token" if request.headers.get("authorization") else "anonymous"
    client = request.client.host if request.client is not None else None
    return {"by": named or credential, "client": client}

"""The routes of OpenAI's Batch API over a ``BatchRunner``: POST /v1/batches, GET /v1/batches,
GET /v1/batches/{id}, POST /v1/batches/{id}/cancel; each answers for the batches the caller's key
may see (``owners``), and a state dir that cannot be written is a 507 or 503 (``store_io``)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends

from forge.server.batches import BatchRunner
from forge.server.owners import Caller, Owners
from forge.server.protocol import APIError, CreateBatchRequest
from forge.server.store_io import storage_errors


def batches_router(runner: BatchRunner, owners: Owners) -> APIRouter:
    router = APIRouter()
    caller = Depends(owners.caller)

    @router.post("/v1/batches")
    async def create(body: CreateBatchRequest, who: Caller = caller) -> dict[str, Any]:
        with storage_errors():
            return runner.create(body, who).body()

    @router.get("/v1/batches")
    async def list_batches(after: str | None = None, limit: int = 20, who: Caller = caller) -> dict[str, Any]:
        if not 1 <= limit <= 100:
            raise APIError("limit must be in 1..100", param="limit")
        with storage_errors():
            batches = runner.visible(who)
        if after is not None:
            ids = [b.id for b in batches]
            batches = batches[ids.index(after) + 1 :] if after in ids else []
        page = batches[:limit]
        return {
            "object": "list",
            "data": [b.body() for b in page],
            "first_id": page[0].id if page else None,
            "last_id": page[-1].id if page else None,
            "has_more": len(batches) > limit,
        }

    @router.get("/v1/batches/{batch_id}")
    async def retrieve(batch_id: str, who: Caller = caller) -> dict[str, Any]:
        with storage_errors():
            return runner.get(batch_id, who).body()

    @router.post("/v1/batches/{batch_id}/cancel")
    async def cancel(batch_id: str, who: Caller = caller) -> dict[str, Any]:
        with storage_errors():
            return runner.cancel(batch_id, who).body()

    return router

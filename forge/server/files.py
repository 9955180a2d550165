"""OpenAI's Files API for batch input and output: ``/v1/files``.

POST /v1/files (multipart form: ``file``, ``purpose=batch``), GET /v1/files, GET /v1/files/{id},
GET /v1/files/{id}/content, DELETE /v1/files/{id}. Each file is two entries of
``<state_dir>/files``: ``<id>.bin`` (the bytes) and ``<id>.json`` (the file object), each
written whole to a temporary name and renamed, so a server that stops mid-write never leaves a
half file behind and a restarted server lists the same files."""

from __future__ import annotations

import json
import os
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, File, Form, UploadFile
from fastapi.responses import Response

from forge.server.protocol import APIError

# purposes a client may upload; batch_output is what the batch runner writes
UPLOAD_PURPOSES = ("batch",)
BATCH_OUTPUT_PURPOSE = "batch_output"


@dataclass(frozen=True)
class FileObject:
    """OpenAI's file object."""

    id: str
    bytes: int
    created_at: int
    filename: str
    purpose: str
    object: str = "file"
    status: str = "processed"

    def body(self) -> dict[str, Any]:
        return asdict(self)


def write_atomically(path: Path, data: bytes) -> None:
    """``data`` at ``path`` whole or not at all (a temporary file renamed over it)."""
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def file_not_found(file_id: str) -> APIError:
    shown = file_id[:64]
    return APIError(f"No such File object: {shown}", 404, "invalid_request_error", "file_id", "not_found")


class FileStore:
    """Files under ``root``; ids are ``file-<hex>``, so no id names a path outside it."""

    def __init__(self, root: Path) -> None:
        self.root = root  # made by the first upload: a server nobody uploads to writes nothing

    def _paths(self, file_id: str) -> tuple[Path, Path]:
        if not (file_id.startswith("file-") and file_id[5:].isalnum()):
            raise file_not_found(file_id)
        return self.root / f"{file_id}.json", self.root / f"{file_id}.bin"

    def create(self, filename: str, purpose: str, data: bytes) -> FileObject:
        obj = FileObject(f"file-{uuid.uuid4().hex[:24]}", len(data), int(time.time()), filename, purpose)
        meta, content = self._paths(obj.id)
        self.root.mkdir(parents=True, exist_ok=True)
        write_atomically(content, data)
        write_atomically(meta, json.dumps(obj.body()).encode())
        return obj

    def get(self, file_id: str) -> FileObject:
        meta, content = self._paths(file_id)
        if not (meta.exists() and content.exists()):
            raise file_not_found(file_id)
        return FileObject(**json.loads(meta.read_text()))

    def content(self, file_id: str) -> bytes:
        self.get(file_id)
        return self._paths(file_id)[1].read_bytes()

    def delete(self, file_id: str) -> None:
        self.get(file_id)
        for path in self._paths(file_id):
            path.unlink(missing_ok=True)

    def list(self, purpose: str | None = None) -> list[FileObject]:
        """Newest first, as OpenAI lists them."""
        objs = [self.get(p.stem) for p in self.root.glob("file-*.json") if p.with_suffix(".bin").exists()]
        objs = [o for o in objs if purpose is None or o.purpose == purpose]
        return sorted(objs, key=lambda o: (o.created_at, o.id), reverse=True)


def files_router(store: FileStore) -> APIRouter:
    router = APIRouter()

    @router.post("/v1/files")
    async def upload(file: Annotated[UploadFile, File()], purpose: Annotated[str, Form()]) -> dict[str, Any]:
        if purpose not in UPLOAD_PURPOSES:
            raise APIError(f"purpose must be one of {list(UPLOAD_PURPOSES)}, got {purpose[:32]!r}", param="purpose")
        data = await file.read()
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise APIError("a batch input file must be UTF-8 JSONL text", param="file") from exc
        return store.create(file.filename or "upload.jsonl", purpose, data).body()

    @router.get("/v1/files")
    async def list_files(
        purpose: str | None = None, limit: int = 10000, order: str = "desc", after: str | None = None
    ) -> dict[str, Any]:
        """OpenAI's paging: newest first (``order=asc``: oldest first), ``limit`` per page, the
        page after the file ``after``."""
        if not 1 <= limit <= 10000:
            raise APIError("limit must be in 1..10000", param="limit")
        if order not in ("asc", "desc"):
            raise APIError('order must be "asc" or "desc"', param="order")
        objs = store.list(purpose)
        if order == "asc":
            objs.reverse()
        if after is not None:
            ids = [o.id for o in objs]
            objs = objs[ids.index(after) + 1 :] if after in ids else []
        page = objs[:limit]
        return {
            "object": "list",
            "data": [o.body() for o in page],
            "first_id": page[0].id if page else None,
            "last_id": page[-1].id if page else None,
            "has_more": len(objs) > limit,
        }

    @router.get("/v1/files/{file_id}")
    async def retrieve(file_id: str) -> dict[str, Any]:
        return store.get(file_id).body()

    @router.get("/v1/files/{file_id}/content")
    async def content(file_id: str) -> Response:
        return Response(store.content(file_id), media_type="application/octet-stream")

    @router.delete("/v1/files/{file_id}")
    async def delete(file_id: str) -> dict[str, Any]:
        store.delete(file_id)
        return {"id": file_id, "object": "file", "deleted": True}

    return router

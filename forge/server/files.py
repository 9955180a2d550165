"""OpenAI's Files API for batch input and output: ``/v1/files``.

POST /v1/files (multipart form: ``file``, ``purpose=batch``), GET /v1/files, GET /v1/files/{id},
GET /v1/files/{id}/content, DELETE /v1/files/{id}. Each file is two entries of
``<state_dir>/files``: ``<id>.bin`` (the bytes) and ``<id>.json`` (the file object and its
owner's key fingerprint, ``owners``), each written whole to a temporary name and renamed, so a
server that stops mid-write never leaves a half file behind and a restarted server lists the
same files. A file record that does not read back as one (damaged on disk) is listed with
``status: "error"`` and a ``status_details`` saying why; the others are unaffected. The input
file of a batch that has not ended cannot be deleted (409). A full disk is a 507."""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Depends, File, Form, UploadFile
from fastapi.responses import Response
from pydantic import TypeAdapter, ValidationError

from forge.server.json_nesting import MAX_JSON_NESTING, check_nesting
from forge.server.owners import Caller, Owners
from forge.server.protocol import APIError
from forge.server.store_io import Disk, storage_errors

# purposes a client may upload; batch_output is what the batch runner writes
UPLOAD_PURPOSES = ("batch",)
BATCH_OUTPUT_PURPOSE = "batch_output"
FILE_ID = re.compile(r"file-[0-9a-zA-Z]{1,64}", re.ASCII)
MAX_RECORD_BYTES = 64 * 1024


@dataclass(frozen=True)
class FileObject:
    """OpenAI's file object; ``owner`` (the creator's key fingerprint) is stored, never sent."""

    id: str
    bytes: int
    created_at: int
    filename: str
    purpose: str
    object: str = "file"
    status: str = "processed"
    status_details: str | None = None
    owner: str | None = field(default=None, repr=False)

    def body(self) -> dict[str, Any]:
        out = asdict(self)
        del out["owner"]
        return out


RECORD = TypeAdapter(FileObject)


def file_not_found(file_id: str) -> APIError:
    shown = file_id[:64]
    return APIError(f"No such File object: {shown}", 404, "invalid_request_error", "file_id", "not_found")


def read_record(path: Path, what: str) -> bytes:
    """The JSON text of a small state-dir record; ``ValueError`` when it is too big or too deep
    to be one (its fields are then checked by a strict ``TypeAdapter.validate_json``)."""
    data = path.read_bytes()
    if len(data) > MAX_RECORD_BYTES:
        raise ValueError(f"{what} is {len(data)} bytes")
    check_nesting(data, MAX_JSON_NESTING, what)
    return data


def record_owner(data: bytes) -> str | None:
    """The ``owner`` a damaged record still names, if it names one."""
    try:
        raw = json.loads(data)
    except ValueError:
        return None
    owner = raw.get("owner") if isinstance(raw, dict) else None
    return owner if isinstance(owner, str) else None


def _damaged(file_id: str, content: Path, reason: str, owner: str | None) -> FileObject:
    """What a file whose record is unreadable is listed as (its owner, when that can be read)."""
    stat = content.stat()
    details = f"the file's record is damaged ({reason[:200]})"
    return FileObject(
        file_id, stat.st_size, int(stat.st_mtime), "", "unknown", status="error", status_details=details, owner=owner
    )


class FileStore:
    """Files under ``root``; ids are ``file-`` and at most 64 ASCII letters and digits, so no id
    names a path outside it (nor one too long for the file system)."""

    def __init__(self, root: Path) -> None:
        self.root = root  # made by the first upload: a server nobody uploads to writes nothing

    def _paths(self, file_id: str) -> tuple[Path, Path]:
        if not FILE_ID.fullmatch(file_id):
            raise file_not_found(file_id)
        return self.root / f"{file_id}.json", self.root / f"{file_id}.bin"

    def create(self, filename: str, purpose: str, data: bytes, owner: str | None = None) -> FileObject:
        obj = FileObject(f"file-{uuid.uuid4().hex[:24]}", len(data), int(time.time()), filename, purpose, owner=owner)
        meta, content = self._paths(obj.id)
        self.root.mkdir(parents=True, exist_ok=True)
        Disk.write(content, data)
        Disk.write(meta, json.dumps(asdict(obj)).encode())
        return obj

    def load(self, file_id: str) -> FileObject:
        """The file, whoever owns it (a damaged record: status ``error``)."""
        meta, content = self._paths(file_id)
        if not (meta.exists() and content.exists()):
            raise file_not_found(file_id)
        try:
            data = read_record(meta, "the record")
        except ValueError as exc:
            return _damaged(file_id, content, str(exc), None)
        try:
            obj = RECORD.validate_json(data, strict=True)
        except ValidationError as exc:
            return _damaged(file_id, content, f"{exc.error_count()} invalid fields", record_owner(data))
        if obj.id != file_id:
            return _damaged(file_id, content, "it names another file", record_owner(data))
        return obj

    def get(self, file_id: str, caller: Caller) -> FileObject:
        obj = self.load(file_id)
        if not caller.sees(obj.owner):
            raise file_not_found(file_id)
        return obj

    def content(self, file_id: str, caller: Caller) -> bytes:
        self.get(file_id, caller)
        return self._paths(file_id)[1].read_bytes()

    def delete(self, file_id: str, caller: Caller) -> None:
        self.get(file_id, caller)
        for path in self._paths(file_id):
            path.unlink(missing_ok=True)

    def list(self, caller: Caller, purpose: str | None = None) -> list[FileObject]:
        """Newest first, as OpenAI lists them."""
        objs = [self._listed(p.stem) for p in self.root.glob("file-*.json") if p.with_suffix(".bin").exists()]
        seen = [o for o in objs if o is not None and caller.sees(o.owner)]
        seen = [o for o in seen if purpose is None or o.purpose == purpose]
        return sorted(seen, key=lambda o: (o.created_at, o.id), reverse=True)

    def _listed(self, file_id: str) -> FileObject | None:
        try:
            return self.load(file_id)
        except (APIError, FileNotFoundError):  # deleted meanwhile, or not a name this store makes
            return None


def _page(objs: list[FileObject], limit: int, after: str | None) -> dict[str, Any]:
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


async def _upload(store: FileStore, file: UploadFile, purpose: str, who: Caller) -> dict[str, Any]:
    """``POST /v1/files``: a UTF-8 file of one of ``UPLOAD_PURPOSES``, stored for ``who``."""
    if purpose not in UPLOAD_PURPOSES:
        raise APIError(f"purpose must be one of {list(UPLOAD_PURPOSES)}, got {purpose[:32]!r}", param="purpose")
    data = await file.read()
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise APIError("a batch input file must be UTF-8 JSONL text", param="file") from exc
    with storage_errors():  # a large file is written on a worker thread
        created = await asyncio.to_thread(store.create, file.filename or "upload.jsonl", purpose, data, who.owner)
    return created.body()


def files_router(store: FileStore, owners: Owners, in_use: Callable[[str], bool]) -> APIRouter:
    """The routes; ``in_use(file_id)``: the file is the input of a batch that has not ended."""
    router = APIRouter()
    caller = Depends(owners.caller)

    @router.post("/v1/files")
    async def upload(
        file: Annotated[UploadFile, File()], purpose: Annotated[str, Form()], who: Caller = caller
    ) -> dict[str, Any]:
        return await _upload(store, file, purpose, who)

    @router.get("/v1/files")
    async def list_files(
        purpose: str | None = None,
        limit: int = 10000,
        order: str = "desc",
        after: str | None = None,
        who: Caller = caller,
    ) -> dict[str, Any]:
        """OpenAI's paging: newest first (``order=asc``: oldest first), ``limit`` per page, the
        page after the file ``after``."""
        if not 1 <= limit <= 10000:
            raise APIError("limit must be in 1..10000", param="limit")
        if order not in ("asc", "desc"):
            raise APIError('order must be "asc" or "desc"', param="order")
        with storage_errors():
            objs = store.list(who, purpose)
        return _page(objs[::-1] if order == "asc" else objs, limit, after)

    @router.get("/v1/files/{file_id}")
    async def retrieve(file_id: str, who: Caller = caller) -> dict[str, Any]:
        with storage_errors():
            return store.get(file_id, who).body()

    @router.get("/v1/files/{file_id}/content")
    async def content(file_id: str, who: Caller = caller) -> Response:
        with storage_errors():
            return Response(store.content(file_id, who), media_type="application/octet-stream")

    @router.delete("/v1/files/{file_id}")
    async def delete(file_id: str, who: Caller = caller) -> dict[str, Any]:
        with storage_errors():
            store.get(file_id, who)
            if in_use(file_id):
                raise APIError(
                    f"{file_id} is the input of a batch that has not ended; delete it once the batch ends",
                    409,
                    param="file_id",
                    code="file_in_use",
                )
            store.delete(file_id, who)
        return {"id": file_id, "object": "file", "deleted": True}

    return router

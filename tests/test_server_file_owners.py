"""Files and batches belong to the API key that created them (issue 40): with
``server.api_keys=[k1, k2]`` k2 gets 404 on k1's files and batches and does not see them listed;
a key of ``server.admin_api_keys`` sees and acts on all; the keys themselves are never written
to the state dir, and a restarted server knows the same owners."""

from __future__ import annotations

import errno
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from forge.config import compose_config
from forge.server.app import app_from_config
from forge.server.background import BackgroundServer
from forge.server.store_io import Disk
from tests.store_helpers import Store, line

K1, K2, ADMIN = "key-one-7f3a9c", "key-two-51b0e2", "admin-key-c4d8aa"


def bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


@dataclass(frozen=True)
class Owned:
    """k1's uploaded file, its batch (ended) and the batch's output file, on ``store``."""

    store: Store
    file_id: str
    batch_id: str
    output_id: str

    def path(self, template: str) -> str:
        return template.format(file=self.file_id, batch=self.batch_id, output=self.output_id)


def serve(state: Path) -> BackgroundServer:
    overrides = [f"server.state_dir={state}", f"server.api_keys=[{K1},{K2}]", f"server.admin_api_keys=[{ADMIN}]"]
    app, _ = app_from_config(compose_config(["model=tiny", *overrides]), "tiny")
    return BackgroundServer(app).start()


@pytest.fixture(scope="module")
def owned(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Owned]:
    state = tmp_path_factory.mktemp("state")
    server = serve(state)
    with httpx.Client(base_url=server.url, timeout=60, headers=bearer(K1)) as client:
        store = Store(client, state)
        file_id = store.upload(line("mine"))
        batch_id = store.create(file_id)
        done = store.wait(batch_id)
        assert done["status"] == "completed", done
        yield Owned(store, file_id, batch_id, done["output_file_id"])
    server.stop()


# (case, key, method, path, status): every route that names a file or a batch, for each kind of key
ACCESS_CASES = [
    *(
        (f"{who}-{name}", key, method, path, status)
        for who, key, status in (("other-key", K2, 404), ("owner", K1, 200), ("admin", ADMIN, 200))
        for name, method, path in (
            ("file", "GET", "/v1/files/{file}"),
            ("file-content", "GET", "/v1/files/{file}/content"),
            ("output-file", "GET", "/v1/files/{output}"),
            ("output-content", "GET", "/v1/files/{output}/content"),
            ("batch", "GET", "/v1/batches/{batch}"),
        )
    ),
    ("other-key-cancel", K2, "POST", "/v1/batches/{batch}/cancel", 404),
    ("owner-cancel-ended", K1, "POST", "/v1/batches/{batch}/cancel", 409),
    ("admin-cancel-ended", ADMIN, "POST", "/v1/batches/{batch}/cancel", 409),
    ("other-key-delete", K2, "DELETE", "/v1/files/{output}", 404),
]


@pytest.mark.parametrize(
    ("key", "method", "path", "status"), [c[1:] for c in ACCESS_CASES], ids=[c[0] for c in ACCESS_CASES]
)
def test_only_the_owner_and_the_admin_key_reach_a_file_or_batch(
    owned: Owned, key: str, method: str, path: str, status: int
) -> None:
    r = owned.store.client.request(method, owned.path(path), headers=bearer(key))
    assert r.status_code == status, r.text
    if status == 404:
        assert r.json()["error"]["code"] == "not_found", r.text


@pytest.mark.parametrize(("key", "sees"), [(K1, True), (K2, False), (ADMIN, True)], ids=["owner", "other", "admin"])
def test_lists_show_only_what_the_key_may_see(owned: Owned, key: str, sees: bool) -> None:
    client = owned.store.client
    files = {f["id"] for f in client.get("/v1/files", headers=bearer(key)).json()["data"]}
    batches = {b["id"] for b in client.get("/v1/batches", headers=bearer(key)).json()["data"]}
    mine = {owned.file_id, owned.output_id}
    assert mine & files == (mine if sees else set()), files
    assert (owned.batch_id in batches) is sees


def test_another_keys_file_cannot_be_batched(owned: Owned) -> None:
    body = {"input_file_id": owned.file_id, "endpoint": "/v1/completions", "completion_window": "24h"}
    r = owned.store.client.post("/v1/batches", json=body, headers=bearer(K2))
    assert r.status_code == 404 and r.json()["error"]["param"] == "file_id", r.text


def test_the_keys_are_not_in_the_state_dir_and_owners_survive_a_restart(owned: Owned) -> None:
    state = owned.store.state
    for path in state.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            assert all(k.encode() not in data for k in (K1, K2, ADMIN)), path
    record = json.loads(owned.store.record(owned.batch_id).read_text())
    assert isinstance(record["owner"], str) and len(record["owner"]) == 32
    again = serve(state)
    try:
        with httpx.Client(base_url=again.url, timeout=30) as client:
            assert client.get(f"/v1/batches/{owned.batch_id}", headers=bearer(K1)).status_code == 200
            assert client.get(f"/v1/batches/{owned.batch_id}", headers=bearer(K2)).status_code == 404
            assert client.delete(f"/v1/files/{owned.file_id}", headers=bearer(K2)).status_code == 404
            assert client.delete(f"/v1/files/{owned.file_id}", headers=bearer(K1)).json()["deleted"] is True
    finally:
        again.stop()


def test_a_state_dir_that_cannot_hold_the_secret_is_507(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fingerprint secret is made on the first keyed request: a full disk then is a 507, not a 500."""

    def full(*_: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    server = serve(tmp_path)
    try:
        monkeypatch.setattr(Disk, "write", staticmethod(full))
        r = httpx.get(f"{server.url}/v1/files", headers=bearer(K1))
        assert r.status_code == 507 and r.json()["error"]["code"] == "insufficient_storage", r.text
        monkeypatch.undo()
        assert httpx.get(f"{server.url}/v1/files", headers=bearer(K1)).status_code == 200
    finally:
        server.stop()

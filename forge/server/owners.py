"""Who owns a file or a batch: the API key that created it, stored as a fingerprint.

With API keys set (``server.api_keys``), a file or batch belongs to the key that created it:
another key gets 404 on it and does not see it listed; a key of ``server.admin_api_keys`` sees
and may act on everyone's. The key itself is never written: its fingerprint is an HMAC-SHA256
of the key under a random secret kept in the state dir (``owner.secret``, made on first use), so
the stored fingerprints do not give the keys away, and a restarted server on the same state dir
knows the same owners. With auth off every caller sees everything (no owners); what was made
while auth was off belongs to no key, so once keys are set only an admin key sees it."""

from __future__ import annotations

import hmac
import os
import secrets
import uuid
from dataclasses import dataclass, field
from hashlib import sha256
from pathlib import Path

from fastapi import Header

from forge.server.auth import bearer_key, key_is_valid
from forge.server.settings import ServerSettings
from forge.server.store_io import Disk, storage_errors


@dataclass(frozen=True)
class Caller:
    """``owner``: the fingerprint of the caller's key (None with auth off); ``admin``: sees all."""

    owner: str | None
    admin: bool

    def sees(self, owner: str | None) -> bool:
        return self.admin or owner == self.owner


@dataclass
class Owners:
    """The ``Caller`` behind a request's ``Authorization`` header (already checked by the access guard)."""

    settings: ServerSettings
    secret_path: Path
    _secret: bytes | None = field(default=None, repr=False)

    def caller(self, authorization: str | None = Header(default=None, include_in_schema=False)) -> Caller:
        """A FastAPI dependency."""
        if not self.settings.keys():
            return Caller(None, admin=True)
        key = bearer_key(authorization)
        if key is None:  # the access guard lets none through: sees only what has no owner
            return Caller(None, admin=False)
        admin = key_is_valid(key, self.settings.admin_api_key_set())
        with storage_errors():  # the secret is made on first use: a full disk is a 507 here too
            return Caller(self.fingerprint(key), admin)

    def fingerprint(self, key: str) -> str:
        digest = hmac.new(self.secret(), key.encode("latin-1", "replace"), sha256)
        return digest.hexdigest()[:32]

    def secret(self) -> bytes:
        """The state dir's secret, made once (two servers racing on one state dir agree on it)."""
        if self._secret is None:
            if not self.secret_path.exists():
                self.secret_path.parent.mkdir(parents=True, exist_ok=True)
                tmp = self.secret_path.with_name(f".{self.secret_path.name}.{uuid.uuid4().hex[:8]}")
                Disk.write(tmp, secrets.token_bytes(32))
                tmp.chmod(0o600)
                try:
                    os.link(tmp, self.secret_path)  # fails if another server made it first: theirs wins
                except FileExistsError:
                    pass
                finally:
                    tmp.unlink()
            self._secret = self.secret_path.read_bytes()
        return self._secret

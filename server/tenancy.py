"""Tenants: each API key is one, and a request's cache_salt splits callers within a key.

The prefix cache is shared by everything the engine runs, and `usage.prompt_tokens_details.
cached_tokens` tells a caller how much of its prompt was already cached: without isolation that
number is an oracle on other callers' prompts. Every request therefore carries a cache salt
(tenant id + the request's own `cache_salt`) into the block digests, so blocks are only ever
shared between requests of the same tenant that sent the same salt.

A tenant id is derived from its key (never the key itself, so logs and salts cannot leak it).
Without API keys every caller is the one anonymous tenant.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable

from starlette.requests import Request

ANONYMOUS = "anonymous"
SCOPE_KEY = "lantern_tenant"  # set by the API-key middleware in scope["state"]
_DOMAIN = b"lantern-tenant\0"  # keeps tenant ids unrelated to the digests keys are checked against


def tenant_id(key: str) -> str:
    """A stable, non-reversible id for the tenant holding `key` (16 hex digits)."""
    return hashlib.sha256(_DOMAIN + key.encode("utf-8")).hexdigest()[:16]


class TenantKeys:
    """The configured keys, checked in constant time: the caller's token is hashed to a fixed
    length and compared with every key's digest, with no early exit, so neither the time taken
    nor the key's length tells an attacker how close a guess was or which key it matched."""

    def __init__(self, keys: Iterable[str]):
        self._entries: list[tuple[bytes, str]] = []
        seen: set[str] = set()
        for key in keys:
            if key in seen:
                continue
            seen.add(key)
            self._entries.append((hashlib.sha256(key.encode("utf-8")).digest(), tenant_id(key)))

    def __bool__(self) -> bool:
        return bool(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def identify(self, token: bytes) -> str | None:
        """The tenant id whose key is `token` (raw header bytes), or None."""
        digest = hashlib.sha256(token).digest()
        found = None
        for key_digest, tid in self._entries:
            if hmac.compare_digest(digest, key_digest):
                found = tid
        return found


def request_tenant(request: Request) -> str:
    """The tenant the API-key middleware recorded for this request (anonymous without keys)."""
    state = request.scope.get("state") or {}
    return state.get(SCOPE_KEY) or ANONYMOUS


def cache_salt_for(request: Request, cache_salt: str | None) -> str:
    """The engine's cache salt for this request: tenant identity plus the request's own salt.

    Tenant ids never contain NUL, so the first NUL separates the two parts unambiguously."""
    return f"{request_tenant(request)}\0{cache_salt or ''}"

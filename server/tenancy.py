"""Tenants: each API key is one, and a request's cache_salt splits callers within a key."""
from __future__ import annotations

from fastapi import Request


def cache_salt_for(request: Request, cache_salt: str | None) -> str:
    """The engine's cache salt for this request: tenant identity plus the request's own salt."""
    return cache_salt or ""  # placeholder until tenants exist

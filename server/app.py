"""FastAPI app factory: the OpenAI-compatible API over one AsyncEngine."""
from __future__ import annotations

import hmac
import time
from dataclasses import dataclass, field

from pathlib import Path

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

from app.engine import AsyncEngine
from server.errors import error_response, install_error_handlers
from server.generation import ServerState
from server.metrics import ServerMetrics
from server.routes import admin, chat, completions, models

OPEN_PATHS = {"/health"}
WEB_DIR = Path(__file__).resolve().parent.parent / "assets" / "web"
# With the browser chat on, these stay open so the page can load and ask for the key.
API_PREFIXES = ("/v1", "/tokenize", "/detokenize", "/metrics", "/docs", "/openapi.json", "/redoc")


@dataclass
class ServerSettings:
    served_model_name: str | None = None
    api_key: str | None = None  # one key (kept for callers that have one); merged into api_keys
    api_keys: list[str] = field(default_factory=list)  # each key is a tenant with its own prefix cache
    max_waiting: int = 1024
    ui_server: bool = False  # serve the browser chat (assets/web) at /
    allowed_origins: list[str] = field(default_factory=list)  # CORS; empty: no cross-origin access
    max_request_bytes: int = 4 * 2**20  # larger bodies get 413
    max_n: int = 128  # n x number of prompts in one request


class APIKeyMiddleware:
    """Bearer-key check as plain ASGI (Starlette's BaseHTTPMiddleware would hide client
    disconnects from the routes, and they abort requests on disconnect)."""

    def __init__(self, app, settings: ServerSettings):
        self.app, self.settings = app, settings

    async def __call__(self, scope, receive, send):
        key = self.settings.api_key
        path = scope.get("path", "")
        is_page = self.settings.ui_server and not path.startswith(API_PREFIXES)
        if scope["type"] == "http" and key and path not in OPEN_PATHS and not is_page:
            headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
            given = headers.get("authorization", "")
            token = given[7:] if given.lower().startswith("bearer ") else headers.get("x-api-key", "")
            if not hmac.compare_digest(token.encode(), key.encode()):
                response = error_response(401, "missing or invalid API key (send Authorization: Bearer KEY)",
                                          code="invalid_api_key")
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def create_app(engine: AsyncEngine, settings: ServerSettings | None = None) -> FastAPI:
    settings = settings or ServerSettings()
    app = FastAPI(title="Lantern", description="OpenAI-compatible local LLM server", version="0.1.0")
    name = settings.served_model_name or engine.engine.model_name
    app.state.lantern = ServerState(
        engine=engine, model_name=name, metrics=ServerMetrics(engine.stats, name),
        max_waiting=settings.max_waiting, api_key=settings.api_key,
    )
    app.state.started = int(time.time())
    install_error_handlers(app)

    app.add_middleware(APIKeyMiddleware, settings=settings)
    for module in (chat, completions, models, admin):
        app.include_router(module.router)
    if settings.ui_server:
        # Mounted last: the API routes above take precedence over the static files.
        app.mount("/", StaticFiles(directory=WEB_DIR, html=True), name="web")
    return app

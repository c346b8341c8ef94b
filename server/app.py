"""FastAPI app factory: the OpenAI-compatible API over one AsyncEngine.

Middlewares, outermost first (all plain ASGI: Starlette's BaseHTTPMiddleware would hide client
disconnects from the routes, and they abort requests on disconnect):
  CORSMiddleware   - only with allowed_origins; answers preflights before any key is asked for
  APIKeyMiddleware - bearer key -> tenant id on the request scope; 401 otherwise
  BodyLimitMiddleware - bodies over max_request_bytes -> 413, declared or streamed
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles
from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from lantern.app.engine import AsyncEngine
from lantern.server.errors import error_response, error_response_for, install_error_handlers
from lantern.server.generation import ServerState
from lantern.server.metrics import ServerMetrics
from lantern.server.routes import admin, chat, classify, completions, embeddings, messages, models, rerank, responses
from lantern.server.tenancy import ANONYMOUS, SCOPE_KEY, TenantKeys

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
    tool_call_parser: str | None = None  # None: picked from the chat template (server/tool_parsers)
    reasoning_parser: str | None = None  # None: <think> blocks split when the template has them
    mcp_config: str | None = None  # an mcpServers JSON file: its tools are run by the server (mcp_loop.py)
    mcp_max_rounds: int = 8  # tool rounds the server runs for one chat request before it answers

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Refuses settings that would silently weaken the server (ValueError)."""
        if isinstance(self.api_keys, str):
            raise TypeError("api_keys must be a list of keys, not one string")
        for key in self.keys():
            # An empty key would otherwise mean "no authentication"; surrounding whitespace cannot
            # be sent in a header (HTTP strips it), so such a key could never match.
            if not key or key != key.strip():
                raise ValueError("an API key must be non-empty and have no leading/trailing whitespace")
        if self.max_request_bytes < 1:
            raise ValueError(f"max_request_bytes must be >= 1; got {self.max_request_bytes}")
        if self.max_n < 1:
            raise ValueError(f"max_n must be >= 1; got {self.max_n}")
        if self.mcp_max_rounds < 1:
            raise ValueError(f"mcp_max_rounds must be >= 1; got {self.mcp_max_rounds}")
        from lantern.app.engine import reasoning
        from lantern.server import tool_parsers

        if self.tool_call_parser is not None and self.tool_call_parser not in tool_parsers.CHOICES:
            raise ValueError(f"tool_call_parser must be one of {', '.join(tool_parsers.CHOICES)}")
        if self.reasoning_parser is not None and self.reasoning_parser not in reasoning.CHOICES:
            raise ValueError(f"reasoning_parser must be one of {', '.join(reasoning.CHOICES)}")

    def keys(self) -> list[str]:
        """api_key and api_keys merged, without repeats."""
        merged = ([self.api_key] if self.api_key is not None else []) + list(self.api_keys)
        return list(dict.fromkeys(merged))


def _bearer_token(headers: list[tuple[bytes, bytes]]) -> bytes:
    """The key a request presents, as raw bytes (header bytes need not be UTF-8; nothing here
    decodes them, so odd bytes are just a wrong key)."""
    authorization = api_key = None
    for name, value in headers:
        name = name.lower()
        if name == b"authorization":
            authorization = value.strip()
        elif name == b"x-api-key":
            api_key = value.strip()
    if authorization is not None and authorization[:7].lower() == b"bearer ":
        return authorization[7:].strip()
    return api_key or b""


class APIKeyMiddleware:
    """Bearer-key check; records the caller's tenant id (never the key) on the request scope."""

    def __init__(self, app: ASGIApp, settings: ServerSettings):
        self.app, self.settings = app, settings
        self.tenants = TenantKeys(settings.keys())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        tenant: str | None = ANONYMOUS
        if self.tenants:
            tenant = self.tenants.identify(_bearer_token(scope["headers"]))
            path = scope.get("path", "")
            is_page = self.settings.ui_server and not path.startswith(API_PREFIXES)
            if tenant is None and path not in OPEN_PATHS and not is_page:
                if path.startswith("/v1/messages"):  # Anthropic clients read their own envelope
                    from lantern.server.anthropic_protocol import anthropic_error

                    response = anthropic_error(401, "missing or invalid API key (send x-api-key: KEY)")
                else:
                    response = error_response(
                        401, "missing or invalid API key (send Authorization: Bearer KEY)", code="invalid_api_key"
                    )
                await response(scope, receive, send)
                return
        scope.setdefault("state", {})[SCOPE_KEY] = tenant or ANONYMOUS
        await self.app(scope, receive, send)


class BodyLimitMiddleware:
    """Refuses bodies over max_bytes with 413: a declared Content-Length at once, a chunked or
    under-declared body as soon as the bytes received pass the limit.

    The body is read here (the routes read all of it anyway) and replayed to the app. Before the
    413 the rest of the body is drained for up to `drain_s`: answering while the client is still
    sending makes the server close a socket with unread data, and the TCP reset can destroy the
    response before the client reads it."""

    def __init__(self, app: ASGIApp, max_bytes: int, drain_s: float = 5.0):
        self.app, self.max_bytes, self.drain_s = app, max_bytes, drain_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope["headers"])
        if declared is not None and declared > self.max_bytes:
            # A client waiting for "100 Continue" has sent nothing yet: answer without asking
            # for the body (reading it would make uvicorn send the 100).
            waiting = (_header(scope["headers"], b"expect") or b"").lower() == b"100-continue"
            await self._refuse(scope, receive, send, more_body=not waiting)
            return
        parts: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client left before sending its whole body: nobody to answer
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                parts.clear()
                await self._refuse(scope, receive, send, more_body=message.get("more_body", False))
                return
            parts.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(parts)
        del parts
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # then http.disconnect, as the routes expect

        await self.app(scope, replay, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send, more_body: bool) -> None:
        if more_body:
            with anyio.move_on_after(self.drain_s):
                while True:
                    message = await receive()
                    if message["type"] != "http.request" or not message.get("more_body", False):
                        break
        response = error_response_for(
            scope.get("path", ""),
            413,
            f"request body is larger than {self.max_bytes} bytes (the server's --max-request-bytes)",
            code="request_too_large",
        )
        response.headers["connection"] = "close"
        await response(scope, receive, send)


def _header(headers: list[tuple[bytes, bytes]], wanted: bytes) -> bytes | None:
    return next((value for name, value in headers if name.lower() == wanted), None)


def _content_length(headers: list[tuple[bytes, bytes]]) -> int | None:
    try:
        value = _header(headers, b"content-length")
        return None if value is None else int(value)
    except ValueError:  # the HTTP layer rejects these first; count the bytes instead
        return None


def _mcp_lifespan(config: str | None) -> Any:
    """Starts the --mcp-config servers with the app and stops them with it (app.state.mcp)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if config is None:
            yield
            return
        from lantern.server.mcp_bridge import MCPToolset, read_mcp_config

        tools = MCPToolset(read_mcp_config(config))
        await tools.start()
        app.state.mcp = tools
        try:
            yield
        finally:
            await tools.close()

    return lifespan


def create_app(engine: AsyncEngine, settings: ServerSettings | None = None) -> FastAPI:
    settings = settings or ServerSettings()
    settings.validate()  # again: fields may have changed since construction
    app = FastAPI(
        title="Lantern",
        description="OpenAI-compatible local LLM server",
        version="0.1.0",
        lifespan=_mcp_lifespan(settings.mcp_config),
    )
    name = settings.served_model_name or engine.model_name
    app.state.lantern = ServerState(
        engine=engine,
        model_name=name,
        metrics=ServerMetrics(engine.stats, name, alive=lambda: engine.dead_reason is None),
        max_waiting=settings.max_waiting,
        max_n=settings.max_n,
    )
    app.state.settings = settings
    app.state.started = int(time.time())
    install_error_handlers(app)

    # add_middleware puts each new one outside the previous ones: innermost first.
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_request_bytes)
    app.add_middleware(APIKeyMiddleware, settings=settings)
    if settings.allowed_origins:
        # Outermost, so a preflight OPTIONS is answered before the key check (browsers never
        # send credentials on a preflight). Bearer keys, not cookies: no allow_credentials.
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(settings.allowed_origins),
            allow_methods=["GET", "POST", "DELETE", "OPTIONS"],
            allow_headers=["*"],
            max_age=600,
        )
    for module in (chat, completions, embeddings, rerank, classify, models, admin):
        app.include_router(module.router)
    app.include_router(responses.router)  # POST /v1/responses, GET/DELETE /v1/responses/{id}
    app.include_router(messages.router)  # Anthropic: POST /v1/messages, /v1/messages/count_tokens
    if settings.ui_server:
        # Mounted last: the API routes above take precedence over the static files.
        app.mount("/", StaticFiles(directory=WEB_DIR, html=True), name="web")
    return app

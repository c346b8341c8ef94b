"""OpenAI's error envelope for every failure: {"error": {"message", "type", "param", "code"}}.

User input never yields a 5xx: typed engine errors carry the field (`param`) and a reason (`code`);
a 500 is left for faults of the server or engine themselves, and 503 for an engine that stopped.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from lantern.app.engine import EngineDeadError, InvalidRequestError, RequestFailedError
from lantern.server.anthropic_protocol import anthropic_error, is_anthropic_path
from lantern.server.protocol import INVALID_UNICODE

logger = logging.getLogger(__name__)

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    503: "service_unavailable",
    500: "internal_error",
}
# Pydantic names union members in error locations ("str", "list[int]", "TextPart"): not fields.
_TYPE_TAGS = {"str", "int", "float", "bool", "none", "list", "dict"}


class APIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code


def _printable(text: str | None) -> str | None:
    """Text safe to encode as UTF-8: a message may quote the client's own (invalid) input."""
    if text is None or text.isascii():
        return text
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict:
    return {
        "error": {
            "message": _printable(message),
            "type": _TYPES.get(status, "invalid_request_error"),
            "param": _printable(param),
            "code": code,
        }
    }


def error_response(
    status: int, message: str, param: str | None = None, code: str | None = None, headers: dict[str, str] | None = None
) -> JSONResponse:
    return JSONResponse(error_body(status, message, param, code), status_code=status, headers=headers)


def invalid(exc: InvalidRequestError) -> APIError:
    """The engine's typed validation error as a 400 naming the field."""
    return APIError(400, exc.message, param=exc.param, code=exc.code)


def engine_error(exc: Exception) -> APIError:
    """Status and envelope for an exception raised while a request ran (or was about to)."""
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, InvalidRequestError):
        return invalid(exc)
    if isinstance(exc, EngineDeadError):
        return APIError(503, f"the engine has stopped and cannot serve requests: {exc}", code="engine_dead")
    if isinstance(exc, RequestFailedError):
        return APIError(500, f"the engine failed while running this request: {exc}", code="request_failed")
    logger.error("request failed", exc_info=exc)
    return APIError(500, "internal server error")


def _param(loc: Any) -> str | None:
    parts: list[str] = []
    for p in loc:
        if p == "body" and not parts:
            continue
        if isinstance(p, int) or (
            isinstance(p, str) and p.isidentifier() and p not in _TYPE_TAGS and not p[0].isupper()
        ):
            parts.append(str(p))
    return ".".join(parts) or None


def _validation_response(exc: RequestValidationError) -> JSONResponse:
    errors = list(exc.errors())
    if any(e.get("type") == "json_invalid" for e in errors):
        return error_response(400, "request body is not valid JSON", None, "invalid_json")
    # A lone surrogate is the real fault even where pydantic lists a union mismatch before it;
    # otherwise the deepest location says most (a content part's bad `type`, not "not a string").
    errors.sort(key=lambda e: (e.get("type") != INVALID_UNICODE, -len((_param(e.get("loc", ())) or "").split("."))))
    first = errors[0] if errors else {}
    param = _param(first.get("loc", ()))
    msg = str(first.get("msg", "invalid request"))
    code = INVALID_UNICODE if first.get("type") == INVALID_UNICODE else None
    return error_response(400, f"{param}: {msg}" if param else msg, param, code)


class CatchAllMiddleware:
    """Answers an unexpected exception with the 500 envelope here, inside the app, instead of
    letting it reach Starlette's ServerErrorMiddleware: that one re-raises after answering, and
    uvicorn then drops the keep-alive connection without saying `Connection: close`. A response
    already under way (a stream) cannot be replaced; those generators end with an error event."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception as exc:
            if started:
                raise
            err = engine_error(exc)
            await error_response_for(scope.get("path", ""), err.status, err.message, err.param, err.code)(
                scope, receive, send
            )


def error_response_for(
    path: str,
    status: int,
    message: str,
    param: str | None = None,
    code: str | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    """The error in the envelope the route's clients read: Anthropic's on /v1/messages*."""
    if is_anthropic_path(path):
        return anthropic_error(status, message, param, headers=headers)
    return error_response(status, message, param, code, headers=headers)


class ClientDisconnected(Exception):
    """A non-streamed request whose client went away (generation.collect): its requests were
    aborted and nobody reads a reply, so it is answered 499 and logged at INFO, not as an error."""


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(_: Request, exc: APIError) -> JSONResponse:
        return error_response(exc.status, exc.message, exc.param, exc.code)

    @app.exception_handler(InvalidRequestError)
    async def _invalid(_: Request, exc: InvalidRequestError) -> JSONResponse:
        return error_response(400, exc.message, exc.param, exc.code)

    @app.exception_handler(EngineDeadError)
    @app.exception_handler(RequestFailedError)
    async def _engine(_: Request, exc: Exception) -> JSONResponse:
        err = engine_error(exc)
        return error_response(err.status, err.message, err.param, err.code)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        return _validation_response(exc)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        # Routing's own errors (405 on GET /v1/messages, 404 under it) in the route's envelope.
        return error_response_for(
            request.url.path, exc.status_code, str(exc.detail), headers=getattr(exc, "headers", None)
        )

    @app.exception_handler(ClientDisconnected)
    async def _gone(request: Request, _: ClientDisconnected) -> Response:
        logger.info("%s %s: the client left before the reply was complete", request.method, request.url.path)
        return Response(status_code=499)  # nginx's "client closed request": nobody reads it

    @app.exception_handler(json.JSONDecodeError)
    async def _json(_: Request, exc: json.JSONDecodeError) -> JSONResponse:
        return error_response(400, "request body is not valid JSON", None, "invalid_json")

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        # Only reached by exceptions from middlewares outside CatchAllMiddleware.
        logger.exception("unhandled error")
        return error_response(500, "internal server error", headers={"Connection": "close"})

    app.add_middleware(CatchAllMiddleware)

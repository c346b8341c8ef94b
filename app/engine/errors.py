"""Typed errors of the engine's public API. Front ends map them to their own envelopes (the server
to OpenAI's `param`/`code`) without parsing message text."""

from __future__ import annotations


class InvalidRequestError(ValueError):
    """A request the engine will not run: bad sampling field, prompt too long, unknown token id.

    `param` names the offending field in OpenAI's spelling where there is one; `code` is a
    machine-readable reason (e.g. "context_length_exceeded")."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code


class RequestFailedError(RuntimeError):
    """The engine failed while running this one request; other requests carry on."""


class EngineDeadError(RuntimeError):
    """The engine loop has stopped; no request can run until the process restarts."""

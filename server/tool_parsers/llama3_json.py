"""Llama 3.1 / 3.2 / 3.3 JSON tool calls: the whole reply is `{"name": ..., "parameters": {...}}`
(optionally after `<|python_tag|>`), several calls separated by `;`. A reply that does not start
that way is plain content."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lantern.server.tool_parsers.base import ParsedDelta, ToolParser
from lantern.server.tool_parsers.grammar import json_rule

PYTHON_TAG = "<|python_tag|>"


class Llama3JsonParser(ToolParser):
    name = "llama3_json"
    markers = (PYTHON_TAG,)
    anchor = "{"

    def _start(self, out: ParsedDelta, final: bool) -> bool:
        body = self.buf.lstrip()
        if not body or (PYTHON_TAG.startswith(body) and body != PYTHON_TAG):
            if final:
                self.state = "plain"
                return True
            return False  # too early to tell
        if body.startswith(PYTHON_TAG):
            self.pending = self.buf[: len(self.buf) - len(body)] + PYTHON_TAG
            self.buf, self.state = body[len(PYTHON_TAG) :], "open"
            return True
        self.state = "open" if body[0] == "{" else "plain"
        return True

    def _open(self, out: ParsedDelta, final: bool) -> bool:
        """Where a call object must start: after the tag, a `;`, or at the very beginning."""
        return self._begin_json_call(out, final, bad="plain")

    def _call(self, out: ParsedDelta, final: bool) -> bool:
        assert self.reader is not None
        return self._read_call(out, final, self.reader, then="sep", bad="plain")

    def _sep(self, out: ParsedDelta, final: bool) -> bool:
        body = self.buf.lstrip()
        if not body:
            self.buf = "" if final else self.buf
            return False
        if body[0] == ";":
            self.pending = self.buf[: len(self.buf) - len(body) + 1]
            self.buf, self.state = body[1:], "open"
            return True
        self.buf, self.state = body, "plain"  # text after the calls
        return True

    @classmethod
    def grammar(cls, tools: list[dict[str, Any]], parallel: bool, lit: Callable[[str], str], template: str = "") -> str:
        many = ' ("; " call)*' if parallel else ""
        return f"calls: {lit(PYTHON_TAG)}? call{many}\ncall: {json_rule(tools, 'parameters')}\n"

"""Mistral: `[TOOL_CALLS]` then either a JSON list `[{"name": ..., "arguments": {...}}, ...]`
(v3 tokenizers: Mistral 7B v0.3, Nemo, Small 2409) or `name[ARGS]{...}` per call (v11+:
Small 3.1+, Magistral, Devstral; `name[CALL_ID]id[ARGS]{...}` also read). Call ids are nine
letters and digits: Mistral's templates refuse others when the call comes back in history."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from lantern.server.tool_parsers.base import (
    CallDelta,
    JsonCallReader,
    MarkedParser,
    ParsedDelta,
    mistral_call_id,
    split_at,
)
from lantern.server.tool_parsers.grammar import json_rule, json_value, marked_calls, params_schema

TOOL_CALLS, ARGS, CALL_ID = "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"
_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,64}")


class MistralParser(MarkedParser):
    name = "mistral"
    open_marker = TOOL_CALLS
    markers = (TOOL_CALLS, ARGS, CALL_ID)
    new_id = staticmethod(mistral_call_id)

    def _open(self, out: ParsedDelta, final: bool) -> bool:
        body = self.buf.lstrip()
        if not body:
            return self._malformed(out) if final else False
        self.pending += self.buf[: len(self.buf) - len(body)]
        if body[0] == "[":
            self.pending += "["
            self.buf, self.state = body[1:], "item"
        else:
            self.buf, self.state = body, "name"
        return True

    # -- v3: a JSON list of call objects ---------------------------------------------------------
    def _item(self, out: ParsedDelta, final: bool) -> bool:
        return self._begin_json_call(out, final)

    def _call(self, out: ParsedDelta, final: bool) -> bool:
        assert self.reader is not None
        return self._read_call(out, final, self.reader, then="list_sep", bad="text")

    def _list_sep(self, out: ParsedDelta, final: bool) -> bool:
        body = self.buf.lstrip()
        if not body:
            self.buf = "" if final else self.buf
            return False
        if body[0] == ",":
            self.pending = self.buf[: len(self.buf) - len(body) + 1]
            self.buf, self.state = body[1:], "item"
        else:
            self.buf, self.state = body[1:] if body[0] == "]" else body, "text"
        return True

    # -- v11+: name[ARGS]{...} -------------------------------------------------------------------
    def _name(self, out: ParsedDelta, final: bool) -> bool:
        head, after, _ = split_at(self.buf, ARGS)
        if after is None:
            probe = head.split(CALL_ID)[0]
            if final or (probe and not _NAME.fullmatch(probe)):
                return self._malformed(out)
            return False
        name, _, call_id = head.partition(CALL_ID)
        if not _NAME.fullmatch(name):
            return self._malformed(out)
        out.calls.append(CallDelta(self.num_calls, call_id.strip() or self.new_id(), name))
        self.pending = ""
        self.buf, self.state = after, "args"
        self.reader = JsonCallReader(self.num_calls, self.new_id, bare=True)
        return True

    def _args(self, out: ParsedDelta, final: bool) -> bool:
        assert self.reader is not None
        return self._read_call(out, final, self.reader, then="text", bad="text")

    @classmethod
    def grammar(cls, tools: list[dict[str, Any]], parallel: bool, lit: Callable[[str], str], template: str = "") -> str:
        if ARGS in template:  # v11+ templates write history calls as name[ARGS]{...}
            alts = [
                f"call_{i}: {lit(t['name'])} {lit(ARGS)} {json_value(params_schema(t))}" for i, t in enumerate(tools)
            ]
            tail = "(" + " | ".join(f"call_{i}" for i in range(len(tools))) + ")"
            return marked_calls(lit(TOOL_CALLS), tail, "", parallel) + "\n".join(alts) + "\n"
        # v3 templates write `[TOOL_CALLS] [{"name": ..., "arguments": ..., "id": "abcDEF123"}]`.
        many = ' (", " call)*' if parallel else ""
        call = json_rule(tools, "arguments", extra={"id": {"type": "string", "pattern": "^[a-zA-Z0-9]{9}$"}})
        return f'calls: {lit(TOOL_CALLS)} calls_rest\ncalls_rest: " [" call{many} "]"\ncall: {call}\n'

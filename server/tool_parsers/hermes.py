"""Hermes / Qwen2.5 / Qwen3: `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`,
one block per call, after optional content."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lantern.server.tool_parsers.base import MarkedParser, ParsedDelta, held_prefix, split_at
from lantern.server.tool_parsers.grammar import json_rule, marked_calls


class HermesParser(MarkedParser):
    name = "hermes"
    open_marker = "<tool_call>"
    close_marker = "</tool_call>"
    markers = (open_marker, close_marker)

    def _open(self, out: ParsedDelta, final: bool) -> bool:
        return self._begin_json_call(out, final)

    def _call(self, out: ParsedDelta, final: bool) -> bool:
        assert self.reader is not None
        return self._read_call(out, final, self.reader, then="close", bad="text")

    def _close(self, out: ParsedDelta, final: bool) -> bool:
        # Whatever sits between the arguments and `</tool_call>` is markup; a missing closer
        # followed by the next `<tool_call>` still starts the next call.
        before, after, held = split_at(self.buf, self.close_marker)
        held = max(held, held_prefix(self.buf, self.open_marker))
        nxt = self.buf.find(self.open_marker)
        if nxt >= 0 and (after is None or nxt < len(before)):
            self.buf, self.state, self.after_call = self.buf[nxt:], "text", True
            return True
        if after is None:
            self.buf = "" if final else self.buf[len(self.buf) - held :]
            return False
        self.buf, self.state, self.after_call = after, "text", True
        return True

    @classmethod
    def grammar(cls, tools: list[dict[str, Any]], parallel: bool, lit: Callable[[str], str], template: str = "") -> str:
        tail = f'"\\n" {json_rule(tools, "arguments")} "\\n" {lit(cls.close_marker)}'
        return marked_calls(lit(cls.open_marker), tail, ' "\\n" ', parallel)

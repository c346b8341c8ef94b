"""Hermes / Qwen2.5 / Qwen3: `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`,
one block per call, after optional content."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lantern.server.tool_parsers.base import MarkedParser, ParsedDelta
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

    @classmethod
    def grammar(cls, tools: list[dict[str, Any]], parallel: bool, lit: Callable[[str], str], template: str = "") -> str:
        tail = f'"\\n" {json_rule(tools, "arguments")} "\\n" {lit(cls.close_marker)}'
        return marked_calls(lit(cls.open_marker), tail, ' "\\n" ', parallel)

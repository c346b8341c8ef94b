"""Qwen3-Coder XML calls:

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    </function>
    </tool_call>

Parameter values are raw text (one newline on each side is layout); they are typed by the
tool's schema: strings stay text, anything else is read as JSON (else Python literal, else
kept as text). The arguments stream one parameter at a time."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from lantern.server.tool_parsers.base import CallDelta, ParsedDelta, RawArgumentsParser, split_at
from lantern.server.tool_parsers.grammar import marked_calls, params_schema, raw_value

FUNC, PARAM, END_PARAM, END_FUNC = "<function=", "<parameter=", "</parameter>", "</function>"
_NAME = re.compile(r"[^\s<>=]{1,128}")


class Qwen3CoderParser(RawArgumentsParser):
    name = "qwen3_coder"
    open_marker = "<tool_call>"
    close_marker = "</tool_call>"
    markers = (open_marker, close_marker)

    param = ""

    def _open(self, out: ParsedDelta, final: bool) -> bool:
        body = self.buf.lstrip()
        if len(body) < len(FUNC) and FUNC.startswith(body):
            return self._malformed(out) if final else False
        if not body.startswith(FUNC):
            return self._malformed(out)
        head, after, _ = split_at(body[len(FUNC) :], ">")
        name = head.strip()
        if after is None:
            if final or (name and not _NAME.fullmatch(name)):
                return self._malformed(out)
            return False
        if not _NAME.fullmatch(name):
            return self._malformed(out)
        out.calls.append(CallDelta(self.num_calls, self.new_id(), name))
        self.pending, self.fn, self.first = "", name, True
        self.buf, self.state = after, "body"
        return True

    def _body(self, out: ParsedDelta, final: bool) -> bool:
        """Inside <function=...>: parameters until </function> (or a missing one's </tool_call>)."""
        body = self.buf.lstrip()
        for marker, then in ((PARAM, "pname"), (END_FUNC, "close"), (self.close_marker, "text")):
            if body.startswith(marker):
                self.buf = body[len(marker) :]
                if then != "pname":
                    self._end_call(out, closed=then == "text")
                self.state = then
                return True
        if final:
            self._end_call(out, closed=True)
            self.buf, self.state = "", "text"
            return False
        if any(m.startswith(body) for m in (PARAM, END_FUNC, self.close_marker)):
            return False  # a marker still arriving
        cut = body.find("<", 1)  # stray text between parameters is layout
        self.buf = body[cut:] if cut > 0 else ""
        return bool(self.buf)

    def _pname(self, out: ParsedDelta, final: bool) -> bool:
        head, after, _ = split_at(self.buf, ">")
        if after is None:
            if final:
                self._end_call(out, closed=True)
                self.buf, self.state = "", "text"
            return False
        self.param, self.buf, self.state = head.strip(), after, "value"
        return True

    def _value(self, out: ParsedDelta, final: bool) -> bool:
        value, after, _ = split_at(self.buf, END_PARAM)
        if after is None:
            # A model that forgets </parameter> still ends the value at the next tag.
            for stop in (PARAM, END_FUNC, self.close_marker):
                i = self.buf.find("\n" + stop)
                if i >= 0:
                    value, after = self.buf[:i], self.buf[i + 1 :]
                    break
        if after is None and not final:
            return False
        value = value.removeprefix("\n").removesuffix("\n")
        return self._argument(out, self.param, value, after)

    def _end_call(self, out: ParsedDelta, closed: bool = True) -> None:
        """closed: false while the </tool_call> after the call is still to come."""
        super()._end_call(out)
        self.after_call = closed

    @classmethod
    def grammar(cls, tools: list[dict[str, Any]], parallel: bool, lit: Callable[[str], str], template: str = "") -> str:
        rules = []
        for i, t in enumerate(tools):
            schema = params_schema(t)
            props = schema.get("properties") or {}
            required = set(schema.get("required") or [])
            parts = []
            for j, (pname, pschema) in enumerate(props.items()):
                head = json.dumps(f"<parameter={pname}>\n", ensure_ascii=False)
                value = raw_value(pschema, f"\n{END_PARAM}\n", lit, f"v{i}_{j}", rules)
                parts.append(f"({head} {value}){'' if pname in required else '?'}")
            head = json.dumps(f"{FUNC}{t['name']}>\n", ensure_ascii=False)
            rules.append(f"call_{i}: {head} {' '.join(parts)} {json.dumps(END_FUNC + chr(10))}")
        tail = '"\\n" (' + " | ".join(f"call_{i}" for i in range(len(tools))) + f") {lit(cls.close_marker)}"
        return marked_calls(lit(cls.open_marker), tail, ' "\\n" ', parallel) + "\n".join(rules) + "\n"

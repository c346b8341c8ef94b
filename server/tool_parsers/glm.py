"""GLM-4.5 / 4.6 / 4.7 key-value calls (vLLM's `glm45` / `glm47` parsers read the same markup):

    <tool_call>get_weather
    <arg_key>city</arg_key>
    <arg_value>Paris</arg_value>
    </tool_call>

GLM-4.7's template writes the same tags without the newlines. The function name runs from the
opening tag to the first tag; each argument is a key and a value tag. Values are what the template
wrote: strings raw, anything else as JSON, so they are typed by the tool's schema (strings stay
text, anything else is read as JSON, else a Python literal, else kept as text). The arguments
stream one key-value pair at a time."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from lantern.server.tool_parsers.base import CallDelta, ParsedDelta, RawArgumentsParser, split_at
from lantern.server.tool_parsers.grammar import marked_calls, params_schema, raw_value

KEY, END_KEY, VALUE, END_VALUE = "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"
_NAME = re.compile(r"[\w.:-]{1,128}")  # a function name (the server refuses others), never JSON


class GlmParser(RawArgumentsParser):
    name = "glm45"
    open_marker = "<tool_call>"
    close_marker = "</tool_call>"
    markers = (open_marker, close_marker, KEY, END_KEY, VALUE, END_VALUE)  # added tokens in GLM's vocabularies

    key = ""

    def _open(self, out: ParsedDelta, final: bool) -> bool:
        """The name: the text up to the first tag (`<arg_key>`, or `</tool_call>` for no arguments)."""
        cut = self.buf.find("<")
        head = self.buf if cut < 0 else self.buf[:cut]
        name = head.strip()
        if cut < 0:
            if final or (name and not _NAME.fullmatch(name)) or len(head) > 256:
                return self._malformed(out)
            return False
        if not _NAME.fullmatch(name):
            return self._malformed(out)
        out.calls.append(CallDelta(self.num_calls, self.new_id(), name))
        self.pending, self.fn, self.first = "", name, True
        self.buf, self.state = self.buf[cut:], "body"
        return True

    def _body(self, out: ParsedDelta, final: bool) -> bool:
        """Between arguments: the next `<arg_key>`, or `</tool_call>`; other text is layout."""
        body = self.buf.lstrip()
        if body.startswith(KEY):
            self.buf, self.state = body[len(KEY) :], "key"
            return True
        if body.startswith(self.close_marker):
            self.buf, self.state = body[len(self.close_marker) :], "text"
            self._end_call(out)
            return True
        if body.startswith(self.open_marker):  # a missing </tool_call>: the next call starts
            self.buf, self.state = body, "text"
            self._end_call(out)
            return True
        if final:
            self._end_call(out)
            self.buf, self.state = "", "text"
            return False
        if any(m.startswith(body) for m in (KEY, self.close_marker, self.open_marker)):
            return False  # a tag still arriving
        cut = body.find("<", 1)
        self.buf = body[cut:] if cut > 0 else ""
        return bool(self.buf)

    def _key(self, out: ParsedDelta, final: bool) -> bool:
        key, after, _ = split_at(self.buf, END_KEY)
        if after is None:
            if final:
                self._end_call(out)
                self.buf, self.state = "", "text"
            return False
        self.key, self.buf, self.state = key.strip(), after, "before_value"
        return True

    def _before_value(self, out: ParsedDelta, final: bool) -> bool:
        body = self.buf.lstrip()
        if body.startswith(VALUE):
            self.buf, self.state = body[len(VALUE) :], "value"
            return True
        if VALUE.startswith(body) and not final:
            return False
        self.buf, self.state = body, "body"  # a key without a value: dropped
        return True

    def _value(self, out: ParsedDelta, final: bool) -> bool:
        """Up to </arg_value>; a model that forgets it still ends the value at the next tag (GLM's
        tags are added tokens: a value's text does not contain them)."""
        ends = [(i, m) for m in (END_VALUE, KEY, self.close_marker, self.open_marker) if (i := self.buf.find(m)) >= 0]
        if not ends and not final:
            return False
        cut, marker = min(ends) if ends else (len(self.buf), "")
        value = self.buf[:cut]
        after: str | None = self.buf[cut + len(marker) :] if marker == END_VALUE else self.buf[cut:] if marker else None
        if marker != END_VALUE:
            value = value.removesuffix("\n")  # GLM-4.5's layout before the next tag
        return self._argument(out, self.key, value, after)

    @classmethod
    def grammar(cls, tools: list[dict[str, Any]], parallel: bool, lit: Callable[[str], str], template: str = "") -> str:
        # GLM-4.7's template writes the tags back to back, GLM-4.5's one per line.
        nl = "" if END_KEY + VALUE in template else ' "\\n"'
        rules = []
        for i, t in enumerate(tools):
            schema = params_schema(t)
            required = set(schema.get("required") or [])
            parts = []
            for j, (pname, pschema) in enumerate((schema.get("properties") or {}).items()):
                head = f"{lit(KEY)} {json.dumps(pname, ensure_ascii=False)} {lit(END_KEY)}{nl} {lit(VALUE)}"
                value = raw_value(pschema, END_VALUE, lit, f"v{i}_{j}", rules)
                parts.append(f"({head} {value}{nl}){'' if pname in required else '?'}")
            rules.append(f"call_{i}: {json.dumps(t['name'], ensure_ascii=False)}{nl} {' '.join(parts)}")
        tail = "(" + " | ".join(f"call_{i}" for i in range(len(tools))) + f") {lit(cls.close_marker)}"
        # GLM-4.5 writes "\n<tool_call>" for every call (the first after the prompt or the content too)
        opening = f'"\\n"? {lit(cls.open_marker)}' if nl else lit(cls.open_marker)
        return marked_calls(opening, tail, " ", parallel) + "\n".join(rules) + "\n"

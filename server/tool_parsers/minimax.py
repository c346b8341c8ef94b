"""MiniMax-M2 / M2.1 calls (vLLM's and SGLang's `minimax_m2` parsers read the same markup):

    <minimax:tool_call>
    <invoke name="get_weather">
    <parameter name="city">Paris</parameter>
    <parameter name="days">3</parameter>
    </invoke>
    <invoke name="ping">
    </invoke>
    </minimax:tool_call>

One block holds every call of the turn, one `<invoke>` each. Values are what MiniMax's template writes:
strings raw, anything else as JSON, so they are typed by the tool's schema (strings stay text, anything
else is read as JSON, else a Python literal, else kept as text). The arguments stream one parameter at a
time."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from lantern.server.tool_parsers.base import CallDelta, ParsedDelta, RawArgumentsParser, split_at
from lantern.server.tool_parsers.grammar import params_schema, raw_value

INVOKE, END_INVOKE, PARAM, END_PARAM = "<invoke", "</invoke>", "<parameter", "</parameter>"
# the attribute of an <invoke ...> / <parameter ...> head: name="..." (quotes as the template writes them)
_ATTR = re.compile(r"""\s+name\s*=\s*(?:"([^"]*)"|'([^']*)'|([^\s"'>]+))\s*""")
_NAME = re.compile(r"[^\s<>\"']{1,128}")
# where a value whose </parameter> never came ends: the next tag on a new line, whole enough to be no text
_NEXT_TAGS = ("\n<parameter name=", "\n" + END_INVOKE, "\n<invoke name=", "\n</minimax:tool_call>")


def _name_of(head: str) -> str | None:
    m = _ATTR.fullmatch(head)
    if m is None:
        return None
    name = next(g for g in m.groups() if g is not None)
    return name if _NAME.fullmatch(name) else None


class MiniMaxParser(RawArgumentsParser):
    name = "minimax_m2"
    open_marker = "<minimax:tool_call>"
    close_marker = "</minimax:tool_call>"
    markers = (open_marker, close_marker)

    param = ""
    whole = False  # the arguments came as one JSON object inside the invoke (no <parameter> tags)
    in_block = 0  # calls read in the current block (a later <invoke> that is no call ends the block)

    def _open(self, out: ParsedDelta, final: bool) -> bool:
        """An `<invoke name="...">` head; right after the block's marker, anything else is no call."""
        body = self.buf.lstrip()
        if len(body) < len(INVOKE) and INVOKE.startswith(body):
            return self._no_call(out) if final else False  # (nothing yet, or the tag still arriving)
        if not body.startswith(INVOKE):
            return self._no_call(out)
        head, after, _ = split_at(body[len(INVOKE) :], ">")
        if after is None:
            if final or len(head) > 160 or "<" in head:
                return self._no_call(out)
            return False
        name = _name_of(head)
        if name is None:
            return self._no_call(out)
        out.calls.append(CallDelta(self.num_calls, self.new_id(), name))
        self.pending, self.fn, self.first, self.whole = "", name, True, False
        self.buf, self.state = after, "body"
        return True

    def _no_call(self, out: ParsedDelta) -> bool:
        """Markup that is no call: content if nothing of the block was a call, else the block's end."""
        if self.in_block:
            self.state = "close"
            return True
        return self._malformed(out)

    def _body(self, out: ParsedDelta, final: bool) -> bool:
        """Inside an invoke: parameters until `</invoke>` (or a missing one's next invoke or block end)."""
        body = self.buf.lstrip()
        for marker, then in ((PARAM, "pname"), (END_INVOKE, "open"), (INVOKE, "open"), (self.close_marker, "close")):
            if body.startswith(marker):
                self.buf = body[len(marker) :] if marker in (PARAM, END_INVOKE) else body
                if then != "pname":
                    self._end_call(out)
                self.state = then
                return True
        if final:
            self._end_call(out)
            self.buf, self.state = "", "text"
            return False
        if any(m.startswith(body) for m in (PARAM, END_INVOKE, INVOKE, self.close_marker)):
            return False  # a tag still arriving
        if self.first and not self.whole and body.startswith("{"):
            return self._json_arguments(out, body)
        cut = body.find("<", 1)  # stray text between parameters is layout
        self.buf = body[cut:] if cut > 0 else ""
        return bool(self.buf)

    def _json_arguments(self, out: ParsedDelta, body: str) -> bool:
        """Arguments written as one JSON object instead of <parameter> tags (a model's slip): taken whole once
        the invoke ends; anything else there is layout, dropped."""
        ends = [i for m in (END_INVOKE, INVOKE, self.close_marker) if (i := body.find(m)) >= 0]
        if not ends:
            return False
        text, self.buf = body[: min(ends)], body[min(ends) :]
        try:
            args = json.loads(text)
        except ValueError:
            args = None
        if isinstance(args, dict):
            self._emit(out, json.dumps(args, ensure_ascii=False))
            self.first, self.whole = False, True
        return True

    def _pname(self, out: ParsedDelta, final: bool) -> bool:
        head, after, _ = split_at(self.buf, ">")
        if after is None:
            if final:
                self._end_call(out)
                self.buf, self.state = "", "text"
            return False
        self.param, self.buf, self.state = _name_of(head) or head.strip(), after, "value"
        return True

    def _value(self, out: ParsedDelta, final: bool) -> bool:
        # Up to </parameter>; a model that forgets it still ends the value at the next tag on a new line
        # (a string holding such a line is cut there: MiniMax's tags are no special tokens).
        ends = [(i, m) for m in (END_PARAM, *_NEXT_TAGS) if (i := self.buf.find(m)) >= 0]
        if not ends and not final:
            return False
        cut, marker = min(ends) if ends else (len(self.buf), "")
        value = self.buf[:cut].removeprefix("\n").removesuffix("\n")  # (one newline each side is layout)
        after = self.buf[cut + len(marker) :] if marker == END_PARAM else self.buf[cut + 1 :] if marker else None
        return self._argument(out, self.param, value, after)

    def _end_call(self, out: ParsedDelta) -> None:
        if not self.whole:
            self._emit(out, "{}" if self.first else "}")
        self.num_calls += 1
        self.in_block += 1

    def _close(self, out: ParsedDelta, final: bool) -> bool:
        self.in_block = 0
        if self.close_marker not in self.buf and self.open_marker not in self.buf:
            if not final:
                return False  # held whole until the closer comes (text inside the block is markup) or the end
            out.content += self.buf.lstrip()  # a block its model never closed: the text after its calls is content
            self.buf, self.state = "", "text"
            return False
        return super()._close(out, final)

    @classmethod
    def grammar(cls, tools: list[dict[str, Any]], parallel: bool, lit: Callable[[str], str], template: str = "") -> str:
        rules = []
        for i, t in enumerate(tools):
            schema = params_schema(t)
            required = set(schema.get("required") or [])
            parts = []
            for j, (pname, pschema) in enumerate((schema.get("properties") or {}).items()):
                head = json.dumps(f'{PARAM} name="{pname}">', ensure_ascii=False)
                value = raw_value(pschema, END_PARAM, lit, f"v{i}_{j}", rules)
                parts.append(f'({head} {value} "\\n"){"" if pname in required else "?"}')
            head = json.dumps(f'{INVOKE} name="{t["name"]}">\n', ensure_ascii=False)
            rules.append(f"call_{i}: {head} {' '.join(parts)} {json.dumps(END_INVOKE + chr(10))}")
        invoke = "(" + " | ".join(f"call_{i}" for i in range(len(tools))) + ")"
        calls = f"{invoke}+" if parallel else invoke
        # MiniMax's template writes "\n<minimax:tool_call>\n" after the content (or the generation prompt)
        head = f'calls: "\\n"? {lit(cls.open_marker)} calls_rest\ncalls_rest: "\\n" {calls} {lit(cls.close_marker)}\n'
        return head + "\n".join(rules) + "\n"

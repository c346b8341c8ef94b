"""What every tool-call parser shares: the events it emits, marker hold-back, an incremental JSON
scanner and the reader of one JSON call object.

A parser is a small state machine fed the generated text piece by piece (`feed`) and closed once
(`finish`). It returns content text and tool-call deltas; the non-streaming response is the same
machine fed the whole text at once, so streamed and non-streamed answers agree by construction.

A call is committed (its id and name go out) as soon as its header is read; from then on the
arguments stream as they arrive. Markup that turns out not to be a call before that point is
handed back as content, word for word.
"""

from __future__ import annotations

import ast
import json
import re
import secrets
import string
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar


@dataclass
class CallDelta:
    """One piece of one tool call: the first carries id and name, later ones argument text."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""


@dataclass
class ParsedDelta:
    content: str = ""
    calls: list[CallDelta] = field(default_factory=list)

    def extend(self, other: ParsedDelta) -> ParsedDelta:
        self.content += other.content
        self.calls.extend(other.calls)
        return self


@dataclass
class ToolCall:
    id: str
    name: str
    arguments: str


def assemble(deltas: list[CallDelta]) -> list[ToolCall]:
    """Finished calls from their deltas, in index order."""
    calls: dict[int, ToolCall] = {}
    for d in deltas:
        if d.index not in calls:
            calls[d.index] = ToolCall(d.id or "", d.name or "", "")
        calls[d.index].arguments += d.arguments
    return [calls[i] for i in sorted(calls)]


def openai_call_id() -> str:
    return "call_" + secrets.token_hex(12)


def mistral_call_id() -> str:
    # Mistral's chat templates refuse any other id shape when the call is sent back in history.
    alphabet = string.ascii_letters + string.digits
    return "".join(secrets.choice(alphabet) for _ in range(9))


def held_prefix(text: str, marker: str) -> int:
    """Length of the longest tail of `text` that could be the start of `marker`."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


def split_at(text: str, marker: str) -> tuple[str, str | None, int]:
    """(safe text before the marker, text after it or None if absent, chars held back)."""
    i = text.find(marker)
    if i >= 0:
        return text[:i], text[i + len(marker) :], 0
    held = held_prefix(text, marker)
    return text[: len(text) - held], None, held


class JsonScanner:
    """Finds where a JSON value that starts at the beginning of a growing text ends, in one pass
    over each character. Only containers and strings have a visible end; a bare scalar ends at the
    first delimiter."""

    def __init__(self) -> None:
        self.pos = 0
        self.depth = 0
        self.in_string = False
        self.escape = False
        self.kind = ""  # "container", "string" or "scalar"
        self.end: int | None = None

    def scan(self, text: str) -> int | None:
        """Index just past the value in `text`, or None while it is still open."""
        while self.end is None and self.pos < len(text):
            c = text[self.pos]
            if not self.kind:
                self.kind = "container" if c in "{[" else "string" if c == '"' else "scalar"
                if self.kind == "string":
                    self.in_string = True
                elif self.kind == "container":
                    self.depth = 1
                self.pos += 1
                continue
            if self.kind == "scalar":
                if c in ",}] \t\r\n;":
                    self.end = self.pos
                    break
            elif self.in_string:
                if self.escape:
                    self.escape = False
                elif c == "\\":
                    self.escape = True
                elif c == '"':
                    self.in_string = False
                    if self.kind == "string":
                        self.end = self.pos + 1
            elif c == '"':
                self.in_string = True
            elif c in "{[":
                self.depth += 1
            elif c in "}]":
                self.depth -= 1
                if self.depth == 0:
                    self.end = self.pos + 1
            self.pos += 1
        return self.end


_HEADER = re.compile(r'\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"(?:arguments|parameters)"\s*:\s*')


class JsonCallReader:
    """Reads one `{"name": ..., "arguments"|"parameters": {...}}` object from a growing text.

    With the name first (what templates teach), the call is committed at the header and the
    arguments stream raw. Otherwise the whole object is awaited and parsed. `feed` returns
    (deltas, consumed, state): state "open" (needs more text), "done" (consumed is where the
    object ended) or "invalid" (not a call: nothing was committed, the text is content)."""

    def __init__(self, index: int, new_id: Callable[[], str], bare: bool = False) -> None:
        """bare: the text holds only the arguments value (the name came before, in other markup)."""
        self.index, self.new_id, self.bare = index, new_id, bare
        self.committed = bare
        self.args_start: int | None = 0 if bare else None
        self.sent = 0  # argument chars already emitted (relative to args_start)
        self.args = JsonScanner()
        self.whole = JsonScanner()

    def feed(self, text: str, final: bool = False) -> tuple[list[CallDelta], int, str]:
        out: list[CallDelta] = []
        if not self.committed:
            m = _HEADER.match(text)
            if m is None:
                end = self.whole.scan(text)
                if end is None:
                    return out, 0, "invalid" if final else "open"
                deltas = self._whole_object(text[:end])
                return deltas, end, "done" if deltas else "invalid"
            try:
                name = json.loads(f'"{m.group(1)}"')
            except ValueError:
                return out, 0, "invalid"
            self.committed, self.args_start = True, m.end()
            out.append(CallDelta(self.index, self.new_id(), name))
        assert self.args_start is not None
        start = self.args_start
        while start < len(text) and text[start] in " \t\r\n" and not self.args.kind:
            start += 1  # whitespace before the value is layout, not argument text
        self.args_start = start
        body = text[start:]
        if not body:
            return out, len(text), "done" if final else "open"
        end = self.args.scan(body)
        if self.args.kind == "string":  # arguments sent as a JSON-encoded string: decode it whole
            if end is None and not final:
                return out, 0, "open"
            raw = body[: end or len(body)]
            if not self.sent:
                try:
                    decoded = json.loads(raw)
                except ValueError:
                    decoded = raw
                text = decoded if isinstance(decoded, str) else json.dumps(decoded)
                out.append(CallDelta(self.index, arguments=text))
                self.sent = len(raw)
        else:
            upto = len(body) if end is None else end
            if self.args.kind == "scalar" and end is None and not final:
                upto = self.sent  # a bare number may still grow
            if upto > self.sent:
                out.append(CallDelta(self.index, arguments=body[self.sent : upto]))
                self.sent = upto
        if end is None:
            return out, len(text), "done" if final else "open"
        if self.bare:
            return out, start + end, "done"
        # Keys after the arguments (Mistral's "id") and the closing brace belong to the call.
        close = self.whole.scan(text)
        if close is None:
            return out, len(text), "done" if final else "open"
        return out, close, "done"

    def _whole_object(self, raw: str) -> list[CallDelta]:
        try:
            obj = json.loads(raw)
        except ValueError:
            return []
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            return []
        args = obj.get("arguments", obj.get("parameters", {}))
        if isinstance(args, str):
            text = args
        else:
            text = json.dumps(args, ensure_ascii=False)
        self.committed = True
        return [CallDelta(self.index, self.new_id(), obj["name"]), CallDelta(self.index, arguments=text)]


def typed_by_schema(value: str, schema: dict[str, Any] | None) -> Any:
    """An argument a template wrote raw if a string and as JSON otherwise (Qwen3-Coder, GLM), typed by
    its schema: strings stay text, anything else is read as JSON, else a Python literal, else kept."""
    kind = (schema or {}).get("type")
    if kind == "string" or (isinstance(kind, list) and "string" in kind) or schema is None:
        return value
    for read in (json.loads, ast.literal_eval):
        try:
            return read(value)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            continue
    return value


class ToolParser:
    """Base of the format parsers. `tools` are the request's function definitions
    ({"name", "parameters", ...}); parsers that convert argument types read their schemas.

    States are methods `_<state>(out, final) -> bool` (True: run again) over `buf`, the text
    not consumed yet. `pending` keeps the raw markup read since a call seemed to start, until
    the call is committed: if it turns out malformed it goes back to content verbatim."""

    name: ClassVar[str] = ""
    markers: ClassVar[tuple[str, ...]] = ()  # texts that may be special tokens (then decoded with them)
    anchor: ClassVar[str] = ""  # formats whose calls can only start the reply: the character they start with
    new_id: Callable[[], str] = staticmethod(openai_call_id)
    reader: JsonCallReader | None = None  # the call being read, for the JSON-object formats

    def __init__(self, tools: list[dict[str, Any]] | None = None, template: str | None = None) -> None:
        self.tools = {t["name"]: t for t in tools or []}
        self.template = template or ""
        self.num_calls = 0
        self.buf = ""
        self.state = "start"
        self.pending = ""
        self.after_call = False

    def feed(self, text: str) -> ParsedDelta:
        self.buf += text
        return self._run(final=False)

    def finish(self) -> ParsedDelta:
        return self._run(final=True)

    def parse(self, text: str) -> tuple[str, list[ToolCall]]:
        """The whole output at once: (content, calls)."""
        d = self.feed(text).extend(self.finish())
        return d.content, assemble(d.calls)

    def _run(self, final: bool) -> ParsedDelta:
        out = ParsedDelta()
        while getattr(self, "_" + self.state)(out, final):
            pass
        return out

    def _plain(self, out: ParsedDelta, final: bool) -> bool:
        """No more calls can follow: everything is content."""
        out.content += self.buf
        self.buf = ""
        return False

    def _malformed(self, out: ParsedDelta, then: str = "text") -> bool:
        """Not a call after all: the markup read so far is content."""
        out.content += self.pending
        self.pending, self.state = "", then
        return True

    def _begin_json_call(self, out: ParsedDelta, final: bool, bad: str = "text") -> bool:
        """Where a JSON call object must start (after optional whitespace): on to state "call"
        with a fresh reader; anything but `{` is no call (`bad`: the state for what follows)."""
        body = self.buf.lstrip()
        if not body:
            return self._malformed(out, bad) if final else False
        if body[0] != "{":
            return self._malformed(out, bad)
        self.pending += self.buf[: len(self.buf) - len(body)]
        self.buf, self.state = body, "call"
        self.reader = JsonCallReader(self.num_calls, self.new_id)
        return True

    def _read_call(self, out: ParsedDelta, final: bool, reader: JsonCallReader, then: str, bad: str) -> bool:
        """Drive a JsonCallReader over `buf`; `then`: the state after the call, `bad`: after markup
        that is no call."""
        deltas, consumed, state = reader.feed(self.buf, final)
        out.calls.extend(deltas)
        if reader.committed:
            self.pending = ""
        if state == "invalid":
            return self._malformed(out, bad)
        if state == "open":
            return False
        self.buf, self.state = self.buf[consumed:], then
        self.num_calls += 1
        self.after_call = True
        return True

    @classmethod
    def grammar(cls, tools: list[dict[str, Any]], parallel: bool, lit: Callable[[str], str], template: str = "") -> str:
        """A Lark rule `calls: ...` (llguidance dialect) for one or more calls of these tools in
        this format. `lit(text)` spells a marker: a quoted literal, or `<[id]>` for a special token."""
        raise NotImplementedError


class MarkedParser(ToolParser):
    """Formats whose calls open with a marker inside free text (`<tool_call>`, `[TOOL_CALLS]`).

    Whitespace between content and call markup is layout: it is held back and dropped when
    markup follows, and skipped after a call (unless the markup proves malformed)."""

    open_marker: ClassVar[str] = ""
    close_marker: ClassVar[str] = ""  # formats whose calls end with one (`</tool_call>`): state "close"

    def __init__(self, tools: list[dict[str, Any]] | None = None, template: str | None = None) -> None:
        super().__init__(tools, template)
        self.state = "text"

    def _close(self, out: ParsedDelta, final: bool) -> bool:
        """After a call, up to `close_marker`: what sits before it is markup; a missing closer
        followed by the next `open_marker` still starts the next call."""
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

    def _text(self, out: ParsedDelta, final: bool) -> bool:
        buf = self.buf
        if self.after_call:
            stripped = buf.lstrip()
            if not stripped:
                self.buf = ""
                return False
            buf, self.after_call = stripped, False
        before, after, _ = split_at(buf, self.open_marker)
        if after is not None:
            content = before.rstrip()
            out.content += content
            self.pending = before[len(content) :] + self.open_marker
            self.buf, self.state = after, "open"
            return True
        safe = buf if final else before.rstrip()
        out.content += safe
        self.buf = buf[len(safe) :]
        return False


class RawArgumentsParser(MarkedParser):
    """Formats that write each argument as its own tagged value, strings raw and anything else as JSON
    (Qwen3-Coder, GLM-4.5, MiniMax-M2): the call's JSON object streams one argument at a time, each typed by
    the function's schema (strings stay text, anything else is read as JSON, else a Python literal)."""

    fn = ""  # the function of the call being read
    first = True  # no argument of it streamed yet

    def _emit(self, out: ParsedDelta, text: str) -> None:
        out.calls.append(CallDelta(self.num_calls, arguments=text))

    def _end_call(self, out: ParsedDelta) -> None:
        self._emit(out, "{}" if self.first else "}")
        self.num_calls += 1
        self.after_call = True

    def _argument(self, out: ParsedDelta, key: str, value: str, after: str | None) -> bool:
        """Stream `key`: `value` and go on with `after`, the text past the value's end tag (None: the output
        ended inside the value, which ends the call too). True while there is more to read."""
        from lantern.server.tool_parsers.grammar import params_schema

        schema = (params_schema(self.tools.get(self.fn, {})).get("properties") or {}).get(key)
        typed = json.dumps(typed_by_schema(value, schema), ensure_ascii=False)
        self._emit(out, ("{" if self.first else ", ") + json.dumps(key, ensure_ascii=False) + ": " + typed)
        self.first = False
        self.buf, self.state = after or "", "body"
        if after is None:
            self._end_call(out)
            self.state = "text"
        return after is not None

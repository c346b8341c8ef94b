"""Pythonic tool calls (Llama 3.2 / Llama 4 style, also ToolACE-like models): the reply is a
Python list of calls, `[get_weather(city="Paris", days=3), get_time()]`, optionally between
`<|python_start|>` and `<|python_end|>`. Keyword values must be literals; JSON's
true/false/null are read as well as Python's True/False/None."""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Callable
from typing import Any

from lantern.server.tool_parsers.base import CallDelta, ParsedDelta, ToolParser
from lantern.server.tool_parsers.grammar import json_value, params_schema

START, END = "<|python_start|>", "<|python_end|>"
_HEAD = re.compile(r"[A-Za-z_][\w.]*\s*\(")
_NAMES = {"true": True, "false": False, "null": None, "True": True, "False": False, "None": None}


def _literal(node: ast.AST) -> Any:
    if isinstance(node, ast.Constant) and isinstance(node.value, (str, int, float, bool, type(None))):
        return node.value
    if isinstance(node, ast.Name) and node.id in _NAMES:
        return _NAMES[node.id]
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        return [_literal(e) for e in node.elts]
    if isinstance(node, ast.Dict):
        out = {}
        for k, v in zip(node.keys, node.values):
            key = _literal(k) if k is not None else None
            if not isinstance(key, str):
                raise ValueError("dictionary keys must be strings")
            out[key] = _literal(v)
        return out
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _literal(node.operand)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return -value if isinstance(node.op, ast.USub) else value
    raise ValueError("not a literal")


def parse_call(text: str) -> tuple[str, dict[str, Any]] | None:
    """`name(a=1, b="x")` -> (name, arguments), or None if it is not such a call."""
    try:
        node = ast.parse(text.strip(), mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    if not isinstance(node, ast.Call) or node.args:
        return None
    name = ast.unparse(node.func)
    if not re.fullmatch(r"[A-Za-z_][\w.]*", name):
        return None
    try:
        args = {kw.arg: _literal(kw.value) for kw in node.keywords if kw.arg is not None}
    except (ValueError, RecursionError):
        return None
    if len(args) != len(node.keywords):
        return None  # **kwargs
    return name, args


class _ParenScanner:
    """Where a call's closing parenthesis is, skipping Python strings; one pass per character."""

    def __init__(self) -> None:
        self.pos, self.depth, self.quote, self.escape = 0, 0, "", False

    def scan(self, text: str) -> int | None:
        while self.pos < len(text):
            c = text[self.pos]
            self.pos += 1
            if self.quote:
                if self.escape:
                    self.escape = False
                elif c == "\\":
                    self.escape = True
                elif c == self.quote:
                    self.quote = ""
            elif c in "\"'":
                self.quote = c
            elif c in "([{":
                self.depth += 1
            elif c in ")]}":
                self.depth -= 1
                if self.depth == 0:
                    return self.pos
        return None


class PythonicParser(ToolParser):
    name = "pythonic"
    markers = (START, END)
    anchor = "["

    scanner: _ParenScanner | None = None

    def _start(self, out: ParsedDelta, final: bool) -> bool:
        body = self.buf.lstrip()
        if not body or (START.startswith(body) and body != START):
            if final:
                self.state = "plain"
                return True
            return False
        self.pending = self.buf[: len(self.buf) - len(body)]
        if body.startswith(START):
            self.pending += START
            body = body[len(START) :].lstrip()
            if not body:
                self.buf = ""
                return self._malformed(out, "plain") if final else False
        if body[0] != "[":
            self.buf = body
            return self._malformed(out, "plain")
        self.pending = self.buf[: len(self.buf) - len(body) + 1]
        self.buf, self.state = body[1:], "call"
        return True

    def _call(self, out: ParsedDelta, final: bool) -> bool:
        body = self.buf.lstrip()
        head = _HEAD.match(body)
        if head is None:
            if not final and re.fullmatch(r"[\w.]*\s*", body):
                return False  # the name is still arriving
            return self._malformed(out, "plain")
        self.scanner = self.scanner or _ParenScanner()
        end = self.scanner.scan(body)
        if end is None:
            return self._malformed(out, "plain") if final else False
        self.scanner = None
        parsed = parse_call(body[:end])
        if parsed is None:
            return self._malformed(out, "plain")
        name, args = parsed
        out.calls.append(CallDelta(self.num_calls, self.new_id(), name))
        out.calls.append(CallDelta(self.num_calls, arguments=json.dumps(args, ensure_ascii=False)))
        self.num_calls += 1
        self.pending, self.buf, self.state = "", body[end:], "sep"
        return True

    def _sep(self, out: ParsedDelta, final: bool) -> bool:
        body = self.buf.lstrip()
        if not body:
            self.buf = "" if final else self.buf
            return False
        if body[0] == ",":
            self.pending, self.buf, self.state = self.buf[: len(self.buf) - len(body) + 1], body[1:], "call"
        elif body[0] == "]":
            self.buf, self.state = body[1:], "tail"
        else:
            self.buf, self.state = body, "plain"
        return True

    def _tail(self, out: ParsedDelta, final: bool) -> bool:
        body = self.buf.lstrip()
        if not final and END.startswith(body):
            return False
        self.buf = body.removeprefix(END).lstrip()
        self.state = "plain"
        return True

    @classmethod
    def grammar(cls, tools: list[dict[str, Any]], parallel: bool, lit: Callable[[str], str], template: str = "") -> str:
        rules = []
        for i, t in enumerate(tools):
            schema = params_schema(t)
            required = set(schema.get("required") or [])
            props = list((schema.get("properties") or {}).items())
            # Required keywords first, in order; each optional one may follow. Without required
            # ones, the first optional keyword opens the list.
            req = [(p, s) for p, s in props if p in required]
            opt = [(p, s) for p, s in props if p not in required]

            def kw(p: str, s: dict[str, Any]) -> str:
                return f"{json.dumps(p + '=')} {json_value(s)}"

            if req:
                args = ' ", " '.join(kw(p, s) for p, s in req) + "".join(f' (", " {kw(p, s)})?' for p, s in opt)
            elif opt:
                args = f"({kw(*opt[0])}" + "".join(f' (", " {kw(p, s)})?' for p, s in opt[1:]) + ")?"
            else:
                args = ""
            rules.append(f'call_{i}: {json.dumps(t["name"] + "(")} {args} ")"')
        many = ' (", " call)*' if parallel else ""
        call = "call: " + " | ".join(f"call_{i}" for i in range(len(tools)))
        return f'calls: "[" call{many} "]"\n{call}\n' + "\n".join(rules) + "\n"

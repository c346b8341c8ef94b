"""Gemma 4's native calls (its chat template renders them so, and the model writes them so):

    <|tool_call>call:get_weather{city:<|"|>Paris<|"|>,days:3}<tool_call|>

The arguments are Gemma's object notation, not JSON: keys bare (or quoted like strings), strings
between `<|"|>` tokens, numbers / true / false bare, objects in braces, lists in brackets. A call's
arguments are read whole (up to the brace that closes them) and go out as one JSON delta. After its
calls the model writes `<|tool_response>` to hand over to the tool: that marker ends the reply."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from lantern.server.tool_parsers.base import CallDelta, MarkedParser, ParsedDelta, held_prefix
from lantern.server.tool_parsers.grammar import lazy_until, marked_calls, params_schema

QUOTE = '<|"|>'
RESPONSE = "<|tool_response>"
_HEAD = re.compile(r"\s*call:([\w.:-]{1,128})\s*\{")
_SCALAR_END = re.compile(r"[,}\]]")


class _Notation:
    """A recursive reader of Gemma's object notation over one complete text."""

    def __init__(self, text: str) -> None:
        self.text, self.pos = text, 0

    def _skip(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos] in " \t\r\n":
            self.pos += 1

    def _eat(self, token: str) -> bool:
        self._skip()
        if self.text.startswith(token, self.pos):
            self.pos += len(token)
            return True
        return False

    def value(self) -> Any:
        self._skip()
        if self._eat(QUOTE):
            end = self.text.find(QUOTE, self.pos)
            if end < 0:
                raise ValueError("unterminated string")
            out, self.pos = self.text[self.pos : end], end + len(QUOTE)
            return out
        if self._eat("{"):
            obj: dict[str, Any] = {}
            while not self._eat("}"):
                if obj and not self._eat(","):
                    raise ValueError("expected , or }")
                key = self.value() if self.text.startswith(QUOTE, self.pos) else self._bare_key()
                if not self._eat(":"):
                    raise ValueError("expected :")
                obj[str(key)] = self.value()
            return obj
        if self._eat("["):
            items: list[Any] = []
            while not self._eat("]"):
                if items and not self._eat(","):
                    raise ValueError("expected , or ]")
                items.append(self.value())
            return items
        m = _SCALAR_END.search(self.text, self.pos)
        end = m.start() if m else len(self.text)
        raw, self.pos = self.text[self.pos : end].strip(), end
        if not raw:
            raise ValueError("empty value")
        return _scalar(raw)

    def _bare_key(self) -> str:
        self._skip()
        end = self.text.find(":", self.pos)
        if end < 0:
            raise ValueError("expected a key")
        key, self.pos = self.text[self.pos : end].strip(), end
        return key


def _scalar(raw: str) -> Any:
    literal = {"true": True, "false": False, "null": None, "None": None, "True": True, "False": False}
    if raw in literal:
        return literal[raw]
    try:
        return json.loads(raw)  # a number
    except ValueError:
        return raw  # unquoted text: kept as the model wrote it


def read_arguments(text: str, schema: dict[str, Any] | None = None) -> dict[str, Any]:
    """`{...}` in Gemma's notation as a dict; a bare value where the schema wants a string stays text."""
    reader = _Notation(text)
    args = reader.value()
    if not isinstance(args, dict):
        raise ValueError("the arguments are not an object")
    props = (schema or {}).get("properties") or {}
    for key, value in args.items():
        kind = (props.get(key) or {}).get("type")
        kinds = set(kind) if isinstance(kind, list) else {kind}
        if "integer" in kinds:
            kinds.add("number")  # (an integer is a number: _json_type says "number" for both)
        if "string" in kinds and not isinstance(value, str) and _json_type(value) not in kinds:
            args[key] = _as_text(value)  # a bare word where only a string fits: the text the model wrote
    return args


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    return {int: "number", float: "number", dict: "object", list: "array"}.get(type(value), "string")


def _as_text(value: Any) -> str:
    """A value the model wrote bare where the schema wants a string, as the model wrote it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return json.dumps(value) if isinstance(value, (dict, list)) or value is None else str(value)


def _object_end(text: str) -> int | None:
    """Index just past the brace closing the object `text` starts with, or None while it is open."""
    depth, i = 0, 0
    while i < len(text):
        if text.startswith(QUOTE, i):
            close = text.find(QUOTE, i + len(QUOTE))
            if close < 0:
                return None
            i = close + len(QUOTE)
            continue
        c = text[i]
        if c in "{[":
            depth += 1
        elif c in "}]":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return None


class Gemma4Parser(MarkedParser):
    name = "gemma4"
    open_marker = "<|tool_call>"
    close_marker = "<tool_call|>"
    markers = (open_marker, close_marker, QUOTE, RESPONSE)  # special tokens of Gemma 4's vocabulary

    fn = ""

    def _text(self, out: ParsedDelta, final: bool) -> bool:
        """As MarkedParser's, but `<|tool_response>` ends the reply (the model hands over to the tool)."""
        end, call = self.buf.find(RESPONSE), self.buf.find(self.open_marker)
        if end >= 0 and (call < 0 or end < call):
            content = self.buf[:end]
            out.content += content.lstrip() if self.after_call else content.rstrip()
            self.buf, self.state = "", "done"
            return False
        held = 0 if final else held_prefix(self.buf, RESPONSE)
        tail, self.buf = self.buf[len(self.buf) - held :], self.buf[: len(self.buf) - held]
        more = super()._text(out, final)
        self.buf += tail  # the marker's start, held back until it is whole or proves to be text
        return more

    def _done(self, out: ParsedDelta, final: bool) -> bool:
        self.buf = ""  # what a model writes after handing over is not its reply
        return False

    def _open(self, out: ParsedDelta, final: bool) -> bool:
        """`call:NAME{`: the call is committed at its brace."""
        m = _HEAD.match(self.buf)
        if m is None:
            head = self.buf.lstrip()
            could_be = "call:".startswith(head[:5]) and (len(head) < 5 or re.fullmatch(r"call:[\w.:-]*", head))
            if final or not could_be or len(head) > 160:
                return self._malformed(out)
            return False
        self.fn = m.group(1)
        out.calls.append(self._delta(name=self.fn))
        self.pending, self.buf, self.state = "", self.buf[m.end() - 1 :], "args"
        return True

    def _delta(self, name: str | None = None, arguments: str = "") -> CallDelta:
        if name is not None:
            return CallDelta(self.num_calls, self.new_id(), name)
        return CallDelta(self.num_calls, arguments=arguments)

    def _args(self, out: ParsedDelta, final: bool) -> bool:
        end = _object_end(self.buf)
        if end is None and not final:
            return False
        body = self.buf if end is None else self.buf[:end]
        try:
            args = read_arguments(body, params_schema(self.tools.get(self.fn, {})))
        except ValueError:
            args = {}  # malformed arguments after a committed name: the call stands, empty
        out.calls.append(self._delta(arguments=json.dumps(args, ensure_ascii=False)))
        self.num_calls += 1
        self.after_call = True
        self.buf, self.state = ("" if end is None else self.buf[end:]), "close"
        return end is not None

    @classmethod
    def grammar(cls, tools: list[dict[str, Any]], parallel: bool, lit: Callable[[str], str], template: str = "") -> str:
        """Each tool's name and its arguments in Gemma's notation, typed by the schema (enums, integers
        in a small range and booleans exactly; strings free up to their closing quote; anyOf / oneOf /
        type lists as alternatives; an object without properties or an untyped value as any value of
        the notation)."""
        rules: list[str] = []
        calls = []
        for i, t in enumerate(tools):
            args = _notation_rule(params_schema(t), lit, f"a{i}", rules)
            calls.append(f"{json.dumps('call:' + t['name'], ensure_ascii=False)} {args}")
        tail = "(" + " | ".join(calls) + f") {lit(cls.close_marker)}"
        return marked_calls(lit(cls.open_marker), tail, " ", parallel) + "\n".join(rules) + ("\n" if rules else "")


_INTEGER, _NUMBER = "/-?[0-9]{1,15}/", "/-?[0-9]{1,15}(\\.[0-9]{1,15})?/"


# Rules for any value of the notation, its objects and its keys (added once per grammar by _any_rules).
_ANY, _ANY_OBJECT, _ANY_KEY = "gemma_any", "gemma_any_object", "gemma_any_key"


def _object_of(value: str) -> str:
    """An object of bare or quoted keys, each holding `value` (a rule or expression)."""
    pair = f'{_ANY_KEY} ":" {value}'
    return f'"{{" ({pair} ("," {pair})*)? "}}"'


def _any_rules(lit: Callable[[str], str], rules: list[str]) -> None:
    """Any value Gemma's notation writes: a string, number, true / false / null, an object with bare or
    quoted keys, a list. Nesting is bounded by the model's output, as JSON's is."""
    if not any(r.startswith(f"{_ANY}:") for r in rules):
        quote = lit(QUOTE)
        rules += [
            f'{_ANY}: {quote} {_ANY}_text | {_NUMBER} | "true" | "false" | "null" | {_ANY_OBJECT} '
            f'| "[" ({_ANY} ("," {_ANY})*)? "]"',
            f"{_ANY_OBJECT}: {_object_of(_ANY)}",
            f"{_ANY_KEY}: /[A-Za-z_][A-Za-z0-9_.-]{{0,63}}/ | {quote} {_ANY}_text",
            f"{_ANY}_text[lazy]: {lazy_until(QUOTE, lit)}",
        ]


def _notation_rule(schema: dict[str, Any], lit: Callable[[str], str], name: str, rules: list[str]) -> str:
    """A Lark expression for one value of `schema` as Gemma's notation writes it (extra rules go to `rules`)."""
    quote = lit(QUOTE)
    union = schema.get("anyOf") or schema.get("oneOf")
    if isinstance(union, list) and union:
        base = {k: v for k, v in schema.items() if k not in ("anyOf", "oneOf")}  # siblings apply to each branch
        branches = [_notation_rule({**base, **b}, lit, f"{name}u{j}", rules) for j, b in enumerate(union)]
        return "(" + " | ".join(branches) + ")"
    if isinstance(schema.get("type"), list) and len(schema["type"]) > 1:
        kinds = [_notation_rule({**schema, "type": k}, lit, f"{name}t{j}", rules) for j, k in enumerate(schema["type"])]
        return "(" + " | ".join(kinds) + ")"
    choices = schema.get("enum", [schema["const"]] if "const" in schema else None)
    if choices is not None:
        spelt = [
            f"{quote} {json.dumps(c, ensure_ascii=False)} {quote}" if isinstance(c, str) else json.dumps(json.dumps(c))
            for c in choices
        ]
        return "(" + " | ".join(spelt) + ")"
    kind = schema.get("type")
    kind = kind[0] if isinstance(kind, list) and kind else kind
    if kind == "integer":
        low, high = schema.get("minimum"), schema.get("maximum")
        if isinstance(low, int) and isinstance(high, int) and 0 <= high - low < 64:
            return "(" + " | ".join(f'"{n}"' for n in range(low, high + 1)) + ")"
        return _INTEGER
    if kind == "number":
        return _NUMBER
    if kind == "boolean":
        return '("true" | "false")'
    if kind == "null":
        return '"null"'
    if kind == "array":
        items = schema.get("items")
        if isinstance(items, dict) and items:
            item = _notation_rule(items, lit, f"{name}i", rules)
        else:
            _any_rules(lit, rules)
            item = _ANY
        return f'"[" ({item} ("," {item})*)? "]"'
    if kind == "object" and "properties" not in schema:  # a free-form object: any keys (and values)
        extra = schema.get("additionalProperties", True)
        if extra is False:
            return '"{" "}"'
        _any_rules(lit, rules)
        if isinstance(extra, dict) and extra:  # every value of that schema
            return _object_of(_notation_rule(extra, lit, f"{name}v", rules))
        return _ANY_OBJECT
    if kind is None and "properties" not in schema:
        _any_rules(lit, rules)
        return _ANY  # no type said: what the model writes is taken as it is
    if kind == "object" or "properties" in schema:
        props = schema.get("properties") or {}
        required = set(schema.get("required") or [])
        order = sorted(props)  # the template writes arguments sorted (dictsort), and so does the model
        pairs = [
            (f"{json.dumps(k + ':', ensure_ascii=False)} {_notation_rule(props[k], lit, f'{name}_{j}', rules)}", k)
            for j, k in enumerate(order)
        ]
        alts = []  # by the first pair present: every pair before it optional, a comma before each after it
        for j, (first, _) in enumerate(pairs):
            rest = [f'("," {p})' + ("" if k in required else "?") for p, k in pairs[j + 1 :]]
            alts.append(" ".join([first, *rest]))
            if pairs[j][1] in required:
                break
        body = "(" + " | ".join(alts) + ")" if alts else ""
        if body and not required & set(props):
            body += "?"
        return f'"{{" {body} "}}"'
    rules.append(f"{name}[lazy]: {lazy_until(QUOTE, lit)}")  # a string (or a type the notation cannot check)
    return f"{quote} {name}"

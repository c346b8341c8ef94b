"""Lark grammars (llguidance's dialect) that force a model to call tools: tool_choice "required"
or a named function. Each format builds its `calls` rule from the pieces here; `tool_grammar`
adds the start rule (and a reasoning block before the calls when the model thinks first).

JSON inside the markup is written compactly the way chat templates render it (`json.dumps`'
", " and ": "), with no free whitespace: a model may not pad a call forever."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from lantern.app.engine import InvalidRequestError
from lantern.app.engine.reasoning import ReasoningMarkup

JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
EMPTY_PARAMS: dict[str, Any] = {"type": "object", "properties": {}, "additionalProperties": False}


def params_schema(tool: dict[str, Any]) -> dict[str, Any]:
    """The function's parameter schema; none given means it takes no arguments (OpenAI's rule).

    Objects that do not say otherwise take only their declared properties (as xgrammar's strict
    mode, vLLM's default, does): a function takes its parameters, and a forced call must be able to
    end — with undeclared keys allowed, a weak model can invent keys until max_tokens."""
    return closed_objects(tool.get("parameters") or EMPTY_PARAMS)


_SCHEMA_MAPS = ("properties", "$defs", "definitions", "patternProperties", "dependentSchemas")


def closed_objects(node: Any) -> Any:
    """`node` with additionalProperties: false on every object schema that declares properties
    and leaves additionalProperties (and patternProperties) unsaid."""
    if isinstance(node, list):
        return [closed_objects(v) for v in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for k, v in node.items():
        if k in ("const", "enum", "default", "examples"):  # values, not schemas
            out[k] = v
        elif k in _SCHEMA_MAPS and isinstance(v, dict):  # name -> schema: the names are not keywords
            out[k] = {name: closed_objects(sub) for name, sub in v.items()}
        else:
            out[k] = closed_objects(v)
    if isinstance(node.get("properties"), dict) and not {"additionalProperties", "patternProperties"} & node.keys():
        out["additionalProperties"] = False
    return out


def _rename_refs(node: Any, prefix: str) -> Any:
    if isinstance(node, dict):
        out = {}
        for k, v in node.items():
            if k == "$ref" and isinstance(v, str):
                for root in ("#/$defs/", "#/definitions/"):
                    if v.startswith(root):
                        v = "#/$defs/" + prefix + v[len(root) :]
                        break
                else:
                    if v == "#" or not v.startswith("#/"):
                        raise InvalidRequestError(
                            f"tools: a parameter schema uses $ref {v!r}; only refs into $defs are supported "
                            "when tool_choice forces a call",
                            param="tools",
                        )
            out[k] = _rename_refs(v, prefix)
        return out
    if isinstance(node, list):
        return [_rename_refs(v, prefix) for v in node]
    return node


def hoist(schemas: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Each schema's $defs moved to one shared root under a per-schema prefix (refs rewritten),
    so several tools' schemas can sit side by side in one anyOf."""
    out, defs = [], {}
    for i, schema in enumerate(schemas):
        schema = dict(schema)
        local = {**schema.pop("definitions", {}), **schema.pop("$defs", {})}
        prefix = f"t{i}_"
        for name, d in local.items():
            defs[prefix + name] = _rename_refs(d, prefix)
        out.append(_rename_refs(schema, prefix))
    return out, defs


def json_value(schema: dict[str, Any], defs: dict[str, Any] | None = None) -> str:
    full = {**schema, "x-guidance": JSON_STYLE}
    if defs:
        full["$defs"] = defs
    return "%json " + json.dumps(full, ensure_ascii=False)


def raw_value(schema: dict[str, Any], end: str, lit: Callable[[str], str], name: str, rules: list[str]) -> str:
    """One argument value as templates that write strings raw and anything else as JSON render it
    (Qwen3-Coder, GLM), up to and including `end`, the markup that closes it. A schema whose type
    is or includes "string" takes free text ending at the first `end` (a lazy rule appended to
    `rules` as `name`), or for an enum / const one of its values as the template writes them."""
    kind = schema.get("type")
    stringy = kind == "string" or (isinstance(kind, list) and "string" in kind)
    choices = schema.get("enum", [schema["const"]] if "const" in schema else None)
    if stringy and choices is not None:
        texts = [c if isinstance(c, str) else json.dumps(c, ensure_ascii=False) for c in choices]
        return "(" + " | ".join(json.dumps(t, ensure_ascii=False) for t in texts) + f") {lit(end)}"
    if stringy:
        rules.append(f"{name}[lazy]: {lazy_until(end, lit)}")
        return name
    return f"{json_value(schema)} {lit(end)}"


def json_rule(tools: list[dict[str, Any]], args_key: str, extra: dict[str, Any] | None = None) -> str:
    """`%json{...}` for one call object {"name": <one of the tools>, args_key: <its arguments>},
    plus `extra` properties after them (all required, in order)."""
    params, defs = hoist([params_schema(t) for t in tools])
    extra = extra or {}
    variants = [
        {
            "type": "object",
            "properties": {"name": {"const": t["name"]}, args_key: p, **extra},
            "required": ["name", args_key, *extra],
            "additionalProperties": False,
        }
        for t, p in zip(tools, params)
    ]
    return json_value(variants[0] if len(variants) == 1 else {"anyOf": variants}, defs)


def marked_calls(open_lit: str, tail: str, sep: str, parallel: bool) -> str:
    """`calls` for formats that open each call with a marker: `calls: OPEN calls_rest`, so a
    grammar that lets the model write text first can take the marker inside that text."""
    more = f" ({sep}{open_lit} call_tail)*" if parallel else ""
    return f"calls: {open_lit} calls_rest\ncalls_rest: call_tail{more}\ncall_tail: {tail}\n"


def literal_maker(tokenizer: Any) -> Callable[[str], str]:
    """lit(text): a Lark literal for `text`, or `<[id]>` when the tokenizer has it as a special
    token (a special token is never spelt by ordinary text tokens, so the grammar must name it)."""
    added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    special = {str(getattr(t, "content", t)): i for i, t in added.items() if getattr(t, "special", False)}

    def lit(text: str) -> str:
        return f"<[{special[text]}]>" if text in special else json.dumps(text, ensure_ascii=False)

    return lit


_REGEX_META = set("\\.+*?()|[]{}^$#&-~/")


def regex_escape(text: str) -> str:
    """`text` as a literal inside a Lark /regex/ (Rust regex syntax)."""
    out = []
    for c in text:
        if c == "\n":
            out.append("\\n")
        elif c == "\t":
            out.append("\\t")
        elif c == "\r":
            out.append("\\r")
        elif c in _REGEX_META:
            out.append("\\" + c)
        else:
            out.append(c)
    return "".join(out)


def lazy_until(end: str, lit: Callable[[str], str]) -> str:
    """A terminal for any text up to and including `end` (the first one)."""
    if lit(end).startswith("<["):  # a special token ends it: free text, then that token
        return f"/(.|\\n)*/ {lit(end)}"
    return f"/(.|\\n)*{regex_escape(end)}/"


def text_or_calls(lit: Callable[[str], str], open_marker: str = "", anchor: str = "") -> str:
    """Rules for `reply`: free text, or calls in the format's markup (with their schemas)
    - marker formats (`open_marker`): any text without the marker, optionally followed by the
      marker and calls (the marker closes the text, so the lexer needs no look-ahead);
    - anchored formats (`anchor`, the character a call list starts with): text whose first
      non-blank character is not the anchor, or the calls alone."""
    if anchor:
        return f"reply: FREE | calls\nFREE: /\\s*([^\\s{regex_escape(anchor)}](.|\\n)*)?/\n"
    marker = lit(open_marker)
    if marker.startswith("<["):  # a special token: text cannot contain it, nothing to exclude
        return f"reply: FREE ({marker} calls_rest)?\nFREE: /(.|\\n)*/\n"
    esc = regex_escape(open_marker)
    return (
        f"reply: FREE | upto_call calls_rest\nFREE: /(.|\\n)*/ & ~/(.|\\n)*{esc}(.|\\n)*/\n"
        f"upto_call[lazy]: /(.|\\n)*{esc}/\n"
    )


def reasoning_then(
    body: str, lit: Callable[[str], str], think: ReasoningMarkup | None, in_think: bool = False
) -> list[str]:
    """The `start` rule: `body` (a rule), after the model's reasoning block when it has one
    (`think`: its markup; `in_think`: the prompt already opened it). Shared by the forced-call
    grammars and structured output (server/structured.py after_reasoning)."""
    if think is None:
        return [f"start: {body}"]
    start = lit(think.opener) + (f" {lit(think.label)}" if think.label else "")  # Gemma 4: <|channel> "thought"
    lazy = lazy_until(think.end, lit)
    rest = f"think_rest[lazy]: {lazy}" if not lazy.startswith("/(.|\\n)*/ <[") else f"think_rest: {lazy}"
    return [
        # (layout before the block too: GLM-4.5 writes "\n<think>" after its generation prompt)
        f"start: think_rest LAYOUT {body}" if in_think else f"start: (LAYOUT {start} think_rest LAYOUT)? {body}",
        rest,
        # Bounded, as JSON whitespace is (app/engine/structured.py): a weak model pads forever otherwise.
        "LAYOUT: /[ \\t\\r\\n]{0,8}/",
    ]


def tool_grammar(
    calls_rules: str,
    lit: Callable[[str], str],
    think: ReasoningMarkup | None = None,
    in_think: bool = False,
    reply: str = "",
) -> str:
    """The whole grammar: `start` is the calls (or `reply` rules from text_or_calls), after the
    model's reasoning block when it has one (see reasoning_then)."""
    lines = ["%llguidance {}", *reasoning_then("reply" if reply else "calls", lit, think, in_think)]
    return "\n".join(lines) + "\n" + calls_rules + reply


def check_grammar(grammar: str) -> None:
    """Compile once without a tokenizer so a bad tool schema is a 400 naming `tools`."""
    import llguidance

    try:
        compiled = llguidance.LLMatcher.grammar_from_lark(grammar)
        is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(compiled)
    except Exception as exc:  # the compiler raises on grammars it cannot even parse
        is_error, messages = True, [str(exc)]
    if is_error:
        detail = messages[0] if messages else "unknown error"
        raise InvalidRequestError(
            f"tools: the function schemas could not be compiled into a grammar: {detail}", param="tools"
        )

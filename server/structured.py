"""Request fields that constrain the output, mapped to the engine's StructuredSpec.

Accepted spellings (at most one constraint per request; a second one is a 400 naming it):
  response_format   OpenAI: {"type": "text" | "json_object" | "json_schema",
                    "json_schema": {"name", "schema", "strict", "description"}}
  structured_outputs  vLLM: {"json" | "regex" | "choice" | "grammar" | "json_object": ...,
                    "disable_any_whitespace", "whitespace_pattern", "disable_fallback"}
  guided_json, guided_regex, guided_choice, guided_grammar (+ guided_whitespace_pattern,
                    guided_decoding_backend): vLLM's older names
`grammar` fields take Lark (llguidance's dialect) or llama.cpp GBNF; which one is detected.
allowed_token_ids is a separate whitelist (it combines with a grammar) and passes straight to
SamplingParams. Schemas, regexes and grammars are compiled in a worker thread before the request
is queued (`compile_structured`): an invalid one is a 400 naming the field, and the event loop
never waits on a compile.

On a model that reasons in `<think>` blocks, the chat routes apply the constraint only after the
reasoning, as vLLM does (`after_reasoning`, called from ChatSetup.after_encode): the spec becomes a
Lark grammar whose start is the reasoning block (optional, or already open when the prompt opened
it) followed by the constraint, so the reasoning lands in reasoning_content and the constrained
answer in content. A prompt that closed the block (thinking off) is constrained from its first token.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

from lantern.app.engine import InvalidRequestError, SamplingParams, StructuredSpec
from lantern.app.engine.reasoning import ReasoningMarkup
from lantern.app.engine.structured import DEFAULT_JSON_WHITESPACE
from lantern.server.tool_parsers.grammar import reasoning_then

_STRUCTURED_OUTPUTS_KINDS = {"json": "json_schema", "regex": "regex", "choice": "choice", "grammar": "grammar"}
# vLLM options of structured_outputs that Lantern honours (disable_fallback: there is no fallback).
_STRUCTURED_OUTPUTS_OPTIONS = {"disable_any_whitespace", "whitespace_pattern", "disable_fallback"}
_BACKENDS = {"auto", "guidance", "llguidance"}


def _refuse(param: str, why: str) -> InvalidRequestError:
    return InvalidRequestError(f"{param} {why}", param=param)


def _grammar_kind(text: Any) -> str:
    """ "lark" or "gbnf" (llama.cpp's `root ::= ...`) by the grammar's own syntax."""
    if not isinstance(text, str):
        return "lark"  # StructuredSpec refuses the non-string with the field's name
    from llguidance.gbnf_to_lark import is_lark_syntax

    return "lark" if is_lark_syntax(text) else "gbnf"


def _spec(kind: str, value: Any, param: str, whitespace: str | None = None, ws_param: str = "") -> StructuredSpec:
    if kind == "grammar":
        kind = _grammar_kind(value)
    if whitespace is not None and kind not in ("json_schema", "json_object"):
        raise _refuse(ws_param, f"applies to JSON constraints only, not to {param}")
    return StructuredSpec(kind, value, param=param, whitespace=whitespace)


def _from_response_format(rf: Any) -> StructuredSpec | None:
    if not isinstance(rf, dict):
        raise _refuse("response_format", "must be an object with a `type`")
    kind = rf.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return StructuredSpec("json_object", param="response_format")
    if kind != "json_schema":
        raise _refuse("response_format", f'type must be "text", "json_object" or "json_schema", got {kind!r}')
    js = rf.get("json_schema")
    if not isinstance(js, dict):
        raise _refuse("response_format", "json_schema must be an object holding the `schema`")
    if "schema" not in js:
        raise _refuse("response_format", "json_schema.schema is required (the JSON schema to follow)")
    name = js.get("name")
    if name is not None and not isinstance(name, str):
        raise _refuse("response_format", "json_schema.name must be a string")
    if js.get("strict") not in (None, True, False):
        raise _refuse("response_format", "json_schema.strict must be a boolean")
    # strict or not, the schema is enforced token by token: the strict guarantee always holds.
    return _spec("json_schema", js["schema"], "response_format")


def _from_structured_outputs(so: Any) -> list[StructuredSpec]:
    if not isinstance(so, dict):
        raise _refuse("structured_outputs", "must be an object")
    unknown = sorted(set(so) - set(_STRUCTURED_OUTPUTS_KINDS) - _STRUCTURED_OUTPUTS_OPTIONS - {"json_object"})
    if unknown:
        raise _refuse(f"structured_outputs.{unknown[0]}", "is not supported by this server")
    ws = _whitespace(so.get("disable_any_whitespace"), so.get("whitespace_pattern"), "structured_outputs")
    ws_param = "structured_outputs." + (
        "whitespace_pattern" if so.get("whitespace_pattern") else "disable_any_whitespace"
    )
    specs = [
        _spec(kind, so[key], f"structured_outputs.{key}", ws, ws_param)
        for key, kind in _STRUCTURED_OUTPUTS_KINDS.items()
        if so.get(key) is not None
    ]
    jo = so.get("json_object")
    if jo not in (None, False, True):
        raise _refuse("structured_outputs.json_object", "must be a boolean")
    if jo:
        specs.append(StructuredSpec("json_object", param="structured_outputs.json_object", whitespace=ws))
    return specs


def _whitespace(disable: Any, pattern: Any, where: str) -> str | None:
    if disable not in (None, False, True):
        raise _refuse(f"{where}.disable_any_whitespace", "must be a boolean")
    if pattern is not None and not isinstance(pattern, str):
        raise _refuse(f"{where}.whitespace_pattern", "must be a string (a regex)")
    if disable and pattern:
        raise _refuse(f"{where}.whitespace_pattern", "cannot be combined with disable_any_whitespace")
    return "" if disable else pattern


def structured_spec(body: Any) -> StructuredSpec | None:
    """The one constraint a request body asks for, or None; 400 when it asks for more than one."""
    specs: list[StructuredSpec] = []
    rf = getattr(body, "response_format", None)
    if rf is not None:
        spec = _from_response_format(rf)
        if spec is not None:
            specs.append(spec)
    so = getattr(body, "structured_outputs", None)
    if so is not None:
        specs += _from_structured_outputs(so)
    backend = getattr(body, "guided_decoding_backend", None)
    if backend is not None and (not isinstance(backend, str) or backend not in _BACKENDS):
        raise _refuse("guided_decoding_backend", f"must be one of {sorted(_BACKENDS)}: this server uses llguidance")
    ws = getattr(body, "guided_whitespace_pattern", None)
    if ws is not None and not isinstance(ws, str):
        raise _refuse("guided_whitespace_pattern", "must be a string (a regex)")
    for field, kind in (
        ("guided_json", "json_schema"),
        ("guided_regex", "regex"),
        ("guided_choice", "choice"),
        ("guided_grammar", "grammar"),
    ):
        value = getattr(body, field, None)
        if value is not None:
            specs.append(_spec(kind, value, field, ws, "guided_whitespace_pattern"))
    if len(specs) > 1:
        first, second = specs[0].param, specs[1].param
        raise InvalidRequestError(
            f"{second}: only one output constraint may be given per request, and {first} is given too",
            param=second,
        )
    return specs[0] if specs else None


def _answer_rule(spec: StructuredSpec) -> str:
    """The `answer` rule: `spec`'s constraint as one Lark (llguidance) rule, with the same
    semantics as the engine's own compile of it (app/engine/structured.py _grammar_text)."""
    where = spec.param or "structured"
    if spec.kind in ("json_schema", "json_object"):
        schema: Any = spec.value if spec.kind == "json_schema" else {"type": "object"}
        if isinstance(schema, bool):  # true: anything; false: nothing (x-guidance needs an object)
            schema = {} if schema else {"not": {}}
        ws = DEFAULT_JSON_WHITESPACE if spec.whitespace is None else spec.whitespace
        options = {"whitespace_flexible": False} if ws == "" else {"whitespace_pattern": ws}
        # the engine's order: its defaults < the schema's own "x-guidance"
        schema = {**schema, "x-guidance": {**options, **(schema.get("x-guidance") or {})}}
        return "answer: %json " + json.dumps(schema, ensure_ascii=False)
    if spec.kind == "regex":
        from llguidance import regex_to_lark

        return f"answer: /{regex_to_lark(spec.value, '')}/"  # "": Rust regex semantics, as grammar_from_regex
    if spec.kind == "choice":
        return "answer: " + " | ".join(json.dumps(c, ensure_ascii=False) for c in spec.value)
    text = spec.value
    if spec.kind == "gbnf":
        from llguidance.gbnf_to_lark import any_to_lark

        try:
            text = any_to_lark(text)
        except Exception as exc:  # the converter raises assorted errors on bad input
            raise InvalidRequestError(f"{where} is not a valid GBNF grammar: {exc}", param=where) from None
    return "answer: %lark {\n" + text + "\n}"  # a nested grammar: its rule names stay its own


def after_reasoning(
    spec: StructuredSpec, lit: Callable[[str], str], markup: ReasoningMarkup, in_think: bool
) -> StructuredSpec:
    """`spec` applied after the model's reasoning block (`markup`: its markers; `lit`: the tokenizer's marker literals,
    server/tool_parsers/grammar.py literal_maker; `in_think`: the prompt opened the block). The
    block's end is allowed anywhere in it, so a thinking_token_budget can always close it. A choice
    list whose every option writes a reasoning marker (opens the block, or closes the one the prompt
    opened) scripts the reasoning itself: it applies as given, from the first token."""
    if spec.kind == "choice" and all(markup.start in c or markup.end in c for c in spec.value):
        return spec
    rules = ["%llguidance {}", *reasoning_then("answer", lit, markup, in_think), _answer_rule(spec)]
    return StructuredSpec("lark", "\n".join(rules) + "\n", param=spec.param)


async def compile_structured(engine: Any, params: SamplingParams, answer: StructuredSpec | None = None) -> None:
    """Compile the request's grammar in a worker thread (cached by the engine), so the event loop
    and the engine thread never wait on it; raises InvalidRequestError (a 400) when it is invalid.
    `answer`: the request's own constraint when after_reasoning wrapped it; when the wrapped
    grammar fails, the constraint's own compile says why in its terms (a regex error, not Lark's)."""
    if params.structured is None:
        return
    try:
        await asyncio.to_thread(engine.compile_grammar, params.structured)
    except InvalidRequestError:
        if answer is not None:
            await asyncio.to_thread(engine.compile_grammar, answer)
        raise

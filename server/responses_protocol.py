"""OpenAI's Responses API request (POST /v1/responses), translated into a ChatCompletionRequest so
tools, tool_choice, structured output, reasoning and the prefix cache behave exactly as on
/v1/chat/completions.

Honoured: input (a string or items: messages with input_text / output_text parts, function_call,
function_call_output, reasoning), instructions, tools (flattened function tools), tool_choice,
parallel_tool_calls, max_tool_calls, max_output_tokens, temperature, top_p, text.format
(text / json_object / json_schema), reasoning.effort (as chat's reasoning_effort: the template's
`reasoning_effort`, else its thinking switched off by "none" / "minimal" and on by any other
effort; refused for a template that reads neither), store,
previous_response_id, metadata (stored and echoed), user / safety_identifier / prompt_cache_key
(identifiers and a cache hint: the prefix cache needs no hint), service_tier auto/default,
truncation "disabled", stream_options.include_obfuscation; vLLM's extras seed, top_k, cache_salt,
chat_template_kwargs. Refused, naming the field: built-in tools (web_search, file_search, ...),
images and files, item references, include, background, conversation, prompt, top_logprobs,
truncation "auto", text.verbosity, reasoning summaries other than "auto".
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import ValidationError

from lantern.app.engine import InvalidRequestError
from lantern.server.protocol import ChatCompletionRequest, ChatMessage, Lenient
from lantern.server.request_fields import EFFORTS

# Where a field of the chat request came from in this one: error params are renamed back.
_RENAMES = {
    "messages": "input",
    "max_completion_tokens": "max_output_tokens",
    "max_tokens": "max_output_tokens",
    "response_format": "text.format",
    "reasoning_effort": "reasoning.effort",
}
_TEXT_PARTS = {"input_text", "output_text", "text"}
_EFFORTS = set(EFFORTS)


def _refuse(param: str, why: str) -> InvalidRequestError:
    return InvalidRequestError(f"{param}: {why}", param=param)


def renamed_param(param: str | None) -> str | None:
    """The Responses API's name for a chat request's field (`messages.3.content` -> `input`)."""
    if param is None:
        return None
    head, *rest = param.split(".")
    if head in ("tools", "tool_choice") and "function" in rest:  # nested in chat, flat here
        rest.remove("function")
        return ".".join([head, *rest])
    if head == "messages":
        return "input"  # chat message indices do not match input item indices
    if head in _RENAMES:
        return _RENAMES[head]
    return param


class ResponsesRequest(Lenient):
    model: str | None = None
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    max_tool_calls: int | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    text: dict[str, Any] | None = None
    reasoning: dict[str, Any] | None = None
    store: bool = True
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    previous_response_id: str | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    service_tier: str | None = None
    truncation: Literal["disabled", "auto"] | None = None
    include: list[str] | None = None
    background: bool | None = None
    conversation: Any = None
    prompt: Any = None
    top_logprobs: int | None = None
    # vLLM's extras
    seed: int | None = None
    top_k: int | None = None
    cache_salt: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None

    def refuse_unsupported(self) -> None:
        for name in ("conversation", "prompt"):
            if getattr(self, name) is not None:
                raise _refuse(name, "is not supported by this server (send input, or previous_response_id)")
        if self.background:
            raise _refuse("background", "is not supported: responses run while the request is open")
        if self.include:
            raise _refuse("include", f"{self.include[0]!r} is not supported by this server")
        if self.top_logprobs:
            raise _refuse("top_logprobs", "is not supported on /v1/responses (use /v1/chat/completions)")
        if self.truncation == "auto":
            raise _refuse("truncation", '"auto" is not supported: an input longer than the context is refused')
        if self.service_tier not in (None, "auto", "default"):
            raise _refuse("service_tier", 'must be "auto" or "default": this server has one tier')
        if self.max_tool_calls is not None and self.max_tool_calls < 1:
            raise _refuse("max_tool_calls", "must be at least 1")
        if self.metadata is not None and len(self.metadata) > 16:
            raise _refuse("metadata", "holds at most 16 keys")
        opts = self.stream_options or {}
        extra = sorted(set(opts) - {"include_obfuscation"})
        if extra:
            raise _refuse(f"stream_options.{extra[0]}", "is not supported")
        if opts.get("include_obfuscation") not in (None, True, False):
            raise _refuse("stream_options.include_obfuscation", "must be a boolean")

    # -- pieces of the chat request -------------------------------------------------------------

    def function_tools(self) -> list[dict[str, Any]] | None:
        """The Responses API's flat function tools in chat's nested shape; built-ins refused."""
        if self.tools is None:
            return None
        out = []
        for i, tool in enumerate(self.tools):
            kind = tool.get("type")
            if kind != "function":
                raise _refuse(
                    f"tools.{i}.type",
                    f"built-in tool {kind!r} is not available on this server; only function tools are",
                )
            unknown = sorted(set(tool) - {"type", "name", "description", "parameters", "strict"})
            if unknown:
                raise _refuse(f"tools.{i}.{unknown[0]}", "is not supported on function tools here")
            fn = {k: tool[k] for k in ("name", "description", "parameters", "strict") if tool.get(k) is not None}
            out.append({"type": "function", "function": fn})
        return out

    def chat_tool_choice(self) -> Any:
        tc = self.tool_choice
        if tc is None or isinstance(tc, str):
            return tc  # none | auto | required; anything else the chat model refuses by name
        if tc.get("type") == "function":
            if not isinstance(tc.get("name"), str):
                raise _refuse("tool_choice.name", "must name a function from tools")
            return {"type": "function", "function": {"name": tc["name"]}}
        raise _refuse("tool_choice", f"type {tc.get('type')!r} is not supported (function tools only)")

    def response_format(self) -> dict[str, Any] | None:
        text = self.text or {}
        extra = sorted(set(text) - {"format", "verbosity"})
        if extra:
            raise _refuse(f"text.{extra[0]}", "is not supported")
        if text.get("verbosity") is not None:
            raise _refuse("text.verbosity", "is not supported: the length of the answer cannot be steered")
        fmt = text.get("format")
        if fmt is None:
            return None
        if not isinstance(fmt, dict):
            raise _refuse("text.format", "must be an object with a type")
        if fmt.get("type") == "json_schema":  # flat here, nested under json_schema in chat
            if "schema" not in fmt:
                raise _refuse("text.format.schema", "is required with type json_schema (the JSON schema to follow)")
            inner = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
            return {"type": "json_schema", "json_schema": inner}
        return dict(fmt)

    def template_kwargs(self) -> dict[str, Any] | None:
        kwargs = dict(self.chat_template_kwargs or {})
        r = self.reasoning or {}
        extra = sorted(set(r) - {"effort", "summary", "generate_summary"})
        if extra:
            raise _refuse(f"reasoning.{extra[0]}", "is not supported")
        for key in ("summary", "generate_summary"):
            if r.get(key) not in (None, "auto"):
                raise _refuse(
                    f"reasoning.{key}", "summaries are not produced; reasoning comes back whole as reasoning items"
                )
        effort = r.get("effort")
        if effort is not None and effort not in _EFFORTS:
            raise _refuse("reasoning.effort", f"must be one of {list(EFFORTS)}")
        return kwargs or None

    def input_messages(self) -> list[ChatMessage]:
        """This request's input (instructions excluded) as chat messages."""
        if isinstance(self.input, str):
            return [ChatMessage(role="user", content=self.input)]
        return items_to_messages(self.input, "input")

    def to_chat(self, history: list[ChatMessage]) -> ChatCompletionRequest:
        """The chat request this response runs as: instructions, the stored conversation of
        previous_response_id, then this input (instructions are not carried over, as OpenAI does)."""
        self.refuse_unsupported()
        messages = list(history) + self.input_messages()
        if not messages:
            raise _refuse("input", "must hold at least one item")
        if self.instructions:
            messages.insert(0, ChatMessage(role="system", content=self.instructions))
        fields = {
            "model": self.model,
            "messages": messages,
            "max_completion_tokens": self.max_output_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "seed": self.seed,
            "user": self.user,
            "cache_salt": self.cache_salt,
            "tools": self.function_tools(),
            "tool_choice": self.chat_tool_choice(),
            "parallel_tool_calls": self.parallel_tool_calls,
            "response_format": self.response_format(),
            "chat_template_kwargs": self.template_kwargs(),
            # Reaches the template as chat's reasoning_effort does (server/request_fields.py).
            "reasoning_effort": (self.reasoning or {}).get("effort"),
        }
        try:
            return ChatCompletionRequest.model_validate({k: v for k, v in fields.items() if v is not None})
        except ValidationError as exc:
            err = exc.errors()[0]
            loc = [str(p) for p in err.get("loc", ()) if isinstance(p, (str, int))]
            param = renamed_param(".".join(loc) or None)
            raise InvalidRequestError(f"{param}: {err.get('msg')}", param=param) from None


def _text_of(content: Any, where: str) -> str:
    """Plain text of a message's content: a string or text parts; images and files refused."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _refuse(f"{where}.content", "must be a string or a list of content parts")
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in _TEXT_PARTS:
            raise _refuse(f"{where}.content.{j}", f"part type {kind!r} is not supported (text parts only)")
        text = part.get("text")
        if not isinstance(text, str):
            raise _refuse(f"{where}.content.{j}.text", "must be a string")
        texts.append(text)
    return "".join(texts)


def _arguments(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise _refuse(f"{where}.arguments", "must be a string of JSON text")
    try:
        ok = isinstance(json.loads(value), dict)
    except ValueError:
        ok = False
    if not ok:
        raise _refuse(f"{where}.arguments", "must be JSON text of an object")
    return value


def items_to_messages(items: list[dict[str, Any]], param: str) -> list[ChatMessage]:
    """Input items as chat messages. An assistant turn's reasoning, text and function calls are
    one assistant message (the template renders them together), as chat sends them."""
    out: list[ChatMessage] = []
    open_turn: dict[str, Any] | None = None  # the assistant message being gathered

    def turn() -> dict[str, Any]:
        nonlocal open_turn
        if open_turn is None:
            open_turn = {"role": "assistant", "content": None, "tool_calls": None, "reasoning_content": None}
            out.append(open_turn)  # type: ignore[arg-type]  # replaced by a ChatMessage below
        return open_turn

    for i, item in enumerate(items):
        where = f"{param}.{i}"
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise _refuse(f"{where}.role", "must be user, system, developer or assistant")
            text = _text_of(item.get("content"), where)
            if role == "assistant":
                t = turn()
                if t["tool_calls"]:  # text after calls starts a new turn
                    open_turn = None
                    t = turn()
                t["content"] = (t["content"] or "") + text
                continue
            open_turn = None
            out.append(ChatMessage(role=role, content=text))
        elif kind == "function_call":
            name, call_id = item.get("name"), item.get("call_id")
            if not isinstance(name, str) or not name:
                raise _refuse(f"{where}.name", "must be the called function's name")
            if not isinstance(call_id, str) or not call_id:
                raise _refuse(f"{where}.call_id", "is required")
            call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": _arguments(
                item.get("arguments"), where)}}  # fmt: skip
            t = turn()
            t["tool_calls"] = [*(t["tool_calls"] or []), call]
        elif kind == "function_call_output":
            call_id = item.get("call_id")
            if not isinstance(call_id, str) or not call_id:
                raise _refuse(f"{where}.call_id", "is required (the call_id of the function_call answered)")
            output = item.get("output")
            text = output if isinstance(output, str) else _text_of(output, where)
            open_turn = None
            out.append(ChatMessage(role="tool", content=text, tool_call_id=call_id))
        elif kind == "reasoning":
            parts = item.get("content") or []
            text = _text_of([{**p, "type": "text"} if isinstance(p, dict) and p.get("type") == "reasoning_text"
                             else p for p in parts], where)  # fmt: skip
            t = turn()
            if t["content"] is not None or t["tool_calls"]:  # reasoning opens a turn
                open_turn = None
                t = turn()
            t["reasoning_content"] = (t["reasoning_content"] or "") + text
        elif kind == "item_reference":
            raise _refuse(f"{where}.type", "item references are not supported; send the item itself")
        else:
            raise _refuse(f"{where}.type", f"input item type {kind!r} is not supported")
    try:
        return [m if isinstance(m, ChatMessage) else ChatMessage.model_validate(m) for m in out]
    except ValidationError as exc:
        raise _refuse(param, str(exc.errors()[0].get("msg"))) from None

"""Anthropic Messages API requests (POST /v1/messages, /v1/messages/count_tokens), translated into
the server's ChatCompletionRequest so tools, tool_choice, grammars, reasoning and the prefix cache
behave exactly as on /v1/chat/completions; plus Anthropic's error envelope for these routes.

How each field is honoured (every other known field is refused with a 400 naming it):
- system (string or text blocks) -> a leading system message; messages' text blocks -> content.
- tool_use blocks -> the assistant's tool_calls; tool_result blocks -> role "tool" messages (a
  result with is_error true is rendered as "Error: <content>": chat templates have no error flag).
- thinking blocks in history -> the assistant's reasoning_content (templates that keep reasoning
  read it); redacted_thinking is opaque and cannot be rendered: refused.
- thinking {type: enabled | adaptive} -> chat_template_kwargs enable_thinking=true and thinking
  blocks in the reply (display "omitted": none shown); absent or disabled -> enable_thinking=false
  (Anthropic's default is no thinking). budget_tokens is checked as Anthropic does (>= 1024, below
  max_tokens) and enforced as chat's thinking_token_budget (type "enabled" carries it; a budget sent
  with another type is enforced too rather than dropped): after that many reasoning tokens the
  engine forces `</think>` and the model goes on to its answer (app/engine/reasoning_budget.py).
  A model that writes no `<think>` block never reasons, so the budget holds trivially there and
  the request is accepted (clients send thinking by default); harmony-format models (gpt-oss)
  reason in a channel the budget does not reach: there only max_tokens bounds the reasoning.
- a last assistant message is a prefill: the reply continues it (server/routes/messages.py).
- output_config.format {type: json_schema} -> response_format json_schema (grammar-constrained).
- tool_choice auto/any/tool/none -> auto/required/named/none; disable_parallel_tool_use ->
  parallel_tool_calls false.
- metadata (user_id) is accepted and deliberately unused (no per-user accounting here); so is
  service_tier (one tier); cache_control is accepted: the prefix cache reuses every shared prefix.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, model_validator

from lantern.app.engine import InvalidRequestError
from lantern.server.protocol import ChatCompletionRequest

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
}
# OpenAI-side names of fields this API spells differently (errors from the shared chat path).
PARAM_NAMES = {
    "stop": "stop_sequences",
    "max_completion_tokens": "max_tokens",
    "thinking_token_budget": "thinking.budget_tokens",
}


def anthropic_error_body(status: int, message: str) -> dict[str, Any]:
    # A message may quote the client's own input, lone surrogates included: those cannot be
    # encoded as UTF-8, and rendering the error must not itself fail (a 500 for bad input).
    if not message.isascii():
        message = message.encode("utf-8", "backslashreplace").decode("utf-8")
    return {"type": "error", "error": {"type": _ERROR_TYPES.get(status, "api_error"), "message": message}}


def anthropic_error(
    status: int, message: str, param: str | None = None, headers: dict[str, str] | None = None
) -> JSONResponse:
    """Anthropic's envelope has no field slot: the field leads the message, as Anthropic's own do."""
    if param:
        param = PARAM_NAMES.get(param, param)
        if not message.startswith(param):
            message = f"{param}: {message}"
    return JSONResponse(anthropic_error_body(status, message), status_code=status, headers=headers)


def is_anthropic_path(path: str) -> bool:
    """Routes whose clients (Anthropic's SDKs) read Anthropic's error envelope."""
    return path == "/v1/messages" or path.startswith("/v1/messages/")


class _Model(BaseModel):
    # Unknown fields are ignored (the API grows); cache_control rides along on any block.
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)


class TextBlock(_Model):
    type: Literal["text"]
    text: str


class ImageBlock(_Model):
    """Accepted by the schema only to be refused by name: no model here takes images."""

    type: Literal["image", "document", "search_result", "container_upload"]


class ToolUseBlock(_Model):
    type: Literal["tool_use"]
    id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    input: dict[str, Any]


class ToolResultBlock(_Model):
    type: Literal["tool_result"]
    tool_use_id: str = Field(min_length=1)
    content: str | list[Annotated[TextBlock | ImageBlock, Field(discriminator="type")]] = ""
    is_error: bool = False


class ThinkingBlock(_Model):
    type: Literal["thinking"]
    thinking: str
    signature: str | None = None  # ours are empty; nothing here verifies one


class RedactedThinkingBlock(_Model):
    type: Literal["redacted_thinking"]


# Tagged by "type": an unknown block type is a 400 naming the block, not a guess among the models.
Block = Annotated[
    TextBlock | ImageBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock | RedactedThinkingBlock,
    Field(discriminator="type"),
]
BLOCK_TYPES = frozenset(
    {"text", "image", "document", "search_result", "container_upload", "tool_use", "tool_result", "thinking",
     "redacted_thinking"}
)  # fmt: skip


class Message(_Model):
    role: Literal["user", "assistant"]
    content: str | list[Block]


class Tool(_Model):
    type: str | None = None  # "custom"; server tools (web_search_..., bash_..., ...) are refused by name
    name: str = Field(pattern=r"^[A-Za-z0-9_\-]{1,64}$")
    description: str | None = None
    input_schema: dict[str, Any] | None = None  # required for custom tools (checked with the type)
    strict: bool | None = None  # true: inputs follow the schema, enforced by a grammar


class ToolChoice(_Model):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None

    @model_validator(mode="after")
    def _named(self) -> ToolChoice:
        if (self.type == "tool") != (self.name is not None):
            raise ValueError('name is required with type "tool" and only allowed there')
        return self


class Thinking(_Model):
    type: Literal["enabled", "adaptive", "disabled"]
    budget_tokens: int | None = Field(default=None, ge=1024)
    display: Literal["summarized", "omitted"] | None = None

    @model_validator(mode="after")
    def _budget(self) -> Thinking:
        if self.type == "enabled" and self.budget_tokens is None:
            raise ValueError('budget_tokens is required with type "enabled"')
        return self


class JsonOutputFormat(_Model):
    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfig(_Model):
    format: JsonOutputFormat | None = None
    effort: str | None = None  # refused when set: no model here trades effort for quality


def _refused(param: str, why: str) -> InvalidRequestError:
    return InvalidRequestError(f"{param} {why}", param=param)


class CountTokensRequest(_Model):
    """What count_tokens takes: a message request's prompt half."""

    model: str | None = None
    messages: list[Message] = Field(min_length=1)
    system: str | list[TextBlock] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None
    output_config: OutputConfig | None = None
    mcp_servers: list[Any] | None = None
    container: Any = None
    # Beta fields that change the reply: declared so that they are refused, not dropped unread.
    context_management: Any = None
    output_format: Any = None

    def refuse_unsupported(self) -> None:
        if self.context_management is not None:
            raise _refused("context_management", "is not supported by this server (nothing is cleared from context)")
        if self.output_format is not None:
            raise _refused("output_format", "is not supported here; send output_config.format (the same schema)")
        if self.mcp_servers:
            raise _refused("mcp_servers", "is not supported by this server (start it with --mcp-config instead)")
        if self.container is not None:
            raise _refused("container", "is not supported by this server (no code-execution containers)")
        if self.output_config is not None and self.output_config.effort is not None:
            raise _refused("output_config.effort", "is not supported by this server")

    def chat_tools(self) -> list[dict[str, Any]] | None:
        if self.tools is None:
            return None
        out = []
        for i, tool in enumerate(self.tools):
            if tool.type not in (None, "custom"):
                raise _refused(f"tools.{i}.type", f"{tool.type!r} is a server tool; this server runs only custom tools")
            if tool.input_schema is None:
                raise _refused(f"tools.{i}.input_schema", "is required for a custom tool")
            fn = {"name": tool.name, "parameters": tool.input_schema}
            if tool.description is not None:
                fn["description"] = tool.description
            if tool.strict is not None:
                fn["strict"] = tool.strict
            out.append({"type": "function", "function": fn})
        return out

    def chat_tool_choice(self) -> tuple[Any, bool | None]:
        """(OpenAI tool_choice, parallel_tool_calls)."""
        c = self.tool_choice
        if c is None:
            return None, None
        parallel = None if c.disable_parallel_tool_use is None else not c.disable_parallel_tool_use
        if c.type == "tool":
            return {"type": "function", "function": {"name": c.name}}, parallel
        return {"auto": "auto", "any": "required", "none": "none"}[c.type], parallel

    @property
    def thinking_enabled(self) -> bool:
        """Anthropic's default is no thinking: the template is told so when the request is silent."""
        return self.thinking is not None and self.thinking.type != "disabled"

    @property
    def thinking_shown(self) -> bool:
        """Whether the reply carries thinking blocks (display "omitted": the model still reasons)."""
        return self.thinking_enabled and self.thinking is not None and self.thinking.display != "omitted"

    def chat_messages(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        if isinstance(self.system, str):
            if self.system:
                out.append({"role": "system", "content": self.system})
        elif self.system:
            out.append({"role": "system", "content": "\n\n".join(b.text for b in self.system)})
        for i, m in enumerate(self.messages):
            if isinstance(m.content, str):
                out.append({"role": m.role, "content": m.content})
            elif m.role == "user":
                out.extend(_user_turn(m.content, f"messages.{i}.content"))
            else:
                out.append(_assistant_turn(m.content, f"messages.{i}.content"))
        return out

    def chat_request(self, **sampling: Any) -> ChatCompletionRequest:
        """The equivalent /v1/chat/completions request (sampling: its OpenAI-named fields)."""
        self.refuse_unsupported()
        choice, parallel = self.chat_tool_choice()
        fmt = self.output_config.format if self.output_config else None
        if fmt is not None:  # structured output: the same path as OpenAI's response_format
            schema = {"name": "output", "schema": fmt.schema_, "strict": True}
            sampling["response_format"] = {"type": "json_schema", "json_schema": schema}
        return ChatCompletionRequest.model_validate(
            {
                "messages": self.chat_messages(),
                "tools": self.chat_tools(),
                "tool_choice": choice,
                "parallel_tool_calls": parallel,
                "chat_template_kwargs": {"enable_thinking": self.thinking_enabled},
                **sampling,
            }
        )


class MessagesRequest(CountTokensRequest):
    max_tokens: int = Field(ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=1.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=1)
    stop_sequences: list[str] | None = None
    stream: bool = False
    metadata: dict[str, Any] | None = None  # user_id: accepted, unused (see the module docstring)
    service_tier: Literal["auto", "standard_only"] | None = None  # one tier here: both mean it

    def to_chat(self) -> ChatCompletionRequest:
        budget = self.thinking.budget_tokens if self.thinking else None
        if budget is not None and budget >= self.max_tokens:
            raise _refused("thinking.budget_tokens", f"({budget}) must be less than max_tokens ({self.max_tokens})")
        return self.chat_request(
            model=self.model,
            max_tokens=self.max_tokens,
            thinking_token_budget=budget,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            stop=self.stop_sequences,
            stream=self.stream,
        )


def _text_of(blocks: list[TextBlock | ImageBlock], where: str) -> str:
    for j, b in enumerate(blocks):
        if isinstance(b, ImageBlock):
            raise _refused(f"{where}.{j}", f"is a {b.type} block; this server takes text only")
    return "".join(b.text for b in blocks if isinstance(b, TextBlock))


def _user_turn(blocks: list[Block], where: str) -> list[dict[str, Any]]:
    """Tool results become tool messages (in order); runs of text between them, user messages."""
    out: list[dict[str, Any]] = []
    text: list[str] = []

    def flush() -> None:
        if text:
            out.append({"role": "user", "content": "".join(text)})
            text.clear()

    for j, b in enumerate(blocks):
        if isinstance(b, TextBlock):
            text.append(b.text)
        elif isinstance(b, ToolResultBlock):
            flush()
            body = b.content if isinstance(b.content, str) else _text_of(b.content, f"{where}.{j}.content")
            if b.is_error:
                body = f"Error: {body}"
            out.append({"role": "tool", "tool_call_id": b.tool_use_id, "content": body})
        elif isinstance(b, ImageBlock):
            raise _refused(f"{where}.{j}", f"is a {b.type} block; this server takes text only")
        else:
            raise _refused(f"{where}.{j}", f"is a {b.type} block, which only assistant messages carry")
    flush()
    return out


def _assistant_turn(blocks: list[Block], where: str) -> dict[str, Any]:
    text: list[str] = []
    thinking: list[str] = []
    calls: list[dict[str, Any]] = []
    for j, b in enumerate(blocks):
        if isinstance(b, TextBlock):
            text.append(b.text)
        elif isinstance(b, ThinkingBlock):
            thinking.append(b.thinking)
        elif isinstance(b, ToolUseBlock):
            args = json.dumps(b.input, ensure_ascii=False)
            calls.append({"id": b.id, "type": "function", "function": {"name": b.name, "arguments": args}})
        elif isinstance(b, RedactedThinkingBlock):
            raise _refused(f"{where}.{j}", "is redacted_thinking, which this server cannot read back")
        else:
            raise _refused(f"{where}.{j}", f"is a {b.type} block, which assistant messages do not carry here")
    msg: dict[str, Any] = {"role": "assistant", "content": "".join(text) or (None if calls else "")}
    if calls:
        msg["tool_calls"] = calls
    if thinking:
        msg["reasoning_content"] = "\n\n".join(thinking)
    return msg

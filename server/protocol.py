"""Pydantic models of the OpenAI requests we accept.

Unknown fields are ignored (clients add new ones), but every field we know is either honoured or
refused with a 400 naming it: a request must never be silently answered as a different request.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from lantern.app.engine import InvalidRequestError, SamplingParams
from lantern.server.request_fields import ReasoningEffort, refuse_unhonoured
from lantern.server.structured import structured_spec

# Error type of a string holding a lone UTF-16 surrogate; the error handler reports it first.
INVALID_UNICODE = "invalid_unicode"
# Names apply_chat_template takes itself: passing them in chat_template_kwargs would be a TypeError.
_RESERVED_TEMPLATE_KWARGS = {
    "conversation",
    "messages",
    "chat_template",
    "add_generation_prompt",
    "tokenize",
    "tools",
    "documents",
    "return_dict",
    "continue_final_message",
}


def _is_valid_text(s: str) -> bool:
    if s.isascii():
        return True
    try:
        s.encode("utf-8")  # JSON "\ud800" escapes decode to lone surrogates, which no tokenizer takes
    except UnicodeEncodeError:
        return False
    return True


def _has_bad_text(value: Any) -> bool:
    if isinstance(value, str):
        return not _is_valid_text(value)
    if isinstance(value, (list, tuple)):
        return any(isinstance(v, (str, list, tuple, dict)) and _has_bad_text(v) for v in value)
    if isinstance(value, dict):
        return any(_has_bad_text(k) or _has_bad_text(v) for k, v in value.items())
    return False  # numbers, None, nested models (they validate their own fields)


class Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

    @field_validator("*", mode="after")
    @classmethod
    def _valid_unicode(cls, value: Any) -> Any:
        if _has_bad_text(value):
            raise PydanticCustomError(INVALID_UNICODE, "contains a lone UTF-16 surrogate (not valid Unicode text)")
        return value


class TextPart(Lenient):
    type: Literal["text"]
    text: str


class FunctionCall(Lenient):
    name: str
    arguments: str  # JSON text of an object, as OpenAI sends it

    @field_validator("arguments")
    @classmethod
    def _json_object(cls, value: str) -> str:
        try:
            parsed = json.loads(value)
        except ValueError as exc:
            raise ValueError(f"must be JSON text of an object: {exc}") from None
        if not isinstance(parsed, dict):
            raise ValueError("must be JSON text of an object")
        return value


class ToolCallMessage(Lenient):
    """A call an assistant made earlier in the conversation."""

    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(Lenient):
    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str | list[TextPart] | None = None
    tool_calls: list[ToolCallMessage] | None = None  # assistant
    tool_call_id: str | None = None  # tool: the call this message answers
    reasoning_content: str | None = None  # assistant: templates that keep reasoning in history read it

    @model_validator(mode="after")
    def _tool_fields(self) -> ChatMessage:
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("a tool message needs tool_call_id (the id of the call it answers)")
        if self.tool_calls and self.role != "assistant":
            raise ValueError("only assistant messages carry tool_calls")
        return self

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)

    def as_template_message(self) -> dict[str, Any]:
        msg: dict[str, Any] = {"role": "system" if self.role == "developer" else self.role, "content": self.text()}
        if self.tool_calls:
            # Templates render arguments with `| tojson` or iterate them: they want the object.
            msg["tool_calls"] = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.function.name, "arguments": json.loads(c.function.arguments)},
                }
                for c in self.tool_calls
            ]
        if self.tool_call_id is not None:
            msg["tool_call_id"] = self.tool_call_id
        if self.reasoning_content is not None:
            msg["reasoning_content"] = self.reasoning_content
            msg["thinking"] = self.reasoning_content  # the name gpt-oss's template reads
        return msg


class StreamOptions(Lenient):
    include_usage: bool = False
    # Random padding on each chunk against a size side channel on OpenAI's network path: no effect
    # on the answer, and chunks from a local server carry none (accepted, checked for type).
    include_obfuscation: bool | None = None


class FunctionDefinition(Lenient):
    name: str = Field(pattern=r"^[A-Za-z0-9_.\-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON schema; none: the function takes no arguments
    strict: bool | None = None


class ToolDefinition(Lenient):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(Lenient):
    name: str


class NamedToolChoice(Lenient):
    type: Literal["function"]
    function: NamedFunction


def _check_template_kwargs(value: dict[str, Any] | None) -> dict[str, Any] | None:
    clash = sorted(set(value or {}) & _RESERVED_TEMPLATE_KWARGS)
    if clash:
        raise ValueError(f"may not set {', '.join(clash)} (the server sets them)")
    return value


def _refuse(param: str, why: str) -> InvalidRequestError:
    return InvalidRequestError(f"{param} {why}", param=param)


class _SamplingFields(Lenient):
    model: str | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    max_tokens: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    n: int | None = None
    best_of: int | None = None
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    logit_bias: dict[str, Any] | None = None  # values checked by SamplingParams, ids by the engine
    ignore_eos: bool = False
    min_tokens: int | None = None
    user: str | None = None
    cache_salt: str | None = None  # vLLM's name: requests with different salts never share cached prefixes
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    # Constrained output (server/structured.py maps these to one StructuredSpec; values checked there).
    response_format: dict[str, Any] | None = None
    structured_outputs: dict[str, Any] | None = None
    guided_json: Any = None
    guided_regex: Any = None
    guided_choice: Any = None
    guided_grammar: Any = None
    guided_whitespace_pattern: Any = None
    guided_decoding_backend: Any = None
    allowed_token_ids: list[int] | None = None
    # vLLM's name: tokens of reasoning before </think> is forced (app/engine/reasoning_budget.py).
    thinking_token_budget: int | None = None
    # vLLM's: each prompt token's logprob and rank, with its k most likely alternatives (non-streamed responses)
    prompt_logprobs: int | None = None

    @property
    def num_choices(self) -> int:
        return 1 if self.n is None else self.n

    def _sampling(
        self, max_tokens: int | None, logprobs: int | None, renames: dict[str, str], prompt_logprobs: int | None = None
    ) -> SamplingParams:
        """SamplingParams with OpenAI's defaults for absent fields. `is None`, never `or`: an
        explicit 0 is a value to validate, not a request for the default."""

        def pick(value: Any, default: Any) -> Any:
            return default if value is None else value

        if self.stream and self.prompt_logprobs is not None:
            raise _refuse("prompt_logprobs", "is returned with non-streamed responses only (as vLLM)")
        if self.best_of is not None and self.best_of != self.num_choices:
            raise _refuse(
                "best_of",
                f"must equal n ({self.num_choices}) when given: returning the best of several samples is not supported",
            )
        try:
            return SamplingParams(
                n=self.num_choices,
                temperature=pick(self.temperature, 1.0),
                top_p=pick(self.top_p, 1.0),
                top_k=pick(self.top_k, 0),
                min_p=pick(self.min_p, 0.0),
                repetition_penalty=pick(self.repetition_penalty, 1.0),
                frequency_penalty=pick(self.frequency_penalty, 0.0),
                presence_penalty=pick(self.presence_penalty, 0.0),
                seed=self.seed,
                max_tokens=max_tokens,
                min_tokens=pick(self.min_tokens, 0),
                stop=self.stop,
                stop_token_ids=self.stop_token_ids,
                ignore_eos=self.ignore_eos,
                logprobs=logprobs,
                prompt_logprobs=prompt_logprobs,
                skip_special_tokens=self.skip_special_tokens,
                include_stop_str_in_output=self.include_stop_str_in_output,
                logit_bias=self.logit_bias,  # type: ignore[arg-type]  # str keys: SamplingParams parses them
                structured=structured_spec(self),
                allowed_token_ids=self.allowed_token_ids,
                thinking_token_budget=self.thinking_token_budget,
            )
        except InvalidRequestError as exc:
            old = exc.param
            if old in renames:  # SamplingParams' name for a field this client spelt another way
                exc.param = renames[old]
                if exc.message.startswith(old + " "):
                    exc.message = exc.param + exc.message[len(old) :]
                    exc.args = (exc.message,)
            raise


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None
    logprobs: bool | None = False
    top_logprobs: int | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    add_generation_prompt: bool = True
    tools: list[ToolDefinition] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    # OpenAI's deprecated function-calling fields: refused (tools/tool_choice replace them).
    functions: list[Any] | None = None
    function_call: Any = None
    # OpenAI's other documented fields: honoured, harmless or refused (server/request_fields.py).
    reasoning_effort: ReasoningEffort | None = None  # reaches the chat template (routes/chat.py)
    modalities: list[str] | None = None
    audio: Any = None
    web_search_options: Any = None
    verbosity: Any = None
    moderation: Any = None
    prediction: Any = None
    service_tier: str | None = None
    metadata: dict[str, Any] | None = None
    store: bool | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: Literal["in_memory", "24h"] | None = None
    prompt_cache_options: dict[str, Any] | None = None

    _template_kwargs = field_validator("chat_template_kwargs")(_check_template_kwargs)

    def refuse_unsupported(self) -> None:
        if self.functions or self.function_call is not None:
            field = "functions" if self.functions else "function_call"
            raise _refuse(field, "is deprecated and not supported by this server; use tools and tool_choice")
        refuse_unhonoured(self)
        names = [t.function.name for t in self.tools or []]
        if len(set(names)) != len(names):
            raise _refuse("tools", "must have distinct function names")
        if isinstance(self.tool_choice, NamedToolChoice):
            wanted = self.tool_choice.function.name
            if wanted not in names:
                raise _refuse("tool_choice", f"names function {wanted!r}, which is not in tools")
        elif self.tool_choice == "required" and not names:
            raise _refuse("tool_choice", '"required" needs at least one function in tools')

    def sampling_params(self) -> SamplingParams:
        self.refuse_unsupported()
        if self.top_logprobs is not None and not self.logprobs:
            raise _refuse("top_logprobs", "requires logprobs to be true")
        k = (self.top_logprobs or 0) if self.logprobs else None
        renames = {"logprobs": "top_logprobs"}
        max_tokens = self.max_tokens
        if self.max_completion_tokens is not None:
            max_tokens, renames["max_tokens"] = self.max_completion_tokens, "max_completion_tokens"
        return self._sampling(max_tokens, k, renames, prompt_logprobs=self.prompt_logprobs)

    def template_messages(self) -> list[dict[str, Any]]:
        return [m.as_template_message() for m in self.messages]


class CompletionRequest(_SamplingFields):
    prompt: str | list[str] | list[int] | list[list[int]]
    echo: bool = False
    logprobs: int | None = None
    max_tokens: int | None = 16
    suffix: str | None = None

    def sampling_params(self) -> SamplingParams:
        if self.suffix:
            raise _refuse("suffix", "is not supported by this server (no fill-in-the-middle)")
        # echo with logprobs scores the prompt's tokens too (OpenAI's legacy completions; lm-evaluation-harness's
        # log-likelihoods), as vLLM's prompt_logprobs does: the engine's prompt_logprobs, as many alternatives as
        # the larger asks
        scored = self.prompt_logprobs  # (an invalid one kept: SamplingParams refuses it by name)
        if self.echo and self.logprobs is not None and (scored is None or 0 <= scored < self.logprobs):
            scored = self.logprobs
        return self._sampling(self.max_tokens, self.logprobs, {}, prompt_logprobs=scored)

    def prompts(self) -> list[str | list[int]]:
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if not p or any(isinstance(x, list) and not x for x in p):
            raise InvalidRequestError("prompt must not be empty", param="prompt")
        if all(isinstance(x, int) for x in p):
            return [[int(x) for x in p]]  # type: ignore[arg-type]  # all ints, checked above
        return [x for x in p if not isinstance(x, int)]  # strings or id lists (the union allows no mix)


class TokenizeRequest(Lenient):
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True
    chat_template_kwargs: dict[str, Any] | None = None

    _template_kwargs = field_validator("chat_template_kwargs")(_check_template_kwargs)


class DetokenizeRequest(Lenient):
    model: str | None = None
    tokens: list[int]


MAX_EMBEDDING_INPUTS = 2048  # OpenAI's limit on inputs per embeddings request


class EmbeddingRequest(Lenient):
    model: str | None = None
    input: str | list[str] | list[int] | list[list[int]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None  # checked against the model's size by the route
    user: str | None = None

    def inputs(self) -> list[str | list[int]]:
        """One text or token-id list per vector asked for; empty ones refused naming input."""
        return input_items(self.input, MAX_EMBEDDING_INPUTS)


def input_items(x: str | list[str] | list[int] | list[list[int]], limit: int) -> list[str | list[int]]:
    """An `input` field (a text, texts, token ids or lists of them) as one text or id list per item; an empty
    list or item, or more than limit items, refused naming input."""
    if isinstance(x, str):
        items: list[str | list[int]] = [x]
    elif x and all(isinstance(v, int) for v in x):
        items = [[int(v) for v in x]]  # type: ignore[arg-type]  # all ints, checked above
    else:
        items = list(x)  # type: ignore[arg-type]  # strings or id lists (the union allows no mix)
    if not items:
        raise InvalidRequestError("input must not be an empty list", param="input")
    if len(items) > limit:
        raise InvalidRequestError(f"input holds {len(items)} items; at most {limit}", param="input")
    empty = next((i for i, item in enumerate(items) if not item), None)
    if empty is not None:
        where = "" if isinstance(x, str) else f"[{empty}]"
        raise InvalidRequestError(f"input{where} must not be empty", param="input")
    return items

"""Pydantic models of the OpenAI requests we accept.

Unknown fields are ignored (clients add new ones), but every field we know is either honoured or
refused with a 400 naming it: a request must never be silently answered as a different request.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic_core import PydanticCustomError

from lantern.app.engine import InvalidRequestError, SamplingParams

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


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

    @field_validator("*", mode="after")
    @classmethod
    def _valid_unicode(cls, value: Any) -> Any:
        if _has_bad_text(value):
            raise PydanticCustomError(INVALID_UNICODE, "contains a lone UTF-16 surrogate (not valid Unicode text)")
        return value


class TextPart(_Lenient):
    type: Literal["text"]
    text: str


class ChatMessage(_Lenient):
    role: Literal["system", "user", "assistant", "developer"]
    content: str | list[TextPart] | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)

    def as_template_message(self) -> dict[str, str]:
        return {"role": "system" if self.role == "developer" else self.role, "content": self.text()}


class StreamOptions(_Lenient):
    include_usage: bool = False


def _check_template_kwargs(value: dict[str, Any] | None) -> dict[str, Any] | None:
    clash = sorted(set(value or {}) & _RESERVED_TEMPLATE_KWARGS)
    if clash:
        raise ValueError(f"may not set {', '.join(clash)} (the server sets them)")
    return value


def _refuse(param: str, why: str) -> InvalidRequestError:
    return InvalidRequestError(f"{param} {why}", param=param)


class _SamplingFields(_Lenient):
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

    @property
    def num_choices(self) -> int:
        return 1 if self.n is None else self.n

    def _sampling(self, max_tokens: int | None, logprobs: int | None, renames: dict[str, str]) -> SamplingParams:
        """SamplingParams with OpenAI's defaults for absent fields. `is None`, never `or`: an
        explicit 0 is a value to validate, not a request for the default."""

        def pick(value: Any, default: Any) -> Any:
            return default if value is None else value

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
                skip_special_tokens=self.skip_special_tokens,
                include_stop_str_in_output=self.include_stop_str_in_output,
                logit_bias=self.logit_bias,  # type: ignore[arg-type]  # str keys: SamplingParams parses them
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
    # Refused unless empty or the plain default: Lantern has no tool calling or constrained output.
    tools: list[Any] | None = None
    functions: list[Any] | None = None
    tool_choice: Any = None
    response_format: dict[str, Any] | None = None

    _template_kwargs = field_validator("chat_template_kwargs")(_check_template_kwargs)

    def refuse_unsupported(self) -> None:
        if self.tools or self.functions:
            raise _refuse("tools" if self.tools else "functions", "are not supported by this server")
        if self.tool_choice not in (None, "none", "auto"):
            raise _refuse("tool_choice", "is not supported by this server (there are no tools)")
        if self.response_format is not None and self.response_format.get("type", "text") != "text":
            raise _refuse("response_format", 'other than {"type": "text"} is not supported by this server')

    def sampling_params(self) -> SamplingParams:
        self.refuse_unsupported()
        if self.top_logprobs is not None and not self.logprobs:
            raise _refuse("top_logprobs", "requires logprobs to be true")
        k = (self.top_logprobs or 0) if self.logprobs else None
        renames = {"logprobs": "top_logprobs"}
        max_tokens = self.max_tokens
        if self.max_completion_tokens is not None:
            max_tokens, renames["max_tokens"] = self.max_completion_tokens, "max_completion_tokens"
        return self._sampling(max_tokens, k, renames)

    def template_messages(self) -> list[dict[str, str]]:
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
        return self._sampling(self.max_tokens, self.logprobs, {})

    def prompts(self) -> list[str | list[int]]:
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if not p or any(isinstance(x, list) and not x for x in p):
            raise InvalidRequestError("prompt must not be empty", param="prompt")
        if all(isinstance(x, int) for x in p):
            return [[int(x) for x in p]]  # type: ignore[arg-type]  # all ints, checked above
        return [x for x in p if not isinstance(x, int)]  # strings or id lists (the union allows no mix)


class TokenizeRequest(_Lenient):
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True
    chat_template_kwargs: dict[str, Any] | None = None

    _template_kwargs = field_validator("chat_template_kwargs")(_check_template_kwargs)


class DetokenizeRequest(_Lenient):
    model: str | None = None
    tokens: list[int]

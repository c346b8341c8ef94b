"""Sampling parameters with OpenAI field names, validated on construction.

Bounds (documented in the README): n 1..128, temperature 0..100, top_p (0, 1], top_k -1/0 (off)
or 1..2^31-1 (above the vocabulary = off), min_p 0..1, repetition_penalty (0, 100],
frequency/presence penalties -2..2, |seed| < 2^63, max_tokens 1..2^31-1 (then capped by the
context), min_tokens 0..max_tokens, at most 64 stop strings of at most 1024 characters (4096 in
all), at most 1024 stop_token_ids, logprobs and prompt_logprobs 0..20, logit_bias at most 1024 entries with values
-100..100, allowed_token_ids non-empty, thinking_token_budget 0..2^31-1 (reasoning tokens before
`</think>` is forced: app/engine/reasoning_budget.py). `structured` (a StructuredSpec) constrains
the output to a JSON schema, regex, choice list or grammar.
Token ids are checked against the model's vocabulary by the engine.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from lantern.app.engine.errors import InvalidRequestError

# OpenAI caps top_logprobs at 20; vLLM allows more but the cost grows with the vocabulary.
MAX_TOP_LOGPROBS = 20
MAX_N = 128  # OpenAI's limit on parallel samples
MAX_INT32 = 2**31 - 1
MAX_STOPS = 64
MAX_STOP_LEN = 1024
MAX_STOP_CHARS = 4096  # all stop strings together: each is searched for after every token
MAX_TOKEN_LIST = 1024  # stop_token_ids, logit_bias entries
MAX_ALLOWED_TOKENS = 1 << 20  # allowed_token_ids: a whitelist may name most of a big vocabulary


STRUCTURED_KINDS = ("json_schema", "json_object", "regex", "choice", "lark", "gbnf")


@dataclass(frozen=True)
class StructuredSpec:
    """A constraint on the generated text, compiled to a grammar by app/engine/structured.py.

    kind / value:
      json_schema: the schema (dict, or its JSON text)
      json_object: any JSON object (value ignored, None)
      regex:       the regular expression (str), matched against the whole output
      choice:      a list of strings; the output is exactly one of them
      lark:        a Lark grammar (llguidance's dialect: `%json{...}`, `%regex{...}` allowed)
      gbnf:        a llama.cpp GBNF grammar
    `param` names the request field the constraint came from, so compile errors can name it.
    `whitespace` (JSON kinds): None = the default (at most one space, or newlines plus an indent of
    up to 20, per gap: bounded, so a model cannot loop on whitespace forever), "" = none at all
    (compact JSON), else a regex for each gap between JSON tokens.
    """

    kind: str
    value: Any = None
    param: str | None = None
    whitespace: str | None = None

    def __post_init__(self) -> None:
        where = self.param or "structured"
        if self.kind not in STRUCTURED_KINDS:
            raise InvalidRequestError(
                f"unknown structured output kind {self.kind!r}; expected one of {', '.join(STRUCTURED_KINDS)}",
                param=where,
            )
        if self.kind == "json_schema":
            if isinstance(self.value, str):
                try:
                    parsed = json.loads(self.value)
                except ValueError as e:
                    raise InvalidRequestError(f"{where}: the JSON schema is not valid JSON: {e}", param=where) from None
                object.__setattr__(self, "value", parsed)
            if not isinstance(self.value, (dict, bool)):
                raise InvalidRequestError(f"{where} must be a JSON schema object", param=where)
        elif self.kind == "choice":
            if (
                not isinstance(self.value, (list, tuple))
                or not self.value
                or not all(isinstance(c, str) for c in self.value)
            ):
                raise InvalidRequestError(f"{where} must be a non-empty list of strings", param=where)
            object.__setattr__(self, "value", tuple(self.value))
        elif self.kind in ("regex", "lark", "gbnf"):
            if not isinstance(self.value, str) or not self.value.strip():
                raise InvalidRequestError(f"{where} must be a non-empty string", param=where)
        if self.whitespace is not None and not isinstance(self.whitespace, str):
            raise InvalidRequestError(f"{where}: the whitespace pattern must be a string", param=where)

    @property
    def key(self) -> str:
        """A text key for the compiled-grammar cache (param excluded: same grammar, same key). Keys
        keep their order: a schema's property order is the order the output writes them in."""
        if self.kind == "json_schema":
            body = json.dumps(self.value, separators=(",", ":"))
        elif self.kind == "choice":
            body = json.dumps(list(self.value))
        else:
            body = "" if self.value is None else str(self.value)
        ws = "" if self.whitespace is None else json.dumps(self.whitespace)
        return f"{self.kind}|{ws}|{body}"


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


@dataclass
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: disabled
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    seed: int | None = None
    max_tokens: int | None = 16
    min_tokens: int = 0
    stop: list[str] | str | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    logprobs: int | None = None  # None: off; k: chosen token plus k most likely
    # None: off; k: each prompt token's log-probability given the tokens before it, plus the k most likely there
    # (vLLM's prompt_logprobs; the server's echo with logprobs). Its prompt is computed whole: no prefix cache.
    prompt_logprobs: int | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    logit_bias: dict[int, float] | None = None  # token id -> added to its logit before sampling
    # Constrained decoding: a grammar the output must match, and/or a whitelist of token ids.
    structured: StructuredSpec | None = None
    allowed_token_ids: list[int] | None = None
    # Tokens the model may write inside its <think> block before </think> is forced (None: no limit).
    thinking_token_budget: int | None = None
    stop_list: list[str] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop_list = [self.stop]
        elif self.stop is None or isinstance(self.stop, (list, tuple)):
            self.stop_list = list(self.stop or [])
        else:
            raise InvalidRequestError("stop must be a string or a list of strings", param="stop")
        self.stop_token_ids = list(self.stop_token_ids or [])
        if self.top_k == -1:
            self.top_k = 0
        if self.logit_bias is not None:
            self.logit_bias = self._parse_bias(self.logit_bias)
        if self.allowed_token_ids is not None:
            self.allowed_token_ids = list(self.allowed_token_ids)
        self._validate()

    @staticmethod
    def _parse_bias(bias: object) -> dict[int, float]:
        if not isinstance(bias, dict):
            raise InvalidRequestError("logit_bias must be an object of token id -> bias", param="logit_bias")
        if len(bias) > MAX_TOKEN_LIST:
            raise InvalidRequestError(f"logit_bias may hold at most {MAX_TOKEN_LIST} entries", param="logit_bias")
        out: dict[int, float] = {}
        for key, value in bias.items():
            try:
                token = int(key)  # JSON object keys arrive as strings
            except (TypeError, ValueError):
                raise InvalidRequestError(
                    f"logit_bias keys must be token ids, got {key!r}", param="logit_bias"
                ) from None
            if token < 0 or not _is_number(value) or not -100.0 <= value <= 100.0:
                raise InvalidRequestError(
                    f"logit_bias maps token ids >= 0 to numbers in [-100, 100]; got {key!r}: {value!r}",
                    param="logit_bias",
                )
            out[token] = float(value)
        return out

    def _validate(self) -> None:
        def fail(name: str, why: str) -> None:
            raise InvalidRequestError(f"{name} {why}", param=name)

        if not _is_int(self.n) or not 1 <= self.n <= MAX_N:
            fail("n", f"must be an integer in [1, {MAX_N}], got {self.n!r}")
        for name in ("temperature", "top_p", "min_p", "repetition_penalty", "frequency_penalty", "presence_penalty"):
            if not _is_number(getattr(self, name)):
                fail(name, f"must be a finite number, got {getattr(self, name)!r}")
        if not 0 <= self.temperature <= 100:
            fail("temperature", f"must be in [0, 100], got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            fail("top_p", f"must be in (0, 1], got {self.top_p}")
        if not _is_int(self.top_k) or not 0 <= self.top_k <= MAX_INT32:
            fail("top_k", f"must be -1 or 0 (disabled) or an integer in [1, {MAX_INT32}], got {self.top_k!r}")
        if not 0.0 <= self.min_p <= 1.0:
            fail("min_p", f"must be in [0, 1], got {self.min_p}")
        if not 0 < self.repetition_penalty <= 100:
            fail("repetition_penalty", f"must be in (0, 100], got {self.repetition_penalty}")
        if not -2.0 <= self.frequency_penalty <= 2.0:
            fail("frequency_penalty", f"must be in [-2, 2], got {self.frequency_penalty}")
        if not -2.0 <= self.presence_penalty <= 2.0:
            fail("presence_penalty", f"must be in [-2, 2], got {self.presence_penalty}")
        if self.seed is not None and (not _is_int(self.seed) or abs(self.seed) >= 2**63):
            fail("seed", f"must be an integer with |seed| < 2^63, got {self.seed!r}")
        if self.max_tokens is not None and (not _is_int(self.max_tokens) or not 1 <= self.max_tokens <= MAX_INT32):
            fail("max_tokens", f"must be an integer in [1, {MAX_INT32}], got {self.max_tokens!r}")
        if not _is_int(self.min_tokens) or not 0 <= self.min_tokens <= MAX_INT32:
            fail("min_tokens", f"must be an integer >= 0, got {self.min_tokens!r}")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            fail("min_tokens", f"({self.min_tokens}) must be <= max_tokens ({self.max_tokens})")
        if len(self.stop_list) > MAX_STOPS:
            fail("stop", f"may hold at most {MAX_STOPS} strings")
        if any(not isinstance(s, str) or not s or len(s) > MAX_STOP_LEN for s in self.stop_list):
            fail("stop", f"must be a non-empty string or a list of non-empty strings of at most {MAX_STOP_LEN} chars")
        if sum(len(s) for s in self.stop_list) > MAX_STOP_CHARS:
            fail("stop", f"strings may hold at most {MAX_STOP_CHARS} characters together")
        stop_ids = self.stop_token_ids or []
        if len(stop_ids) > MAX_TOKEN_LIST:
            fail("stop_token_ids", f"may hold at most {MAX_TOKEN_LIST} ids")
        if any(not _is_int(t) or not 0 <= t <= MAX_INT32 for t in stop_ids):
            fail("stop_token_ids", "must be a list of non-negative integers")
        if self.structured is not None and not isinstance(self.structured, StructuredSpec):
            fail("structured", "must be a StructuredSpec")
        allowed = self.allowed_token_ids
        if allowed is not None and (
            not allowed or len(allowed) > MAX_ALLOWED_TOKENS or any(not _is_int(t) or t < 0 for t in allowed)
        ):
            fail("allowed_token_ids", f"must be a non-empty list of at most {MAX_ALLOWED_TOKENS} token ids >= 0")
        budget = self.thinking_token_budget
        if budget is not None and (not _is_int(budget) or not 0 <= budget <= MAX_INT32):
            fail("thinking_token_budget", f"must be an integer in [0, {MAX_INT32}], got {budget!r}")
        if self.logprobs is not None and (not _is_int(self.logprobs) or not 0 <= self.logprobs <= MAX_TOP_LOGPROBS):
            fail("logprobs", f"must be an integer in [0, {MAX_TOP_LOGPROBS}], got {self.logprobs!r}")
        k = self.prompt_logprobs
        if k is not None and (not _is_int(k) or not 0 <= k <= MAX_TOP_LOGPROBS):
            fail("prompt_logprobs", f"must be an integer in [0, {MAX_TOP_LOGPROBS}], got {k!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def uses_penalties(self) -> bool:
        return self.repetition_penalty != 1.0 or self.frequency_penalty != 0.0 or self.presence_penalty != 0.0

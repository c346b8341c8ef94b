"""What callers get back: per-request outputs holding one CompletionOutput per sample."""

from __future__ import annotations

from dataclasses import dataclass, field

from lantern.app.engine.errors import InvalidRequestError, RequestFailedError
from lantern.app.engine.sequence import TokenLogprob


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None  # "stop" | "length" | "abort"
    stop_reason: str | int | None = None  # the stop string or token id that ended it
    logprobs: list[TokenLogprob] | None = None
    # Streaming deltas: what is new since the previous RequestOutput for this request.
    text_delta: str = ""
    token_ids_delta: list[int] = field(default_factory=list)
    logprobs_delta: list[TokenLogprob] | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    num_cached_tokens: int = 0
    # SamplingParams.prompt_logprobs: each prompt token's logprob given those before it (None for the first), once
    # the prompt is computed; None when not asked for.
    prompt_logprobs: list[TokenLogprob | None] | None = None
    error: str | None = None  # set (with finished=True) when the engine failed this request
    # Set with `error` when the request itself is at fault (InvalidRequestError's param): a 400.
    error_param: str | None = None

    def raise_error(self) -> None:
        """The exception a caller gets for a failed request (no-op when it did not fail)."""
        if self.error is None:
            return
        if self.error_param is not None:
            raise InvalidRequestError(self.error, param=self.error_param)
        raise RequestFailedError(self.error)

    @property
    def num_generated_tokens(self) -> int:
        return sum(len(o.token_ids) for o in self.outputs)

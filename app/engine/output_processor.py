"""Per-request output state: detokenization, stop conditions, and streaming deltas."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from lantern.app.engine.detokenizer import IncrementalDetokenizer, StopStringMatcher
from lantern.app.engine.request import CompletionOutput, RequestOutput
from lantern.app.engine.sampling_params import SamplingParams
from lantern.app.engine.sequence import Sequence
from lantern.app.engine.structured import TokenConstraint


@dataclass
class SeqOutputState:
    seq: Sequence
    detok: IncrementalDetokenizer
    visible_len: int = 0  # chars of detok.text safe to show (stop strings held back / cut)
    sent_text: int = 0
    sent_tokens: int = 0
    constraint: TokenConstraint | None = None  # grammar matcher / allowed ids, advanced per token


@dataclass
class RequestState:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    max_tokens: int
    seqs: list[SeqOutputState] = field(default_factory=list)
    # n > 1: the other samples, queued once the first has computed the prompt (they then share
    # it through the prefix cache).
    pending_children: list[Sequence] = field(default_factory=list)
    arrival: float = field(default_factory=time.monotonic)
    first_token_time: float | None = None
    stop_matcher: StopStringMatcher | None = None  # built once, when the request has stop strings

    @property
    def finished(self) -> bool:
        return not self.pending_children and all(s.seq.is_finished for s in self.seqs)


class OutputProcessor:
    def __init__(self, tokenizer: Any, eos_token_ids: list[int], max_model_len: int):
        self.tokenizer = tokenizer
        self.eos = set(eos_token_ids)
        self.max_model_len = max_model_len

    def track(self, state: RequestState, seq: Sequence, constraint: TokenConstraint | None = None) -> None:
        detok = IncrementalDetokenizer(self.tokenizer, seq.prompt_token_ids, state.params.skip_special_tokens)
        state.seqs.append(SeqOutputState(seq, detok, constraint=constraint))

    @staticmethod
    def constraint(requests: dict[str, RequestState], seq: Sequence) -> TokenConstraint | None:
        """The grammar / allowed-ids constraint of a live sequence, if it has one."""
        state = requests.get(seq.request_id)
        return state.seqs[seq.index].constraint if state is not None else None

    def banned_tokens(self, seq: Sequence) -> list[int]:
        """EOS and stop token ids may not be drawn until min_tokens are out."""
        p = seq.params
        if len(seq.output_token_ids) >= p.min_tokens:
            return []
        return sorted(set(p.stop_token_ids or ()) | (set() if p.ignore_eos else self.eos))

    def append(self, state: RequestState, out: SeqOutputState, token: int) -> str | None:
        """Record a new token; returns a finish reason when the sequence must stop."""
        seq, p = out.seq, state.params
        seq.append_token(token)
        if out.constraint is not None:
            out.constraint.accept(token)
        n_out = len(seq.output_token_ids)
        new_text = out.detok.add(token)
        out.visible_len = len(out.detok.text)
        if p.stop_list and n_out >= p.min_tokens:
            if state.stop_matcher is None:
                state.stop_matcher = StopStringMatcher(p.stop_list, p.include_stop_str_in_output)
            stop, cut = state.stop_matcher.check(out.detok.text, len(new_text), floor=out.sent_text)
            out.visible_len = cut
            if stop is not None:
                seq.stop_reason = stop
                return "stop"
        reason = None
        if n_out >= p.min_tokens and token in (p.stop_token_ids or ()):
            seq.stop_reason = token
            reason = "stop"
        elif n_out >= p.min_tokens and token in self.eos and not p.ignore_eos:
            reason = "stop"
        elif out.constraint is not None and out.constraint.finished:
            reason = "stop"  # the grammar is complete: nothing but EOS could follow
        elif n_out >= state.max_tokens or seq.num_tokens >= self.max_model_len:
            reason = "length"
        if reason is not None:
            out.visible_len = len(out.detok.text)  # release text held back for a stop string
        return reason

    def make_output(self, state: RequestState, final_only: bool = False) -> RequestOutput:
        outputs = []
        for out in state.seqs:
            seq = out.seq
            text = out.detok.text[: out.visible_len]
            logprobs = seq.output_logprobs if state.params.logprobs is not None else None
            outputs.append(
                CompletionOutput(
                    index=seq.index,
                    text=text,
                    token_ids=list(seq.output_token_ids),
                    finish_reason=seq.finish_reason,
                    stop_reason=seq.stop_reason,
                    logprobs=list(logprobs) if logprobs is not None else None,
                    text_delta=text[out.sent_text :],
                    token_ids_delta=seq.output_token_ids[out.sent_tokens :],
                    logprobs_delta=logprobs[out.sent_tokens :] if logprobs is not None else None,
                )
            )
            out.sent_text = len(text)
            out.sent_tokens = len(seq.output_token_ids)
        outputs.sort(key=lambda o: o.index)
        cached = state.seqs[0].seq.num_cached_tokens if state.seqs else 0
        scored = state.seqs[0].seq.prompt_logprobs if state.seqs and state.params.prompt_logprobs is not None else None
        return RequestOutput(
            request_id=state.request_id,
            prompt=state.prompt,
            prompt_token_ids=state.prompt_token_ids,
            outputs=outputs,
            finished=state.finished,
            num_cached_tokens=cached,
            prompt_logprobs=scored,  # (the sequence's own list: filled while the prompt runs, then unchanged)
        )

"""Constrained decoding with llguidance: grammar compilation (cached) and per-sequence token masks.

Flow: a request's StructuredSpec is compiled once, off the engine thread where the front end allows
(the server compiles in a worker thread before queueing; `LLMEngine.validate` finds it cached),
into a template matcher. Each sequence gets a deep copy, advanced with every token it accepts.
Before each step the engine asks every constrained row for its packed bitmask (32 tokens per int32
word, bit i of word w = token 32w + i, llguidance's layout), computed for all rows at once by
llguidance's thread pool; the backend turns the bits into -inf on the row's forbidden logits.

Preemption by recompute keeps a sequence's tokens, so its matcher (which has consumed exactly those
tokens) stays valid; a matcher only moves in `TokenConstraint.accept`, after the token is final.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import OrderedDict
from typing import Any

import numpy as np

from lantern.app.engine.errors import InvalidRequestError
from lantern.app.engine.sampling_params import SamplingParams, StructuredSpec

logger = logging.getLogger(__name__)

# Between JSON tokens: nothing, one space or tab, or one or two newlines and an indent of up to 20
# (llama.cpp's bound for its JSON grammars). Unbounded whitespace lets a weak model loop forever.
DEFAULT_JSON_WHITESPACE = r"(?:[ \t]|\n{1,2}[ \t]{0,20})?"
CACHE_SIZE = 256  # compiled grammars kept (LRU); a tool-calling server reuses a few per tool set
_MAX_ERROR_CHARS = 600


def mask_words(vocab: int) -> int:
    """int32 words of one packed token bitmask."""
    return (vocab + 31) // 32


def pack_allowed(token_ids: list[int], vocab: int) -> np.ndarray:
    """A bitmask ([mask_words(vocab)] int32) with exactly `token_ids` allowed."""
    bits = np.zeros(mask_words(vocab) * 32, dtype=np.uint8)
    bits[np.asarray(token_ids, dtype=np.int64)] = 1
    return np.packbits(bits, bitorder="little").view(np.int32)


def unpack_mask(words: np.ndarray, vocab: int) -> np.ndarray:
    """bool [..., vocab] from packed int32 words (the numpy reference of what samplers do)."""
    w = np.ascontiguousarray(words, dtype=np.int32)
    bits = np.unpackbits(w.view(np.uint8), axis=-1, bitorder="little")
    return bits[..., :vocab].astype(bool)


class TokenConstraint:
    """One sequence's constraint: a grammar matcher and/or a fixed set of allowed token ids."""

    def __init__(self, matcher: Any | None, allowed: np.ndarray | None, param: str | None):
        self.matcher = matcher
        self.allowed = allowed  # packed words, or None
        self.param = param

    @property
    def finished(self) -> bool:
        """The grammar admits no further token (only EOS): the output is complete."""
        return self.matcher is not None and self.matcher.is_stopped()

    def accept(self, token: int) -> None:
        """Advance past a sampled token. A token the mask forbade means a broken invariant."""
        if self.matcher is None:
            return
        if not self.matcher.consume_token(token):
            # The mask allowed it, yet the matcher refuses it: llguidance maps constrained text that
            # spells a special token ("<|channel|>") to that token. The request's constraint cannot
            # be followed with this tokenizer: its own fault (a 400 naming it), not the engine's.
            why = self.matcher.get_error() or "the token is not allowed here"
            raise InvalidRequestError(
                f"{self.param or 'the structured output constraint'}: cannot be followed with this model's tokens "
                f"(token {token} was offered, then refused: {why[:200]}); text that spells a special token "
                "cannot be constrained",
                param=self.param or "response_format",
            )


class GrammarCompiler:
    """Compiles StructuredSpecs against one tokenizer; thread-safe, with an LRU cache."""

    def __init__(self, tokenizer: Any, vocab_size: int, eos_token_ids: list[int]):
        self._hf_tokenizer = tokenizer
        # The model's logits may be wider than the tokenizer (padded embeddings): masks cover both.
        self.vocab = max(vocab_size, len(tokenizer)) if hasattr(tokenizer, "__len__") else vocab_size
        self.words = mask_words(self.vocab)
        self._eos = list(eos_token_ids)
        self._lock = threading.Lock()
        self._ll_tokenizer: Any = None
        self._executor: Any = None
        self._cache: OrderedDict[str, Any] = OrderedDict()

    def _tokenizer(self) -> Any:
        """llguidance's view of the vocabulary, built on first use (about a second for 150k tokens)."""
        if self._ll_tokenizer is None:
            import llguidance.hf

            try:
                if hasattr(self._hf_tokenizer, "byte_tokens"):  # (a slow tokenizer of byte tokens: RWKV's World)
                    tok = _byte_tokenizer(self._hf_tokenizer, self.vocab, self._eos)
                else:
                    tok = llguidance.hf.from_tokenizer(
                        self._hf_tokenizer, n_vocab=self.vocab, eos_token=self._eos or None
                    )
            except Exception as exc:  # llguidance reads only fast (Rust) tokenizers
                raise InvalidRequestError(
                    f"constrained decoding is not available for this model's tokenizer: {exc}", param="structured"
                ) from None
            with self._lock:
                if self._ll_tokenizer is None:
                    self._ll_tokenizer = tok
        return self._ll_tokenizer

    def executor(self) -> Any:
        if self._executor is None:
            import llguidance

            self._executor = llguidance.LLExecutor()
        return self._executor

    def compile(self, spec: StructuredSpec) -> Any:
        """The template matcher of `spec` (fresh state, never advanced); InvalidRequestError naming
        spec.param when the schema, regex or grammar is invalid."""
        key = spec.key
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                return hit
        import llguidance

        where = spec.param or "structured"
        grammar = _grammar_text(spec, where)
        matcher = llguidance.LLMatcher(self._tokenizer(), grammar, log_level=0)
        if matcher.is_error():
            message = matcher.get_error().strip()
            if len(message) > _MAX_ERROR_CHARS:
                message = message[:_MAX_ERROR_CHARS] + "..."
            raise InvalidRequestError(f"{where} is not a valid {_NAMES[spec.kind]}: {message}", param=where)
        with self._lock:
            self._cache[key] = matcher
            while len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)
        return matcher

    def constraint(self, params: SamplingParams) -> TokenConstraint | None:
        """A fresh per-sequence constraint for `params`, or None when it has none."""
        spec, allowed = params.structured, params.allowed_token_ids
        if spec is None and not allowed:
            return None
        matcher = self.compile(spec).deep_copy() if spec is not None else None
        packed = pack_allowed(allowed, self.vocab) if allowed else None
        return TokenConstraint(matcher, packed, spec.param if spec is not None else "allowed_token_ids")

    def attach_masks(self, rows: list[Any], constraints: list[TokenConstraint | None]) -> None:
        """Set this step's token_bitmask on each SamplingRow whose sequence is constrained
        (computing a mask does not move the matcher: a failed step can be retried)."""
        live = [(row, c) for row, c in zip(rows, constraints, strict=True) if c is not None]
        if live:
            masks = self.fill_masks([c for _, c in live])
            for (row, c), mask in zip(live, masks):
                if not mask.any():  # a dead end: sampling would take a token the grammar refuses
                    raise InvalidRequestError(
                        f"{c.param or 'the structured output constraint'}: no token of this model can continue the "
                        "constrained text here (it needs a special token, or bytes the vocabulary cannot spell)",
                        param=c.param or "response_format",
                    )
                row.token_bitmask = mask

    def fill_masks(self, constraints: list[TokenConstraint]) -> np.ndarray:
        """Packed masks [len(constraints), words] int32 for this step, grammars computed in parallel."""
        out = np.full((len(constraints), self.words), -1, dtype=np.int32)
        with_grammar = [(c.matcher, i) for i, c in enumerate(constraints) if c.matcher is not None]
        if with_grammar:
            from llguidance.numpy import fill_next_token_bitmask_par

            fill_next_token_bitmask_par(self.executor(), with_grammar, out)
        for i, c in enumerate(constraints):
            if c.allowed is not None:
                out[i] &= c.allowed
        return out


_NAMES = {
    "json_schema": "JSON schema",
    "json_object": "JSON object constraint",
    "regex": "regular expression",
    "choice": "list of choices",
    "lark": "Lark grammar",
    "gbnf": "GBNF grammar",
}


def _grammar_text(spec: StructuredSpec, where: str) -> str:
    """llguidance's grammar text of a spec (compilation and checking happen in LLMatcher)."""
    from llguidance import LLMatcher, grammar_from

    try:
        if spec.kind in ("json_schema", "json_object"):
            schema = spec.value if spec.kind == "json_schema" else {"type": "object"}
            ws = DEFAULT_JSON_WHITESPACE if spec.whitespace is None else spec.whitespace
            # defaults < the schema's own "x-guidance" < overrides (llguidance's order).
            options = {"whitespace_flexible": False} if ws == "" else {"whitespace_pattern": ws}
            return LLMatcher.grammar_from_json_schema(json.dumps(schema), defaults=options)  # type: ignore[arg-type]
        if spec.kind == "regex":
            return LLMatcher.grammar_from_regex(spec.value)
        if spec.kind == "choice":
            # Lark string literals take JSON's escapes; non-ASCII stays literal.
            choices = " | ".join(json.dumps(c, ensure_ascii=False) for c in spec.value)
            return LLMatcher.grammar_from_lark("start: " + choices)
        if spec.kind == "lark":
            return LLMatcher.grammar_from_lark(spec.value)
        return grammar_from("gbnf", spec.value)
    except ValueError as exc:
        raise InvalidRequestError(f"{where} is not a valid {_NAMES[spec.kind]}: {exc}", param=where) from None


def _byte_tokenizer(tokenizer: Any, n_vocab: int, eos: Any) -> Any:
    """llguidance's view of a tokenizer that states each id's bytes (byte_tokens) rather than a tokenizer.json."""
    import llguidance

    tokens, special = tokenizer.byte_tokens(n_vocab)

    class _Bytes:
        def __init__(self) -> None:
            self.tokens, self.special_token_ids = tokens, special
            eos_id = eos[0] if isinstance(eos, (list, tuple)) and eos else eos
            self.eos_token_id = int(eos_id) if eos_id is not None else int(tokenizer.eos_token_id)
            self.bos_token_id = tokenizer.bos_token_id

        def __call__(self, text: str) -> list[int]:
            return tokenizer.encode(text, add_special_tokens=False)

    return llguidance.LLTokenizer(llguidance.TokenizerWrapper(_Bytes()))

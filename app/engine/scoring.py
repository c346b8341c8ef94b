"""Relevance scores (`--task score`): a cross-encoder or reranker reads a (query, document) pair as one input and
its classifier head (app/models/score_head.py) gives the pair's score.

Each pair is tokenized as the model's tokenizer encodes a text pair (BERT: [CLS] query [SEP] document [SEP] with
token types 0 then 1; XLM-RoBERTa: <s> query </s></s> document </s>), as sentence-transformers' CrossEncoder and
transformers do, or, for a prompt reranker (Qwen3-Reranker), put into its prompt template and tokenized whole; it
runs through the embedding side (app/engine/embedding.py) like any input. A pair longer than
the model's context loses tokens from the end of its document (the query is kept whole), as Cohere's and Jina's
rerank APIs truncate long documents (sentence-transformers' CrossEncoder cuts the longer of the two); a query that
leaves no room is refused. `max_document_tokens` cuts the document first (Cohere's max_tokens_per_doc).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from lantern.app.engine.embedding import EmbeddingOutput, require_embedder, run_offline
from lantern.app.engine.errors import InvalidRequestError


def _too_long(limit: int) -> InvalidRequestError:
    return InvalidRequestError(
        f"query is too long for this model's context of {limit} tokens with a document beside it",
        param="query",
        code="context_length_exceeded",
    )


def _past_context(count: int, limit: int) -> InvalidRequestError:
    return InvalidRequestError(
        f"input is {count} tokens; this model's context is {limit} tokens (truncate it or ask for truncation)",
        param="input",
        code="context_length_exceeded",
    )


def pair_tokenizer(engine: Any) -> Any:
    """The engine's tokenizers.Tokenizer for pairs: a private copy without the truncation and padding a
    tokenizer.json may save (transformers keeps them on its shared backend until one of its own calls resets
    them; read directly they would cut or pad a pair), never changed once made. None for a slow tokenizer."""
    embedder = engine.embedder
    own = getattr(embedder, "pair_tokenizer", None)
    if own is not None:
        return own
    backend = getattr(engine.tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    from tokenizers import Tokenizer

    own = Tokenizer.from_str(backend.to_str())
    own.no_truncation()
    own.no_padding()
    embedder.pair_tokenizer = own
    return own


def _cut(tok: Any, text: str, max_tokens: int) -> str:
    """text up to the end of its max_tokens-th token (by the tokens' offsets; no special tokens)."""
    offsets = tok.encode(text, add_special_tokens=False).offsets
    if len(offsets) <= max_tokens:
        return text
    return text[: offsets[max_tokens - 1][1]] if max_tokens > 0 else ""


_SLOTS = re.compile(r"\{(query|document|instruction)\}")


def _fill(template: str, values: dict[str, str]) -> str:
    """Each {slot} of the template replaced in one pass (a value's own braces are text, never a slot)."""
    return _SLOTS.sub(lambda m: values[m.group(1)], template)


def _prompt_parts(template: str, query: str, instruction: str | None) -> tuple[str, str]:
    """The prompt before and after the document: the caller's instruction in place of Qwen3-Reranker's default."""
    if instruction is not None:
        from lantern.app.models.qwen3_reranker import DEFAULT_INSTRUCTION

        if DEFAULT_INSTRUCTION not in template:
            why = "its prompt template states no instruction"
            raise InvalidRequestError(f"instruction applies to prompt rerankers (Qwen3-Reranker); {why}", "instruction")
        if not instruction.strip():
            raise InvalidRequestError("instruction must not be empty", param="instruction")
        template = template.replace(DEFAULT_INSTRUCTION, "{instruction}")
    before, after = template.split("{document}", 1)
    values = {"query": query, "instruction": instruction or "", "document": "{document}"}
    return _fill(before, values), _fill(after, values)


def _templated(
    engine: Any,
    template: str,
    query: str,
    document: str,
    max_document_tokens: int | None,
    truncate: bool,
    instruction: str | None,
) -> list[int]:
    """A prompt reranker's ids: the template with the pair in place, tokenized whole as its model card does; a
    document past the context cut at one of its own token boundaries (offsets) and the text tokenized again."""
    tok, limit = pair_tokenizer(engine), engine.max_model_len
    before, after = _prompt_parts(template, query, instruction)
    if tok is None:
        raise InvalidRequestError("a prompt reranker needs a fast tokenizer (tokenizer.json)", param="model")
    if max_document_tokens is not None:
        document = _cut(tok, document, max_document_tokens)
    for _ in range(4):  # a cut re-tokenizes to its tokens; a merge across the cut may need one more round
        enc = tok.encode(before + document + after, add_special_tokens=False)
        over = len(enc.ids) - limit
        if over <= 0:
            return list(enc.ids)
        if not truncate:
            raise _past_context(len(enc.ids), limit)
        start, end = len(before), len(before) + len(document)
        inside = [(a, b) for a, b in enc.offsets if a >= start and b <= end and b > a]
        keep = len(inside) - over
        if keep < 1:
            raise _too_long(limit)
        document = document[: inside[keep - 1][1] - start]
    raise _too_long(limit)


def tokenize_pair(
    engine: Any,
    query: str,
    document: str,
    max_document_tokens: int | None = None,
    truncate: bool = True,
    instruction: str | None = None,
) -> tuple[list[int], list[int] | None]:
    """(ids, token types) of the pair for the engine's cross-encoder; types None where the model has no
    token-type table (RoBERTa's single row, decoders). InvalidRequestError naming query when the query alone
    leaves no room for a document; with truncate False, naming input when the pair is past the context at all.
    instruction: a prompt reranker's task in place of its default ("Given a web search query, ...").

    The two texts are encoded apart, the document's tokens cut, then joined by the tokenizer's own pair template
    (tokenizers' post_process), on pair_tokenizer's private copy: exact cuts, and no tokenizer state shared with
    other threads' calls."""
    limit = engine.max_model_len
    template = getattr(engine.embedder, "pair_template", None)
    if template is not None:  # a prompt reranker (Qwen3-Reranker): one text, no segments
        return _templated(engine, template, query, document, max_document_tokens, truncate, instruction), None
    if instruction is not None:
        why = "this model is a cross-encoder"
        raise InvalidRequestError(f"instruction applies to prompt rerankers (Qwen3-Reranker); {why}", "instruction")
    tok = pair_tokenizer(engine)
    if tok is None:  # (a slow tokenizer: no cut, the pair as it encodes)
        enc = engine.tokenizer(query, document)
        ids, types = list(enc["input_ids"]), enc.get("token_type_ids")
        if len(ids) > limit:
            raise _past_context(len(ids), limit)
    else:
        first = tok.encode(query, add_special_tokens=False)
        second = tok.encode(document, add_special_tokens=False)
        room = limit - tok.num_special_tokens_to_add(True) - len(first.ids)
        if room < (1 if second.ids else 0):
            raise _too_long(limit)
        wanted = min(len(second.ids), max_document_tokens or len(second.ids))
        if not truncate and room < wanted:
            raise _past_context(limit - room + wanted, limit)
        if min(room, wanted) < len(second.ids):
            second.truncate(min(room, wanted))
        pair = tok.post_process(first, second, add_special_tokens=True)
        ids, types = list(pair.ids), list(pair.type_ids)
    encoder = engine.model_config.encoder
    if types is None or getattr(encoder, "type_vocab_size", 0) < 2 or not any(types):
        return ids, None
    return ids, list(types)


def pairs_of(
    text_1: str | Sequence[str], text_2: str | Sequence[str], names: tuple[str, str] = ("text_1", "text_2")
) -> list[tuple[str, str]]:
    """The pairs a score request names (vLLM's /score): one text with one, one with each of a list, or two lists
    of one length zipped."""
    one, two = (
        ([text_1] if isinstance(text_1, str) else list(text_1)),
        ([text_2] if isinstance(text_2, str) else list(text_2)),
    )
    if not one:
        raise InvalidRequestError(f"{names[0]} must not be an empty list", param=names[0])
    if not two:
        raise InvalidRequestError(f"{names[1]} must not be an empty list", param=names[1])
    if len(one) == 1:
        return [(one[0], t) for t in two]
    if len(one) != len(two):
        raise InvalidRequestError(
            f"{names[0]} holds {len(one)} texts and {names[1]} {len(two)}: give one {names[0]}, or lists of one length",
            param=names[1],
        )
    return list(zip(one, two))


def score_offline(
    engine: Any, text_1: str | Sequence[str], text_2: str | Sequence[str], instruction: str | None = None
) -> list[EmbeddingOutput]:
    """LLM.score: each pair's output (its `.score`), in pairs_of's order, on the calling thread."""
    embedder = require_embedder(engine, "score")
    inputs = [tokenize_pair(engine, a, b, instruction=instruction) for a, b in pairs_of(text_1, text_2)]
    return run_offline(engine, embedder, inputs)

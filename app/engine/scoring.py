"""Relevance scores (`--task score`): a cross-encoder or reranker reads a (query, document) pair as one input and
its classifier head (app/models/score_head.py) gives the pair's score.

Each pair is tokenized as the model's tokenizer encodes a text pair (BERT: [CLS] query [SEP] document [SEP] with
token types 0 then 1; XLM-RoBERTa: <s> query </s></s> document </s>), as sentence-transformers' CrossEncoder and
transformers do, and runs through the embedding side (app/engine/embedding.py) like any input. A pair longer than
the model's context loses tokens from the end of its document (the query is kept whole), as Cohere's and Jina's
rerank APIs truncate long documents (sentence-transformers' CrossEncoder cuts the longer of the two); a query that
leaves no room is refused. `max_document_tokens` cuts the document first (Cohere's max_tokens_per_doc).
"""

from __future__ import annotations

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


def tokenize_pair(
    engine: Any, query: str, document: str, max_document_tokens: int | None = None
) -> tuple[list[int], list[int] | None]:
    """(ids, token types) of the pair for the engine's cross-encoder; types None where the model has no
    token-type table (RoBERTa's single row, decoders). InvalidRequestError naming query when the query alone
    leaves no room for a document.

    The two texts are encoded apart, the document's tokens cut, then joined by the tokenizer's own pair template
    (tokenizers' post_process): exact cuts, and no use of the tokenizer's truncation option, which is state on the
    shared tokenizer (set by one caller it would truncate another thread's prompt)."""
    tokenizer, limit = engine.tokenizer, engine.max_model_len
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:  # (a slow tokenizer: no cut, the pair as it encodes)
        enc = tokenizer(query, document)
        ids, types = list(enc["input_ids"]), enc.get("token_type_ids")
        if len(ids) > limit:
            raise _too_long(limit)
    else:
        first = backend.encode(query, add_special_tokens=False)
        second = backend.encode(document, add_special_tokens=False)
        room = limit - backend.num_special_tokens_to_add(True) - len(first.ids)
        if room < (1 if second.ids else 0):
            raise _too_long(limit)
        keep = min(room, len(second.ids), max_document_tokens or len(second.ids))
        if keep < len(second.ids):
            second.truncate(keep)
        pair = backend.post_process(first, second, add_special_tokens=True)
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


def score_offline(engine: Any, text_1: str | Sequence[str], text_2: str | Sequence[str]) -> list[EmbeddingOutput]:
    """LLM.score: each pair's output (its `.score`), in pairs_of's order, on the calling thread."""
    embedder = require_embedder(engine, "score")
    inputs = [tokenize_pair(engine, a, b) for a, b in pairs_of(text_1, text_2)]
    return run_offline(engine, embedder, inputs)

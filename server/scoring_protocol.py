"""Request bodies of the routes of scoring models (server/routes/rerank.py, server/routes/classify.py).

- Rerank (POST /v1/rerank, /rerank, /v2/rerank): the shape Cohere's SDKs (v1 and v2), Jina's API, vLLM, TEI-style
  clients, LangChain's rerankers and Open WebUI's external reranker send: `query`, `documents` (strings, or Jina's /
  Cohere v1's {"text": ...} objects), `top_n`, `return_documents`, Cohere v2's `max_tokens_per_doc`; and Lantern's
  `instruction` (here and on score): Qwen3-Reranker's task in place of its default, refused for cross-encoders.
- TEI's rerank (POST /rerank with `texts`): `query`, `texts`, `raw_scores`, `return_text`, `truncate`.
- Score (POST /v1/score, /score): vLLM's `text_1` / `text_2` (a text or a list each).
- Classify (POST /classify, /v1/classify): vLLM's `input` (a text, texts, token ids or lists of them).

Unlike the OpenAI routes (whose audited extra fields are listed in request_fields.py), these bodies are closed: a
field they do not name is refused with a 400 naming it, so that an option such as Cohere v1's `rank_fields` or
`max_chunks_per_doc`, or Cohere's `relevant_spans`, is never silently dropped.
"""

from __future__ import annotations

from pydantic import ConfigDict, Field, field_validator

from lantern.app.engine import InvalidRequestError
from lantern.app.engine.scoring import pairs_of
from lantern.server.protocol import Lenient, input_items

MAX_DOCUMENTS = 10_000  # Cohere's limit on documents per rerank request


class _Closed(Lenient):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)  # (Lenient's checks, unknown fields refused)


class TextDocument(_Closed):
    """Jina's {"text"} and Cohere v1's document objects: `text` is what is ranked (Cohere ranks the other keys only
    when rank_fields names them, which is refused), so a title or id beside it is carried, not scored."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False)
    text: str


class RerankRequest(_Closed):
    model: str | None = None
    query: str
    documents: list[str | TextDocument]
    top_n: int | None = Field(default=None, ge=0)  # (0: all, as vLLM reads it)
    return_documents: bool = True  # (Jina's and vLLM's default; Cohere v1's is false, its SDK sends it when given)
    max_tokens_per_doc: int | None = Field(default=None, ge=1)
    instruction: str | None = None  # Lantern's: a prompt reranker's (Qwen3-Reranker's) task, refused elsewhere
    priority: int = 0  # Cohere v2: an order under load; one queue here, so only the default is served
    user: str | None = None

    @field_validator("priority")
    @classmethod
    def _one_priority(cls, value: int) -> int:
        if value != 0:
            raise ValueError("this server has one queue: only priority 0 is served")
        return value

    def texts(self) -> list[str]:
        """The documents as texts; an empty query or list refused naming its field."""
        if not self.query:
            raise InvalidRequestError("query must not be empty", param="query")
        if not self.documents:
            raise InvalidRequestError("documents must not be an empty list", param="documents")
        if len(self.documents) > MAX_DOCUMENTS:
            raise InvalidRequestError(
                f"documents holds {len(self.documents)} items; at most {MAX_DOCUMENTS}", param="documents"
            )
        return [d if isinstance(d, str) else d.text for d in self.documents]


class TEIRerankRequest(_Closed):
    """Hugging Face text-embeddings-inference's POST /rerank (its clients: Haystack's TEI ranker, LlamaIndex's):
    `texts` instead of `documents`, answered as a bare list."""

    model: str | None = None  # (not TEI's; sent by clients that name one)
    query: str
    texts: list[str]
    raw_scores: bool = False  # the logits, not the sigmoid of them
    return_text: bool = False
    truncate: bool | None = None  # TEI: refuse an input past the context unless asked to cut it
    truncation_direction: str = "Right"

    @field_validator("truncation_direction")
    @classmethod
    def _right_only(cls, value: str) -> str:
        if value.lower() != "right":
            raise ValueError("only Right truncation (the end of a document) is served")
        return value

    def checked(self) -> list[str]:
        if not self.query:
            raise InvalidRequestError("query must not be empty", param="query")
        if not self.texts:
            raise InvalidRequestError("texts must not be an empty list", param="texts")
        if len(self.texts) > MAX_DOCUMENTS:
            raise InvalidRequestError(f"texts holds {len(self.texts)} items; at most {MAX_DOCUMENTS}", param="texts")
        return list(self.texts)


class ScoreRequest(_Closed):
    model: str | None = None
    text_1: str | list[str]
    text_2: str | list[str]
    instruction: str | None = None  # as RerankRequest's
    user: str | None = None

    def pairs(self) -> list[tuple[str, str]]:
        """The (text_1, text_2) pairs the request names (scoring.pairs_of), each list at most MAX_DOCUMENTS long."""
        for name in ("text_1", "text_2"):
            value = getattr(self, name)
            if not isinstance(value, str) and len(value) > MAX_DOCUMENTS:
                raise InvalidRequestError(f"{name} holds {len(value)} texts; at most {MAX_DOCUMENTS}", param=name)
        return pairs_of(self.text_1, self.text_2)


class ClassifyRequest(_Closed):
    model: str | None = None
    input: str | list[str] | list[int] | list[list[int]]
    user: str | None = None

    def inputs(self) -> list[str | list[int]]:
        """One text or token-id list per input; empty ones refused naming input."""
        return input_items(self.input, MAX_DOCUMENTS)

"""Public engine API. Front ends import from here and from lantern.app.config only."""

from lantern.app.config import EngineConfig
from lantern.app.engine import reasoning  # <think> splitting, shared by the server and the TUI
from lantern.app.engine.async_engine import AsyncEngine
from lantern.app.engine.embedding import EmbeddingOutput
from lantern.app.engine.engine import LLM, LLMEngine
from lantern.app.engine.errors import EngineDeadError, InvalidRequestError, RequestFailedError
from lantern.app.engine.request import CompletionOutput, RequestOutput
from lantern.app.engine.sampling_params import SamplingParams, StructuredSpec
from lantern.app.engine.sequence import TokenLogprob

__all__ = [
    "LLM",
    "AsyncEngine",
    "CompletionOutput",
    "EmbeddingOutput",
    "EngineConfig",
    "EngineDeadError",
    "InvalidRequestError",
    "LLMEngine",
    "RequestFailedError",
    "RequestOutput",
    "SamplingParams",
    "StructuredSpec",
    "TokenLogprob",
    "reasoning",
]

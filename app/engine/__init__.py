"""Public engine API. Front ends import from here and from lantern.app.config only."""

from lantern.app.config import EngineConfig
from lantern.app.engine.async_engine import AsyncEngine
from lantern.app.engine.engine import LLM, LLMEngine
from lantern.app.engine.errors import EngineDeadError, InvalidRequestError, RequestFailedError
from lantern.app.engine.request import CompletionOutput, RequestOutput
from lantern.app.engine.sampling_params import SamplingParams
from lantern.app.engine.sequence import TokenLogprob

__all__ = [
    "LLM",
    "AsyncEngine",
    "CompletionOutput",
    "EngineConfig",
    "EngineDeadError",
    "InvalidRequestError",
    "LLMEngine",
    "RequestFailedError",
    "RequestOutput",
    "SamplingParams",
    "TokenLogprob",
]

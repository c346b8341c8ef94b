"""Public engine API. Front ends import from here and from app.config only."""
from app.config import EngineConfig
from app.engine.async_engine import AsyncEngine
from app.engine.engine import LLM, LLMEngine
from app.engine.errors import EngineDeadError, InvalidRequestError, RequestFailedError
from app.engine.request import CompletionOutput, RequestOutput
from app.engine.sampling_params import SamplingParams
from app.engine.sequence import TokenLogprob

__all__ = [
    "AsyncEngine", "CompletionOutput", "EngineConfig", "EngineDeadError", "InvalidRequestError", "LLM",
    "LLMEngine", "RequestFailedError", "RequestOutput", "SamplingParams", "TokenLogprob",
]

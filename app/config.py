"""Engine configuration: every knob the engine, CLI and server share, with defaults."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any


@dataclass
class BackendOptions:
    """Options only a backend reads; the engine core passes them through untouched."""

    tensor_parallel_size: int = 1  # ranks (one process each) sharing the model; torch backend
    enforce_eager: bool = False  # no CUDA graphs for decode steps (torch backend on CUDA)
    num_threads: int | None = None  # CPU threads for tensor work (CPU backends); None: the library's default
    compile_decode: bool = False  # decode steps through torch.compile (torch backend on a CPU; --compile)

    def __post_init__(self) -> None:
        if self.tensor_parallel_size < 1:
            raise ValueError(f"tensor_parallel_size has an invalid value: {self.tensor_parallel_size!r}")
        if self.num_threads is not None and self.num_threads < 1:
            raise ValueError(f"num_threads has an invalid value: {self.num_threads!r}")


BACKEND_OPTION_NAMES = {f.name for f in dataclasses.fields(BackendOptions)}


@dataclass
class EngineConfig:
    model: str
    backend: str = "auto"  # "mlx" | "torch" | "auto"
    dtype: str = "auto"  # "float32" | "float16" | "bfloat16" | "auto"
    block_size: int = 16
    max_num_seqs: int = 256
    max_num_batched_tokens: int | None = None  # tokens per step; None: the backend's default_step_tokens
    prefill_chunk_size: int = 512
    max_model_len: int | None = None  # default: the model's context length, capped by the KV pool
    kv_cache_memory_mb: int | None = None  # explicit KV budget
    gpu_memory_fraction: float = 0.25  # else: this share of the memory free after loading weights
    num_kv_blocks: int | None = None  # exact block count (tests); overrides the memory budget
    enable_prefix_caching: bool = True
    # Decode steps scheduled ahead, the host's work per step hidden behind the device's (app/engine/step_ahead.py).
    # None: where the backend's steps run asynchronously (CUDA, MLX); True also elsewhere (tests); False: never.
    async_scheduling: bool | None = None
    # Models with recurrent layers: snapshots of their state kept for the prefix cache (None: by memory;
    # 0: no prefix caching for such models). app/engine/state_cache.py says where they are taken.
    prefix_cache_states: int | None = None
    chat_template: str | None = None  # overrides the model's template
    quantization: str | None = None  # "q4" | "q8": in-situ quantization of float weights (--isq)
    task: str = "auto"  # "generate" | "embed" | "score" | "classify" | "auto": the folder's (app/models/pooling.py)
    pooling: str = "auto"  # embeddings: "last" | "mean" | "cls" | "auto": the folder's, else by architecture
    backend_options: BackendOptions = field(default_factory=BackendOptions)  # passed to the backend as is

    @classmethod
    def from_options(cls, **options: Any) -> EngineConfig:
        """Flat keyword options (what LLM(...), AsyncEngine(...) and the CLI take), the backend's
        own (tensor_parallel_size, enforce_eager, num_threads) gathered into backend_options."""
        backend = {k: options.pop(k) for k in list(options) if k in BACKEND_OPTION_NAMES}
        if backend:
            options["backend_options"] = BackendOptions(**backend)
        return cls(**options)

    def __post_init__(self) -> None:
        checks = {
            "block_size": self.block_size >= 1,
            "max_num_seqs": self.max_num_seqs >= 1,
            "max_num_batched_tokens": self.max_num_batched_tokens is None or self.max_num_batched_tokens >= 1,
            "prefill_chunk_size": self.prefill_chunk_size >= 1,
            "gpu_memory_fraction": 0.0 < self.gpu_memory_fraction <= 1.0,
            "max_model_len": self.max_model_len is None or self.max_model_len >= 2,
            "kv_cache_memory_mb": self.kv_cache_memory_mb is None or self.kv_cache_memory_mb >= 1,
            "num_kv_blocks": self.num_kv_blocks is None or self.num_kv_blocks >= 1,
            "prefix_cache_states": self.prefix_cache_states is None or self.prefix_cache_states >= 0,
        }
        for name, ok in checks.items():
            if not ok:
                raise ValueError(f"{name} has an invalid value: {getattr(self, name)!r}")
        if self.quantization not in (None, "q4", "q8", "fp8"):
            raise ValueError(f"quantization must be q4, q8 or fp8; got {self.quantization!r}")
        if self.task not in ("auto", "generate", "embed", "score", "classify"):
            raise ValueError(f"task must be auto, generate, embed, score or classify; got {self.task!r}")
        if self.pooling not in ("auto", "last", "mean", "cls"):
            raise ValueError(f"pooling must be auto, last, mean or cls; got {self.pooling!r}")
        if self.dtype not in ("auto", "float32", "float16", "bfloat16"):
            raise ValueError(f"dtype must be auto, float32, float16 or bfloat16; got {self.dtype!r}")

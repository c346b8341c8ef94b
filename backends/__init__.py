"""Backend selection: one name -> one implementation of backends.base.Backend."""
from __future__ import annotations

import importlib.util
import platform

from backends.base import Backend

BACKENDS = ("mlx", "torch")


def _mlx_available() -> bool:
    return importlib.util.find_spec("mlx") is not None


def pick_backend(name: str = "auto") -> str:
    """'auto': MLX on Apple Silicon, torch on CUDA, otherwise whichever is installed (MLX first)."""
    if name != "auto":
        if name not in BACKENDS:
            raise ValueError(f"backend must be one of auto, {', '.join(BACKENDS)}; got {name!r}")
        return name
    if platform.system() == "Darwin" and platform.machine() == "arm64" and _mlx_available():
        return "mlx"
    if importlib.util.find_spec("torch") is not None:
        import torch

        if torch.cuda.is_available():
            return "torch"
    if _mlx_available():
        return "mlx"
    raise RuntimeError("no backend available: install lantern[mlx] or lantern[torch]")


def create_backend(name: str = "auto", tensor_parallel_size: int = 1) -> Backend:
    chosen = pick_backend(name)
    if chosen == "mlx":
        if not _mlx_available():
            raise RuntimeError("backend 'mlx' needs MLX: pip install 'lantern[mlx]'")
        if tensor_parallel_size != 1:
            raise ValueError("tensor parallelism is implemented by the torch backend only")
        from backends.mlx.runner import MLXBackend

        return MLXBackend()
    if importlib.util.find_spec("torch") is None:
        raise RuntimeError("backend 'torch' needs PyTorch: pip install 'lantern[torch]'")
    from backends.torch.runner import TorchBackend

    return TorchBackend(tensor_parallel_size=tensor_parallel_size)

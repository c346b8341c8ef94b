"""Kernel tests run Triton's interpreter on CPU unless a CUDA device is present."""

import os

if not os.environ.get("CUDA_VISIBLE_DEVICES") and "TRITON_INTERPRET" not in os.environ:
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    if not has_cuda:
        os.environ["TRITON_INTERPRET"] = "1"  # must be set before triton is imported

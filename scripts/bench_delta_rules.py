"""Speed of the delta rules' chunked prefill (one sequence), Lantern's against transformers' own torch implementations
on the same inputs in one run: the gated delta rule (Qwen3-Next / Qwen3.5, OLMo Hybrid, Lara Mini: a decay per head)
and Kimi Delta Attention (Kimi Linear: a decay per key channel), on torch and MLX, float32.

  python scripts/bench_delta_rules.py                          # L=1024, 8 heads of 128
  python scripts/bench_delta_rules.py --length 4096 --heads 32
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _seconds(run: Callable[[], object], repeat: int) -> float:
    run()
    start = time.perf_counter()
    for _ in range(repeat):
        run()
    return (time.perf_counter() - start) / repeat


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--length", type=int, default=1024)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    import mlx.core as mx
    import torch
    from transformers.models.kimi_linear.modeling_kimi_linear import chunk_kimi_delta_attention
    from transformers.models.qwen3_next.modeling_qwen3_next import torch_chunk_gated_delta_rule

    from lantern.backends.mlx import gated_delta as mlx_gdn
    from lantern.backends.mlx import kimi_delta as mlx_kda
    from lantern.backends.torch import gated_delta, kimi_delta

    torch.manual_seed(0)
    length, heads, dim = args.length, args.heads, args.dim
    q, k, v = (torch.randn(length, heads, dim) for _ in range(3))
    beta, state = torch.rand(length, heads), torch.zeros(heads, dim, dim)
    qn, kn = gated_delta.l2norm(q) * dim**-0.5, gated_delta.l2norm(k)
    cases = (
        (
            "gated delta rule",
            -torch.rand(length, heads),
            gated_delta.chunked,
            mlx_gdn.chunked,
            torch_chunk_gated_delta_rule,
        ),
        (
            "Kimi Delta Attention",
            -torch.rand(length, heads, dim),
            kimi_delta.chunked,
            mlx_kda.chunked,
            chunk_kimi_delta_attention,
        ),
    )
    print(f"chunked prefill, one sequence of {length} tokens, {heads} heads of {dim}, float32 (ms)")
    for rule, g, torch_rule, mlx_rule, reference in cases:
        inputs = (q[None], k[None], v[None], g[None], beta[None])
        ref = _seconds(lambda f=reference, a=inputs: f(*a, use_qk_l2norm_in_kernel=True), args.repeat)
        lt = _seconds(lambda f=torch_rule, g=g: f(qn, kn, v, g, beta, state), args.repeat)
        arrays = [mx.array(t.numpy()) for t in (qn, kn, v, g, beta, state)]
        lm = _seconds(lambda f=mlx_rule, a=arrays: mx.eval(*f(*a)), args.repeat)
        speedup = ref / lt
        print(
            f"  {rule}: transformers {ref * 1e3:.0f}, Lantern torch {lt * 1e3:.0f} ({speedup:.2f}x), MLX {lm * 1e3:.0f}"
        )


if __name__ == "__main__":
    main()

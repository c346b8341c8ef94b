"""Where a bs=1 decode step's time goes on a GPU: the engine's wall time per token against the GPU's
busy time per token, and the GPU time per kernel (torch.profiler), for a `lantern bench` shape.

  python scripts/profile_decode.py --shape 8b --isq q4          # the issue's 8B int4 goal, on CUDA
  python scripts/profile_decode.py --shape tiny --tokens 8       # a CPU smoke run (no GPU timings)

bs=1 tokens/s is measured as `lantern bench` does ((n - 1) / (t(n) - t(1)), greedy and T=1.0), and set
against the HBM roofline of the bytes the backend holds per weight. CUDA events around each forward
(the graph replay, or the eager forward) and around each execute (forward + sampling) give the GPU's
share of a step; the rest of the wall time is the host (scheduler, batch building, uploads, the token's
download, detokenizing) while the GPU waits. The kernel table sums each kernel's device time over the
profiled steps (kernels inside CUDA graph replays are recorded by CUPTI like eager ones).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main(argv: list[str] | None = None) -> dict:
    from lantern.app.bench import SHAPES, ShapeCost, device_peaks, prepare_model
    from lantern.app.engine import LLM, SamplingParams

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="8b", choices=sorted(SHAPES))
    p.add_argument("--isq", default=None, choices=("q4", "q8", "fp8"))
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--tokens", type=int, default=128, help="tokens per timed generation")
    p.add_argument("--profile-tokens", type=int, default=32, help="tokens under torch.profiler")
    p.add_argument("--enforce-eager", action="store_true")
    p.add_argument("--top", type=int, default=25, help="kernels listed")
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = getattr(torch, args.dtype)
    shape = SHAPES[args.shape]
    path = prepare_model(args.shape, dtype, device)
    t0 = time.perf_counter()
    llm = LLM(
        str(path),
        backend="torch",
        dtype=args.dtype,
        max_num_seqs=1,
        enforce_eager=args.enforce_eager,
        enable_prefix_caching=False,
        quantization=args.isq,
    )
    print(f"loaded {args.shape} {args.dtype} isq={args.isq} in {time.perf_counter() - t0:.1f} s", flush=True)
    prompt = [[3 + (i * 7919) % (shape["vocab_size"] - 3) for i in range(args.prompt_len)]]

    def generate(n: int, temperature: float) -> float:
        params = [SamplingParams(temperature=temperature, seed=0, max_tokens=n, ignore_eos=True)]
        t = time.perf_counter()
        llm.generate(prompt, params)
        return time.perf_counter() - t

    generate(4, 0.0)  # warm: compile, graphs
    generate(4, 1.0)
    result: dict = {"shape": args.shape, "dtype": args.dtype, "isq": args.isq, "device": str(device)}
    for name, temp in (("greedy", 0.0), ("sampled", 1.0)):
        result[f"{name}_bs1_tok_s"] = (args.tokens - 1) / (generate(args.tokens, temp) - generate(1, temp))
    peaks = device_peaks(device, dtype)
    elt = llm.engine.weight_bytes / llm.engine.num_params if args.isq else dtype.itemsize
    roof = ShapeCost.of(shape, elt).bs1_roofline(args.prompt_len + args.tokens / 2, peaks)
    result["bs1_roofline_tok_s"] = roof
    result["peaks"] = {"bandwidth": peaks.bandwidth, "flops": peaks.flops, "source": peaks.source}
    result["greedy_fraction_of_roofline"] = result["greedy_bs1_tok_s"] / roof
    print(
        f"bs=1: greedy {result['greedy_bs1_tok_s']:.1f} tok/s ({100 * result['greedy_fraction_of_roofline']:.0f}% of "
        f"{roof:.0f}), T=1.0 {result['sampled_bs1_tok_s']:.1f} tok/s; {elt:.3f} bytes/weight",
        flush=True,
    )
    if device.type == "cuda":
        result.update(gpu_share(llm, generate, args.profile_tokens))
        result["kernels"] = kernel_table(generate, args.profile_tokens, args.top)
    llm.engine.shutdown()
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return result


def gpu_share(llm, generate, tokens: int) -> dict:
    """Per decode step: wall time, GPU time of the forward and of forward + sampling (CUDA events)."""
    backend = llm.engine.backend
    spans: dict[str, list] = {"forward": [], "execute": []}

    def timed(name: str, fn):
        def wrapper(*a, **kw):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            out = fn(*a, **kw)
            end.record()
            spans[name].append((start, end))
            return out

        return wrapper

    forward, execute = backend._forward, backend.execute
    backend._forward, backend.execute = timed("forward", forward), timed("execute", execute)
    try:
        wall = generate(tokens + 1, 0.0)
        for v in spans.values():  # the prefill's step: before the first decode step
            del v[: len(v) - tokens]
        wall -= generate(1, 0.0)
    finally:
        backend._forward, backend.execute = forward, execute
    torch.cuda.synchronize()
    per = {k: sum(s.elapsed_time(e) for s, e in v[:tokens]) / tokens * 1e3 for k, v in spans.items()}
    out = {
        "wall_us_per_token": wall / tokens * 1e6,
        "forward_gpu_us_per_step": per["forward"],
        "execute_gpu_us_per_step": per["execute"],
        "steps_timed": tokens,
    }
    print(
        f"per token: wall {out['wall_us_per_token']:.0f} us; GPU: forward {per['forward']:.0f} us, "
        f"forward + sampling {per['execute']:.0f} us (events around each call; the rest is the host)",
        flush=True,
    )
    return out


def kernel_table(generate, tokens: int, top: int) -> list[dict]:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        generate(tokens, 0.0)
    torch.cuda.synchronize()
    rows = [e for e in prof.key_averages() if e.self_device_time_total > 0]
    rows.sort(key=lambda e: e.self_device_time_total, reverse=True)
    total = sum(e.self_device_time_total for e in rows)
    print(f"GPU time over {tokens} tokens: {total / 1e3:.2f} ms ({total / tokens:.0f} us a token); top kernels:")
    table = []
    for e in rows[:top]:
        share = e.self_device_time_total / total if total else 0.0
        print(f"  {e.self_device_time_total / tokens:8.1f} us/token {100 * share:5.1f}%  x{e.count:<6} {e.key[:90]}")
        table.append({"name": e.key, "us_per_token": e.self_device_time_total / tokens, "count": e.count})
    return table


if __name__ == "__main__":
    main()

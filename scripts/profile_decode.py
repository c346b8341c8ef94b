"""Where a bs=1 decode step's time goes on a GPU: the engine's wall time per token against the GPU's
busy time per token, and the GPU time per kernel (torch.profiler), for a `lantern bench` shape.

  python scripts/profile_decode.py --shape 8b --isq q4          # the issue's 8B int4 goal, on CUDA
  python scripts/profile_decode.py --shape tiny --tokens 8       # a CPU smoke run (no GPU timings)

bs=1 tokens/s is measured as `lantern bench` does ((n - 1) / (t(n) - t(1)), greedy and T=1.0), and set
against the HBM roofline of the bytes the backend holds per weight. CUDA events around each forward
(the graph replay, or the eager forward) and around each launch (forward + sampling) give the stream time
each spans (host work inside the call included); wall time beyond them is the host alone (scheduler, batch
building, detokenizing) while the GPU waits. The kernel table sums each kernel's device time over the
decode steps (a profiled generation less one of a single token: its prefill), kernels inside CUDA graph replays
recorded by CUPTI like eager ones: the GPU's busy time, against which the spans and the wall time show the gaps.
With async scheduling (the default on CUDA) bs=1 is also timed with steps one after the other, in the same run.
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
    ahead = llm.engine.ahead  # async scheduling (app/engine/step_ahead.py): also timed without, side by side
    if ahead is not None:
        llm.engine.ahead = None
        for name, temp in (("greedy", 0.0), ("sampled", 1.0)):
            result[f"{name}_bs1_tok_s_one_by_one"] = (args.tokens - 1) / (
                generate(args.tokens, temp) - generate(1, temp)
            )
        llm.engine.ahead = ahead
        print(
            f"steps one after the other (--no-async-scheduling): greedy {result['greedy_bs1_tok_s_one_by_one']:.1f} "
            f"tok/s, T=1.0 {result['sampled_bs1_tok_s_one_by_one']:.1f}",
            flush=True,
        )
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
    """Per decode step: wall time, and the stream time spanned by the forward and by forward + sampling (CUDA events
    recorded around each call: they enclose the host's work inside the call too, so they bound the GPU's busy time
    from above; the kernel table gives the busy time itself)."""
    backend = llm.engine.backend
    spans: dict[str, list] = {"forward": [], "launch": []}

    def timed(name: str, fn):
        def wrapper(*a, **kw):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            out = fn(*a, **kw)
            end.record()
            spans[name].append((start, end))
            return out

        return wrapper

    forward, launch = backend._forward, backend.launch
    backend._forward, backend.launch = timed("forward", forward), timed("launch", launch)
    try:
        wall = generate(tokens + 1, 0.0)
        for v in spans.values():  # the prefill's step: before the first decode step
            del v[: len(v) - tokens]
        wall -= generate(1, 0.0)
    finally:
        backend._forward, backend.launch = forward, launch
    torch.cuda.synchronize()
    per = {k: sum(s.elapsed_time(e) for s, e in v[:tokens]) / tokens * 1e3 for k, v in spans.items()}
    out = {
        "wall_us_per_token": wall / tokens * 1e6,
        "forward_span_us_per_step": per["forward"],
        "step_span_us_per_step": per["launch"],
        "steps_timed": tokens,
    }
    print(
        f"per token: wall {out['wall_us_per_token']:.0f} us; stream spans: forward {per['forward']:.0f} us, "
        f"forward + sampling {per['launch']:.0f} us (events around each launch; with steps scheduled ahead the host's "
        "work overlaps them, else wall beyond them is the host alone)",
        flush=True,
    )
    return out


def kernel_table(generate, tokens: int, top: int) -> list[dict]:
    """Each kernel's device time per decode token: a profiled generation of tokens + 1 less one of 1 (its prefill),
    kernel rows only (an eager aten op also carries its kernels' time: summed with them it would count twice)."""
    from torch.profiler import ProfilerActivity, profile

    def kernels(n: int) -> dict[str, tuple[float, int]]:
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            generate(n, 0.0)
        torch.cuda.synchronize()
        cuda = torch.autograd.DeviceType.CUDA
        return {
            e.key: (e.self_device_time_total, e.count)
            for e in prof.key_averages()
            if e.device_type == cuda and not e.is_user_annotation and e.self_device_time_total > 0
        }

    both, prefill = kernels(tokens + 1), kernels(1)
    decode = {k: (t - prefill.get(k, (0.0, 0))[0], c - prefill.get(k, (0.0, 0))[1]) for k, (t, c) in both.items()}
    rows = sorted(((k, t, c) for k, (t, c) in decode.items() if t > 0), key=lambda r: -r[1])
    total = sum(t for _, t, _ in rows)
    print(f"GPU busy time over {tokens} decode tokens: {total / 1e3:.2f} ms ({total / tokens:.0f} us a token); top:")
    table = []
    for key, t, count in rows[:top]:
        print(f"  {t / tokens:8.1f} us/token {100 * t / total:5.1f}%  x{count:<6} {key[:90]}")
        table.append({"name": key, "us_per_token": t / tokens, "count": count})
    return table


if __name__ == "__main__":
    main()

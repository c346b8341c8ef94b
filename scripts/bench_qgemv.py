"""Sweep the Triton quantized GEMV (kernels/triton_quant.py) over block sizes on a GPU, against the HBM roofline.

  python scripts/bench_qgemv.py                      # 8B shapes, 4-bit g64 (--isq q4 on CUDA), 1 row, bf16
  python scripts/bench_qgemv.py --bits 8 --rows 2
  TRITON_INTERPRET=1 python scripts/bench_qgemv.py --device cpu --shape 64x256 --iters 1 --max-configs 3

For each weight shape (N x K) it checks the default config's output against the dequantize-then-matmul
reference, then times every config of the grid with CUDA graphs (one graph of --iters launches, replayed;
median of --repeats replays) and prints microseconds, GB/s (the packed weight, its scales and biases, x
and the output, read or written once) and the fraction of --peak-gbs. References timed alongside: the
dense bf16 GEMV of the same shape (torch.mv through cuBLAS, 2 bytes a weight) and, for 4-bit, aten's
tinygemm int4 kernel (torch._weight_int4pack_mm) where this torch has it for CUDA, and for 16-bit x the
int8-activation GEMV decode takes (kernels/triton_gemv_dp4a.py) at its built-in config and other BLOCK_N.
The last line is one JSON object: per shape, each kernel's default figure and the best config found.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

# The 8B Llama shape's decode matrices: q/k/v stacked, o, gate/up stacked, down, the head.
SHAPES_8B = ("6144x4096", "4096x4096", "28672x4096", "4096x14336", "128256x4096")
# 48 configs; shapes that share K share the compiled kernels (N is a run-time argument).
GRID = {"BLOCK_N": (2, 4, 8, 16), "BLOCK_K": (256, 512, 1024), "num_warps": (4, 8), "num_stages": (1, 2)}
DP4A_BLOCK_N = (4, 8, 16, 32)  # the dp4a GEMV's rows a program (its other sizes follow K)


def time_fn(fn: Callable[[], Any], device: torch.device, iters: int, repeats: int) -> float:
    """Median microseconds per call: a CUDA graph of `iters` calls, replayed `repeats` times (on a CPU,
    plain wall time: the smoke run only)."""
    import time

    fn()  # compile / warm
    if device.type != "cuda":
        t = time.perf_counter()
        for _ in range(iters):
            fn()
        return (time.perf_counter() - t) / iters * 1e6
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(iters):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / iters)
    return statistics.median(times)


def configs(n: int, k: int, group: int, stages: tuple[int, ...] = GRID["num_stages"]) -> list[dict]:
    out = []
    for bn, bk, warps, st in itertools.product(GRID["BLOCK_N"], GRID["BLOCK_K"], GRID["num_warps"], stages):
        if bk % group or bk > max(group, triton.next_power_of_2(k)) or n < bn:
            continue
        out.append({"BLOCK_N": bn, "BLOCK_K": bk, "num_warps": warps, "num_stages": st})
    return out


def bench_shape(args: argparse.Namespace, n: int, k: int, device: torch.device) -> dict:
    from lantern.backends.torch.kernels import quant_reference, triton_gemv_dp4a, triton_quant

    dtype = getattr(torch, args.dtype)
    gen = torch.Generator(device="cpu").manual_seed(0)
    codes = torch.randint(0, 1 << args.bits, (n, k), dtype=torch.uint8, generator=gen)
    packed = triton_quant.pack_codes(codes, args.bits).to(device)
    groups = k // args.group
    scales = (torch.rand((n, groups), generator=gen) * 0.02).to(dtype).to(device)
    biases = None if args.e2m1 else (torch.randn((n, groups), generator=gen) * 0.01).to(dtype).to(device)
    x = torch.randn((args.rows, k), generator=gen).to(dtype).to(device)
    io_bytes = (x.numel() + args.rows * n) * x.element_size()
    nbytes = packed.numel() + (1 if args.e2m1 else 2) * scales.numel() * scales.element_size() + io_bytes

    if biases is None:  # e2m1: every nibble is a value
        want = quant_reference.e2m1_matmul_reference(x, packed, scales, args.group).float()
    else:
        want = quant_reference.affine_matmul_reference(x, packed, scales, biases, args.bits, args.group).float()
    code = "e2m1" if args.e2m1 else "affine"
    got = triton_quant.gemv(x, packed, scales, biases, args.bits, args.group, code=code).float()
    err = float((got - want).abs().max() / want.abs().max().clamp_min(1e-6))
    if err > 2e-2:
        raise SystemExit(f"{n}x{k}: the GEMV's output is off the reference by {err:.3g} (relative): stop")

    def row(name: str, us: float, b: int = nbytes) -> dict:
        gbs = b / us / 1e3
        print(f"  {name:<60} {us:9.2f} us {gbs:8.0f} GB/s {100 * gbs / args.peak_gbs:5.1f}%", flush=True)
        return {"name": name, "us": round(us, 3), "gbs": round(gbs, 1), "roofline": round(gbs / args.peak_gbs, 3)}

    kind = "e2m1" if args.e2m1 else f"{args.bits}-bit"
    print(f"{n}x{k}, {kind} g{args.group}, {args.rows} row(s), {args.dtype}: {nbytes / 1e6:.1f} MB a call")

    def t(fn: Callable[[], Any]) -> float:
        return time_fn(fn, device, args.iters, args.repeats)

    def gemv(cfg: dict) -> Callable[[], Any]:
        return lambda: triton_quant.gemv(x, packed, scales, biases, args.bits, args.group, code=code, **cfg)

    default_cfg = triton_quant._gemv_config(n, k, args.bits, args.group, args.e2m1)
    result: dict[str, Any] = {"shape": f"{n}x{k}", "max_rel_err": err, "default_config": default_cfg}
    result["default"] = row(f"default {default_cfg}", t(gemv({})))
    dense = torch.randn((n, k), generator=gen).to(dtype).to(device)
    dense_bytes = dense.numel() * dense.element_size() + io_bytes
    result["dense"] = row("dense x @ W.T (cuBLAS)", t(lambda: x @ dense.T), dense_bytes)
    tiny = None if args.e2m1 else tinygemm(x, codes, args, device, dtype)
    if tiny is not None:
        result["tinygemm"] = row("aten _weight_int4pack_mm (tinygemm)", t(tiny))
    if not args.e2m1 and triton_gemv_dp4a.supports(x, args.bits, args.group, code):
        result.update(bench_dp4a(args, x, packed, scales, biases, t, row))
    best = {**result["default"], "config": default_cfg}  # (a grid config must beat the built-in one to win)
    for cfg in configs(n, k, args.group, tuple(args.stages))[: args.max_configs]:
        try:
            us = t(gemv(cfg))
        except Exception as exc:  # a config the compiler refuses (registers, shared memory): skip it
            print(f"  {cfg}: {type(exc).__name__}: {str(exc).splitlines()[0][:100]}")
            continue
        entry = row(str(cfg), us)
        if entry["us"] < best["us"]:
            best = {**entry, "config": cfg}
    result["best"] = best
    return result


def bench_dp4a(args: argparse.Namespace, x, packed, scales, biases, t: Callable, row: Callable) -> dict:
    """The int8-activation GEMV (triton_gemv_dp4a, what decode takes for 16-bit x): checked against its own
    reference first, then its built-in config and the other BLOCK_N timed."""
    from lantern.backends.torch.kernels import quant_reference
    from lantern.backends.torch.kernels import triton_gemv_dp4a as td

    n, k = packed.shape[0], x.shape[1]
    want = quant_reference.int8_activation_matmul_reference(x, packed, scales, biases, args.bits, args.group).float()
    got = td.gemv(x, packed, scales, biases, args.bits, args.group).float()
    err = float((got - want).abs().max() / want.abs().max().clamp_min(1e-6))
    if err > 2e-2:
        raise SystemExit(f"{n}x{k}: the dp4a GEMV's output is off its reference by {err:.3g} (relative): stop")
    built_in = td._config(n, k, args.bits)
    out = {
        "dp4a_max_rel_err": err,
        "dp4a": {
            **row(f"dp4a {built_in}", t(lambda: td.gemv(x, packed, scales, biases, args.bits, args.group))),
            "config": built_in,
        },
    }
    best = out["dp4a"]
    for block_n in DP4A_BLOCK_N[: args.dp4a_configs]:
        if block_n == built_in["BLOCK_N"] or block_n > n:
            continue
        cfg = {**built_in, "BLOCK_N": block_n}
        entry = row(f"dp4a {cfg}", t(lambda c=cfg: td.gemv(x, packed, scales, biases, args.bits, args.group, **c)))
        if entry["us"] < best["us"]:
            best = {**entry, "config": cfg}
    out["dp4a_best"] = best
    return out


def tinygemm(x: torch.Tensor, codes: torch.Tensor, args: argparse.Namespace, device: torch.device, dtype: torch.dtype):
    """aten's CUDA int4 kernel on the same codes (its own layout), or None where it does not apply."""
    if args.bits != 4 or device.type != "cuda" or dtype != torch.bfloat16 or not hasattr(torch, "_weight_int4pack_mm"):
        return None
    try:
        n, k = codes.shape
        packed = (codes[:, ::2] << 4 | codes[:, 1::2]).to(device)
        weight = torch._convert_weight_to_int4pack(packed, 8)
        sz = torch.zeros((k // args.group, n, 2), dtype=dtype, device=device)
        sz[..., 0] = 0.01
        torch._weight_int4pack_mm(x, weight, args.group, sz)
        return lambda: torch._weight_int4pack_mm(x, weight, args.group, sz)
    except Exception as exc:  # an older torch or another layout: the reference is skipped, said once
        print(f"  tinygemm unavailable here: {type(exc).__name__}: {str(exc).splitlines()[0][:100]}")
        return None


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", action="append", help="NxK (repeatable); default: the 8B decode matrices")
    p.add_argument("--bits", type=int, default=4, choices=(4, 8))
    p.add_argument("--group", type=int, default=64, choices=(16, 32, 64, 128))
    p.add_argument("--e2m1", action="store_true", help="fp4 codes, no biases (MXFP4: --group 32; NVFP4: 16)")
    p.add_argument("--rows", type=int, default=1, help="rows of x (the GEMV takes up to GEMV_MAX_M)")
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    p.add_argument("--device", default="cuda")
    p.add_argument("--iters", type=int, default=50, help="launches per CUDA graph")
    p.add_argument("--repeats", type=int, default=20, help="graph replays (the median is reported)")
    p.add_argument("--peak-gbs", type=float, default=4800.0, help="the HBM roofline (H200: 4800)")
    p.add_argument("--max-configs", type=int, help="time only the first this many configs of the grid")
    p.add_argument("--dp4a-configs", type=int, default=len(DP4A_BLOCK_N), help="dp4a BLOCK_N tried (0: built-in)")
    p.add_argument("--stages", type=int, nargs="+", default=list(GRID["num_stages"]), help="num_stages swept")
    p.add_argument("--json", type=Path, help="also write the summary here (after each shape)")
    args = p.parse_args(argv)
    if args.e2m1 and args.bits != 4:
        p.error("--e2m1 codes are 4-bit")
    device = torch.device(args.device)
    shapes = [tuple(int(v) for v in s.lower().split("x")) for s in (args.shape or SHAPES_8B)]
    summary = {"bits": args.bits, "e2m1": args.e2m1, "group": args.group, "rows": args.rows, "dtype": args.dtype}
    results: list[dict] = []
    summary["shapes"] = results
    for n, k in shapes:  # written after each shape: a sweep cut short by a time limit keeps what it measured
        results.append(bench_shape(args, n, k, device))
        if args.json:
            args.json.write_text(json.dumps(summary, indent=1))
    line = {}
    for r in results:
        line[r["shape"]] = {"default": r["default"]["roofline"], "best": r["best"]}
        if "dp4a" in r:
            line[r["shape"]].update(dp4a=r["dp4a"]["roofline"], dp4a_best=r["dp4a_best"])
    print(json.dumps(line))
    return summary


if __name__ == "__main__":
    main()

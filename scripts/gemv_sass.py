"""The quantized GEMV's inner loop as Hopper runs it, without a GPU: instructions issued per weight.

The Triton GEMV (kernels/triton_quant.py) is compiled for sm_90 as the JIT would at run time (pointers and
arguments divisible by 16 marked so, arguments equal to 1 specialized), disassembled with the nvdisasm that
Triton's wheel carries, and its main loop (the longest backward branch) counted by opcode. On the H200
(2026-11-30) the 4-bit g64 GEMV moved ~2.0 TB/s at ~6.6 instructions a weight: an SM issues 4 warp
instructions a cycle, so 132 SMs at ~1.98 GHz issue ~33 T thread instructions/s, ~5 T weights/s at that
count -- the loop is issue-bound well before HBM (4.8 TB/s = 9.6 T weights/s needs <= ~3.5 a weight).

  python scripts/gemv_sass.py                                  # 8B gate/up matrix, the built-in config
  python scripts/gemv_sass.py --shape 4096x14336 --config '{"BLOCK_N": 16, "BLOCK_K": 512}' --x-dtype fp32
  python scripts/gemv_sass.py --kernel dp4a                    # triton_gemv_dp4a: 1.9 a weight here

On sm_90 (2026-12-01, Triton 3.6): the float GEMV 6.6 (4-bit) / 8.3 (8-bit) a weight; the dp4a GEMV
1.9 (4-bit, 16-row programs: every 8B matrix), 2.6 (8 rows), 3.8 (4 rows), 2.9 (8-bit), x in two int8 levels.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

_INSTRUCTION = re.compile(r"^\s+/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*)")
_LABEL = re.compile(r"^(\.L_x_\d+):")
_BRANCH = re.compile(r"\bBRA\b\s+`?\(?(\.L_x_\d+)")


def loop_opcodes(sass: str) -> list[str]:
    """Opcodes of the longest loop: from a label to the last branch back to it."""
    labels: dict[str, int] = {}
    body: list[str] = []
    best: list[str] = []
    ops: list[tuple[int, str]] = []
    for line in sass.splitlines():
        if m := _LABEL.match(line):
            labels[m.group(1)] = len(ops)
        elif m := _INSTRUCTION.match(line):
            ops.append((len(ops), m.group(1)))
            if (b := _BRANCH.search(line)) and b.group(1) in labels:
                body = [op for _, op in ops[labels[b.group(1)] :]]
                best = body if len(body) > len(best) else best
    return best


def _specialize(fn, consts: dict, values: dict, kinds: dict, default_ptr: str) -> tuple[dict, dict]:
    """(signature, attrs) as the JIT makes them: 1 becomes a constant, multiples of 16 are marked divisible."""
    signature, attrs = {}, {}
    for i, name in enumerate(fn.arg_names):
        if name in consts or values.get(name) == 1:
            consts.setdefault(name, values.get(name))
            signature[name] = "constexpr"
            continue
        signature[name] = kinds.get(name, default_ptr if name.endswith("_ptr") else "i32")
        if name.endswith("_ptr") or values.get(name, 1) % 16 == 0:
            attrs[(i,)] = [["tt.divisibility", 16]]
    return signature, attrs


def compile_gemv(
    n: int, k: int, bits: int, group: int, config: dict, x_dtype: str, kernel: str = "float", gated: bool = False
) -> tuple[str, dict, dict]:
    """sm_90 SASS of a GEMV for one [n, k] weight and one row of x; (sass, constexprs, options).
    kernel: "float" (triton_quant._gemv_kernel) or "dp4a" (triton_gemv_dp4a, int8 activations; gated: with
    SiLU(gate) * up in its epilogue)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from lantern.backends.torch.kernels import triton_gemv_dp4a as td
    from lantern.backends.torch.kernels import triton_quant as tq

    if kernel == "dp4a":
        cfg = {**td._config(n, k, bits), **config}
    else:
        cfg = {**tq._gemv_config(n, k, bits, group), **config}
    options = {key: v for key, v in cfg.items() if key.startswith("num_")}
    consts = {key: v for key, v in cfg.items() if key not in options}
    if kernel == "dp4a":
        fn = td._gemv_dp4a_kernel
        consts.update(BITS=bits, GROUP=group, X_BF16=x_dtype == "bf16", ASM=True, TWO_ROWS=False, EXPERTS=False)
        consts.update(A_DIV=1, MUL_WEIGHT=False, OUT_BIAS=False, GATED=gated, PDL=False)
        consts.update(EVEN_N=n % consts["BLOCK_N"] == 0, EVEN_K=k % (32 * consts["NB"]) == 0)
        values = {"M": 1, "N": n, "K": k, "stride_xm": k // 2, "stride_cn": k * bits // 32}
        values.update(stride_we=0, stride_se=0, stride_obe=0)
        kinds = {"xpairs_ptr": "*i32", "words_ptr": "*i32", "expert_ptr": "*i32", "rw_ptr": "*fp32"}
    else:
        fn = tq._gemv_kernel
        consts.update(BITS=bits, GROUP=group, FLOAT_CODE=0, ROWS=1, BLOCK_M=1)
        values = {
            "M": 1,
            "N": n,
            "K": k,
            "stride_xm": k,
            "stride_xk": 1,
            "stride_cn": k * bits // 32,
            "one": 0x3F800000,
        }
        kinds = {"x_ptr": f"*{x_dtype}", "words_ptr": "*i32", "one": "i32"}
    values.update(stride_sn=k // group, stride_om=n)
    kinds["out_ptr"] = f"*{x_dtype}"  # (the output: x's dtype)
    signature, attrs = _specialize(fn, consts, values, kinds, "*bf16")
    src = ASTSource(fn=fn, signature=signature, constexprs=consts, attrs=attrs)
    compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)
    nvdisasm = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "nvdisasm"
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "gemv.cubin"
        cubin.write_bytes(compiled.asm["cubin"])
        sass = subprocess.run([str(nvdisasm), "-c", str(cubin)], capture_output=True, text=True, check=True).stdout
    return sass, consts, options


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="28672x4096", help="NxK of the weight")
    p.add_argument("--bits", type=int, default=4, choices=(4, 8))
    p.add_argument("--group", type=int, default=64)
    p.add_argument("--config", default="{}", help="JSON overrides of the built-in block sizes")
    p.add_argument("--x-dtype", default="bf16", choices=("bf16", "fp16", "fp32"))
    p.add_argument("--kernel", default="float", choices=("float", "dp4a"), help="dp4a: int8 activations")
    p.add_argument("--gated", action="store_true", help="dp4a: SiLU(gate) * up in the epilogue (a gate_up weight)")
    args = p.parse_args(argv)
    if args.kernel == "dp4a" and args.x_dtype == "fp32":
        p.error("the dp4a GEMV takes bf16 / fp16 activations")
    if args.gated and args.kernel != "dp4a":
        p.error("--gated is the dp4a GEMV's epilogue")
    n, k = (int(v) for v in args.shape.lower().split("x"))
    sass, consts, options = compile_gemv(
        n, k, args.bits, args.group, json.loads(args.config), args.x_dtype, args.kernel, args.gated
    )
    loop = loop_opcodes(sass)
    threads = 32 * options.get("num_warps", 4)
    block_k = consts["NB"] * 32 if args.kernel == "dp4a" else consts["BLOCK_K"]
    weights = consts["BLOCK_N"] * block_k / threads  # per thread per loop step
    counts: dict[str, int] = {}
    for op in loop:
        counts[op] = counts.get(op, 0) + 1
    result = {
        "shape": args.shape,
        "kernel": args.kernel + (" gated" if args.gated else ""),
        "config": {key: consts[key] for key in ("BLOCK_N", "BLOCK_K", "NB") if key in consts} | options,
        "x_dtype": args.x_dtype,
        "loop_instructions": len(loop),
        "weights_per_thread_step": weights,
        "per_weight": len(loop) / weights,
        "opcodes": dict(sorted(counts.items(), key=lambda t: -t[1])),
    }
    print(
        f"{args.shape} {result['config']} x {args.x_dtype}: {len(loop)} instructions a step for {weights:.0f} "
        f"weights a thread = {result['per_weight']:.2f} a weight"
    )
    print("  " + " ".join(f"{op}:{c}" for op, c in result["opcodes"].items()))
    return result


if __name__ == "__main__":
    main()

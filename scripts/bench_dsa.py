"""What DeepSeek Sparse Attention costs: decode tokens/s of a small DeepSeek-V3.2-shaped model (random weights,
transformers' own config class) past a long prompt, with an index_topk the context passes (sparse rows) and one it
never reaches (every key kept, the plain latent attention), side by side with transformers' generate on the same
model. Sampled decoding (temperature 1.0).

  python scripts/bench_dsa.py --prompt 2048 --new 32 --topk 256 --backends torch mlx
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SHAPE = {
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 8,
    "kv_lora_rank": 64,
    "q_lora_rank": 96,
    "qk_rope_head_dim": 16,
    "qk_nope_head_dim": 32,
    "v_head_dim": 32,
    "first_k_dense_replace": 1,
    "n_routed_experts": 8,
    "n_shared_experts": 1,
    "num_experts_per_tok": 2,
    "n_group": 1,
    "topk_group": 1,
    "moe_intermediate_size": 128,
    "index_head_dim": 64,
    "index_n_heads": 8,
    "max_position_embeddings": 8192,
    "pad_token_id": 0,
}


def lantern_tps(path: Path, backend: str, prompt: list[int], new: int) -> float:
    from lantern.app.engine import LLM, SamplingParams

    # (no prefix cache: the timed request prefills its prompt again, as transformers' generate does)
    llm = LLM(
        str(path), backend=backend, dtype="float32", max_model_len=len(prompt) + new + 8, enable_prefix_caching=False
    )
    params = SamplingParams(temperature=1.0, max_tokens=new, ignore_eos=True, seed=0)
    llm.generate([prompt], SamplingParams(temperature=1.0, max_tokens=2, ignore_eos=True))  # warm-up
    start = time.perf_counter()
    llm.generate([prompt], params)
    return new / (time.perf_counter() - start)  # (the prompt's prefill included, in every row of the table)


def transformers_tps(path: Path, prompt: list[int], new: int) -> float:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    ids = torch.tensor([prompt])
    with torch.no_grad():
        model.generate(ids, max_new_tokens=2, do_sample=True, pad_token_id=0)
        start = time.perf_counter()
        model.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=True, temperature=1.0, pad_token_id=0)
    return new / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompt", type=int, default=2048)
    parser.add_argument("--new", type=int, default=32)
    parser.add_argument("--topk", type=int, default=256)
    parser.add_argument("--backends", nargs="*", default=["torch"], choices=["torch", "mlx"])
    parser.add_argument("--no-transformers", action="store_true")
    args = parser.parse_args()
    from tests.fixtures.tiny_models import build_model

    root = Path(tempfile.mkdtemp(prefix="bench-dsa-"))
    rows = []
    for label, topk in (("sparse", args.topk), ("dense", args.prompt + args.new + 8)):
        path = build_model("deepseek_v32", root / label, **SHAPE, index_topk=topk)
        prompt = [(7 * i) % 300 + 5 for i in range(args.prompt)]
        for backend in args.backends:
            rows.append((label, topk, backend, lantern_tps(path, backend, prompt, args.new)))
        if not args.no_transformers:
            rows.append((label, topk, "transformers", transformers_tps(path, prompt, args.new)))
    print(f"\nprompt {args.prompt} tokens, {args.new} sampled tokens (temperature 1.0), float32")
    for label, topk, who, tps in rows:
        print(f"{label:7s} index_topk={topk:<6d} {who:13s} {tps:8.2f} tok/s")
    base = {(label, who): tps for label, _, who, tps in rows}
    for label in ("sparse", "dense"):
        for backend in args.backends:
            ref = base.get((label, "transformers"))
            if ref:
                print(f"{label}: Lantern {backend} / transformers = {base[(label, backend)] / ref:.2f}x")


if __name__ == "__main__":
    main()

"""Throughput of a decoder reranker (Qwen3-Reranker's shape, random weights) in one run: Lantern's torch backend with
and without the prefix cache against transformers' batched forward on the same weights (batches of 32, padded on the
right, the "yes" / "no" logits at each prompt's last token, as the model card scores).

Every prompt is the reranker's: a shared head (--head tokens: the system prompt, instruction and query), then a
document of random ids, then the short tail; so the prefix cache computes the head once per tenant.

  python scripts/bench_rerank.py                         # Qwen3-Reranker-0.6B's shape, 64 documents of 192 tokens
  python scripts/bench_rerank.py --layers 8 --docs 128
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

QWEN3_06B = dict(
    hidden_size=1024,
    intermediate_size=3072,
    num_hidden_layers=28,
    num_attention_heads=16,
    num_key_value_heads=8,
    head_dim=128,
    max_position_embeddings=4096,
    tie_word_embeddings=True,
    rms_norm_eps=1e-6,
)


def build(root: Path, layers: int) -> Path:
    """A random Qwen3ForCausalLM of the 0.6B shape (std 0.02) named as a reranker, with the tests' tokenizer
    (which holds "yes" and "no") and the 151669-row vocabulary of the real one."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from tests.fixtures.tiny_rerankers import build_qwen3_reranker

    folder = build_qwen3_reranker(root / "Qwen3-Reranker-bench")
    config = AutoConfig.for_model("qwen3", **{**QWEN3_06B, "num_hidden_layers": layers, "vocab_size": 151669})
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.eval().save_pretrained(str(folder), safe_serialization=True)
    return folder


def prompts(docs: int, head: int, length: int) -> list[list[int]]:
    import numpy as np

    rng = np.random.default_rng(0)
    shared = rng.integers(1000, 100000, head).tolist()
    tail = rng.integers(1000, 100000, 8).tolist()
    return [shared + rng.integers(1000, 100000, length).tolist() + tail for _ in range(docs)]


def run_lantern(folder: Path, data: list[list[int]], cache: bool) -> float:
    from lantern.app.engine import LLM
    from lantern.app.engine.embedding import run_offline

    llm = LLM(model=str(folder), backend="torch", dtype="float32", enable_prefix_caching=cache)
    run_offline(llm.engine, llm.engine.embedder, [(d, None) for d in data[:2]])  # warm-up
    llm.engine.block_manager.reset_prefix_cache()
    t0 = time.perf_counter()
    run_offline(llm.engine, llm.engine.embedder, [(d, None) for d in data])
    return len(data) / (time.perf_counter() - t0)


def run_transformers(folder: Path, data: list[list[int]], batch: int = 32) -> float:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()

    def score(chunk: list[list[int]]) -> None:
        longest = max(map(len, chunk))
        ids = torch.tensor([c + [0] * (longest - len(c)) for c in chunk])
        mask = torch.tensor([[1] * len(c) + [0] * (longest - len(c)) for c in chunk])
        with torch.inference_mode():
            h = model.model(input_ids=ids, attention_mask=mask).last_hidden_state
            last = h[torch.arange(len(chunk)), mask.sum(1) - 1]
            torch.softmax(model.lm_head(last)[:, :2], dim=-1)  # (two rows stand for "yes" / "no")

    score(data[:2])
    t0 = time.perf_counter()
    for i in range(0, len(data), batch):
        score(data[i : i + batch])
    return len(data) / (time.perf_counter() - t0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--docs", type=int, default=64)
    parser.add_argument("--len", type=int, default=192, help="document tokens")
    parser.add_argument("--head", type=int, default=96, help="the shared prompt head's tokens")
    parser.add_argument("--layers", type=int, default=28)
    args = parser.parse_args()
    data = prompts(args.docs, args.head, args.len)
    with tempfile.TemporaryDirectory() as tmp:
        folder = build(Path(tmp), args.layers)
        results = {
            "transformers": run_transformers(folder, data),
            "lantern-torch": run_lantern(folder, data, cache=True),
            "lantern-torch, no prefix cache": run_lantern(folder, data, cache=False),
        }
    print(json.dumps(vars(args)))
    base = results["transformers"]
    for name, rate in results.items():
        print(f"{name:32s} {rate:8.2f} documents/s  {rate / base:5.2f}x transformers")


if __name__ == "__main__":
    main()

"""Embedding and reranking throughput of an encoder (a random checkpoint of a real model's shape) in one run:
Lantern's backends against transformers on the same weights, batched as sentence-transformers batches (32 inputs,
padded to the longest; embeddings mean pooled and L2-normalized, cross-encoders' pairs through their classifier
head and a sigmoid, as CrossEncoder.predict).

--shape bge-small (BERT 33M: 384 x 12), bge-base / all-mpnet-base (110M: 768 x 12; MPNet's relative bias),
nomic-embed (137M: rope, SwiGLU); cross-encoders: ms-marco-minilm (BERT 22M: 384 x 6, pooler and classifier),
bge-reranker-base (XLM-R 278M: 768 x 12, a 250k vocabulary); inputs of --len tokens (random ids; a pair: a
16-token query and the rest document) x --inputs.

  python scripts/bench_embed.py                              # bge-small, 256 inputs of 128 tokens
  python scripts/bench_embed.py --shape nomic-embed --len 256 --backends torch
  python scripts/bench_embed.py --shape bge-reranker-base --len 256
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

_BASE = {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072}
SHAPES = {
    "bge-small": ("bert", {**_BASE, "hidden_size": 384, "intermediate_size": 1536}),
    "bge-base": ("bert", _BASE),
    "all-mpnet-base": ("mpnet", _BASE),
    "nomic-embed": ("nomic_bert", _BASE),
    "ms-marco-minilm": ("bert", {**_BASE, "hidden_size": 384, "num_hidden_layers": 6, "intermediate_size": 1536}),
    "bge-reranker-base": ("xlm-roberta", {**_BASE, "vocab_size": 250002, "type_vocab_size": 1}),
}
CROSS_ENCODERS = ("ms-marco-minilm", "bge-reranker-base")
QUERY_LEN = 16


def build(shape: str, root: Path) -> Path:
    """The shape's random checkpoint (std 0.02, as initialised) with a WordPiece tokenizer of 30522 rows."""
    import torch
    from transformers import AutoConfig, AutoModel, AutoModelForSequenceClassification

    from tests.fixtures.tiny_encoders import build_bert_tokenizer, write_sentence_transformers

    model_type, dims = SHAPES[shape]
    build_bert_tokenizer(root)
    extra = (
        {"max_position_embeddings": 514, "pad_token_id": 1}
        if model_type in ("mpnet", "xlm-roberta")
        else {"max_position_embeddings": 512}
    )
    torch.manual_seed(0)
    config = AutoConfig.for_model(model_type, **{"vocab_size": 30522, **dims, **extra})
    if shape in CROSS_ENCODERS:
        config.num_labels = 1
        model = AutoModelForSequenceClassification.from_config(config, dtype=torch.float32)
        model.eval().save_pretrained(str(root), safe_serialization=True)
        return root
    AutoModel.from_config(config, dtype=torch.float32).eval().save_pretrained(str(root), safe_serialization=True)
    write_sentence_transformers(root, "mean", dims["hidden_size"])
    return root


def inputs(n: int, length: int) -> list[list[int]]:
    import numpy as np

    rng = np.random.default_rng(0)
    return [[2, *rng.integers(1000, 30000, length - 2).tolist(), 3] for _ in range(n)]


def types_of(data: list[list[int]], pairs: bool) -> list[list[int] | None]:
    """A pair's segments: [CLS] query [SEP] as 0, the document and its [SEP] as 1 (None: single inputs)."""
    return [[0] * (QUERY_LEN + 2) + [1] * (len(ids) - QUERY_LEN - 2) if pairs else None for ids in data]


def run_lantern(folder: Path, backend: str, data: list[list[int]], dtype: str, pairs: bool) -> float:
    from lantern.app.engine import LLM
    from lantern.app.engine.embedding import run_offline

    llm = LLM(model=str(folder), backend=backend, dtype=dtype)
    inputs = list(zip(data, types_of(data, pairs and llm.engine.model_config.encoder.type_vocab_size > 1)))
    run_offline(llm.engine, llm.engine.embedder, inputs[:8])  # warm-up
    t0 = time.perf_counter()
    run_offline(llm.engine, llm.engine.embedder, inputs)
    return len(data) / (time.perf_counter() - t0)


def run_transformers(folder: Path, data: list[list[int]], dtype: str, pairs: bool, batch: int = 32) -> float:
    import torch
    from transformers import AutoModel, AutoModelForSequenceClassification

    auto = AutoModelForSequenceClassification if pairs else AutoModel
    model = auto.from_pretrained(str(folder), dtype=getattr(torch, dtype)).eval()
    typed = pairs and getattr(model.config, "type_vocab_size", 0) > 1

    def embed(chunk: list[list[int]]) -> None:
        longest = max(map(len, chunk))
        ids = torch.tensor([c + [0] * (longest - len(c)) for c in chunk])
        mask = torch.tensor([[1] * len(c) + [0] * (longest - len(c)) for c in chunk])
        with torch.inference_mode():
            if pairs:
                types = [t + [0] * (longest - len(t)) for t in types_of(chunk, True)] if typed else None
                extra = {"token_type_ids": torch.tensor(types)} if types else {}
                torch.sigmoid(model(input_ids=ids, attention_mask=mask, **extra).logits.float())
                return
            h = model(input_ids=ids, attention_mask=mask).last_hidden_state
            pooled = (h * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)
            torch.nn.functional.normalize(pooled.float(), dim=-1)

    embed(data[:8])
    t0 = time.perf_counter()
    for i in range(0, len(data), batch):
        embed(data[i : i + batch])
    return len(data) / (time.perf_counter() - t0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="bge-small", choices=list(SHAPES))
    parser.add_argument("--inputs", type=int, default=256)
    parser.add_argument("--len", type=int, default=128)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--backends", nargs="*", default=["torch", "mlx"])
    args = parser.parse_args()
    data = inputs(args.inputs, args.len)
    with tempfile.TemporaryDirectory() as tmp:
        folder = build(args.shape, Path(tmp))
        pairs = args.shape in CROSS_ENCODERS
        results = {"transformers": run_transformers(folder, data, args.dtype, pairs)}
        for backend in args.backends:
            results[f"lantern-{backend}"] = run_lantern(folder, backend, data, args.dtype, pairs)
    base = results["transformers"]
    print(json.dumps({"shape": args.shape, "inputs": args.inputs, "len": args.len, "dtype": args.dtype}))
    for name, rate in results.items():
        print(f"{name:18s} {rate:8.1f} inputs/s  {rate / base:5.2f}x transformers")


if __name__ == "__main__":
    main()

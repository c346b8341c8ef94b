"""The `lantern` command line's flags turned into what they configure: engine options and server
settings, each value checked first so that nonsense is refused in one line before anything loads."""

from __future__ import annotations

import argparse
import os
from typing import Any

DEFAULT_SERVED_NAME = "SmolLM2-135M-Instruct"


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
        "--max-num-batched-tokens": args.max_num_batched_tokens,
        "--tensor-parallel-size": args.tensor_parallel_size,
    }
    for flag, value in positive.items():
        if value is not None and value < 1:
            raise UsageError(f"{flag} must be a positive number, got {value}")
    if args.max_model_len is not None and args.max_model_len < 2:
        raise UsageError(
            f"--max-model-len must be at least 2 (a prompt token and a generated one), got {args.max_model_len}"
        )
    if args.prefix_cache_states is not None and args.prefix_cache_states < 0:
        raise UsageError(f"--prefix-cache-states must be 0 or more, got {args.prefix_cache_states}")
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
        "max_num_batched_tokens": args.max_num_batched_tokens,
        "enable_prefix_caching": not args.no_prefix_cache,
        "prefix_cache_states": args.prefix_cache_states,
        "async_scheduling": args.async_scheduling,
        "enforce_eager": args.enforce_eager,
        "num_threads": args.threads,
        "compile_decode": args.compile_decode,
        "quantization": args.isq,
        "task": args.task,
        "pooling": args.pooling,
    }


def check_key(key: str, source: str) -> str:
    # An empty key used to switch authentication off; one with spaces or non-ASCII characters
    # could never be sent in an Authorization header.
    if not key or not key.isascii() or not key.isprintable() or any(c.isspace() for c in key):
        raise UsageError(f"{source}: an API key must be non-empty printable ASCII without spaces")
    return key


def read_key_file(path: str) -> list[str]:
    """One key per line; blank lines and lines starting with # are skipped."""
    with open(path, encoding="utf-8") as f:
        lines = [line.strip() for line in f]
    keys = [check_key(line, f"{path}:{i}") for i, line in enumerate(lines, 1) if line and not line.startswith("#")]
    if not keys:
        raise UsageError(f"--api-key-file {path} holds no key")
    return keys


def api_keys(args: argparse.Namespace) -> list[str]:
    """Keys from --api-key (repeatable) and --api-key-file; LANTERN_API_KEY when neither is given."""
    keys = [check_key(k, "--api-key") for k in args.api_key or []]
    if args.api_key_file:
        keys += read_key_file(args.api_key_file)
    if not keys and os.environ.get("LANTERN_API_KEY"):
        keys.append(check_key(os.environ["LANTERN_API_KEY"], "LANTERN_API_KEY"))
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

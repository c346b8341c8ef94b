"""The `lantern` command line. Flags keep candle-vllm's short names with long aliases.

The flags are defined in cli_args.py, checked and turned into engine options and server settings
in cli_options.py, and run by the subcommands of cli_commands.py; this module is the entry point
(`lantern = lantern.app.cli:main`) and keeps the names other code imports from it.
"""

from __future__ import annotations

import logging
import sys

from lantern.app.cli_args import add_model_args, build_parser
from lantern.app.cli_commands import cmd_bench, cmd_chat, cmd_generate, cmd_menubar, cmd_serve
from lantern.app.cli_options import (
    DEFAULT_SERVED_NAME,
    UsageError,
    allowed_origins,
    api_keys,
    check_engine_args,
    engine_options,
    mcp_config,
    read_key_file,
    server_settings,
)

__all__ = [
    "DEFAULT_SERVED_NAME",
    "UsageError",
    "add_model_args",
    "allowed_origins",
    "api_keys",
    "build_parser",
    "check_engine_args",
    "cmd_bench",
    "cmd_chat",
    "cmd_generate",
    "cmd_menubar",
    "cmd_serve",
    "engine_options",
    "main",
    "mcp_config",
    "read_key_file",
    "server_settings",
]


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

"""What each `lantern` subcommand runs (generate, serve, chat, menubar, bench); their flags are in
app/cli_args.py and read through app/cli_options.py."""

from __future__ import annotations

import argparse
import logging
import os

from lantern.app.cli_options import check_engine_args, check_key, engine_options, server_settings


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
    routes = {  # what a non-generating model answers (the other routes say which task it serves)
        "embed": " for embeddings (POST /v1/embeddings)",
        "score": " for relevance scores (POST /v1/rerank, /v2/rerank, /rerank, /v1/score)",
        "classify": " for classification (POST /classify)",
    }
    logging.getLogger("lantern").info(
        "serving %s at http://%s:%d/v1%s%s",
        app.state.lantern.model_name,
        args.host,
        args.port,
        routes.get(engine.task, ""),
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
        check_key(key, "--api-key")
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

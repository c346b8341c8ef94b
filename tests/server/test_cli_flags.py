"""`lantern serve` flags: nonsense is refused at start with one clear line and exit status 1,
before any model is loaded; the new flags reach ServerSettings and EngineConfig."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from lantern.app.cli import build_parser, engine_options, main, server_settings


def parse(*argv: str):
    return build_parser().parse_args(["serve", *argv])


NONSENSE = [
    (["--mem", "0"], "--mem"),
    (["--mem", "-1"], "--mem"),
    (["--api-key", ""], "API key"),
    (["--api-key", "ok", "--api-key", "has space"], "API key"),
    (["--max-model-len", "1"], "--max-model-len"),
    (["--threads", "0"], "--threads"),
    (["--max-n", "0"], "--max-n"),
    (["--max-request-bytes", "0"], "--max-request-bytes"),
    (["--allowed-origins", "localhost:3000"], "--allowed-origins"),
    (["--gpu-memory-fraction", "0"], "--gpu-memory-fraction"),
    (["--max-num-batched-tokens", "0"], "--max-num-batched-tokens"),
    (["--prefix-cache-states", "-1"], "--prefix-cache-states"),
]


@pytest.mark.parametrize("argv,needle", NONSENSE)
def test_nonsense_is_refused_before_loading(argv, needle, tmp_path, monkeypatch, caplog):
    # A model folder that does not exist: had the flags passed, loading would fail differently.
    monkeypatch.delenv("LANTERN_API_KEY", raising=False)
    assert main(["serve", "--w", str(tmp_path / "none"), *argv]) == 1
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and needle in errors[0], errors


@pytest.mark.parametrize("argv,needle", [NONSENSE[0], NONSENSE[2]])
def test_the_command_prints_one_line_and_exits_1(argv, needle, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "LANTERN_API_KEY"}
    proc = subprocess.run(
        [sys.executable, "-m", "lantern", "serve", "--w", str(tmp_path / "none"), *argv],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert proc.returncode == 1, proc.stderr
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in lines[0], lines


def test_empty_api_key_file_and_comments(tmp_path):
    keys = tmp_path / "keys.txt"
    keys.write_text("# team keys\n\nalpha-key\n  beta-key  \n# gamma-key\n")
    settings = server_settings(parse("--api-key", "one", "--api-key", "two", "--api-key-file", str(keys)))
    assert settings.api_keys == ["one", "two", "alpha-key", "beta-key"]
    empty = tmp_path / "empty.txt"
    empty.write_text("# nothing\n\n")
    with pytest.raises(ValueError, match="no key"):
        server_settings(parse("--api-key-file", str(empty)))


def test_env_key_is_used_when_no_flag_gives_one(monkeypatch):
    monkeypatch.setenv("LANTERN_API_KEY", "from-env")
    assert server_settings(parse()).api_keys == ["from-env"]
    assert server_settings(parse("--api-key", "flag")).api_keys == ["flag"]
    monkeypatch.setenv("LANTERN_API_KEY", "")  # set but empty: no key, as if unset
    assert server_settings(parse()).api_keys == []


def test_server_and_engine_flags_reach_their_settings(monkeypatch):
    monkeypatch.delenv("LANTERN_API_KEY", raising=False)
    args = parse(
        "--w",
        "/models/x",
        "--allowed-origins",
        "http://a.test,http://b.test/",
        "--allowed-origins",
        "http://c.test",
        "--max-request-bytes",
        "1000",
        "--max-n",
        "7",
        "--threads",
        "3",
        "--mem",
        "64",
        "--max-num-batched-tokens",
        "512",
        "--prefix-cache-states",
        "6",
    )
    settings = server_settings(args)
    assert settings.allowed_origins == ["http://a.test", "http://b.test", "http://c.test"]
    assert (settings.max_request_bytes, settings.max_n, settings.api_keys) == (1000, 7, [])
    options = engine_options(args)
    assert (options["num_threads"], options["kv_cache_memory_mb"], options["model"]) == (3, 64, "/models/x")
    assert (options["max_num_batched_tokens"], options["prefix_cache_states"]) == (512, 6)
    assert engine_options(parse("--w", "/models/x"))["max_num_batched_tokens"] is None  # the backend's default
    assert engine_options(parse("--w", "/models/x"))["prefix_cache_states"] is None  # sized by memory
    defaults = server_settings(parse("--w", "/models/x"))
    assert (defaults.max_request_bytes, defaults.max_n, defaults.allowed_origins) == (4 * 2**20, 128, [])

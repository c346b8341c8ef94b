"""`lantern bench`: its cost model against transformers' own parameter counts, and one real run; and the
pure parts of scripts/bench_vs_llamacpp.py (parsing, arithmetic, the random GGUF) without llama.cpp."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from lantern.app.bench import SHAPES, Peaks, ShapeCost, hf_config, run_bench  # noqa: E402


@pytest.mark.parametrize("shape_name", list(SHAPES))
def test_cost_model_counts_the_parameters_transformers_builds(shape_name):
    from transformers import AutoModelForCausalLM

    shape = SHAPES[shape_name]
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config(shape))
    expected = sum(p.numel() for p in model.parameters())  # tied weights are counted once
    assert ShapeCost.of(shape, 2).num_params(shape, 2) == expected
    assert model.config.model_type == shape.get("model_type", "llama")


def test_moe_cost_reads_k_experts_at_bs1_and_all_of_them_for_large_batches():
    """Qwen3-30B-A3B: ~3.3B parameters active per token of ~30.5B (its model card: 3.3B of 30.5B)."""
    shape = SHAPES["30b-a3b"]
    cost = ShapeCost.of(shape, 1)
    active = cost.weight_bytes_per_step + shape["vocab_size"] * shape["hidden_size"] - shape["hidden_size"]
    assert 3.2e9 < active < 3.5e9  # + the embedding table, less the one row a step reads
    total = cost.num_params(shape, 1)
    assert 30.0e9 < total < 31.0e9
    assert cost.step_weight_bytes(1) == pytest.approx(cost.weight_bytes_per_step)
    assert cost.step_weight_bytes(1) < cost.step_weight_bytes(8) < cost.step_weight_bytes(64)
    everything = total - shape["vocab_size"] * shape["hidden_size"] + shape["hidden_size"]
    assert cost.step_weight_bytes(100000) == pytest.approx(everything)  # every expert touched
    # 2 tokens: E (1 - (1 - k/E)^2) = 2k - k^2/E distinct experts per layer
    k, e = shape["num_experts_per_tok"], shape["num_experts"]
    extra = (2 * k - k * k / e - k) * cost.expert_bytes
    assert cost.step_weight_bytes(2) == pytest.approx(cost.weight_bytes_per_step + extra)


def test_moe_bench_runs_end_to_end_against_transformers(tmp_path, monkeypatch):
    """`--shape moe` (shrunk further here to keep the test short): Lantern and transformers on the
    same random Qwen3-MoE weights."""
    monkeypatch.setenv("LANTERN_CACHE", str(tmp_path / "cache"))
    small = {**SHAPES["moe"], "hidden_size": 64, "moe_intermediate_size": 32, "num_experts": 16}
    small.update(num_hidden_layers=2, num_attention_heads=4, head_dim=16, vocab_size=512)
    monkeypatch.setitem(SHAPES, "moe", small)
    args = SimpleNamespace(
        backend="torch", dtype="float32", shape=["moe"], requests=3, prompt_len=8, out_len=6, no_hf=False,
        enforce_eager=False, json=None,
    )  # fmt: skip
    [row] = run_bench(args)
    assert row["shape"] == "moe" and row["params"] == ShapeCost.of(small, 4).num_params(small, 4)
    for side in ("lantern", "hf"):
        assert row[side]["bs1_tok_s"] > 0 and row[side]["throughput_tok_s"] > 0
    config = (tmp_path / "cache" / "bench" / "roofline-moe-float32" / "config.json").read_text()
    assert json.loads(config)["model_type"] == "qwen3_moe"


def test_ideal_time_is_memory_bound_at_bs1_and_compute_bound_when_flops_are_scarce():
    shape = SHAPES["1b"]
    cost = ShapeCost.of(shape, 2)
    fast_compute = Peaks(bandwidth=1e12, flops=1e30, source="test")
    # bs=1 with infinite compute: one weight read for the prefill and per decode step, plus KV reads.
    got = cost.ideal_seconds(1, 10, 5, fast_compute)
    want = sum((cost.weight_bytes_per_step + cost.kv_bytes_per_token * c) / 1e12 for c in range(10, 14))
    assert got == pytest.approx(want + cost.weight_bytes_per_step / 1e12)
    slow_compute = Peaks(bandwidth=1e30, flops=1e12, source="test")
    assert cost.ideal_seconds(64, 10, 5, slow_compute) == pytest.approx(
        64 * (10 * cost.matmul_flops_per_token + cost.attn_flops_per_ctx_token * 50) / 1e12
        + sum(64 * (cost.matmul_flops_per_token + cost.attn_flops_per_ctx_token * c) / 1e12 for c in range(10, 14))
    )


def test_bench_runs_end_to_end_on_the_torch_backend(tmp_path, monkeypatch):
    monkeypatch.setenv("LANTERN_CACHE", str(tmp_path / "cache"))
    args = SimpleNamespace(
        backend="torch",
        dtype="float32",
        shape=["tiny"],
        requests=3,
        prompt_len=8,
        out_len=6,
        no_hf=False,
        enforce_eager=False,
        json=str(tmp_path / "out.json"),
    )
    [row] = run_bench(args)
    assert row["params"] == ShapeCost.of(SHAPES["tiny"], 4).num_params(SHAPES["tiny"], 4)
    for side in ("lantern", "hf"):
        assert row[side]["bs1_tok_s"] > 0 and row[side]["throughput_tok_s"] > 0
    assert row["bs1_fraction_of_roofline"] == pytest.approx(row["lantern"]["bs1_tok_s"] / row["bs1_roofline_tok_s"])
    assert json.loads((tmp_path / "out.json").read_text())[0]["shape"] == "tiny"
    assert (tmp_path / "cache" / "bench" / "roofline-tiny-float32" / "tokenizer.json").exists()


def test_bench_isq_quantizes_and_counts_quantized_bytes_in_the_roofline(tmp_path, monkeypatch):
    monkeypatch.setenv("LANTERN_CACHE", str(tmp_path / "cache"))
    base = dict(backend="torch", dtype="float32", shape=["tiny"], requests=2, prompt_len=8, out_len=4)
    args = SimpleNamespace(**base, no_hf=True, enforce_eager=False, json=None, isq="q4")
    [row] = run_bench(args)
    assert row["dtype"] == "float32 --isq q4"
    assert row["lantern"]["bs1_tok_s"] > 0
    # The bytes the backend holds (4-bit codes + a bf16 scale and zero per 32 weights on a CPU, norms
    # in float32), not float32 weights, bound the bs=1 roofline: about 0.625 bytes per weight.
    float_roof = ShapeCost.of(SHAPES["tiny"], 4).bs1_roofline(8 + 4 / 2, Peaks(**row["peaks"]))
    assert row["bs1_roofline_tok_s"] == pytest.approx(float_roof * 4 / (0.5 + 4 / 32), rel=0.2)
    assert "bytes_per_weight" not in row["lantern"]


def test_profile_decode_script_reports_bs1_against_the_quantized_roofline(tmp_path, monkeypatch):
    """scripts/profile_decode.py (the GPU session's step breakdown) on a CPU: bs=1 tok/s greedy and sampled, the
    roofline of the bytes --isq q4 leaves per weight; the CUDA-only event and kernel timings are absent here."""
    monkeypatch.setenv("LANTERN_CACHE", str(tmp_path / "cache"))
    path = Path(__file__).resolve().parents[2] / "scripts" / "profile_decode.py"
    spec = importlib.util.spec_from_file_location("profile_decode", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    out = tmp_path / "p.json"
    args = ["--shape", "tiny", "--isq", "q4", "--dtype", "float32", "--prompt-len", "8", "--tokens", "5"]
    result = script.main([*args, "--json", str(out)])
    assert result["greedy_bs1_tok_s"] > 0 and result["sampled_bs1_tok_s"] > 0
    float_roof = ShapeCost.of(SHAPES["tiny"], 4).bs1_roofline(8 + 5 / 2, Peaks(**result["peaks"]))
    assert result["bs1_roofline_tok_s"] / float_roof > 4  # 4-bit codes, not float32 weights, bound it
    assert result["greedy_fraction_of_roofline"] == pytest.approx(
        result["greedy_bs1_tok_s"] / result["bs1_roofline_tok_s"]
    )
    assert "kernels" not in result and json.loads(out.read_text())["isq"] == "q4"


def test_data_sheet_peaks_follow_the_dtype(monkeypatch):
    from lantern.app import bench

    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    cuda = torch.device("cuda")
    bf16, f32 = bench.device_peaks(cuda, torch.bfloat16), bench.device_peaks(cuda, torch.float32)
    assert bf16.bandwidth == f32.bandwidth == 3.35e12
    assert bf16.flops == 989e12 and f32.flops == 67e12  # CUDA-core float32, not half the tensor rate


# ---------------------------------------------------------------- scripts/bench_vs_llamacpp.py (no llama.cpp needed)

_SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_vs_llamacpp.py"


@pytest.fixture(scope="module")
def bvl():
    spec = importlib.util.spec_from_file_location("bench_vs_llamacpp", _SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_vs_llamacpp"] = module  # dataclasses look their module up here
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop("bench_vs_llamacpp", None)


# Captured 2026-11-23 from llama-server (llama.cpp 0c1e570, from llama-cpp-python 0.3.36) and from
# `lantern serve`: the first two and the last two events of one streamed /v1/completions of 128
# tokens (llama-server coalesced some tokens: 122 chunks; only usage says 128).
LLAMA_SERVER_SSE = [
    '{"choices":[{"text":"........","index":0,"logprobs":null,"finish_reason":null}],"created":1795419221,"model":"/root/.cache/lantern/models/SmolLM2-135M-Instruct.Q4_1.gguf","system_fingerprint":"b1-0c1e570","object":"text_completion","id":"chatcmpl-PlvkR5Lqh6gMkhN8YqquJBvl4X8RZOtx"}',
    '{"choices":[{"text":"***","index":0,"logprobs":null,"finish_reason":null}],"created":1795419221,"model":"/root/.cache/lantern/models/SmolLM2-135M-Instruct.Q4_1.gguf","system_fingerprint":"b1-0c1e570","object":"text_completion","id":"chatcmpl-PlvkR5Lqh6gMkhN8YqquJBvl4X8RZOtx"}',
    '{"choices":[{"text":"","index":0,"logprobs":null,"finish_reason":"length"}],"created":1795419230,"model":"/root/.cache/lantern/models/SmolLM2-135M-Instruct.Q4_1.gguf","system_fingerprint":"b1-0c1e570","object":"text_completion","usage":{"completion_tokens":128,"prompt_tokens":128,"total_tokens":256,"prompt_tokens_details":{"cached_tokens":0}},"id":"chatcmpl-PlvkR5Lqh6gMkhN8YqquJBvl4X8RZOtx","timings":{"cache_n":0,"prompt_n":128,"prompt_ms":3006.597,"prompt_per_token_ms":23.4890390625,"prompt_per_second":42.57304853294272,"predicted_n":128,"predicted_ms":8785.595,"predicted_per_token_ms":69.17791338582677,"predicted_per_second":14.455480818316802}}',
    "[DONE]",
]
LANTERN_SSE = [
    '{"id": "cmpl-a241ca3285f64a6a875d5677", "object": "text_completion", "created": 1795419273, "model": "SmolLM2-135M-Instruct.Q4_1", "choices": [{"index": 0, "text": "Ex", "logprobs": null, "finish_reason": null}]}',  # noqa: E501
    '{"id": "cmpl-a241ca3285f64a6a875d5677", "object": "text_completion", "created": 1795419273, "model": "SmolLM2-135M-Instruct.Q4_1", "choices": [{"index": 0, "text": "ON", "logprobs": null, "finish_reason": "length"}]}',  # noqa: E501
    '{"id": "cmpl-a241ca3285f64a6a875d5677", "object": "text_completion", "created": 1795419273, "model": "SmolLM2-135M-Instruct.Q4_1", "choices": [], "usage": {"prompt_tokens": 128, "completion_tokens": 128, "total_tokens": 256, "prompt_tokens_details": {"cached_tokens": 0}}}',  # noqa: E501
    "[DONE]",
]
LLAMA_BENCH_JSON = """[
  {"build_commit": "0c1e570", "cpu_info": "AMD EPYC", "model_type": "llama 256M Q4_1", "n_threads": 2,
   "n_prompt": 512, "n_gen": 0, "avg_ts": 301.5, "stddev_ts": 3.1},
  {"build_commit": "0c1e570", "cpu_info": "AMD EPYC", "model_type": "llama 256M Q4_1", "n_threads": 2,
   "n_prompt": 0, "n_gen": 32, "n_depth": 0, "avg_ns": 254698116, "stddev_ns": 1568760,
   "avg_ts": 125.641318, "stddev_ts": 0.773862, "samples_ts": [ 125.094, 126.189 ]}
]"""


def _feed(bvl, events, times):
    s = bvl.Stream(start=0.0)
    for data, t in zip(events, times):
        if not bvl.feed_event(s, data, t):
            break
    return s


def test_stream_accounting_on_both_servers_captured_output(bvl):
    llama = _feed(bvl, LLAMA_SERVER_SSE, [1.0, 1.1, 2.5, 2.6])
    # usage, not the chunk count, gives the tokens; the closing chunk (empty text) is the end
    assert (llama.first, llama.end, llama.tokens, llama.chunks) == (1.0, 2.5, 128, 3)
    ours = _feed(bvl, LANTERN_SSE, [0.5, 1.5, 1.6, 1.7])
    # Lantern's usage chunk has no choices: the last token chunk stays the end
    assert (ours.first, ours.end, ours.tokens) == (0.5, 1.5, 128)
    no_usage = _feed(bvl, LANTERN_SSE[:2] + ["[DONE]"], [0.5, 1.5, 1.6])
    assert no_usage.tokens == 2  # falls back to counting chunks


def test_server_error_event_is_raised(bvl):
    with pytest.raises(RuntimeError, match="context"):
        bvl.feed_event(bvl.Stream(start=0.0), json.dumps({"error": {"message": "context full"}}), 1.0)


def test_summary_arithmetic(bvl):
    a = bvl.Stream(start=0.0, first=1.0, end=3.0, usage_tokens=5)  # (5-1)/2 = 2 tok/s
    b = bvl.Stream(start=0.5, first=2.5, end=4.5, usage_tokens=9)  # (9-1)/2 = 4 tok/s, TTFT 2
    c = bvl.Stream(start=0.0, first=4.0, end=5.0, usage_tokens=3)  # 2 tok/s, TTFT 4 (median 2, not the mean)
    got = bvl.summarize([a, b, c], wall=5.0)
    assert got["decode_tok_s"] == pytest.approx(8.0)
    assert got["total_tok_s"] == pytest.approx(17 / 5)
    assert got["ttft_p50_s"] == pytest.approx(2.0)
    with pytest.raises(RuntimeError, match="1 of 2 streams"):
        bvl.summarize([a, bvl.Stream(start=0.0)], wall=1.0)


def test_ratio_table_and_medians(bvl):
    table = bvl.medians(
        {
            "bs=1 (tok/s)": {"lantern": [10.0, 30.0, 20.0], "llama.cpp": [40.0, 40.0]},
            "x": {"lantern": [1.0], "llama.cpp": []},
        }
    )
    assert table == {"bs=1 (tok/s)": {"lantern": 20.0, "llama.cpp": 40.0}, "x": {"lantern": 1.0, "llama.cpp": None}}
    header, row, missing = bvl.ratio_table(table).splitlines()
    assert header.split() == ["metric", "lantern", "llama.cpp", "ratio"]
    assert row.split()[-3:] == ["20.00", "40.00", "0.50"]
    assert missing.split()[-3:] == ["1.00", "-", "-"]


def test_llama_bench_json_gives_the_generation_rate(bvl):
    assert bvl.parse_llama_bench(LLAMA_BENCH_JSON) == pytest.approx(125.641318)  # not the pp512 row
    with pytest.raises(ValueError, match="no tg row"):
        bvl.parse_llama_bench('[{"n_prompt": 512, "n_gen": 0, "avg_ts": 300.0}]')


def test_arguments_and_commands(bvl, tmp_path):
    args = bvl.parse_args([])
    assert (args.threads, args.requests, args.prompt_len, args.out_len, args.backend) == (2, 32, 128, 128, "torch")
    assert args.gguf.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    args = bvl.parse_args(["--threads", "1", "--backend", "mlx", "--gguf", "/m.gguf", "--concurrent-temps", "0", "1"])
    assert (args.threads, args.backend, str(args.gguf), args.concurrent_temps) == (1, "mlx", "/m.gguf", [0.0, 1.0])
    with pytest.raises(SystemExit):
        bvl.parse_args(["--threads", "0"])
    cmd = bvl.llama_server_cmd(Path("/b/llama-server"), Path("/m.gguf"), 2, 8080, 32, 256)
    assert [cmd[cmd.index(f) + 1] for f in ("-t", "-tb", "-np", "-c", "--port")] == ["2", "2", "32", "8192", "8080"]
    bench = bvl.llama_bench_cmd(Path("/b/llama-bench"), Path("/m.gguf"), 1, 128)
    assert [bench[bench.index(f) + 1] for f in ("-t", "-p", "-n", "-o")] == ["1", "0", "128", "json"]
    serve = bvl.lantern_serve_cmd(Path("/m.gguf"), "torch", 1, 9000, 32)
    assert [serve[serve.index(f) + 1] for f in ("--f", "--threads", "--p", "--max-num-seqs")] == [
        "/m.gguf",
        "1",
        "9000",
        "32",
    ]
    assert "--no-prefix-cache" in serve


def test_missing_llamacpp_binaries_are_named(bvl, tmp_path):
    with pytest.raises(SystemExit, match="llama-server, llama-bench, llama-quantize"):
        bvl.llamacpp_binaries(tmp_path)
    (tmp_path / "bin").mkdir()
    for name in ("llama-server", "llama-bench", "llama-quantize"):
        (tmp_path / "bin" / name).write_text("#!/bin/sh\n")
        (tmp_path / "bin" / name).chmod(0o755)
    assert bvl.llamacpp_binaries(tmp_path)["llama-bench"] == tmp_path / "bin" / "llama-bench"


def test_random_llama_gguf_has_the_shape_and_the_source_tokenizer(bvl, tmp_path):
    gguf = pytest.importorskip("gguf")
    import numpy as np

    src = tmp_path / "src.gguf"
    w = gguf.GGUFWriter(str(src), "llama")
    tokens = [f"tok{i}" for i in range(96)]
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens)
    w.add_token_types([1] * 96)
    w.add_token_merges(["t o", "to k"])
    w.add_bos_token_id(1)
    w.add_tensor("token_embd.weight", np.zeros((96, 32), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    shape = {"hidden": 64, "layers": 2, "heads": 4, "kv_heads": 2, "intermediate": 96}
    out = tmp_path / "tiny.gguf"
    bvl.make_llama_gguf(src, out, shape, "Q4_0")
    r = gguf.GGUFReader(str(out))
    assert r.fields["tokenizer.ggml.tokens"].contents() == tokens
    assert r.fields["tokenizer.ggml.merges"].contents() == ["t o", "to k"]
    assert r.fields["llama.attention.head_count_kv"].contents() == 2
    assert r.fields["llama.feed_forward_length"].contents() == 96
    tensors = {t.name: t for t in r.tensors}
    assert len(tensors) == 2 + 2 * 9
    k = tensors["blk.1.attn_k.weight"]
    assert k.tensor_type == gguf.GGMLQuantizationType.Q4_0 and list(k.shape) == [64, 32]  # GGUF order: in, out
    assert tensors["token_embd.weight"].tensor_type == gguf.GGMLQuantizationType.Q8_0
    assert tensors["blk.0.attn_norm.weight"].tensor_type == gguf.GGMLQuantizationType.F32
    down = gguf.quants.dequantize(tensors["blk.0.ffn_down.weight"].data, gguf.GGMLQuantizationType.Q4_0)
    assert down.shape == (64, 96) and 0.015 < float(np.std(down)) < 0.025  # the N(0, 0.02) it was drawn from

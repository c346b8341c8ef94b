"""`lantern bench`: its cost model against transformers' own parameter counts, and one real run."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from lantern.app.bench import SHAPES, Peaks, ShapeCost, run_bench  # noqa: E402


@pytest.mark.parametrize("shape_name", list(SHAPES))
def test_cost_model_counts_the_parameters_transformers_builds(shape_name):
    from transformers import AutoModelForCausalLM, LlamaConfig

    shape = SHAPES[shape_name]
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(LlamaConfig(**shape))
    expected = sum(p.numel() for p in model.parameters())  # tied weights are counted once
    assert ShapeCost.of(shape, 2).num_params(shape, 2) == expected


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


def test_data_sheet_peaks_follow_the_dtype(monkeypatch):
    from lantern.app import bench

    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    cuda = torch.device("cuda")
    bf16, f32 = bench.device_peaks(cuda, torch.bfloat16), bench.device_peaks(cuda, torch.float32)
    assert bf16.bandwidth == f32.bandwidth == 3.35e12
    assert bf16.flops == 989e12 and f32.flops == 67e12  # CUDA-core float32, not half the tensor rate

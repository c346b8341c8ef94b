"""Programmatic dependent launch (backends/torch/kernels/pdl.py): off on a CPU and where turned off; on a Hopper GPU
a decode-like chain of PDL kernels (norm -> dp4a GEMV -> rope + KV write -> attention -> norm, each reading the one
before), replayed from a CUDA graph, gives what the same chain launched plainly gives, bit for bit.
(The PDL cases of the sm_90 compile are in test_compile_cuda: griddepcontrol in their PTX, in no other kernel's.)"""

from __future__ import annotations

import logging

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from lantern.backends.torch.kernels import pdl  # noqa: E402


def test_off_on_a_cpu():
    assert pdl.launch(torch.zeros(2)) == {"PDL": False, "launch_pdl": False}


def test_turned_off_once_and_said(monkeypatch, caplog):
    monkeypatch.setitem(pdl._OFF, "flag", False)
    with caplog.at_level(logging.WARNING):
        assert pdl.turn_off("a capture refused it") is True
    assert "programmatic dependent launch turned off: a capture refused it" in caplog.text
    assert pdl.turn_off("again") is False  # (nothing left to retry)


@pytest.mark.gpu
def test_a_chain_of_pdl_kernels_in_a_cuda_graph_matches_plain_launches(monkeypatch):
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("programmatic dependent launch needs a Hopper (sm_90) or later GPU")
    from lantern.backends.torch.kernels import triton_fused as tf
    from lantern.backends.torch.kernels import triton_gemv_dp4a as td
    from lantern.backends.torch.kernels import triton_kernels as tk
    from tests.kernels.test_triton_quant import make_weight

    dev, dt, k, heads, kvh, d, bs = torch.device("cuda"), torch.bfloat16, 2048, 16, 4, 128, 16
    gen = torch.Generator(device=dev).manual_seed(0)
    _, packed, scales, biases = make_weight((heads + 2 * kvh) * d, k, 4, 64, dt, 1, dev)
    norm_w = torch.rand(k, device=dev, generator=gen, dtype=torch.float32).to(dt) + 0.5
    k_pool = torch.zeros(64 * bs, kvh, d, device=dev, dtype=dt)
    v_pool = torch.zeros_like(k_pool)
    pos = torch.arange(4096, device=dev, dtype=torch.float32)[:, None]
    freqs = pos / 10000 ** (torch.arange(0, d, 2, device=dev) / d)
    cos, sin = freqs.cos().to(dt), freqs.sin().to(dt)
    tables = torch.arange(64, device=dev, dtype=torch.int32).view(1, 64)
    x = torch.randn(1, k, device=dev, generator=gen).to(dt)
    slots = torch.arange(64, device=dev, dtype=torch.long)  # (sliced, not made in the loop: no kernel between)
    lens = torch.arange(1, 65, device=dev, dtype=torch.int32)

    def step(n: int) -> torch.Tensor:
        h, residual = x, torch.zeros_like(x)
        for i in range(n):  # 24 rounds of norm -> GEMV -> rope + KV write -> attention, each PDL kernel after another
            normed, residual = tf.rms_norm(h, norm_w, 1e-6, residual)
            qkv = td.gemv(normed, packed, scales, biases, 4, 64)
            q_k, v = qkv[:, : (heads + kvh) * d].view(1, heads + kvh, d), qkv[:, (heads + kvh) * d :].view(1, kvh, d)
            qk = tf.rotary_write_kv(q_k, v, cos[i : i + 1], sin[i : i + 1], k_pool, v_pool, slots[i : i + 1])
            att = tk.paged_decode(qk[:, :heads], k_pool, v_pool, tables, lens[i : i + 1], bs, d**-0.5, fold=True)
            h = att.reshape(1, -1)[:, :k]  # (the next norm adds it to the residual: no kernel between)
        return torch.cat([h, residual], dim=-1)

    def captured() -> torch.Tensor:
        k_pool.zero_(), v_pool.zero_()
        step(24)  # (compiles the kernels outside the capture)
        k_pool.zero_(), v_pool.zero_()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = step(24)
        k_pool.zero_(), v_pool.zero_()
        graph.replay()
        torch.cuda.synchronize()
        return out.clone()

    monkeypatch.setitem(pdl._OFF, "flag", False)
    assert pdl.launch(x)["launch_pdl"]
    with_pdl = captured()
    monkeypatch.setitem(pdl._OFF, "flag", True)
    plain = captured()
    assert torch.equal(with_pdl, plain) and with_pdl.abs().sum() > 0

"""The native bf16 elementwise steps (backends/torch/cpu_elementwise.py, kernels/cpu_elementwise.c)
against the torch code they replace (reference.rms_norm, reference.rotary, SiLU(gate) * up): the same
bf16 values up to one unit where a float32 sum's order or SiLU's exp lands on a rounding boundary;
strided inputs as the layers pass them; layouts the kernels do not take are refused (the torch path
serves them); inside a compiled graph the torch ops run; the engine's eager bf16 steps call them."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lantern.backends.torch import cpu_elementwise, native_build
from lantern.backends.torch.kernels import ops, reference

pytestmark = pytest.mark.skipif(
    not native_build.cpu_has_avx512(), reason="the native kernels are built for x86-64 CPUs with AVX-512 only"
)
BF16 = torch.bfloat16


def units_apart(a: torch.Tensor, b: torch.Tensor) -> int:
    """The most bf16 units (last places) between a and b, element by element (same signs)."""
    return int((a.view(torch.int16).int() - b.view(torch.int16).int()).abs().max()) if a.numel() else 0


def randn(*shape, seed=0, scale=1.0):
    return (torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale).to(BF16)


@pytest.mark.parametrize("rows, n", [(1, 576), (300, 576), (7, 40), (2048, 64)])
@pytest.mark.parametrize("with_residual", [False, True])
def test_rms_norm_matches_torch(rows, n, with_residual):
    x, r = randn(rows, n, seed=1), randn(rows, n, seed=2)
    w = (torch.rand(n, generator=torch.Generator().manual_seed(3)) + 0.5).to(BF16)
    residual = r if with_residual else None
    out, h = cpu_elementwise.rms_norm(x, w, 1e-5, residual)
    ref_out, ref_h = reference.rms_norm(x, w, 1e-5, residual)
    assert out.dtype == BF16 and out.shape == x.shape
    assert torch.equal(h, ref_h) and (h is x) == (residual is None)
    assert units_apart(out, ref_out) <= 1 and float((out != ref_out).float().mean()) < 0.01


def test_rms_norm_of_strided_heads_and_refusals():
    """q heads inside the q/k/v projection's output ([T, heads, d] with a token stride of the whole
    row) are normed in place of a copy; a layout whose rows are not evenly spaced, or another weight
    dtype, is left to the reference (None)."""
    qkv = randn(5, 3 * 64 + 2 * 16, seed=4)
    q = qkv[:, : 3 * 64].view(5, 3, 64)
    w = randn(64, seed=5)
    out, _ = cpu_elementwise.rms_norm(q, w, 1e-6)
    assert units_apart(out, reference.rms_norm(q, w, 1e-6)[0]) <= 1
    heads_first = randn(4, 6, 64, seed=6)[:, ::2].transpose(0, 1)  # still [outer][inner] rows
    out, _ = cpu_elementwise.rms_norm(heads_first, w, 1e-6)
    assert units_apart(out, reference.rms_norm(heads_first, w, 1e-6)[0]) <= 1
    uneven = randn(3, 4, 2, 64, seed=6)[:, 1:3]  # dims before the last two do not flatten
    assert cpu_elementwise.rms_norm(uneven, w, 1e-6) is None
    assert cpu_elementwise.rms_norm(q, w.float(), 1e-6) is None
    assert cpu_elementwise.rms_norm(q, w, 1e-6, residual=q[:2]) is None


@pytest.mark.parametrize("t, heads, d", [(1, 12, 64), (300, 12, 64), (9, 3, 80), (4, 2, 6)])
def test_rope_matches_torch_on_the_projection_view(t, heads, d):
    """x as the layers pass it: q and k heads side by side inside the projection's output."""
    qkv = randn(t, (heads + 1) * d, seed=7, scale=3.0)
    x = qkv[:, : heads * d].view(t, heads, d)
    gen = torch.Generator().manual_seed(8)
    cos, sin = torch.randn(t, d, generator=gen), torch.randn(t, d, generator=gen)
    out = cpu_elementwise.rope(x, cos, sin)
    ref = reference.rotary(x, cos, sin)
    assert out.is_contiguous() and units_apart(out, ref) <= 1
    assert float((out != ref).float().mean()) < 0.01
    assert cpu_elementwise.rope(x, cos.double(), sin.double()) is None
    assert cpu_elementwise.rope(x, cos[:1], sin[:1]) is None or t == 1


@pytest.mark.parametrize("t, n", [(1, 1536), (300, 1536), (5, 24)])
def test_silu_mul_matches_torch(t, n):
    gate_up = randn(t, 2 * n, seed=9, scale=4.0)
    gate, up = gate_up.chunk(2, dim=-1)
    out = cpu_elementwise.silu_mul(gate_up)
    ref = F.silu(gate).mul_(up)
    assert out.shape == (t, n) and units_apart(out, ref) <= 1
    assert float((out != ref).float().mean()) < 0.01


def test_silu_mul_extremes():
    """Saturated and signed-zero inputs: SiLU's e^-|x| never overflows."""
    gate = torch.tensor([-1e4, -50.0, -1e-30, 0.0, 1e-30, 50.0, 1e4, float("inf")] * 2).to(BF16)
    gate_up = torch.cat([gate, torch.ones_like(gate)])[None]
    out = cpu_elementwise.silu_mul(gate_up)[0].float()
    ref = F.silu(gate.float())
    assert torch.allclose(out, ref.to(BF16).float(), rtol=2**-7, atol=1e-20)


def test_the_ops_take_the_native_steps_eagerly_and_torchs_when_compiled(monkeypatch):
    """ops.rms_norm / ops.rotary / ops.silu_mul call the kernels for bf16 CPU tensors in eager mode;
    a compiled graph traces the torch ops (no graph break: fullgraph)."""
    calls = []
    for name in ("rms_norm", "rope", "silu_mul"):
        real = getattr(cpu_elementwise, name)
        monkeypatch.setattr(cpu_elementwise, name, lambda *a, _r=real, _n=name, **k: calls.append(_n) or _r(*a, **k))
    x, w = randn(6, 64, seed=10), randn(64, seed=11)
    cos, sin = torch.randn(6, 64), torch.randn(6, 64)

    def layer(x):
        normed, _ = ops.rms_norm(x, w, 1e-6)
        roped = ops.rotary(normed.view(6, 1, 64), cos, sin)
        gate_up = torch.cat([roped.view(6, 64), x], dim=-1)
        act = ops.silu_mul(gate_up)  # None: the caller's torch ops (as layers.MLP does)
        if act is None:
            gate, up = gate_up.chunk(2, dim=-1)
            act = F.silu(gate) * up
        return act

    eager = layer(x)
    assert calls == ["rms_norm", "rope", "silu_mul"]
    calls.clear()
    compiled = torch.compile(layer, fullgraph=True, backend="inductor")(x)
    assert not calls  # inductor keeps the bf16 intermediates in float32: close, not equal
    assert torch.allclose(compiled.float(), eager.float(), rtol=0.02, atol=0.01)


def test_a_bf16_engine_runs_its_layers_through_them(tiny_model_dir, monkeypatch):
    """A bf16 CPU engine's prefill and eager decode steps call all three, and its greedy tokens follow
    the torch path's logits closely (the tokens themselves may differ at near-ties of this random
    model, so the first-token top logprobs are compared)."""
    from lantern.app.engine import LLM, SamplingParams

    counts: dict[str, int] = {}
    for name in ("rms_norm", "rope", "silu_mul"):
        real = getattr(cpu_elementwise, name)
        monkeypatch.setattr(
            cpu_elementwise,
            name,
            lambda *a, _r=real, _n=name, **k: counts.__setitem__(_n, counts.get(_n, 0) + 1) or _r(*a, **k),
        )
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, logprobs=5)
    prompts = [list(range(5, 40)), list(range(50, 57))]

    def first_logprobs() -> list[dict[int, float]]:
        llm = LLM(tiny_model_dir("llama3"), backend="torch", dtype="bfloat16", block_size=4, num_kv_blocks=64)
        try:
            return [o.outputs[0].logprobs[0].top for o in llm.generate(prompts, params)]
        finally:
            llm.engine.shutdown()

    fast = first_logprobs()
    assert set(counts) == {"rms_norm", "rope", "silu_mul"}
    monkeypatch.setattr(cpu_elementwise, "serves", lambda x: False)
    slow = first_logprobs()
    for a, b in zip(fast, slow, strict=True):
        assert set(a) == set(b) and max(abs(a[t] - b[t]) for t in a) < 0.05

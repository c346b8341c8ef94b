"""The fused mixture-of-experts kernel (triton_moe) against its plain-torch reference (moe_reference).

On CPU the kernel runs in Triton's interpreter (TRITON_INTERPRET=1, see conftest.py) with 16-wide
blocks so that grids stay tiny; N and K are not multiples of the blocks, so every edge is masked.
The reference is independently checked against transformers' MoE block in tests/unit/test_moe.py
through the torch layer's CPU path, which computes the same maths.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lantern.backends.torch.kernels import moe_reference as mr

tm = pytest.importorskip("lantern.backends.torch.kernels.triton_moe")
tq = pytest.importorskip("lantern.backends.torch.kernels.triton_quant")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if DEVICE == "cuda" else [])  # no bf16 dot on CPU
TOL = {torch.float32: 1e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}
SMALL = {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16}


def routing(tokens: int, experts: int, k: int, seed: int, skew: bool = False):
    g = torch.Generator().manual_seed(seed)
    scores = torch.rand(tokens, experts, generator=g)
    if skew:  # every token picks expert 1 first: one long run, most experts idle
        scores[:, 1] += 2
    ids = scores.topk(k, dim=-1).indices
    weights = torch.rand(tokens, k, generator=g) + 0.1
    return ids.to(DEVICE), weights.to(DEVICE)


def float_experts(e: int, n: int, k: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(e, n, k, generator=g) / k**0.5).to(DEVICE, dtype)


def packed_experts(e: int, n: int, k: int, bits: int, group: int, dtype: torch.dtype, seed: int):
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 2**bits, (e, n, k), generator=g, dtype=torch.uint8)
    scales = (torch.rand(e, n, k // group, generator=g) + 1) * 3 / (2**bits * k**0.5)  # weights of std ~1/sqrt(k)
    biases = -scales * 2 ** (bits - 1)
    packed = torch.stack([tq.pack_codes(c, bits) for c in codes])
    return mr.PackedExperts(packed.to(DEVICE), scales.to(DEVICE, dtype), biases.to(DEVICE, dtype), bits, group)


def assert_matches(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> None:
    assert out.dtype == ref.dtype and out.shape == ref.shape
    scale = float(ref.float().abs().max())
    assert scale > 0.05, "degenerate test data"
    torch.testing.assert_close(out.float(), ref.float(), atol=TOL[dtype] * scale, rtol=TOL[dtype])


def test_align_groups_pairs_by_expert_in_whole_blocks():
    ids, _ = routing(7, 5, 3, seed=1)
    sorted_ids, block_expert = tm.align_by_expert(ids, 5, 4)
    flat = ids.reshape(-1).cpu()
    sorted_ids, block_expert = sorted_ids.cpu(), block_expert.cpu()
    pairs = flat.numel()
    assert sorted_ids.numel() % 4 == 0 and block_expert.numel() == sorted_ids.numel() // 4
    real = sorted_ids[sorted_ids < pairs]
    assert sorted(real.tolist()) == list(range(pairs))  # every pair exactly once
    for b, e in enumerate(block_expert.tolist()):
        block = sorted_ids[4 * b : 4 * b + 4]
        members = block[block < pairs]
        if e < 0:
            assert members.numel() == 0
        else:
            assert members.numel() > 0 and bool((flat[members] == e).all())
            assert members.tolist() == sorted(members.tolist())  # stable: token order within an expert
    assert (block_expert >= 0).sum() == sum(-(-int((flat == e).sum()) // 4) for e in range(5))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("tokens", "experts", "k", "skew"), [(1, 4, 2, False), (9, 6, 2, False), (12, 8, 3, True)])
def test_fused_moe_matches_reference(tokens, experts, k, skew, dtype):
    hidden, inner = 40, 24  # gate_up: N = 48, K = 40; down: N = 40, K = 24 (all partly masked)
    x = torch.randn(tokens, hidden, generator=torch.Generator().manual_seed(tokens)).to(DEVICE, dtype)
    gate_up = float_experts(experts, 2 * inner, hidden, dtype, seed=1)
    down = float_experts(experts, hidden, inner, dtype, seed=2)
    ids, weights = routing(tokens, experts, k, seed=tokens, skew=skew)
    out = tm.fused_moe(x, gate_up, down, ids, weights, **SMALL)
    assert_matches(out, mr.fused_moe_reference(x, gate_up, down, ids, weights), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("bits", "group"), [(4, 32), (8, 32), (4, 64)])
def test_fused_moe_on_quantized_experts_matches_reference(bits, group, dtype):
    tokens, experts, k, hidden, inner = 6, 4, 2, 128, 64
    x = torch.randn(tokens, hidden, generator=torch.Generator().manual_seed(3)).to(DEVICE, dtype)
    gate_up = packed_experts(experts, 2 * inner, hidden, bits, group, dtype, seed=4)
    down = packed_experts(experts, hidden, inner, bits, group, dtype, seed=5)
    ids, weights = routing(tokens, experts, k, seed=6)
    out = tm.fused_moe(x, gate_up, down, ids, weights, BLOCK_M=16, BLOCK_N=32, BLOCK_K=32)
    assert_matches(out, mr.fused_moe_reference(x, gate_up, down, ids, weights), dtype)


@pytest.mark.parametrize("quantized", [False, True])
def test_fused_moe_on_ungated_experts_matches_reference(quantized):
    """Nemotron 3's experts: gate_up holds the up rows alone and the activation is relu(up)^2; the reference is
    checked against the per-token sum in test_reference_is_the_per_token_sum."""
    dtype, tokens, experts, k, hidden, inner = torch.float32, 7, 6, 3, 64, 96
    x = torch.randn(tokens, hidden, generator=torch.Generator().manual_seed(8)).to(DEVICE, dtype)
    if quantized:
        up = packed_experts(experts, inner, hidden, 4, 32, dtype, 9)
        down = packed_experts(experts, hidden, inner, 8, 32, dtype, 10)
    else:
        up, down = float_experts(experts, inner, hidden, dtype, 9), float_experts(experts, hidden, inner, dtype, 10)
    ids, weights = routing(tokens, experts, k, seed=11)
    relu2 = mr.ACTIVATIONS["relu2"]
    out = tm.fused_moe(x, up, down, ids, weights, activate=relu2, BLOCK_M=16, BLOCK_N=32, BLOCK_K=32)
    assert_matches(out, mr.fused_moe_reference(x, up, down, ids, weights, "relu2", gated=False), dtype)


def test_reference_is_the_per_token_sum():
    """The reference itself, on one token: sum over its experts of w * down(act(gate) * up)."""
    x = torch.randn(1, 8)
    gate_up, down = torch.randn(3, 10, 8), torch.randn(3, 8, 5)
    ids, weights = torch.tensor([[2, 0]]), torch.tensor([[0.7, 0.3]])
    want = torch.zeros(8)
    for e, w in zip(ids[0].tolist(), weights[0].tolist()):
        h = gate_up[e] @ x[0]
        want += w * (down[e] @ (torch.nn.functional.silu(h[:5]) * h[5:]))
    torch.testing.assert_close(mr.fused_moe_reference(x, gate_up, down, ids, weights)[0], want, atol=1e-5, rtol=1e-5)
    # ungated (Nemotron 3): w * down(relu(up)^2) with gate_up holding up's rows alone
    up = gate_up[:, :5]
    want = sum(w * (down[e] @ torch.relu(up[e] @ x[0]).square()) for e, w in zip(ids[0].tolist(), weights[0].tolist()))
    got = mr.fused_moe_reference(x, up, down, ids, weights, "relu2", gated=False)[0]
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_kernel_on_a_layers_weights_matches_its_cpu_path():
    """The torch SparseMoE's stacked experts and routing through the kernel == its grouped CPU path
    (which tests/unit/test_moe.py checks against transformers' block)."""
    from tests.unit.test_moe import hf_block, torch_moe

    block, cfg = hf_block("qwen2_moe")
    moe = torch_moe(block, cfg)
    x = torch.randn(5, cfg.hidden_size, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ids, weights = moe.route(x)
        want = moe.routed(x, ids, weights)
        got = tm.fused_moe(
            x, moe.experts.gate_up_proj, moe.experts.down_proj, ids, weights, activate=moe.activate, **SMALL
        )
    assert_matches(got, want, torch.float32)


def test_quantized_experts_stack_into_the_kernels_layout():
    """QuantExperts of Triton layers (the CUDA loading path) stack into PackedExperts; the kernel on
    them == the reference on the AffineWeights' own dequantized values, and each expert's layer still
    computes from views of the stacks."""
    from lantern.app.models.quant.affine import ErrorLog, quantize_affine
    from lantern.backends.torch.moe import QuantExperts
    from lantern.backends.torch.quant_linear import quantized_linear

    experts, hidden, inner = 4, 64, 32
    g = torch.Generator().manual_seed(7)
    layers = QuantExperts(experts)
    dense = {"gate_up": [], "down": []}
    for e in range(experts):
        for name, shape in (("gate_up", (2 * inner, hidden)), ("down", (hidden, inner))):
            w = quantize_affine((torch.randn(*shape, generator=g) / shape[1] ** 0.5).numpy(), 4, 32)
            dense[name].append(torch.from_numpy(w.dequantize()))
            layer = quantized_linear(w, None, "cpu", torch.float32, ErrorLog(), kernel="triton")
            getattr(layers, f"{name}_proj")[e] = layer
    layers.stack_for_cuda()
    assert layers.packed is not None
    x = torch.randn(6, hidden, generator=g)
    ids, weights = routing(6, experts, 2, seed=8)
    ref = mr.fused_moe_reference(x, torch.stack(dense["gate_up"]), torch.stack(dense["down"]), ids, weights)
    got = tm.fused_moe(x, *layers.packed, ids, weights, BLOCK_M=16, BLOCK_N=32, BLOCK_K=32)
    assert_matches(got, ref, torch.float32)
    assert layers.down_proj[2].packed.data_ptr() == layers.packed[1].packed[2].data_ptr()  # one copy
    torch.testing.assert_close(
        layers.down_proj[2](x[:, :inner]), x[:, :inner] @ dense["down"][2].T, atol=1e-4, rtol=1e-4
    )


def e2m1_experts(e: int, n: int, k: int, group: int, dtype: torch.dtype, seed: int) -> mr.PackedExperts:
    """fp4 experts: every nibble is an e2m1 value (at most 6), scales giving weights of std ~1/sqrt(k)."""
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 16, (e, n, k), generator=g, dtype=torch.uint8)
    scales = (torch.rand(e, n, k // group, generator=g) + 0.5) / (3 * k**0.5)
    packed = torch.stack([tq.pack_codes(c, 4) for c in codes])
    return mr.PackedExperts(packed.to(DEVICE), scales.to(DEVICE, dtype), None, 4, group, "e2m1")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("group", [16, 32])
def test_fused_moe_on_e2m1_experts_with_biases_and_a_glu(group, dtype):
    """gpt-oss's shape of MoE on fp4 experts: MXFP4 (g32) / NVFP4 (g16) codes, an output bias per
    expert on both projections and the clamped SwiGLU between them."""
    from lantern.backends.torch.moe import clamped_swiglu

    tokens, experts, k, hidden, inner = 7, 4, 2, 64, 64
    g = torch.Generator().manual_seed(group)
    x = torch.randn(tokens, hidden, generator=g).to(DEVICE, dtype)
    gate_up = e2m1_experts(experts, 2 * inner, hidden, group, dtype, seed=1)
    down = e2m1_experts(experts, hidden, inner, group, dtype, seed=2)
    biases = {"gate_up_bias": torch.randn(experts, 2 * inner, generator=g).to(DEVICE, dtype) * 0.3}
    biases["down_bias"] = torch.randn(experts, hidden, generator=g).to(DEVICE, dtype) * 0.3
    glu = clamped_swiglu(1.702, 1.0)
    ids, weights = routing(tokens, experts, k, seed=9)
    activate = lambda h: glu(*h.chunk(2, dim=-1))  # (SparseMoE.activate's gated form)
    out = tm.fused_moe(x, gate_up, down, ids, weights, activate=activate, **biases, BLOCK_M=16, BLOCK_N=32, BLOCK_K=32)
    ref = mr.fused_moe_reference(x, gate_up, down, ids, weights, glu=glu, **biases)
    assert_matches(out, ref, dtype)
    unbiased = mr.fused_moe_reference(x, gate_up, down, ids, weights, glu=glu)
    assert (ref.float() - unbiased.float()).abs().max() > 0.05  # the biases count
    with pytest.raises(ValueError, match="expert biases"):
        tm.fused_moe(x, gate_up, down, ids, weights, gate_up_bias=biases["down_bias"], **SMALL)
    affine_without_biases = mr.PackedExperts(gate_up.packed, gate_up.scales, None, 4, group)  # scales read as biases
    with pytest.raises(ValueError, match="need biases exactly when affine"):
        tm.fused_moe(x, affine_without_biases, down, ids, weights, **SMALL)


def test_the_reference_adds_biases_and_applies_the_glu_per_pair():
    """The reference on one token by hand: sum over its experts of w * (down(glu(gate, up) + b2))."""
    from lantern.backends.torch.moe import clamped_swiglu

    x = torch.randn(1, 8)
    gate_up, down = torch.randn(3, 10, 8), torch.randn(3, 8, 5)
    b1, b2 = torch.randn(3, 10), torch.randn(3, 8)
    ids, weights = torch.tensor([[2, 0]]), torch.tensor([[0.7, 0.3]])
    glu = clamped_swiglu(1.702, 7.0)
    want = torch.zeros(8)
    for e, w in zip(ids[0].tolist(), weights[0].tolist()):
        h = gate_up[e] @ x[0] + b1[e]
        want += w * (down[e] @ glu(h[:5], h[5:]) + b2[e])
    got = mr.fused_moe_reference(x, gate_up, down, ids, weights, glu=glu, gate_up_bias=b1, down_bias=b2)
    torch.testing.assert_close(got[0], want, atol=1e-5, rtol=1e-5)


def gpt_oss_moe(tokens: int):
    from lantern.app.models.spec import ModelConfig
    from lantern.backends.torch.moe import SparseMoE, clamped_swiglu
    from tests.unit.test_moe import hf_config

    cfg = ModelConfig.from_hf(
        hf_config(
            "gpt_oss", num_local_experts=4, num_experts_per_tok=2, head_dim=8, swiglu_limit=2.0, intermediate_size=64
        ).to_dict()  # MXFP4's groups of 32 need both widths a multiple of 32
    )
    moe = SparseMoE(cfg, router_bias=True, expert_bias=True, glu=clamped_swiglu(1.702, 2.0), softmax_after_topk=True)
    torch.manual_seed(1)
    with torch.no_grad():
        for p in moe.parameters():
            p.normal_(0, 0.5)
    return moe.eval(), torch.randn(tokens, cfg.hidden_size)


def routed_on_both_paths(moe, x, monkeypatch) -> tuple[list[dict], torch.Tensor, torch.Tensor]:
    """SparseMoE.routed on its CPU path, then with the Triton path switched on (left on): (fused_moe's keyword
    arguments per call, the Triton path's output, the CPU path's)."""
    from lantern.backends.torch.kernels import ops

    calls = []
    real = tm.fused_moe
    monkeypatch.setattr(tm, "fused_moe", lambda *a, **kw: calls.append(kw) or real(*a, **kw, **SMALL))
    with torch.no_grad():
        ids, weights = moe.route(x)
        want = moe.routed(x, ids, weights)
        monkeypatch.setattr(ops, "use_triton", lambda t: True)
        return calls, moe.routed(x, ids, weights), want


@pytest.mark.parametrize("quantized", [False, True])
def test_gpt_oss_experts_take_the_fused_kernel(quantized, monkeypatch):
    """SparseMoE.routed on gpt-oss's experts (float BiasedExperts, or MXFP4 QuantExperts stacked as on
    CUDA) with the Triton path switched on == the same layer's CPU path (the grouped matmuls, which
    test_moe.py checks against the dense path), and the kernel is what ran."""
    from lantern.app.models.quant.affine import ErrorLog
    from lantern.app.models.quant.microscaled import MxWeight
    from lantern.backends.torch import moe as moe_mod
    from lantern.backends.torch.quant_linear import quantized_linear

    moe, x = gpt_oss_moe(5)
    if quantized:  # MXFP4 experts as family_gptoss leaves them: Triton layers, then stacked
        experts = moe_mod.QuantExperts.replacing(moe.experts)
        rng = np.random.default_rng(0)
        for name, proj in (("gate_up", experts.gate_up_proj), ("down", experts.down_proj)):
            n, k = getattr(moe.experts, f"{name}_proj").shape[1:]
            for e in range(len(proj)):
                words = rng.integers(0, 2**32, (n, k // 8), dtype=np.uint32)
                w = MxWeight("mxfp4", words, rng.integers(119, 123, (n, k // 32)).astype(np.uint8), "t").portable()
                proj[e] = quantized_linear(w, None, "cpu", torch.float32, ErrorLog(), kernel="triton")
        experts.stack_for_cuda()
        assert experts.packed is not None and experts.packed[0].code == "e2m1"
        moe.experts = experts
    calls, got, want = routed_on_both_paths(moe, x, monkeypatch)
    assert len(calls) == 1 and calls[0]["activate"] == moe.activate and calls[0]["down_bias"] is not None
    assert_matches(got, want, torch.float32)


@pytest.mark.parametrize("dtype", DTYPES)
def test_fused_moe_on_block_scaled_fp8_experts(dtype):
    """FP8 experts with 128x128 block scales (Qwen3-MoE-FP8, DeepSeek-V3) as the CUDA loader stacks
    them: each expert an e4m3 Triton layer, the stack's kernel == the reference on torch's own
    float8_e4m3fn decode of the bytes times the block scales."""
    from lantern.app.models.quant.affine import ErrorLog, Fp8Weight
    from lantern.backends.torch.moe import QuantExperts
    from lantern.backends.torch.quant_linear import quantized_linear

    experts, hidden, inner = 3, 128, 128
    g = torch.Generator().manual_seed(11)
    layers = QuantExperts(experts)
    dense = {"gate_up": [], "down": []}
    for e in range(experts):
        for name, (n, k) in (("gate_up", (2 * inner, hidden)), ("down", (hidden, inner))):
            data = (torch.randn(n, k, generator=g) * 50).to(torch.float8_e4m3fn).view(torch.uint8).numpy()
            scales = (torch.rand(-(-n // 128), k // 128, generator=g) * 0.002 + 0.001).numpy()
            w = Fp8Weight(data, scales, (128, 128), f"fp8 {name}")
            dense[name].append(torch.from_numpy(w.dequantize(np.float32)))
            getattr(layers, f"{name}_proj")[e] = quantized_linear(w, None, DEVICE, dtype, ErrorLog(), kernel="triton")
    layers.stack_for_cuda()
    assert layers.packed is not None and layers.packed[0].code == "e4m3" and layers.packed[0].biases is None
    x = torch.randn(5, hidden, generator=g).to(DEVICE, dtype)
    ids, weights = routing(5, experts, 2, seed=12)
    gate_up, down = layers.packed
    ref = mr.fused_moe_reference(
        x, torch.stack(dense["gate_up"]).to(DEVICE), torch.stack(dense["down"]).to(DEVICE), ids, weights
    )
    got = tm.fused_moe(x, gate_up, down, ids, weights, BLOCK_M=16, BLOCK_N=32, BLOCK_K=32)
    assert_matches(got, ref, dtype)


def test_a_silu_moe_leaves_its_activation_to_the_kernels(monkeypatch):
    """SparseMoE with silu(gate) * up (Mixtral's) passes activate=None to fused_moe -- the kernels' own, made in the
    decode GEMV's epilogue -- and the result is the CPU path's; a glu replaced after init (Step 3.5's clamp)
    is passed on as the layer's activate."""
    from lantern.app.models.spec import ModelConfig
    from lantern.backends.torch.moe import SparseMoE
    from tests.unit.test_moe import hf_config

    cfg = ModelConfig.from_hf(hf_config("mixtral", num_local_experts=4, num_experts_per_tok=2).to_dict())
    moe = SparseMoE(cfg)
    torch.manual_seed(2)
    with torch.no_grad():
        for p in moe.parameters():
            p.normal_(0, 0.5)
    x = torch.randn(3, cfg.hidden_size)
    calls, got, want = routed_on_both_paths(moe, x, monkeypatch)
    assert calls[-1]["activate"] is None
    assert_matches(got, want, torch.float32)
    with torch.no_grad():
        ids, weights = moe.route(x)
        moe.glu = lambda gate, up: torch.nn.functional.silu(gate).clamp(max=1.0) * up
        moe.routed(x, ids, weights)
        assert calls[-1]["activate"] == moe.activate

"""The dp4a decode GEMV (int8 activations) against its plain-torch reference, by hand, and in dispatch.

On CPU the kernel runs in Triton's interpreter, where `dp4a` is the same byte-wise sum written in shifts
(ASM=False): the packing of x and of the codes, the two int8 levels and the scales are checked
here; the inline PTX is checked by the cases marked gpu (and at load, by `verify`).
"""

from __future__ import annotations

import pytest
import torch

from lantern.backends.torch.kernels import quant_reference as qr

td = pytest.importorskip("lantern.backends.torch.kernels.triton_gemv_dp4a")
tq = pytest.importorskip("lantern.backends.torch.kernels.triton_quant")

TOL = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2}  # the output's rounding, relative to its largest value
INT8_X_TOL = 1e-3  # two int8 levels vs the exact product, beside the output's rounding (~1.5e-5 of a block's absmax)
SMALL = {"BLOCK_N": 8, "NB": 4, "num_warps": 1}  # 128 columns a step: K = 3 groups of 64 leaves a masked step


def make_weight(n: int, k: int, bits: int, group: int, dtype: torch.dtype, seed: int = 0, device: str = "cpu"):
    """(packed, scales, biases) as test_triton_quant makes them: scales of both signs, biases near the centre."""
    from tests.kernels.test_triton_quant import make_weight as codes_and_weight

    return codes_and_weight(n, k, bits, group, dtype, seed, device)[1:]


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.float() - ref.float()).abs().max() / ref.float().abs().max().clamp_min(1e-6))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("group", [32, 64, 128])
@pytest.mark.parametrize("bits", [4, 8])
def test_kernel_matches_reference(bits, group, dtype):
    """Masked K (3 groups: a part step), ragged N (37 and 13 rows: the last program's rows partly masked, with
    K masked or not, over several programs) and exact fits, 1 to 3 rows (an odd M: the second row of the last
    pair is not stored); tight against the int8-activation reference, and against the exact one within the
    output's rounding and INT8_X_TOL."""
    cases = [
        (1, 40, 3 * group, SMALL),
        (3, 37, 3 * group, SMALL),
        (2, 13, 512, SMALL),
        (1, 24, 256, {}),
        (3, 37, 256, {}),
    ]
    for m, n, k, cfg in cases:
        packed, scales, biases = make_weight(n, k, bits, group, dtype, seed=m * n + group + bits)
        x = torch.randn(m, k, generator=torch.Generator().manual_seed(m + k)).to(dtype)
        out = td.gemv(x, packed, scales, biases, bits, group, **cfg)
        assert out.dtype == dtype and out.shape == (m, n)
        want = qr.int8_activation_matmul_reference(x, packed, scales, biases, bits, group)
        assert rel_err(out, want) < TOL[dtype], (m, n, k, cfg)
        assert (
            rel_err(out, qr.affine_matmul_reference(x, packed, scales, biases, bits, group)) < TOL[dtype] + INT8_X_TOL
        )


@pytest.mark.parametrize("bits", [4, 8])
def test_two_int8_levels_by_hand(bits):
    """x as the kernel takes it, worked by hand: per 32 columns d = absmax / 127, q1 = round(x / d),
    q2 = round((x / d - q1) * 254), x ~ d (q1 + q2 / 254). Block 0 (absmax 127, d = 1): 2.5 -> 2 + 127/254
    (exact), 3.25 -> 3 + 64/254, 0.1 -> 0 + 25/254; block 1 (absmax 1): -0.5 -> (-64 + 127/254) / 127
    (exact), 0.25 -> (32 - 64/254) / 127. Row 2 reads 0.1's column alone with code 15 and scale 1: 15 * 25/254
    = 1.476, not 1.5 -- the second level's step shows; each output is sum((s code + b) x~) over its groups."""
    k = 64
    x = torch.zeros(1, k)
    x[0, :6] = torch.tensor([127.0, 2.5, -2.5, 3.25, -6.0, 0.1])
    x[0, 32:36] = torch.tensor([-0.5, 0.25, 0.75, 1.0])
    seen = torch.zeros(k, dtype=torch.float64)  # x~ by hand
    seen[:6] = torch.tensor([127.0, 2.5, -2.5, 3 + 64 / 254, -6.0, 25 / 254], dtype=torch.float64)
    seen[32:36] = torch.tensor([-64 + 127 / 254, 32 - 64 / 254, 95 + 64 / 254, 127.0], dtype=torch.float64) / 127
    codes = torch.zeros(3, k, dtype=torch.uint8)
    codes[0, :5] = torch.tensor([1, 3, 14, 7, 2])  # even and odd columns of block 0
    codes[1, 32:36] = torch.tensor([2, 4, 6, 8])
    codes[2, 5] = 15
    scales = torch.tensor([[1 / 64, 1 / 32], [1 / 16, 1 / 64], [1.0, 1.0]])
    biases = torch.tensor([[1 / 8, -1 / 4], [0.0, 1 / 2], [0.0, 0.0]])
    weight = codes.double() * scales.double().repeat_interleave(32, 1) + biases.double().repeat_interleave(32, 1)
    packed = tq.pack_codes(codes, bits)
    out = td.gemv(x.half(), packed, scales.half(), biases.half(), bits, 32, **SMALL)[0].double()
    atol = 2 * 2.0**-6  # two float16 steps at these magnitudes (< 16)
    torch.testing.assert_close(out, weight @ seen, rtol=0, atol=atol)
    assert abs(float(out[2]) - 15 * 25 / 254) < 2e-3 and abs(float(out[2]) - 1.5) > 0.02
    want = qr.int8_activation_matmul_reference(x.half(), packed, scales.half(), biases.half(), bits, 32)[0]
    torch.testing.assert_close(want.double(), weight @ seen, rtol=0, atol=atol)


@pytest.mark.parametrize("bits", [4, 8])
def test_largest_integer_sums(bits):
    """Every code at its largest and x at one constant (q1 = 127, q2 = 0 in every column): the dot products
    reach their bound (16 * 15 * 32258 * 32 for 4-bit, 255 * 32258 * 32 for 8-bit, < 2^31) and the result is
    the exact product; the biases make each weight 0 in one row, so the codes' part is all there is to see."""
    n, k = 8, 256
    codes = torch.full((n, k), (1 << bits) - 1, dtype=torch.uint8)
    scales = torch.full((n, k // 32), 0.5)
    biases = torch.zeros(n, k // 32)
    biases[0] = -0.5 * ((1 << bits) - 1)  # row 0: w = 0
    x = torch.full((1, k), 3.0).half()
    packed = tq.pack_codes(codes, bits)
    out = td.gemv(x, packed, scales.half(), biases.half(), bits, 32, **SMALL).float()
    want = qr.affine_matmul_reference(x.float(), packed, scales, biases, bits, 32)
    assert out[0, 0] == 0 and torch.equal(out[0, 1:], want[0, 1:].half().float())


def test_zero_blocks_and_strided_inputs():
    """An all-zero block (absmax 0) adds only its bias term (none); a column slice at an odd offset and a
    transpose are copied to the layout the kernel reads, with the same result."""
    packed, scales, biases = make_weight(24, 128, 4, 32, torch.float16, seed=5)
    x = torch.randn(2, 128).half()
    x[:, 32:64] = 0
    want = qr.int8_activation_matmul_reference(x, packed, scales, biases, 4, 32)
    assert rel_err(td.gemv(x, packed, scales, biases, 4, 32, **SMALL), want) < TOL[torch.float16]
    assert not td.gemv(torch.zeros(1, 128).half(), packed, scales, biases, 4, 32, **SMALL).any()
    wide = torch.randn(2, 161).half()
    flat = torch.randn(2 * 128 + 3).half()
    # a column slice, a transpose's transpose, rows at an odd offset, one row of an odd stride (the last two
    # count as contiguous to torch, yet cannot be read as int32 pairs as they lie)
    for xs in (wide[:, 1:129], x.T.contiguous().T, flat[3:].view(2, 128), wide[:1, :128], flat[1:129].view(1, 128)):
        want = qr.int8_activation_matmul_reference(xs, packed, scales, biases, 4, 32)
        assert rel_err(td.gemv(xs, packed, scales, biases, 4, 32, **SMALL), want) < TOL[torch.float16]
    assert td.gemv(torch.zeros(0, 128).half(), packed, scales, biases, 4, 32).shape == (0, 24)
    with pytest.raises(ValueError, match="multiple of 32"):
        td.gemv(torch.zeros(1, 48).half(), packed[:, :24], scales[:, :1], biases[:, :1], 4, 32)


def test_configs_divide_k_and_fill_the_gpu():
    """NB divides K's 32-column blocks where a power of two from 32 to 128 does (no masked steps); 16 rows a
    program for 4-bit (8 for 8-bit), fewer where that would leave fewer than ~2 programs per SM (counting every
    row of x a program is launched for: MoE pairs)."""
    assert td._config(28672, 4096, 4) == {"BLOCK_N": 16, "NB": 128, "num_warps": 4}
    assert td._config(4096, 4096, 4) == {"BLOCK_N": 16, "NB": 128, "num_warps": 4}  # 256 programs
    assert td._config(1024, 4096, 4)["BLOCK_N"] == 4
    assert td._config(4096, 14336, 4)["NB"] == 64  # 448 blocks = 7 x 64
    assert td._config(28672, 4096, 8)["BLOCK_N"] == 8
    assert td._config(64, 1536, 4)["NB"] == 64  # 48 blocks: no power of two >= 32 divides; masked
    assert td._config(64, 64, 4) == {"BLOCK_N": 4, "NB": 2, "num_warps": 1}
    assert td._config(1536, 2048, 4, rows_of_x=8)["BLOCK_N"] == 16  # MoE decode: 8 pairs fill the GPU too


def test_dispatch(monkeypatch):
    """affine_matmul: bf16 / fp16 decode rows (M <= GEMV_MAX_M) take the dp4a GEMV, float32 rows and
    LANTERN_GEMV=float the float GEMV, more rows the GEMM; leading dims are kept."""
    packed, scales, biases = make_weight(40, 256, 4, 64, torch.float16, seed=3)
    calls = []
    for mod, name in ((tq, "gemv"), (tq, "gemm"), (td, "gemv")):
        fn = getattr(mod, name)
        label = "dp4a" if mod is td else name
        monkeypatch.setattr(mod, name, lambda *a, _fn=fn, _l=label, **kw: calls.append(_l) or _fn(*a, **kw))
    x = torch.randn(2, 1, 256).half()
    out = tq.affine_matmul(x, packed, scales, biases, 4, 64)
    assert out.shape == (2, 1, 40)
    want = qr.int8_activation_matmul_reference(x.reshape(2, 256), packed, scales, biases, 4, 64)
    assert rel_err(out.reshape(2, 40), want) < TOL[torch.float16]
    tq.affine_matmul(x.float(), packed, scales.float(), biases.float(), 4, 64)
    tq.affine_matmul(torch.randn(3, 256).half(), packed, scales, biases, 4, 64)
    assert calls == ["dp4a", "gemv", "gemm"]
    calls.clear()
    monkeypatch.setenv("LANTERN_GEMV", "float")
    td.mode.cache_clear()
    try:
        out = tq.affine_matmul(x, packed, scales, biases, 4, 64)
        assert calls == ["gemv"]
        ref = qr.affine_matmul_reference(x.reshape(2, 256), packed, scales, biases, 4, 64)
        assert rel_err(out.reshape(2, 40), ref) < TOL[torch.float16]
    finally:
        td.mode.cache_clear()
    monkeypatch.setenv("LANTERN_GEMV", "fast")
    assert td.mode() == "dp4a"  # (a warning names the value)
    td.mode.cache_clear()
    assert not td.supports(x, 4, 16, "affine") and not td.supports(x, 4, 32, "e2m1")


def test_self_check_tells_a_right_kernel_from_a_wrong_one(monkeypatch):
    """`verify` (run on a GPU at load) rests on self_check, a score against per-dtype bounds: well under 1 for
    the kernel, over 1 for one whose activations are 5% off and for one that drops x's second int8 level
    (llama.cpp's one-level q8: caught by the fp16 cases) and for a gated epilogue that swaps gate and up; off a
    GPU verify is True without running."""
    assert td.self_check(torch.device("cpu")) < 0.5
    right = td.gemv
    monkeypatch.setattr(td, "gemv", lambda x, *a, **kw: right(x * 1.05, *a, **kw))
    assert td.self_check(torch.device("cpu")) > 1

    def one_level(x, packed, scales, biases, bits, group, gated=False, **config):  # q2 = round(r - q1) = 0
        x1 = qr.int8_activations(x, level2=1)
        h = qr.affine_matmul_reference(x1, packed, scales, biases, bits, group)
        if gated:
            gate, up = h.chunk(2, dim=-1)
            h = torch.nn.functional.silu(gate) * up
        return h.to(x.dtype)

    monkeypatch.setattr(td, "gemv", one_level)
    assert td.self_check(torch.device("cpu")) > 1

    def swapped_epilogue(x, packed, scales, biases, bits, group, gated=False, **config):  # silu(up) * gate
        if not gated:
            return right(x, packed, scales, biases, bits, group, **config)
        h = right(x, packed, scales, biases, bits, group, **config).float()
        gate, up = h.chunk(2, dim=-1)
        return (torch.nn.functional.silu(up) * gate).to(x.dtype)

    monkeypatch.setattr(td, "gemv", swapped_epilogue)
    assert td.self_check(torch.device("cpu")) > 1  # the gated cases catch a wrong epilogue
    assert td.verify(torch.device("cpu")) is True


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("bits,group", [(4, 32), (4, 64), (4, 128), (8, 32), (8, 128)])
@pytest.mark.parametrize("m", [1, 2, 3])
def test_cuda_default_configs(m, bits, group, dtype):
    """On a GPU (inline PTX dp4a) with the configs gemv picks: 8B-model widths (16-row programs, NB 128 and
    64), a narrow (4-row) and a ragged one; its self-check is well inside its bound, and verify() passes."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    assert td.self_check(torch.device("cuda")) < 0.5
    assert td.verify(torch.device("cuda"))
    for n, k in [(28672, 4096), (4096, 14336), (1024, 4096), (4100, 1536)]:
        packed, scales, biases = make_weight(n, k, bits, group, dtype, seed=m + n, device="cuda")
        x = torch.randn(m, k, device="cuda").to(dtype)
        out = td.gemv(x, packed, scales, biases, bits, group)
        assert rel_err(out, qr.int8_activation_matmul_reference(x, packed, scales, biases, bits, group)) < TOL[dtype]
        assert (
            rel_err(out, qr.affine_matmul_reference(x, packed, scales, biases, bits, group)) < TOL[dtype] + INT8_X_TOL
        )


def test_the_gemv_bench_times_the_dp4a_kernel_too(capsys):
    """scripts/bench_qgemv.py with 16-bit x (a tiny shape in the interpreter): the dp4a GEMV is checked
    against its reference, timed at its built-in config and another BLOCK_N, and named in the summary."""
    import importlib.util
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "scripts" / "bench_qgemv.py"
    spec = importlib.util.spec_from_file_location("bench_qgemv", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    args = ["--device", "cpu", "--shape", "32x256", "--dtype", "float16", "--iters", "1", "--repeats", "1"]
    (shape,) = script.main([*args, "--max-configs", "1", "--dp4a-configs", "1"])["shapes"]
    assert shape["dp4a_max_rel_err"] < TOL[torch.float16]
    assert shape["dp4a"]["config"] == td._config(32, 256, 4)
    assert shape["dp4a_best"]["config"]["BLOCK_N"] in (4, td._config(32, 256, 4)["BLOCK_N"])
    summary = json.loads(capsys.readouterr().out.splitlines()[-1])["32x256"]
    assert summary["dp4a_best"]["config"] == shape["dp4a_best"]["config"]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("bits", "group", "hidden"), [(4, 32, 96), (8, 64, 128), (4, 64, 128)])
def test_moe_decode_steps_take_the_per_pair_gemv(bits, group, hidden, dtype, monkeypatch):
    """fused_moe on packed affine experts: steps of 1 and 2 tokens take expert_gemv twice -- gate_up on each
    pair's token row (a_div = k) with its bias, down on each pair's own row with its bias and routing weight --
    each call tight against the int8-activation reference of its pairs' experts, the k pairs summed; 96
    features leave a masked K step and masked rows; 3 tokens take the grouped GEMM."""
    from lantern.backends.torch.kernels import moe_reference as mr
    from lantern.backends.torch.kernels import triton_moe as tm

    def experts(e, n, k, seed):
        g = torch.Generator().manual_seed(seed)
        codes = torch.randint(0, 2**bits, (e, n, k), generator=g, dtype=torch.uint8)
        scales = (torch.rand(e, n, k // group, generator=g) + 1) * 3 / (2**bits * k**0.5)
        biases = -scales * 2 ** (bits - 1) + 0.002 * torch.randn(e, n, k // group, generator=g)
        packed = torch.stack([tq.pack_codes(c, bits) for c in codes])
        return mr.PackedExperts(packed, scales.to(dtype), biases.to(dtype), bits, group)

    n_exp, inner, k = 5, 64, 2
    gate_up, down = experts(n_exp, 2 * inner, hidden, 1), experts(n_exp, hidden, inner, 2)
    g = torch.Generator().manual_seed(3)
    biases = {"gate_up_bias": (0.1 * torch.randn(n_exp, 2 * inner, generator=g)).to(dtype)}
    biases["down_bias"] = (0.1 * torch.randn(n_exp, hidden, generator=g)).to(dtype)
    calls = []
    spy = td.expert_gemv
    monkeypatch.setattr(td, "expert_gemv", lambda *a, **kw: calls.append((a, kw, spy(*a, **kw))) or calls[-1][2])
    for tokens in (1, 2, 3):
        x = torch.randn(tokens, hidden, generator=g).to(dtype)
        ids = torch.stack([torch.randperm(n_exp, generator=g)[:k] for _ in range(tokens)])
        weights = torch.rand(tokens, k, generator=g) + 0.1
        calls.clear()
        out = tm.fused_moe(x, gate_up, down, ids, weights, **biases)
        exact = mr.fused_moe_reference(x, gate_up, down, ids, weights, **biases)
        if tokens > tm.GEMV_TOKENS:
            assert calls == []
            if dtype == torch.float16:  # (the interpreter's tl.dot takes no bf16: the grouped GEMM's own tests)
                assert rel_err(out, exact) < TOL[dtype]
            continue
        assert [c[0][7] for c in calls] == [k, 1]  # a_div: gate_up reads token rows, down the pairs' own
        assert [c[1].get("gated", False) for c in calls] == [True, False]  # the activation in gate_up's epilogue
        assert calls[0][2].shape == (tokens * k, inner)
        pair_ids = ids.reshape(-1)
        token_rows = x[torch.arange(tokens * k) // k]  # each pair's token
        for (args, kw, got), w, rows in ((calls[0], gate_up, token_rows), (calls[1], down, calls[1][0][0])):
            assert args[6] is pair_ids or torch.equal(args[6], pair_ids)
            for p, e in enumerate(pair_ids.tolist()):
                want = qr.int8_activation_matmul_reference(
                    rows[p : p + 1], w.packed[e], w.scales[e], w.biases[e], bits, group
                ).float()[0]
                want = want + kw["out_bias"][e].float()
                if kw.get("gated"):  # gate_up's epilogue: silu(gate) * up of the biased sums
                    gate, up = want.chunk(2)
                    want = torch.nn.functional.silu(gate) * up
                scale = float(weights.reshape(-1)[p]) if "routing" in kw else 1.0
                assert rel_err(got[p], (want * scale).to(dtype)) < TOL[dtype], (p, e)
        per_pair = calls[1][2].float().view(tokens, k, -1).sum(1)
        assert torch.equal(out, per_pair.to(dtype))  # the k pairs summed in float32
        assert rel_err(out, exact) < 2 * (TOL[dtype] + INT8_X_TOL)  # (two GEMVs, each rounded to x's dtype)
    x = torch.randn(1, hidden).to(dtype)
    assert tm.decode_gemv_serves(x, gate_up, down)
    assert not tm.decode_gemv_serves(x.float(), gate_up, down)  # float32 x: the grouped GEMM
    assert not tm.decode_gemv_serves(x, gate_up, mr.PackedExperts(down.packed, down.scales, None, 4, group, "e2m1"))

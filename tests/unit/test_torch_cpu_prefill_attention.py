"""The native prefill attention (cpu_attention.paged_prefill, kernels/cpu_prefill_attention.c) against
the plain-torch reference (reference.paged_prefill: the keys gathered from the pool, then SDPA or
explicit softmax), which the parity tests check against transformers: several chunks of a step in
one call, chunks after a cached prefix, grouped-query heads, windows, soft-capping, sinks, V inside
K, odd head sizes, float32 and bfloat16 pools, with and without bf16 dot products; a query's output
does not depend on how its sequence was cut into chunks or what else shares the step; the engine's
prefill steps take it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lantern.backends.torch import attention, cpu_attention, native_build
from lantern.backends.torch.attention import PrefillGroup
from lantern.backends.torch.kernels import reference

DTYPES = [torch.float32, torch.bfloat16]
ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(
    not native_build.cpu_has_avx512(), reason="the native kernels are built for x86-64 CPUs with AVX-512 only"
)


def prefill_case(chunks, kvh, g, d, dv, block_size, seed=0, v_in_k=False, dtype=torch.float32):
    """chunks: (queries, context) per sequence, each sequence's blocks scattered over the pools; q
    [T, H, D] a strided view (as the model's q beside k in one tensor), its first 3 tokens decode
    rows that no chunk owns."""
    gen = torch.Generator().manual_seed(seed)
    per_seq = [-(-ctx // block_size) for _, ctx in chunks]
    blocks = sum(per_seq) + 5
    order = torch.randperm(blocks, generator=gen)
    k = torch.randn(blocks * block_size, kvh, d, generator=gen).to(dtype)
    v = k[..., :dv] if v_in_k else torch.randn(blocks * block_size, kvh, dv, generator=gen).to(dtype)
    total = 3 + sum(n for n, _ in chunks)
    q = torch.randn(total, kvh * g + kvh, d, generator=gen).to(dtype)[:, : kvh * g]
    groups, start, used = [], 3, 0
    for (n, ctx), nb in zip(chunks, per_seq, strict=True):
        table = order[used : used + nb].int()
        groups.append(PrefillGroup(start, start + n, table, ctx, n < ctx))
        start, used = start + n, used + nb
    return q, k, v, groups


def widened(q, k, v):
    kf = k.float()
    return q.float(), kf, kf[..., : v.shape[-1]] if v.data_ptr() == k.data_ptr() else v.float()


def native(q, k, v, groups, block_size, **kw):
    packed = cpu_attention.prefill_groups(groups, q.device)
    return cpu_attention.paged_prefill(q, k, v, packed, block_size, q.shape[-1] ** -0.5, **kw)


def expected(q, k, v, groups, block_size, window=None, softcap=None, sinks=None):
    scale = q.shape[-1] ** -0.5
    return torch.cat(
        [
            reference.paged_prefill(
                q[g.q_start : g.q_end], k, v, g.block_table, g.ctx_len, block_size, scale, window, softcap, sinks
            )
            for g in groups
        ]
    )


CASES = {
    "smollm2, 16 prompts": dict(chunks=[(128, 128)] * 16, kvh=3, g=3, d=64, dv=64, block_size=16),
    "chunks after a prefix": dict(chunks=[(100, 300), (1, 40), (37, 37)], kvh=2, g=4, d=64, dv=64, block_size=16),
    "odd head size, small blocks": dict(chunks=[(33, 90), (20, 20)], kvh=2, g=2, d=80, dv=80, block_size=4),
    "mla, v inside k": dict(chunks=[(40, 70)], kvh=1, g=8, d=72, dv=40, block_size=32, v_in_k=True),
    "no grouping, tiny heads": dict(chunks=[(19, 19), (5, 9)], kvh=4, g=1, d=6, dv=6, block_size=8),
    "odd head size (bf16: no pairs to dot)": dict(chunks=[(21, 30)], kvh=1, g=3, d=7, dv=5, block_size=8),
    "long": dict(chunks=[(300, 900)], kvh=2, g=2, d=128, dv=128, block_size=16),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "bfloat16"])
@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("extras", ["plain", "window", "softcap+sinks"])
def test_matches_the_reference(name, extras, dtype):
    """float32: the reference's values up to float32 rounding. bf16: the float32 reference on the
    same (widened) values up to the output's one rounding to bf16, and within one unit in the last
    place of the kernel's own float32 result on the widened values, rounded (the sums run in another
    order where the CPU has bf16 dot products)."""
    case = dict(CASES[name])
    v_in_k = case.pop("v_in_k", False)
    q, k, v, groups = prefill_case(**case, v_in_k=v_in_k, dtype=dtype)
    bs = case["block_size"]
    kw = {}
    if extras == "window":
        kw["window"] = 23
    elif extras == "softcap+sinks":
        kw["softcap"] = 5.0
        kw["sinks"] = torch.randn(q.shape[1], generator=torch.Generator().manual_seed(9))
    qf, kf, vf = widened(q, k, v)
    ref = expected(qf, kf, vf, groups, bs, **kw)
    out = native(q, k, v, groups, bs, **kw)
    assert out.shape == ref.shape and out.dtype == dtype
    rounding = 2.0**-8 * ref.abs() if dtype == torch.bfloat16 else 0.0
    err = float(((out.float() - ref).abs() - rounding).max())
    assert err < 2e-5 * max(1.0, float(ref.abs().max())), err
    if dtype == torch.bfloat16:
        # (plus 1e-6 of the largest value: where a row's sum nearly cancels, the order of its float32
        # sums moves a tiny result by more than one of its own units)
        wide = native(qf, kf, vf, groups, bs, **kw).to(torch.bfloat16).float()
        assert bool(((out.float() - wide).abs() <= 2.0**-7 * wide.abs() + 1e-6 * ref.abs().max()).all())


@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "bfloat16"])
@pytest.mark.parametrize("window", [None, 37])
def test_a_querys_output_does_not_depend_on_chunking_or_neighbours(dtype, window):
    """A sequence prefilled in one chunk, in three chunks (each after its prefix), and beside other
    sequences gives every query the same values bit for bit: key chunks start at fixed positions."""
    q, k, v, groups = prefill_case([(150, 150), (60, 80), (9, 9)], 3, 3, 64, 64, 16, seed=3, dtype=dtype)
    whole = native(q, k, v, groups, 16, window=window)
    first = groups[0]
    alone = native(q, k, v, [first], 16, window=window)
    assert torch.equal(alone, whole[:150])
    pieces = []
    for a, b in ((0, 17), (17, 100), (100, 150)):
        piece = PrefillGroup(first.q_start + a, first.q_start + b, first.block_table, b, a > 0)
        pieces.append(native(q, k, v, [piece], 16, window=window))
    assert torch.equal(torch.cat(pieces), whole[:150])
    reordered = torch.cat([whole[210:], whole[150:210], whole[:150]])
    assert torch.equal(native(q, k, v, groups[::-1], 16, window=window), reordered)


def test_bad_inputs_are_refused_before_the_pool_is_read():
    q, k, v, groups = prefill_case([(20, 40)], 2, 2, 64, 64, 16)
    g = groups[0]
    outside = PrefillGroup(g.q_start, g.q_end, torch.tensor([0, k.shape[0] // 16 + 5], dtype=torch.int32), 40, True)
    with pytest.raises(ValueError, match="outside the KV pool"):
        native(q, k, v, [outside], 16)
    short = PrefillGroup(g.q_start, g.q_end, g.block_table[:1], 40, True)
    with pytest.raises(ValueError, match="needs more than"):
        native(q, k, v, [short], 16)
    with pytest.raises(ValueError, match="outside the KV pool"):  # padded to the wider table beside it
        native(q, k, v, [short, PrefillGroup(g.q_start, g.q_end, g.block_table, 40, True)], 16)
    with pytest.raises(ValueError, match="do not fit"):
        native(q[..., :32], k, v, groups, 16)
    with pytest.raises(ValueError, match="do not fit"):  # float16: not a dtype the kernel reads
        native(q.half(), k.half(), v.half(), groups, 16)
    with pytest.raises(ValueError, match="do not fit"):
        native(q, k, v, groups, 16, sinks=torch.zeros(q.shape[1] + 1))
    with pytest.raises(ValueError, match="do not fit"):
        native(q[:, :3], k, v, groups, 16)  # 3 query heads over 2 KV heads
    assert not cpu_attention.serves_prefill(q.double(), k.double(), v.double())
    assert not cpu_attention.serves_prefill(q.bfloat16(), k, v)  # q and the pools in one dtype
    assert cpu_attention.serves_prefill(q, k, v)
    assert cpu_attention.serves_prefill(q.bfloat16(), k.bfloat16(), v.bfloat16())


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_engine_prefills_through_it(tiny_model_dir, monkeypatch, dtype):
    """A CPU engine's prefill steps (several prompts in one step, and a prompt cut into chunks after a
    cached prefix) call the kernel once a layer, and give the reference path's tokens (float32) or
    logits within bf16's rounding (bfloat16)."""
    from lantern.app.engine import LLM, SamplingParams

    path = tiny_model_dir("llama3")
    shared = list(range(5, 45))
    prompts = [shared + list(range(50, 60)), list(range(30, 37)), shared + list(range(70, 101))]
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, logprobs=5)
    small = dict(backend="torch", dtype=dtype, block_size=4, num_kv_blocks=128, prefill_chunk_size=16)
    real, calls = cpu_attention.paged_prefill, []

    def spy(q, *a, **kw):
        calls.append((len(a[2][0]), q.dtype))
        return real(q, *a, **kw)

    layers = []

    def run() -> list:
        llm = LLM(path, **small)
        layers.append(llm.engine.model_config.num_layers)
        try:
            llm.generate(prompts[:1], params)  # its prefix is cached for the third prompt
            return llm.generate(prompts, params)
        finally:
            llm.engine.shutdown()

    monkeypatch.setattr(cpu_attention, "paged_prefill", spy)
    fast = run()
    assert calls and len(calls) % layers[0] == 0 and max(n for n, _ in calls) >= 2  # once a layer, chunks together
    assert {str(t) for _, t in calls} == {f"torch.{dtype}"}
    monkeypatch.setattr(cpu_attention, "serves_prefill", lambda *a: False)
    calls.clear()
    slow = run()
    assert not calls
    for a, b in zip(fast, slow, strict=True):
        if dtype == "float32":
            assert a.outputs[0].token_ids == b.outputs[0].token_ids
        else:  # the first token's top logprobs: same candidates, values within bf16 rounding
            top_a, top_b = a.outputs[0].logprobs[0].top, b.outputs[0].logprobs[0].top
            assert set(top_a) == set(top_b)
            assert max(abs(top_a[t] - top_b[t]) for t in top_a) < 0.05


def test_a_cpu_without_bf16_dot_products_gets_the_widening_build(tmp_path):
    """Built without AVX512-BF16 (a fresh process whose flag check says so), the kernel widens bf16
    keys to float32 and still matches the reference on bf16 pools, odd head sizes and V inside K."""
    code = f"""
import sys, torch
sys.path.insert(0, {str(ROOT)!r})
from lantern.backends.torch import cpu_attention
from tests.unit.test_torch_cpu_prefill_attention import CASES, prefill_case, widened, native, expected
cpu_attention._flags = lambda: ()
for name in ("smollm2, 16 prompts", "odd head size, small blocks", "mla, v inside k", "no grouping, tiny heads"):
    case = dict(CASES[name]); v_in_k = case.pop("v_in_k", False)
    q, k, v, groups = prefill_case(**case, v_in_k=v_in_k, dtype=torch.bfloat16)
    ref = expected(*widened(q, k, v), groups, case["block_size"], window=23)
    out = native(q, k, v, groups, case["block_size"], window=23)
    err = float(((out.float() - ref).abs() - 2.0**-8 * ref.abs()).max())
    assert err < 2e-5 * max(1.0, float(ref.abs().max())), (name, err)
print("ok")
"""
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["ok"]
    # the one build is the flag-less one (this asks for it: found, not built again)
    ask = "from lantern.backends.torch import native_build as n; "
    ask += "print(n.build(n.KERNELS / 'cpu_prefill_attention.c').name)"
    name = subprocess.run([sys.executable, "-c", ask], env=env, capture_output=True, text=True, timeout=300)
    built = list((tmp_path / "lantern" / "cpu_kernels").glob("cpu_prefill_attention-*.so"))
    assert [b.name for b in built] == [name.stdout.strip()]


def test_the_reference_path_serves_where_the_pool_is_not_native(tiny_model_dir, monkeypatch):
    """A pool the native kernels do not serve (the switch off, another dtype) never reaches the kernel."""
    monkeypatch.setattr(attention.cpu_attention, "serves", lambda dtype, device: False)
    monkeypatch.setattr(cpu_attention, "paged_prefill", lambda *a, **k: pytest.fail("the kernel was called"))
    from lantern.app.engine import LLM, SamplingParams

    llm = LLM(tiny_model_dir("llama3"), backend="torch", dtype="float32", block_size=4, num_kv_blocks=64)
    try:
        out = llm.generate([list(range(5, 30))], SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))
        assert len(out[0].outputs[0].token_ids) == 3
    finally:
        llm.engine.shutdown()

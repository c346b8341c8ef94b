"""The native paged decode attention (backends/torch/cpu_attention.py, kernels/cpu_paged_attention.c)
against the plain-torch reference (gather + SDPA / explicit softmax), which the parity tests check
against transformers: grouped-query heads, windows, soft-capping, sinks, V inside K, odd head sizes,
contexts over several parts; a row's output does not depend on the rows beside it; the engine's
decode steps take it, eagerly and inside compiled graphs."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from lantern.backends.torch import attention, cpu_attention, native_build
from lantern.backends.torch.kernels import reference

pytestmark = pytest.mark.skipif(
    not native_build.cpu_has_avx512(), reason="the native kernels are built for x86-64 CPUs with AVX-512 only"
)


def paged_case(b, kvh, g, d, dv, block_size, max_len, seed=0, v_in_k=False, min_len=1):
    """Pools with each row's blocks scattered over them, random lengths up to max_len."""
    gen = torch.Generator().manual_seed(seed)
    per_row = -(-max_len // block_size)
    blocks = b * per_row + 3
    tables = torch.randperm(blocks, generator=gen)[: b * per_row].view(b, per_row).int()
    lens = torch.randint(min_len, max_len + 1, (b,), generator=gen, dtype=torch.int32)
    k = torch.randn(blocks * block_size, kvh, d, generator=gen)
    v = k[..., :dv] if v_in_k else torch.randn(blocks * block_size, kvh, dv, generator=gen)
    q = torch.randn(b, kvh * g, d, generator=gen)
    return q, k, v, tables, lens


def native(q, k, v, tables, lens, block_size, window=None, softcap=None, sinks=None):
    scale = q.shape[-1] ** -0.5
    op = torch.ops.lantern.paged_decode_f32
    return op(q, k, v, tables, lens, block_size, scale, window or 0, softcap or 0.0, sinks)


CASES = {
    "smollm2": dict(b=32, kvh=3, g=3, d=64, dv=64, block_size=16, max_len=300),
    "one row, short": dict(b=1, kvh=3, g=3, d=64, dv=64, block_size=16, max_len=5),
    "odd head size": dict(b=4, kvh=2, g=4, d=80, dv=80, block_size=16, max_len=700),
    "mla, v inside k": dict(b=3, kvh=1, g=8, d=72, dv=40, block_size=32, max_len=600, v_in_k=True),
    "long, many parts": dict(b=2, kvh=2, g=2, d=128, dv=128, block_size=16, max_len=2500, min_len=1500),
    "no grouping": dict(b=5, kvh=4, g=1, d=32, dv=32, block_size=8, max_len=90),
}


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("extras", ["plain", "window", "softcap+sinks"])
def test_matches_the_reference(name, extras):
    case = dict(CASES[name])
    v_in_k = case.pop("v_in_k", False)
    q, k, v, tables, lens = paged_case(**case, v_in_k=v_in_k)
    bs = case["block_size"]
    kw = {}
    if extras == "window":
        kw["window"] = max(3, case["max_len"] // 3)
    elif extras == "softcap+sinks":
        kw["softcap"] = 5.0
        kw["sinks"] = torch.randn(q.shape[1], generator=torch.Generator().manual_seed(9))
    ref = reference.paged_decode(q, k, v, tables, lens, bs, q.shape[-1] ** -0.5, **kw)
    out = native(q, k, v, tables, lens, bs, **kw)
    assert out.shape == ref.shape and out.dtype == torch.float32
    err = float((out - ref).abs().max())
    assert err < 2e-5 * max(1.0, float(ref.abs().max())), err


def test_a_rows_output_does_not_depend_on_its_neighbours():
    """Each row alone, and the rows in another order, give the batch's values bit for bit: the
    key ranges are cut at fixed positions, not by the batch."""
    q, k, v, tables, lens = paged_case(9, 3, 3, 64, 64, 16, 700, seed=4)
    batch = native(q, k, v, tables, lens, 16, window=500)
    for i in range(9):
        alone = native(q[i : i + 1], k, v, tables[i : i + 1, : -(-int(lens[i]) // 16)], lens[i : i + 1], 16, window=500)
        assert torch.equal(alone[0], batch[i]), i
    order = torch.randperm(9, generator=torch.Generator().manual_seed(1))
    assert torch.equal(native(q[order], k, v, tables[order], lens[order], 16, window=500), batch[order])


def test_bad_inputs_are_refused_before_the_pool_is_read():
    q, k, v, tables, lens = paged_case(2, 2, 2, 64, 64, 16, 40)
    bad = tables.clone()
    bad[0, 0] = k.shape[0] // 16 + 5  # a block the pool does not have
    with pytest.raises(ValueError, match="outside the KV pool"):
        native(q, k, v, bad, torch.full((2,), 40, dtype=torch.int32), 16)
    with pytest.raises(ValueError, match="needs more than"):
        native(q, k, v, tables[:, :1], torch.full((2,), 40, dtype=torch.int32), 16)
    with pytest.raises(ValueError, match="do not fit"):
        native(q[..., :32], k, v, tables, lens, 16)
    with pytest.raises(ValueError, match="do not fit"):
        native(q.double(), k, v, tables, lens, 16)


def test_a_compiled_graph_calls_the_op_over_symbolic_widths():
    """The op has a fake implementation: one dynamic graph serves block tables of 2..5 blocks and
    gives the eager op's values."""
    from torch._dynamo.testing import CompileCounterWithBackend

    counter = CompileCounterWithBackend("inductor")
    fn = lambda q, k, v, t, n: torch.ops.lantern.paged_decode_f32(q, k, v, t, n, 16, 0.125, 0, 0.0, None) * 2
    compiled = torch.compile(fn, backend=counter, dynamic=True)
    for width in (2, 3, 5):
        q, k, v, tables, lens = paged_case(3, 2, 2, 64, 64, 16, 16 * width, seed=width, min_len=16 * width - 15)
        torch._dynamo.maybe_mark_dynamic(tables, 1)
        assert torch.equal(compiled(q, k, v, tables, lens), fn(q, k, v, tables, lens)), width
    assert counter.frame_count == 1


def test_the_engine_decodes_through_it(tiny_model_dir, monkeypatch):
    """A float32 CPU engine's decode steps read the pool in place (the step metadata says so and
    the op runs), and give the tokens of the gathered path."""
    from lantern.app.engine import LLM, SamplingParams

    path = tiny_model_dir("llama3")
    prompts = [list(range(5, 18)), list(range(30, 37))]
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    small = dict(backend="torch", dtype="float32", block_size=4, num_kv_blocks=64)
    calls = []
    lib = cpu_attention._library()
    real = lib.lantern_paged_decode
    try:
        lib.lantern_paged_decode = lambda *a: calls.append(a[1]) or real(*a)
        llm = LLM(path, **small)
        try:
            native_tokens = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
        finally:
            llm.engine.shutdown()
    finally:
        lib.lantern_paged_decode = real
    assert calls and 2 in calls
    monkeypatch.setattr(attention.cpu_attention, "serves", lambda dtype, device: False)
    llm = LLM(path, **small)
    try:
        gathered = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    finally:
        llm.engine.shutdown()
    assert native_tokens == gathered


def test_switched_off_nothing_serves(tmp_path):
    """LANTERN_CPU_KERNELS=0 (a fresh process: decided once): no pool is served natively and
    nothing is built."""
    code = (
        "import torch; from lantern.backends.torch import cpu_attention; "
        "print(cpu_attention.serves(torch.float32, 'cpu'))"
    )
    env = dict(os.environ, LANTERN_CPU_KERNELS="0", XDG_CACHE_HOME=str(tmp_path))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["False"]
    assert not (tmp_path / "lantern").exists()
    assert not cpu_attention.serves(torch.bfloat16, torch.device("cpu"))

"""The native paged decode attention (backends/torch/cpu_attention.py, kernels/cpu_paged_attention.c)
against the plain-torch reference (gather + SDPA / explicit softmax), which the parity tests check
against transformers: grouped-query heads, windows, soft-capping, sinks, V inside K, odd head sizes,
contexts over several parts, float32 and bfloat16 pools; a row's output does not depend on the rows
beside it; the engine's decode steps take it, eagerly and inside compiled graphs."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys

import pytest
import torch

from lantern.backends.torch import attention, cpu_attention, native_build
from lantern.backends.torch.kernels import reference

DTYPES = [torch.float32, torch.bfloat16]

pytestmark = pytest.mark.skipif(
    not native_build.cpu_has_avx512(), reason="the native kernels are built for x86-64 CPUs with AVX-512 only"
)


def paged_case(b, kvh, g, d, dv, block_size, max_len, seed=0, v_in_k=False, min_len=1, dtype=torch.float32):
    """Pools with each row's blocks scattered over them, random lengths up to max_len; q and the
    pools in `dtype`."""
    gen = torch.Generator().manual_seed(seed)
    per_row = -(-max_len // block_size)
    blocks = b * per_row + 3
    tables = torch.randperm(blocks, generator=gen)[: b * per_row].view(b, per_row).int()
    lens = torch.randint(min_len, max_len + 1, (b,), generator=gen, dtype=torch.int32)
    k = torch.randn(blocks * block_size, kvh, d, generator=gen).to(dtype)
    v = k[..., :dv] if v_in_k else torch.randn(blocks * block_size, kvh, dv, generator=gen).to(dtype)
    q = torch.randn(b, kvh * g, d, generator=gen).to(dtype)
    return q, k, v, tables, lens


def widened(q, k, v):
    """q, k, v in float32 (exact for bf16), V still a view into K where it was one."""
    kf = k.float()
    vf = kf[..., : v.shape[-1]] if v.data_ptr() == k.data_ptr() else v.float()
    return q.float(), kf, vf


@pytest.fixture(autouse=True)
def _op_defined():
    """torch.ops.lantern.paged_decode is defined the first time a pool asks whether it is served."""
    assert cpu_attention.serves(torch.float32, torch.device("cpu"))


def native(q, k, v, tables, lens, block_size, window=None, softcap=None, sinks=None):
    scale = q.shape[-1] ** -0.5
    op = torch.ops.lantern.paged_decode
    return op(q, k, v, tables, lens, block_size, scale, window or 0, softcap or 0.0, sinks)


CASES = {
    "smollm2": dict(b=32, kvh=3, g=3, d=64, dv=64, block_size=16, max_len=300),
    "one row, short": dict(b=1, kvh=3, g=3, d=64, dv=64, block_size=16, max_len=5),
    "odd head size": dict(b=4, kvh=2, g=4, d=80, dv=80, block_size=16, max_len=700),
    "mla, v inside k": dict(b=3, kvh=1, g=8, d=72, dv=40, block_size=32, max_len=600, v_in_k=True),
    "long, many parts": dict(b=2, kvh=2, g=2, d=128, dv=128, block_size=16, max_len=2500, min_len=1500),
    "no grouping": dict(b=5, kvh=4, g=1, d=32, dv=32, block_size=8, max_len=90),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "bfloat16"])
@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("extras", ["plain", "window", "softcap+sinks"])
def test_matches_the_reference(name, extras, dtype):
    """float32: the reference's values up to float32 rounding. bf16: the reference in float32 on the
    same (widened) values, up to the output's one rounding to bf16 (half a unit in the last place,
    at most 2^-8 of the value); and within one unit in the last place of the float32 kernel's result
    on the widened values, rounded (every sum is float32, in another order where the CPU has bf16
    dot products, so a value near a rounding boundary may round the other way)."""
    case = dict(CASES[name])
    v_in_k = case.pop("v_in_k", False)
    q, k, v, tables, lens = paged_case(**case, v_in_k=v_in_k, dtype=dtype)
    bs = case["block_size"]
    kw = {}
    if extras == "window":
        kw["window"] = max(3, case["max_len"] // 3)
    elif extras == "softcap+sinks":
        kw["softcap"] = 5.0
        kw["sinks"] = torch.randn(q.shape[1], generator=torch.Generator().manual_seed(9))
    qf, kf, vf = widened(q, k, v)
    ref = reference.paged_decode(qf, kf, vf, tables, lens, bs, q.shape[-1] ** -0.5, **kw)
    out = native(q, k, v, tables, lens, bs, **kw)
    assert out.shape == ref.shape and out.dtype == dtype
    rounding = 2.0**-8 * ref.abs() if dtype == torch.bfloat16 else 0.0
    err = float(((out.float() - ref).abs() - rounding).max())
    assert err < 2e-5 * max(1.0, float(ref.abs().max())), err
    if dtype == torch.bfloat16:
        wide = native(qf, kf, vf, tables, lens, bs, **kw).to(torch.bfloat16)
        assert int((out.view(torch.int16).int() - wide.view(torch.int16).int()).abs().max()) <= 1


@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "bfloat16"])
def test_a_rows_output_does_not_depend_on_its_neighbours(dtype):
    """Each row alone, and the rows in another order, give the batch's values bit for bit: the
    key ranges are cut at fixed positions, not by the batch."""
    q, k, v, tables, lens = paged_case(9, 3, 3, 64, 64, 16, 700, seed=4, dtype=dtype)
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
    with pytest.raises(ValueError, match="do not fit"):
        native(q.double(), k.double(), v.double(), tables, lens, 16)  # float32 and bf16 pools only
    with pytest.raises(ValueError, match="do not fit"):  # q, K and V in one dtype
        native(q.bfloat16(), k, v, tables, lens, 16)
    with pytest.raises(ValueError, match="do not fit"):
        native(q.bfloat16(), k.bfloat16(), v, tables, lens, 16)


@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "bfloat16"])
def test_a_compiled_graph_calls_the_op_over_symbolic_widths(dtype):
    """The op has a fake implementation (the output in q's dtype): one dynamic graph serves block
    tables of 2..5 blocks and gives the eager op's values."""
    from torch._dynamo.testing import CompileCounterWithBackend

    counter = CompileCounterWithBackend("inductor")
    fn = lambda q, k, v, t, n: torch.ops.lantern.paged_decode(q, k, v, t, n, 16, 0.125, 0, 0.0, None) * 2
    compiled = torch.compile(fn, backend=counter, dynamic=True)
    for width in (2, 3, 5):
        q, k, v, tables, lens = paged_case(
            3, 2, 2, 64, 64, 16, 16 * width, seed=width, min_len=16 * width - 15, dtype=dtype
        )
        torch._dynamo.maybe_mark_dynamic(tables, 1)
        out = compiled(q, k, v, tables, lens)
        assert out.dtype == dtype and torch.equal(out, fn(q, k, v, tables, lens)), width
    assert counter.frame_count == 1


@contextlib.contextmanager
def spying(calls: list):
    """Records (rows, bf16 flag) of each call of the op while inside (the engine's eager steps look
    it up on torch.ops.lantern at each call)."""
    real = torch.ops.lantern.paged_decode
    torch.ops.lantern.paged_decode = lambda q, *a: (
        calls.append((q.shape[0], int(q.dtype == torch.bfloat16))) or real(q, *a)
    )
    try:
        yield
    finally:
        torch.ops.lantern.paged_decode = real


def test_the_engine_decodes_through_it(tiny_model_dir, monkeypatch):
    """A float32 CPU engine's decode steps read the pool in place (the step metadata says so and
    the op runs), and give the tokens of the gathered path."""
    from lantern.app.engine import LLM, SamplingParams

    path = tiny_model_dir("llama3")
    prompts = [list(range(5, 18)), list(range(30, 37))]
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    small = dict(backend="torch", dtype="float32", block_size=4, num_kv_blocks=64)
    calls = []
    with spying(calls):
        llm = LLM(path, **small)
        try:
            native_tokens = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
        finally:
            llm.engine.shutdown()
    assert (2, 0) in calls and all(flag == 0 for _, flag in calls)
    monkeypatch.setattr(attention.cpu_attention, "serves", lambda dtype, device: False)
    llm = LLM(path, **small)
    try:
        gathered = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    finally:
        llm.engine.shutdown()
    assert native_tokens == gathered


def test_a_bf16_engine_decodes_through_it(tiny_model_dir, monkeypatch):
    """A bfloat16 CPU engine (the default dtype on CPUs with native bf16) reads its bf16 pool in
    place: batched and one-row decode steps call the kernel on bf16 operands, and its logits are as
    close to the float32 engine's as the gathered bf16 path's are (bf16 rounding elsewhere in the
    model dominates) and close to that path's. Logits, not greedy tokens: this random tiny model has
    near-ties, e.g. after the prompt below and 4 tokens two logits 0.025 std apart in float32 are
    one bf16 value, and which wins then depends on the last bit of each path's rounding (the kernel
    keeps float32 throughout, bf16 SDPA does not)."""
    from lantern.app.engine import LLM, SamplingParams
    from tests.fixtures.teacher_forcing import teacher_forced_logits

    path = tiny_model_dir("llama3")
    small = dict(backend="torch", block_size=4, num_kv_blocks=64)
    prompt, forced = list(range(5, 18)), [136, 396, 87, 212, 354, 246, 130, 214]

    def logits(dtype: str) -> dict:
        llm = LLM(path, dtype=dtype, **small)
        try:
            if dtype == "bfloat16":  # two rows of a step in one call
                params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
                llm.generate([prompt, list(range(30, 37))], params)
            return dict(teacher_forced_logits(llm.engine, prompt, forced))
        finally:
            llm.engine.shutdown()

    calls = []
    with spying(calls):
        native = logits("bfloat16")
    assert (2, 1) in calls and (1, 1) in calls and all(flag == 1 for _, flag in calls)
    truth = logits("float32")
    monkeypatch.setattr(attention.cpu_attention, "serves", lambda dtype, device: False)
    calls.clear()
    with spying(calls):
        gathered = logits("bfloat16")
    assert not calls and len(native) == len(gathered) == len(forced)
    err = lambda a, b: max(float(abs(a[p] - b[p]).max() / b[p].std()) for p in b)
    assert err(gathered, truth) < 0.15  # what bf16 costs this model (~0.11 measured)
    assert err(native, truth) < 1.25 * err(gathered, truth), (err(native, truth), err(gathered, truth))
    assert err(native, gathered) < 0.08, err(native, gathered)  # ~0.04 measured


def test_switched_off_nothing_serves(tmp_path):
    """LANTERN_CPU_KERNELS=0 (a fresh process: decided once): no pool is served natively and
    nothing is built."""
    code = (
        "import torch; from lantern.backends.torch import cpu_attention; "
        "print(cpu_attention.serves(torch.float32, 'cpu'), cpu_attention.serves(torch.bfloat16, 'cpu'))"
    )
    env = dict(os.environ, LANTERN_CPU_KERNELS="0", XDG_CACHE_HOME=str(tmp_path))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["False", "False"]
    assert not (tmp_path / "lantern").exists()


def test_float32_and_bf16_pools_on_a_cpu_are_served():
    """Other dtypes and devices keep the reference path."""
    cpu = torch.device("cpu")
    assert cpu_attention.serves(torch.float32, cpu) and cpu_attention.serves(torch.bfloat16, cpu)
    assert not cpu_attention.serves(torch.float16, cpu) and not cpu_attention.serves(torch.float64, cpu)
    assert not cpu_attention.serves(torch.bfloat16, torch.device("meta"))


def test_a_cpu_without_bf16_dot_products_gets_the_widening_build():
    """Built without AVX512-BF16 (as on a CPU that lacks it: a fresh process whose flag check says
    so), the kernel widens bf16 scores on load instead of VDPBF16PS and still matches the reference
    on bf16 pools, odd head sizes and V inside K included."""
    code = """
import sys, torch
sys.path.insert(0, {root!r})
from lantern.backends.torch import cpu_attention, native_build
from lantern.backends.torch.kernels import reference
from tests.unit.test_torch_cpu_attention import CASES, paged_case, widened
cpu_attention._flags = lambda: ()
native_build.load_ops = lambda *a, **k: False  # the ctypes op: built by gcc alone, in seconds
assert cpu_attention.serves(torch.bfloat16, torch.device("cpu"))
for name in ("smollm2", "odd head size", "mla, v inside k", "long, many parts"):
    case = dict(CASES[name]); v_in_k = case.pop("v_in_k", False)
    q, k, v, tables, lens = paged_case(**case, v_in_k=v_in_k, dtype=torch.bfloat16)
    scale = q.shape[-1] ** -0.5
    ref = reference.paged_decode(*widened(q, k, v), tables, lens, case["block_size"], scale)
    out = torch.ops.lantern.paged_decode(q, k, v, tables, lens, case["block_size"], scale, 0, 0.0, None)
    err = float(((out.float() - ref).abs() - 2.0**-8 * ref.abs()).max())
    print(name, err <= 2e-5 * max(1.0, float(ref.abs().max())), err)
"""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = subprocess.run(
        [sys.executable, "-c", code.format(root=root)], capture_output=True, text=True, timeout=300, cwd=root
    )
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 4 and all(" True " in line for line in lines), out.stdout

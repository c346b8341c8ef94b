"""cpu_vnni_gemm's codebook mode: 8-bit codes that take at most 16 values (GGUF's IQ4/IQ3/IQ2/IQ1 and
MXFP4 tensors) held as 4-bit indices into a 16-code table.

The reference is the same weight held as plain 8-bit codes by the same layer: the table lookup must
give the same integer codes, so every result (kernel, prefill decoder, row lookup) is equal bit for
bit; and the source weight (`AffineWeight.dequantize`) within float16's rounding of the scales.
"""

import numpy as np
import pytest
import torch

from lantern.app.models.quant.affine import AffineWeight, ErrorLog
from lantern.backends.torch import cpu_vnni_gemm, vnni_linear
from lantern.backends.torch import quant_linear as ql
from lantern.backends.torch.compiled_decode import INDUCTOR
from lantern.backends.torch.packed_decode import DENSE_ROWS
from tests.unit.test_torch_vnni_gemm import needs_vnni, rel_err, scheme_reference

CPU = torch.device("cpu")


def codebook_weight(n: int, k: int, levels: int = 16, seed: int = 0, dont_care: bool = True) -> AffineWeight:
    """8-bit codes drawn from `levels` values (IQ4's table shifted to codes); with dont_care, some
    groups have scale and bias 0 and codes outside the table (as a zero IQ4_XS sub-block scale)."""
    rng = np.random.default_rng(seed)
    table = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113, 120]) + 128
    codes = rng.choice(table[:levels], size=(n, k)).astype(np.uint8)
    scales = rng.uniform(1e-4, 3e-4, (n, k // 32)).astype(np.float32) * rng.choice([-1, 1], (n, k // 32))
    if dont_care:
        scales[rng.random(scales.shape) < 0.05] = 0
        zero = np.repeat(scales == 0, 32, axis=1)
        codes[zero] = 128  # level 0: not in the table
    return AffineWeight(codes, scales, (-128 * scales).astype(np.float32), 8, 32, "test codebook")


def both_layouts(w: AffineWeight, monkeypatch) -> tuple[vnni_linear.VnniLinear, vnni_linear.VnniLinear]:
    indexed = vnni_linear.VnniLinear(w, CPU)
    with monkeypatch.context() as m:
        m.setattr(cpu_vnni_gemm, "codebook", lambda w: None)
        plain = vnni_linear.VnniLinear(w, CPU)
    return indexed, plain


@needs_vnni
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n, k", [(200, 512), (33, 256)])
def test_a_codebook_weight_computes_what_its_8_bit_codes_do_at_half_the_bytes(n, k, dtype, monkeypatch):
    w = codebook_weight(n, k, seed=n)
    indexed, plain = both_layouts(w, monkeypatch)
    assert (indexed.bits, plain.bits) == (4, 8) and indexed.lut is not None and plain.lut is None
    assert indexed.codes.numel() * 2 == plain.codes.numel() and "codebook" in indexed.target
    stored = plain.rows(torch.arange(n))
    assert torch.equal(indexed.rows(torch.arange(n)), stored)
    exact = torch.from_numpy(w.dequantize()).double()
    assert rel_err(stored, exact) < 1e-3  # float16 scales
    for m in (1, 3, 5, 13, 33, DENSE_ROWS - 1, DENSE_ROWS + 5):  # every tile shape, and the dense path
        x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).to(dtype)
        y = indexed(x)
        assert torch.equal(y, plain(x)), m
        if dtype == torch.float32 and m < DENSE_ROWS:
            assert rel_err(y, scheme_reference(x, indexed)) < 1e-6, m


@needs_vnni
def test_the_prefill_decoder_and_row_lookup_read_the_table():
    w = codebook_weight(70, 256, levels=6, dont_care=False)  # a 6-level grid (IQ2's signed 8, 25, 43)
    layer = vnni_linear.VnniLinear(w, CPU)
    assert layer.bits == 4 and layer.lut is not None
    want = torch.from_numpy(w.dequantize())
    ids = torch.tensor([0, 69, 15, 16, 33])
    assert rel_err(layer.rows(ids), want[ids].double()) < 1e-3
    for start, stop in ((0, 70), (16, 53)):
        got = layer._decoded_rows(start, stop, torch.float32)
        assert torch.equal(got, layer.rows(torch.arange(start, stop)))


@needs_vnni
def test_seventeen_codes_stay_8_bit():
    w = codebook_weight(40, 128, levels=17, dont_care=False)
    layer = vnni_linear.VnniLinear(w, CPU)
    assert layer.bits == 8 and layer.lut is None
    assert cpu_vnni_gemm.codebook(w) is None


@needs_vnni
def test_a_table_that_does_not_fit_is_refused():
    layer = ql.quantized_linear(codebook_weight(64, 128), None, "cpu", torch.float32, ErrorLog(), kernel="vnni")
    args = (layer.codes, layer.scales, layer.out_scale, 32, 64, 4)
    x = torch.randn(3, 128)
    for table in (torch.zeros(15, dtype=torch.uint8), torch.zeros(16, dtype=torch.int32)):
        with pytest.raises(ValueError, match="codebook table"):
            cpu_vnni_gemm.vnni_mm(x, *args, table)
    wide = vnni_linear.VnniLinear(codebook_weight(64, 128, levels=17, dont_care=False), CPU)
    with pytest.raises(ValueError, match="codebook table"):  # indices are 4-bit only
        cpu_vnni_gemm.vnni_mm(x, wide.codes, wide.scales, wide.out_scale, 32, 64, 8, layer.lut)


@needs_vnni
def test_a_compiled_graph_calls_the_codebook_op_as_eager():
    """Inductor traces the codebook op (its own op: a defaulted argument would be dropped by the C++
    wrapper inductor generates) over a symbolic row count, with the eager values."""
    layer = vnni_linear.VnniLinear(codebook_weight(72, 128, seed=3), CPU)
    assert layer.lut is not None
    fn = lambda x: layer(x).relu()
    compiled = torch.compile(fn, dynamic=True, fullgraph=True, options=INDUCTOR)  # as decode steps compile
    for m in (2, 20, 40):
        x = torch.randn(m, 128, generator=torch.Generator().manual_seed(m))
        assert torch.equal(compiled(x), fn(x)), m

"""MLX folders' affine weights reach the MLX backend as the stored words (quant/mlx_packed.py): no unpacking
to one byte a code and packing again while loading; every other consumer gets the same shared form."""

from __future__ import annotations

import numpy as np
import pytest

from lantern.app.models.quant.hf_formats import parse_quant_scheme, read_quantized_module
from lantern.app.models.quant.mlx_packed import MlxPacked

mx = pytest.importorskip("mlx.core")


def _stored(bits: int, group: int, shape=(48, 256)) -> dict[str, np.ndarray]:
    w = mx.random.normal(shape, key=mx.random.key(bits)) * 0.05
    packed, scales, biases = mx.quantize(w, group_size=group, bits=bits)
    return {"weight": np.array(packed), "scales": np.array(scales), "biases": np.array(biases)}


@pytest.mark.parametrize("bits", [2, 3, 4, 5, 6, 8])
@pytest.mark.parametrize("group", [32, 64, 128])
def test_packed_words_are_the_shared_form_of_the_same_values(bits, group):
    t = _stored(bits, group)
    scheme = parse_quant_scheme({"quantization": {"bits": bits, "group_size": group}})
    packed = read_quantized_module(scheme, "m", t, mlx_words=True)
    plain = read_quantized_module(scheme, "m", t)
    assert isinstance(packed, MlxPacked) and packed.shape == plain.shape == (48, 256)
    np.testing.assert_array_equal(packed.words, t["weight"].view(np.uint32))
    np.testing.assert_array_equal(packed.to_affine().codes, plain.codes)
    want = np.array(mx.dequantize(*map(mx.array, (t["weight"], t["scales"], t["biases"])), group_size=group, bits=bits))
    np.testing.assert_allclose(packed.dequantize(), want, rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(packed.rows(8, 20).dequantize(), plain.rows(8, 20).dequantize())
    # what MLX is handed either way: the same arrays, of the same types
    from lantern.app.models.quant.affine import ErrorLog
    from lantern.backends.mlx.quant import to_mlx_arrays

    for dtype in (mx.float32, mx.bfloat16, mx.float16):
        fast, slow = to_mlx_arrays(packed, dtype, ErrorLog()), to_mlx_arrays(plain, dtype, ErrorLog())
        assert fast[3:] == slow[3:] == (bits, group)
        for a, b in zip(fast[:3], slow[:3]):
            assert a.dtype == b.dtype and mx.array_equal(a, b).item()


def test_mlx_backend_takes_an_mlx_folder_without_repacking(tmp_path, monkeypatch):
    from lantern.app.engine import LLM
    from lantern.backends.mlx import quant
    from tests.fixtures.hf_quant_writers import writer

    folder, _ = writer("mlx4", tmp_path)

    def no_packing(*args, **kwargs):
        raise AssertionError("an MLX folder's weight was packed again")

    monkeypatch.setattr(quant, "pack_bits", no_packing)
    llm = LLM(str(folder), backend="mlx", dtype="float32", num_kv_blocks=8)
    try:
        q_proj = llm.engine.backend.model.model.layers[0].self_attn.q_proj
        from safetensors import safe_open

        with safe_open(str(folder / "model.safetensors"), "numpy") as f:
            stored = f.get_tensor("model.layers.0.self_attn.q_proj.weight")
        np.testing.assert_array_equal(np.array(q_proj.weight), stored.view(np.uint32))
    finally:
        llm.engine.shutdown()

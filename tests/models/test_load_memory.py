"""Loading a quantized file keeps memory near the quantized size (issue 11: peak <= 1.5x the file).

Measured in a fresh subprocess: the peak resident set (VmHWM) is reset after imports and the
tokenizer, so the number is what loading the weights alone adds.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

MEASURE = r"""
import json, sys
backend_name, path = sys.argv[1], sys.argv[2]
from lantern.app.models.loader import resolve_model
loaded = resolve_model(path, "float32")
if backend_name == "torch":
    import torch
    torch.set_num_threads(1)
    from lantern.backends.torch.runner import TorchBackend
    backend = TorchBackend(device="cpu")
else:
    import mlx.core as mx
    from lantern.backends.mlx.runner import MLXBackend
    backend = MLXBackend()
# Page in the kernels' code first (int4/int8 layers, the converters): library code is not what
# loading the weights costs, and it is shared with every other process using the library.
import numpy as np
from lantern.app.models.quant.affine import ErrorLog, quantize_affine
w = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)
for bits in (4, 8):
    small = quantize_affine(w, bits, 32)
    if backend_name == "torch":
        from lantern.backends.torch.quant_linear import quantized_embedding, quantized_linear
        quantized_linear(small, None, "cpu", torch.float32, ErrorLog())(torch.ones(1, 64))
        quantized_embedding(small, "cpu", torch.float32, ErrorLog())(torch.zeros(1, dtype=torch.long))
    else:
        from lantern.backends.mlx.quant import to_mlx_arrays
        q, s, b, bb, g = to_mlx_arrays(small, mx.float32, ErrorLog())
        mx.eval(mx.quantized_matmul(mx.ones((1, 64)), q, s, b, transpose=True, group_size=g, bits=bb))
def status(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1]) * 1024
import gc; gc.collect()
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # reset VmHWM to the current RSS
before = status("VmRSS:")
info = backend.load(loaded.spec)
print(json.dumps({"before": before, "peak": status("VmHWM:"), "after": status("VmRSS:"),
                  "weight_bytes": info.weight_bytes}))
"""


def _measure(backend: str, path) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", MEASURE, backend, str(path)], capture_output=True, text=True, timeout=600, check=False
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("backend", ["torch", "mlx"])
def test_loading_smollm2_q4_1_peaks_under_one_and_a_half_file_sizes(gguf_path, backend):
    size = gguf_path.stat().st_size
    m = _measure(backend, gguf_path)
    added = m["peak"] - m["before"]
    assert added <= 1.5 * size, f"loading added {added / 1e6:.0f} MB at peak for a {size / 1e6:.0f} MB file: {m}"
    # The weights themselves stay 4-bit (plus the 8-bit embedding): at most 110 MB on the device.
    assert m["weight_bytes"] <= 110e6, m


def _write_mlx_4bit_folder(out, layers: int = 24, hidden: int = 640, inter: int = 1728):
    """An MLX-community-style 4-bit g64 Llama folder of ~60 MB, written straight from random codes
    (packed words, bf16 scales and biases) so the test spends its time loading, not quantizing.
    24 layers, as small real models have: one layer's conversion is a realistic share of the whole."""
    import torch
    from safetensors.torch import save_file

    from tests.fixtures.tiny_models import build_tokenizer

    out.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(out)
    vocab = len(tok)
    rng = np.random.default_rng(0)

    def quantized(prefix: str, rows: int, cols: int) -> dict:
        words = rng.integers(0, 2**32, size=(rows, cols // 8), dtype=np.uint32)
        groups = (rows, cols // 64)
        return {
            f"{prefix}.weight": torch.from_numpy(words.view(np.int32)).view(torch.uint32),
            f"{prefix}.scales": torch.full(groups, 0.01, dtype=torch.bfloat16),
            f"{prefix}.biases": torch.full(groups, -0.08, dtype=torch.bfloat16),
        }

    tensors: dict = {}
    tensors.update(quantized("model.embed_tokens", vocab, hidden))
    tensors.update(quantized("lm_head", vocab, hidden))
    tensors["model.norm.weight"] = torch.ones(hidden, dtype=torch.bfloat16)
    kv_rows = 2 * 64  # 2 KV heads of 64
    shapes = {"q_proj": (hidden, hidden), "k_proj": (kv_rows, hidden), "v_proj": (kv_rows, hidden)}
    shapes.update(o_proj=(hidden, hidden), gate_proj=(inter, hidden), up_proj=(inter, hidden))
    shapes["down_proj"] = (hidden, inter)
    for i in range(layers):
        for name, (rows, cols) in shapes.items():
            group = "self_attn" if name[0] in "qkvo" else "mlp"
            tensors.update(quantized(f"model.layers.{i}.{group}.{name}", rows, cols))
        for norm in ("input_layernorm", "post_attention_layernorm"):
            tensors[f"model.layers.{i}.{norm}.weight"] = torch.ones(hidden, dtype=torch.bfloat16)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "mlx"})
    config = {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": inter,
        "num_hidden_layers": layers,
        "num_attention_heads": hidden // 64,
        "num_key_value_heads": 2,
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "quantization": {"group_size": 64, "bits": 4},
    }
    (out / "config.json").write_text(json.dumps(config))
    return out


@pytest.mark.parametrize("backend", ["torch", "mlx"])
def test_loading_a_quantized_folder_peaks_under_one_and_a_half_folder_sizes(tmp_path_factory, backend):
    folder = tmp_path_factory.getbasetemp() / "mlx4-folder"
    if not (folder / "config.json").exists():
        _write_mlx_4bit_folder(folder)
    size = sum(f.stat().st_size for f in folder.glob("*.safetensors"))
    assert size > 40e6  # large enough that the allocator's noise is small against it
    m = _measure(backend, folder)
    added = m["peak"] - m["before"]
    assert added <= 1.5 * size, f"loading added {added / 1e6:.0f} MB at peak for a {size / 1e6:.0f} MB folder: {m}"
    # Kept 4-bit: the weights on the device are near the file's size, not the ~4x of bf16.
    assert m["weight_bytes"] <= 1.3 * size, m

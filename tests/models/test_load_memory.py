"""Loading a quantized file keeps memory near the quantized size (issue 11: peak <= 1.5x the file).

Measured in a fresh subprocess: the peak resident set (VmHWM) is reset after imports and the
tokenizer, so the number is what loading the weights alone adds.
"""

from __future__ import annotations

import json
import subprocess
import sys

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

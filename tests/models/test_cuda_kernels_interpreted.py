"""The torch backend's CUDA code path through a whole model, on a CPU: every op that takes a Triton kernel on a GPU
(ops.use_triton) takes it here under Triton's interpreter -- the fused norms, the rope that writes the KV cache,
SiLU * up, split-K decode attention folding its splits, paged prefill -- and the logits match transformers'
forward pass, teacher-forced over a prompt and decode steps through the paged cache (float32: the interpreter
has no bfloat16 tl.dot). Run in a fresh process: TRITON_INTERPRET must be set before triton is imported.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

_CHECK = """
import json, sys
from pathlib import Path
from unittest import mock

from lantern.backends.torch import cpu_attention
from lantern.backends.torch.kernels import triton_fused, triton_kernels
from tests.fixtures.tiny_models import build_model
from tests.models.quant_logits import logits_error

calls = {"rotary_write_kv": 0, "silu_mul": 0, "decode_folded": 0, "decode_reduced": 0}


def counted(name, fn):
    def wrapper(*a, **kw):
        calls[name] += 1
        return fn(*a, **kw)
    return wrapper


partial, reduce = triton_kernels._decode_partial_kernel, triton_kernels._decode_reduce_kernel
partial.run = counted("decode_folded", partial.run)  # (every decode launches it; the reduce only where not folded)
reduce.run = counted("decode_reduced", reduce.run)


path = build_model(sys.argv[1], Path(sys.argv[2]))
with mock.patch("lantern.backends.torch.kernels.ops.use_triton", lambda t: True), \\
        mock.patch.object(cpu_attention, "serves", lambda *a, **kw: False), \\
        mock.patch.object(triton_fused, "rotary_write_kv", counted("rotary_write_kv", triton_fused.rotary_write_kv)), \\
        mock.patch.object(triton_fused, "silu_mul", counted("silu_mul", triton_fused.silu_mul)):
    err = logits_error(str(path), str(path), "torch")
print(json.dumps({"error": err, **calls}))
"""


def interpreted(args: list[str], cwd: Path) -> dict:
    """Python run with `args` in a fresh process under Triton's interpreter -> the JSON its last line prints."""
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, timeout=600, cwd=cwd)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("variant", ["llama3", "qwen2_swa"])
def test_a_model_through_the_cuda_kernels_matches_transformers(variant, tmp_path):
    """llama3 (GQA, llama3 rope scaling) and qwen2 with a sliding window on one layer: within 1e-4 of the logits'
    spread, every decode step's attention one folded kernel, every layer's rope writing its K/V."""
    report = interpreted(["-c", _CHECK, variant, str(tmp_path / variant)], ROOT)
    assert report["error"] < 1e-4, report
    assert report["decode_folded"] > 0 and report["decode_reduced"] == 0, report
    assert report["rotary_write_kv"] > 0 and report["silu_mul"] > 0, report


def test_a_quantized_llama_decode_layer_launches_eight_kernels(tmp_path):
    """scripts/count_decode_kernels.py (the CUDA path's launches in one decode step, counted in the interpreter) on a
    2-layer Llama with --isq q4 in float16: per layer two norms, four dp4a GEMVs (SiLU * up inside gate_up's), the
    rope writing K/V and one attention kernel -- no separate activation, KV write or reduce kernel."""
    report = interpreted([str(ROOT / "scripts" / "count_decode_kernels.py"), "--layers", "2"], tmp_path)
    layers, kernels = report["layers"], report["kernels"]
    assert kernels == {
        "_gemv_dp4a_kernel": 4 * layers + 1,  # (+ the head)
        "_rms_norm_kernel": 2 * layers + 1,  # (+ the final norm)
        "_rotary_write_kv_kernel": layers,
        "_decode_partial_kernel": layers,
    }, report
    assert report["per_layer"] == 8

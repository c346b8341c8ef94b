"""Gemma 4 GGUF files as llama.cpp writes them (tests/fixtures/gguf_gemma4.py, checked tensor for tensor and
key for key against llama.cpp's own converter): the metadata alone gives the checkpoint's config (per-layer
KV heads and MLP widths, the shared-KV layers, the proportional rope from rope_freqs, the experts), and the
logits equal transformers' on the values the file holds, through the paged cache, on both backends; a Q8_0
file stays quantized and computes what its blocks hold."""

from __future__ import annotations

import json

import pytest
import torch

from lantern.app.engine import LLM
from lantern.app.models.loader import resolve_model
from lantern.app.models.spec import ModelConfig, UnsupportedModelError
from tests.fixtures.teacher_forcing import assert_matches_reference
from tests.models.quant_logits import logits_error, tolerance

PROMPT = "Paged attention stores keys and values in blocks, while continuous batching"


@pytest.mark.parametrize("outtype", ["f32", "f16"])
@pytest.mark.parametrize("variant", ["gemma4", "gemma4_moe"])
def test_gguf_as_llama_cpp_writes_it(tiny_model_dir, tmp_path, monkeypatch, variant, outtype, backend):
    from pathlib import Path

    from transformers import AutoModelForCausalLM

    from tests.fixtures.gguf_gemma4 import convert_gemma4

    monkeypatch.setenv("LANTERN_CACHE", str(tmp_path / "cache"))
    src = Path(tiny_model_dir(variant))
    path, ref = convert_gemma4(src, tmp_path, outtype=outtype)
    ours = resolve_model(str(path)).spec.config
    want = ModelConfig.from_hf(json.loads((src / "config.json").read_text()))
    for field in ("gemma4", "kv_shapes", "moe", "layer_windows", "final_softcap", "head_dim", "rope_theta"):
        assert getattr(ours, field) == getattr(want, field), field
    llm = LLM(str(path), backend=backend, dtype="float32", block_size=4, prefill_chunk_size=8, num_kv_blocks=64)
    reference = AutoModelForCausalLM.from_pretrained(ref, dtype=torch.float32).eval()
    assert_matches_reference(llm, reference, PROMPT, steps=8, atol=1e-4)


def test_q8_0_file_computes_what_its_blocks_hold(tiny_model_dir, tmp_path, monkeypatch, backend):
    """Experts' gate and up rows in one Q8_0 tensor (ffn_gate_up_exps) split into per-expert layers."""
    from pathlib import Path

    from tests.fixtures.gguf_gemma4 import convert_gemma4

    monkeypatch.setenv("LANTERN_CACHE", str(tmp_path / "cache"))
    path, ref = convert_gemma4(Path(tiny_model_dir("gemma4_moe")), tmp_path, outtype="q8_0")
    err = logits_error(str(path), str(ref), backend)
    assert err <= tolerance(backend, str(ref)), f"{backend}: {err:.4f}"
    # the file's values were loaded, not the float checkpoint's
    assert logits_error(tiny_model_dir("gemma4_moe"), str(ref), backend) > 2 * err


def test_a_rope_freqs_tensor_that_is_not_proportional_is_refused(tiny_model_dir, tmp_path, monkeypatch):
    from pathlib import Path

    import numpy as np

    from tests.fixtures import gguf_gemma4

    monkeypatch.setenv("LANTERN_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(gguf_gemma4, "rope_freqs", lambda cfg: np.full(16, 2.0, dtype=np.float32))
    path, _ = gguf_gemma4.convert_gemma4(Path(tiny_model_dir("gemma4")), tmp_path)
    with pytest.raises(UnsupportedModelError, match="rope_freqs"):
        resolve_model(str(path))


def _with_shared_layers_kv(src, out):
    """A copy of the tiny gemma4 folder whose KV-sharing layers (4: sliding, 5: full) carry K/V projections
    and norms, as the released E2B / E4B checkpoints do (transformers ignores them)."""
    import shutil

    from safetensors.torch import load_file, save_file

    shutil.copytree(src, out)
    tensors = load_file(str(out / "model.safetensors"))
    for layer, dim in ((4, 16), (5, 32)):
        for proj in ("k_proj", "v_proj"):
            tensors[f"model.layers.{layer}.self_attn.{proj}.weight"] = torch.full((2 * dim, 64), 9.0)
        tensors[f"model.layers.{layer}.self_attn.k_norm.weight"] = torch.full((dim,), 9.0)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


@pytest.mark.parametrize("fuse_qkv", [False, True], ids=["separate", "fuse_qkv"])
@pytest.mark.parametrize("variant", ["gemma4", "gemma4_moe"])
def test_shared_layers_kv_and_fused_qkv_files(tiny_model_dir, tmp_path, monkeypatch, variant, fuse_qkv, backend):
    """llama.cpp's converter keeps the sharing layers' K/V tensors a checkpoint holds (skipped here), and
    --fuse-qkv writes attn_qkv wherever a layer has q, k and v: split by each layer's own shape (V = K's
    projection still read from the missing attn_v on the full layers of gemma4_moe)."""
    from pathlib import Path

    from transformers import AutoModelForCausalLM

    from tests.fixtures.gguf_gemma4 import convert_gemma4

    monkeypatch.setenv("LANTERN_CACHE", str(tmp_path / "cache"))
    src = Path(tiny_model_dir(variant))
    if variant == "gemma4":
        src = _with_shared_layers_kv(src, tmp_path / "with-kv")
    path, ref = convert_gemma4(src, tmp_path / "gguf", fuse_qkv=fuse_qkv)
    from gguf import GGUFReader

    names = {t.name for t in GGUFReader(str(path)).tensors}
    assert ("blk.0.attn_qkv.weight" in names) == fuse_qkv
    want = ModelConfig.from_hf(json.loads((src / "config.json").read_text()))
    assert resolve_model(str(path)).spec.config.gemma4 == want.gemma4
    llm = LLM(str(path), backend=backend, dtype="float32", block_size=4, prefill_chunk_size=8, num_kv_blocks=64)
    reference = AutoModelForCausalLM.from_pretrained(ref, dtype=torch.float32).eval()
    assert_matches_reference(llm, reference, PROMPT, steps=6, atol=1e-4)

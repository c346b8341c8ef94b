"""Gemma 3n GGUF files as llama.cpp writes them (tests/fixtures/gguf_gemma3n.py, checked tensor for tensor and key
for key against llama.cpp's own converter): the metadata alone gives the checkpoint's config (per-layer widths,
sliding pattern, shared-KV layers, the sparse gate's cutoffs, AltUp's streams, LAuReL's rank), AltUp's stacked
projections are split per stream, and the logits equal transformers' on the values the file holds, through the
paged cache, on both backends; a Q8_0 file stays quantized and computes what its blocks hold."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from lantern.app.engine import LLM
from lantern.app.models.loader import resolve_model
from lantern.app.models.spec import ModelConfig
from tests.fixtures.teacher_forcing import assert_matches_reference
from tests.models.quant_logits import logits_error, tolerance

PROMPT = "Paged attention stores keys and values in blocks, while continuous batching"


def _padded_reference(ref: Path, rows: int) -> Path:
    """The reference with its per-layer table padded with zero rows to `rows`, as the file holds it: the converter
    pads the table to vocab_size, and llama.cpp (so Lantern) reads those zero rows for the ids past the checkpoint's
    table, where transformers would read row 0 of the shorter one."""
    from safetensors.numpy import load_file, save_file

    weights = load_file(str(ref / "model.safetensors"))
    name = next(n for n in weights if n.endswith("embed_tokens_per_layer.weight"))
    table = weights[name]
    weights[name] = np.concatenate([table, np.zeros((rows - table.shape[0], table.shape[1]), table.dtype)])
    save_file(weights, str(ref / "model.safetensors"))
    cfg = json.loads((ref / "config.json").read_text())
    (ref / "config.json").write_text(json.dumps({**cfg, "vocab_size_per_layer_input": rows}))
    return ref


@pytest.mark.parametrize("outtype", ["f32", "f16"])
def test_gguf_as_llama_cpp_writes_it(tiny_model_dir, tmp_path, monkeypatch, outtype, backend):
    from transformers import AutoModelForCausalLM

    from tests.fixtures.gguf_gemma3n import activation_sparsity_scale, convert_gemma3n

    monkeypatch.setenv("LANTERN_CACHE", str(tmp_path / "cache"))
    src = Path(tiny_model_dir("gemma3n"))
    path, ref = convert_gemma3n(src, tmp_path, outtype=outtype)
    ours = resolve_model(str(path)).spec.config
    want = ModelConfig.from_hf(json.loads((src / "config.json").read_text()))
    for field in ("kv_shapes", "layer_windows", "final_softcap", "head_dim", "rope_theta", "vocab_size"):
        assert getattr(ours, field) == getattr(want, field), field
    # the gate's cutoffs as the converter computed them (torch's float32 Phi^-1; the folder's may be an ulp away)
    pattern = json.loads((src / "config.json").read_text())["activation_sparsity_pattern"]
    cutoffs = [None if c == float("-inf") else c for c in activation_sparsity_scale(pattern)]
    assert ours.gemma3n == type(want.gemma3n)(**{**vars(want.gemma3n), "sparsity_cutoffs": tuple(cutoffs)})
    assert np.allclose([c or 0 for c in cutoffs], [c or 0 for c in want.gemma3n.sparsity_cutoffs], rtol=1e-6)
    assert ours.gemma4.ple_vocab == ours.vocab_size > want.gemma4.ple_vocab  # the padded table's rows
    assert ours.gemma4 == type(want.gemma4)(**{**vars(want.gemma4), "ple_vocab": ours.vocab_size})
    llm = LLM(str(path), backend=backend, dtype="float32", block_size=4, prefill_chunk_size=8, num_kv_blocks=64)
    prompt_ids = llm.tokenizer.encode(PROMPT)
    assert max(prompt_ids) >= want.gemma4.ple_vocab  # the padding rows are read
    reference = _padded_reference(ref, ours.vocab_size)
    hf = AutoModelForCausalLM.from_pretrained(reference, dtype=torch.float32).eval()
    assert_matches_reference(llm, hf, PROMPT, steps=8, atol=1e-4)


def test_q8_0_file_computes_what_its_blocks_hold(tiny_model_dir, tmp_path, monkeypatch, backend):
    from tests.fixtures.gguf_gemma3n import convert_gemma3n

    monkeypatch.setenv("LANTERN_CACHE", str(tmp_path / "cache"))
    path, ref = convert_gemma3n(Path(tiny_model_dir("gemma3n")), tmp_path, outtype="q8_0")
    ref = _padded_reference(ref, resolve_model(str(path)).spec.config.vocab_size)
    err = logits_error(str(path), str(ref), backend)
    assert err <= tolerance(backend, str(ref)), f"{backend}: {err:.4f}"
    # the file's values were loaded, not the float checkpoint's
    assert logits_error(tiny_model_dir("gemma3n"), str(ref), backend) > 2 * err
    llm = LLM(str(path), backend=backend, dtype="float32", num_kv_blocks=16)
    mlp = llm.engine.backend.model.model.layers[0].mlp
    assert "Linear" != type(getattr(mlp, "gate_up_proj", None) or mlp.gate_proj).__name__  # Q8_0 kept quantized

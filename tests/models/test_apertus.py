"""Apertus checkpoints as released: bfloat16, xIELU's constants stored in bfloat16 beside its trained scalars.
(The float32 tiny variant's logits run in tests/conformance: test_parity, test_cross_backend.)"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from lantern.app.engine import LLM, SamplingParams


def test_a_bfloat16_checkpoint_loads_and_answers_as_transformers(tiny_model_dir, tmp_path, backend):
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM

    src = Path(tiny_model_dir("apertus"))
    folder = shutil.copytree(src, tmp_path / "bf16")
    tensors = {n: t.to(torch.bfloat16) for n, t in load_file(src / "model.safetensors").items()}
    assert tensors["model.layers.0.mlp.act_fn.eps"].dtype == torch.bfloat16  # stored as transformers saves bf16
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    ref = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    prompt = [5, 17, 42, 99, 7, 3, 11, 60]
    ref.generation_config.eos_token_id = None
    with torch.no_grad():
        want = ref.generate(torch.tensor([prompt]), max_new_tokens=6, do_sample=False, pad_token_id=0)[0, 8:].tolist()
    llm = LLM(str(folder), backend=backend, dtype="float32", block_size=4, num_kv_blocks=64)
    try:
        out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))
    finally:
        llm.engine.shutdown()
    assert out[0].outputs[0].token_ids == want


pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def _apertus_gguf(src: Path, path: Path) -> Path:
    """`src` as an F32 GGUF the way llama.cpp's ApertusModel writes it: a LlamaModel with q/k as stored, the
    llama3 rope as rope_freqs, xIELU's four scalars per layer as metadata arrays (xielu.alpha_p / alpha_n / beta
    / eps, as the checkpoint holds them) instead of tensors."""
    import json

    import gguf
    import numpy as np
    from safetensors.numpy import load_file
    from transformers import AutoTokenizer

    from tests.fixtures.gguf_writer import write_llama_hparams, write_tokenizer
    from tests.models.test_gguf_llama3_rope import converter_divisors

    cfg = json.loads((src / "config.json").read_text())
    rope, layers = cfg["rope_parameters"], cfg["num_hidden_layers"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    w = gguf.GGUFWriter(path, "apertus")
    write_llama_hparams(w, cfg, rope["rope_theta"])
    w.add_vocab_size(cfg["vocab_size"])
    w.add_rope_dimension_count(head_dim)
    write_tokenizer(w, AutoTokenizer.from_pretrained(str(src)))
    w.add_tensor("rope_freqs.weight", converter_divisors(head_dim, rope["rope_theta"], rope))
    tensors = load_file(str(src / "model.safetensors"))
    for key, add in (("alpha_n", w.add_xielu_alpha_n), ("alpha_p", w.add_xielu_alpha_p)):
        add([float(tensors[f"model.layers.{i}.mlp.act_fn.{key}"].reshape(-1)[0]) for i in range(layers)])
    w.add_xielu_beta([0.5] * layers)
    w.add_xielu_eps([-1e-6] * layers)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.APERTUS, layers)
    for name, value in tensors.items():
        if ".act_fn." in name:
            continue
        gguf_name = names.get_name(name.removesuffix(".weight"))
        w.add_tensor(gguf_name + ".weight", np.ascontiguousarray(value, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_gguf_answers_as_transformers(tiny_model_dir, tmp_path, monkeypatch, backend):
    """An `apertus` GGUF: its config is the checkpoint's (the llama3 rope recovered from rope_freqs is checked by
    the logits), xIELU's trained scalars come from the metadata, the logits equal transformers'."""
    import dataclasses

    from lantern.app.models.loader import resolve_model
    from tests.conformance.test_parity import PROMPT, hf_model
    from tests.fixtures.teacher_forcing import assert_matches_reference

    monkeypatch.setenv("LANTERN_CACHE", str(tmp_path / "cache"))
    src = Path(tiny_model_dir("apertus"))
    path = _apertus_gguf(src, tmp_path / "tiny-apertus.gguf")
    got, want = resolve_model(str(path)).spec.config, resolve_model(str(src)).spec.config
    assert dataclasses.replace(got, rope_scaling=None) == dataclasses.replace(want, rope_scaling=None)
    llm = LLM(str(path), backend=backend, dtype="float32", block_size=4, prefill_chunk_size=8, num_kv_blocks=64)
    try:
        assert_matches_reference(llm, hf_model(str(src)), PROMPT)
    finally:
        llm.engine.shutdown()

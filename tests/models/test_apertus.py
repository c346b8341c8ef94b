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

"""YaRN with an explicit attention_factor (rope_scaling.attention_factor), as transformers'
_compute_yarn_parameters takes it: the stated factor scales cos and sin instead of the one derived
from factor / mscale / mscale_all_dim.

The torch tables and the MLX rope module equal transformers' rotary embedding; tiny random llama and
qwen2 models (qwen2 with a Qwen2.5-style legacy config.json) run through the paged cache on both
backends with logits within 1e-4 of transformers' and the same 64 greedy tokens. A factor that is
not a positive number is refused naming the key (transformers only warns and multiplies by it)."""

from __future__ import annotations

import json
import shutil

import mlx.core as mx
import numpy as np
import pytest
import torch

from lantern.app.engine import LLM, SamplingParams
from lantern.app.models.spec import ModelConfig, UnsupportedModelError
from tests.conformance.test_parity import PROMPT, hf_greedy, hf_model
from tests.fixtures.teacher_forcing import teacher_forced_logits
from tests.fixtures.tiny_models import build_model

ATTENTION = 0.7  # transformers would derive 0.1 * ln(4) + 1 = 1.139 from factor 4: clearly not that
LLAMA_YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "attention_factor": ATTENTION}
# Qwen2.5's config.json shape: the legacy key, max_position_embeddings the pre-scaling length.
QWEN25_YARN = {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "attention_factor": ATTENTION}
MODELS = {
    "llama": ("llama", {"rope_scaling": LLAMA_YARN}),
    "qwen2": ("qwen2", {"max_position_embeddings": 64, "rope_scaling": QWEN25_YARN}),
}


def _raw(model_type: str, **extra) -> dict:
    base = {"vocab_size": 400, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2}
    return {"model_type": model_type, **base, "num_attention_heads": 4, "num_key_value_heads": 2, **extra}


def _hf_rotary(raw: dict, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [T, head_dim] from the family's own rotary embedding module (attention factor in)."""
    from transformers import AutoConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
    from transformers.models.qwen2.modeling_qwen2 import Qwen2RotaryEmbedding

    raw = json.loads(json.dumps(raw))  # transformers fills defaults into the dicts it is given
    config = type(AutoConfig.for_model(raw["model_type"])).from_dict(raw)
    module = (Qwen2RotaryEmbedding if raw["model_type"] == "qwen2" else LlamaRotaryEmbedding)(config)
    cos, sin = module(torch.zeros(1, dtype=torch.float32), positions[None])
    return cos[0], sin[0]


@pytest.mark.parametrize("name", list(MODELS))
def test_yarn_attention_factor_tables_equal_transformers(name):
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    from lantern.backends.mlx.layers import rotary_dim
    from lantern.backends.mlx.rope import build_rope
    from lantern.backends.torch.layers import rope_tables

    model_type, extra = MODELS[name]
    raw = _raw(model_type, **{"max_position_embeddings": 256, **extra})
    cfg = ModelConfig.from_hf(raw)
    assert cfg.rope_scaling["attention_factor"] == ATTENTION
    positions = torch.arange(160)  # past the original 64
    cos, sin = _hf_rotary(raw, positions)
    assert cos[0, 0].item() == pytest.approx(ATTENTION)  # cos(0) times the stated factor
    ours_cos, ours_sin = rope_tables(cfg, len(positions), torch.device("cpu"))
    torch.testing.assert_close(ours_cos, cos, rtol=0, atol=2e-6)
    torch.testing.assert_close(ours_sin, sin, rtol=0, atol=2e-6)

    torch.manual_seed(0)
    q = torch.randn(1, 2, len(positions), cfg.head_dim)  # [batch, heads, T, D]
    want = apply_rotary_pos_emb(q, q, cos[None], sin[None])[0][0].transpose(0, 1)  # [T, heads, D]
    rope = build_rope(rotary_dim(cfg), cfg.rope_theta, False, cfg.rope_scaling, cfg.max_position_embeddings)
    x = mx.array(q[0].transpose(0, 1).numpy())[:, :, None, :]  # tokens as a batch, one offset each
    got = np.array(rope(x, offset=mx.array(positions.numpy()))[:, :, 0, :])
    np.testing.assert_allclose(got, want.numpy(), rtol=0, atol=2e-5)


@pytest.mark.parametrize("bad", [0, -0.5, "0.7", True])
def test_attention_factor_that_is_not_a_positive_number_is_refused(bad):
    raw = _raw("llama", max_position_embeddings=256, rope_scaling={**LLAMA_YARN, "attention_factor": bad})
    with pytest.raises(UnsupportedModelError, match=r"rope_scaling\.attention_factor=") as err:
        ModelConfig.from_hf(raw)
    assert "positive number" in str(err.value) and "\n" not in str(err.value)


@pytest.fixture(scope="module", params=list(MODELS))
def yarn_model(request, tmp_path_factory) -> str:
    """A tiny random model whose config.json carries the YaRN attention_factor, as written."""
    model_type, extra = MODELS[request.param]
    variant = "llama2" if model_type == "llama" else model_type  # tiny_models' plain variants
    out = build_model(variant, tmp_path_factory.mktemp(f"yarn_{request.param}"))
    config = json.loads((out / "config.json").read_text())
    config.pop("rope_parameters", None)
    (out / "config.json").write_text(json.dumps({**config, **extra}, indent=2))
    return str(out)


def test_yarn_attention_factor_model_matches_transformers(yarn_model, backend, tmp_path):
    llm = LLM(yarn_model, backend=backend, dtype="float32", block_size=4, prefill_chunk_size=8, num_kv_blocks=64)
    assert llm.engine.model_config.rope_scaling["attention_factor"] == ATTENTION
    prompt = llm.tokenizer.encode(PROMPT)
    hf = hf_model(yarn_model)
    assert hf.config.rope_parameters["attention_factor"] == ATTENTION  # the reference reads it too
    ref_tokens = hf_greedy(hf, prompt, 64)
    out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=64, ignore_eos=True))
    assert out[0].outputs[0].token_ids == ref_tokens
    assert len(set(ref_tokens)) > 8, "degenerate reference: the tiny model should produce varied tokens"
    with torch.no_grad():
        ref = hf(torch.tensor([prompt + ref_tokens])).logits[0].numpy()
    rows = 0
    for pos, got in teacher_forced_logits(llm.engine, prompt, ref_tokens[:24]):
        np.testing.assert_allclose(got, ref[pos], atol=1e-4, rtol=0)
        rows += 1
    assert rows == 24

    # Not vacuous: without the stated factor transformers' logits move well past the tolerance.
    derived = tmp_path / "derived"
    shutil.copytree(yarn_model, derived)
    config = json.loads((derived / "config.json").read_text())
    config["rope_scaling"] = {k: v for k, v in config["rope_scaling"].items() if k != "attention_factor"}
    (derived / "config.json").write_text(json.dumps(config))
    with torch.no_grad():
        other = hf_model(str(derived))(torch.tensor([prompt + ref_tokens])).logits[0].numpy()
    assert np.abs(other - ref).max() > 1e-2

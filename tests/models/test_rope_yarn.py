"""YaRN as transformers' _compute_yarn_parameters takes it, on both backends.

An explicit attention_factor (rope_scaling.attention_factor) scales cos and sin instead of the one
derived from factor / mscale / mscale_all_dim; a factor that is not a positive number is refused
naming the key (transformers only warns and multiplies by it). `truncate: false` leaves the
correction range's ends unrounded (gpt-oss states it; any family may): kept for every family whose
transformers code reads it, refused for Gemma 3 (transformers reads it at the top of its per-layer
rope_parameters, so never).

The torch tables and the MLX rope module equal transformers' rotary embedding; tiny random llama and
qwen2 models (qwen2 with a Qwen2.5-style legacy config.json) run through the paged cache on both
backends with logits within 1e-4 of transformers' and the same 64 greedy tokens."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
import torch

from lantern.app.engine import LLM, SamplingParams
from lantern.app.models.spec import ModelConfig, UnsupportedModelError
from tests.conformance.test_parity import PROMPT, hf_greedy, hf_model
from tests.fixtures.teacher_forcing import teacher_forced_logits
from tests.fixtures.tiny_models import ARCH_VARIANTS, build_model

ATTENTION = 0.7  # transformers would derive 0.1 * ln(4) + 1 = 1.139 from factor 4: clearly not that
LLAMA_YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "attention_factor": ATTENTION}
# Qwen2.5's config.json shape: the legacy key, max_position_embeddings the pre-scaling length.
QWEN25_YARN = {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "attention_factor": ATTENTION}
MODELS = {
    "llama": ("llama", {"rope_scaling": LLAMA_YARN}),
    "qwen2": ("qwen2", {"max_position_embeddings": 64, "rope_scaling": QWEN25_YARN}),
}
# Untruncated: with head_dim 16, base 10000 and original 64 the range is (-1.9, 2.02), (0, 3) when
# rounded, so pairs 1 and 2 get other frequencies.
NO_TRUNC = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "truncate": False}
UNTRUNCATED = {
    "llama": ("llama", {"rope_scaling": NO_TRUNC}),
    "qwen2": ("qwen2", {"max_position_embeddings": 64, "rope_scaling": {**NO_TRUNC, "type": "yarn"}}),
}
del UNTRUNCATED["qwen2"][1]["rope_scaling"]["rope_type"]  # the legacy key alone, as Qwen2.5 writes it
# Every family whose rope goes through spec._rope_scaling with a flat rope dict (tiny_models' variants).
FAMILIES = ["llama2", "mistral", "qwen2", "qwen3", "mixtral", "qwen2_moe", "qwen3_moe", "gemma2", "glm4"]
FAMILIES += ["deepseek_v2", "deepseek_v3", "gpt_oss"]


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


def _write(name: str, model_type: str, extra: dict, tmp_path_factory) -> str:
    """A tiny random model whose config.json carries `extra` (its rope) as written."""
    variant = "llama2" if model_type == "llama" else model_type  # tiny_models' plain variants
    out = build_model(variant, tmp_path_factory.mktemp(name))
    config = json.loads((out / "config.json").read_text())
    config.pop("rope_parameters", None)
    (out / "config.json").write_text(json.dumps({**config, **extra}, indent=2))
    return str(out)


@pytest.fixture(scope="module", params=list(MODELS))
def yarn_model(request, tmp_path_factory) -> str:
    return _write(f"yarn_{request.param}", *MODELS[request.param], tmp_path_factory)


@pytest.fixture(scope="module", params=list(UNTRUNCATED))
def untruncated_model(request, tmp_path_factory) -> str:
    return _write(f"untruncated_{request.param}", *UNTRUNCATED[request.param], tmp_path_factory)


def matches_transformers(model: str, backend: str) -> tuple[list[int], np.ndarray]:
    """Lantern's 64 greedy tokens and 24 teacher-forced logits rows equal transformers'; returns
    (the prompt and those tokens, transformers' logits over them)."""
    llm = LLM(model, backend=backend, dtype="float32", block_size=4, prefill_chunk_size=8, num_kv_blocks=64)
    try:
        prompt = llm.tokenizer.encode(PROMPT)
        hf = hf_model(model)
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
    finally:
        llm.engine.shutdown()
    return prompt + ref_tokens, ref


def _logits_with(model: str, tmp_path, ids: list[int], **rope_change) -> np.ndarray:
    """transformers' logits over `ids` with the config's rope_scaling changed (None: key removed)."""
    other = tmp_path / "changed"
    shutil.copytree(model, other)
    config = json.loads((other / "config.json").read_text())
    rope = {**config["rope_scaling"], **rope_change}
    config["rope_scaling"] = {k: v for k, v in rope.items() if v is not None}
    (other / "config.json").write_text(json.dumps(config))
    with torch.no_grad():
        return hf_model(str(other))(torch.tensor([ids])).logits[0].numpy()


def test_yarn_attention_factor_modelmatches_transformers(yarn_model, backend, tmp_path):
    cfg = ModelConfig.from_hf(json.loads(Path(yarn_model, "config.json").read_text()))
    assert cfg.rope_scaling["attention_factor"] == ATTENTION
    assert hf_model(yarn_model).config.rope_parameters["attention_factor"] == ATTENTION  # the reference reads it
    ids, ref = matches_transformers(yarn_model, backend)
    # Not vacuous: without the stated factor transformers' logits move well past the tolerance.
    assert np.abs(_logits_with(yarn_model, tmp_path, ids, attention_factor=None) - ref).max() > 1e-2


def test_untruncated_yarn_modelmatches_transformers(untruncated_model, backend, tmp_path):
    cfg = ModelConfig.from_hf(json.loads(Path(untruncated_model, "config.json").read_text()))
    assert cfg.rope_scaling["truncate"] is False
    ids, ref = matches_transformers(untruncated_model, backend)
    # Not vacuous: the rounded range (transformers' default) moves the logits well past the tolerance.
    assert np.abs(_logits_with(untruncated_model, tmp_path, ids, truncate=None) - ref).max() > 1e-2


@pytest.mark.parametrize("variant", FAMILIES)
def test_untruncated_yarn_is_kept_for_every_family_as_transformers_computes_it(variant):
    """The family's own transformers config reads truncate (its YaRN initialiser gives other
    frequencies without it); MLX's frequencies and torch's tables equal that initialiser's."""
    from transformers import AutoConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from lantern.backends.mlx.rope import yarn_inv_freq
    from lantern.backends.torch.layers import rope_tables, rotary_dim

    model_type, extra = ARCH_VARIANTS[variant]
    extra = {k: v for k, v in extra.items() if k not in ("rope_parameters", "rope_scaling", "max_position_embeddings")}
    if model_type == "mixtral":
        extra["head_dim"] = 16  # transformers' YaRN cannot derive it for Mixtral (MixtralConfig keeps None)
    raw = _raw(model_type, **extra, max_position_embeddings=256, rope_parameters={**NO_TRUNC, "rope_theta": 1e4})
    cfg = ModelConfig.from_hf(raw)
    assert cfg.rope_scaling["truncate"] is False

    def hf_yarn(rope: dict) -> tuple[torch.Tensor, float]:
        config = json.loads(json.dumps({**raw, "rope_parameters": rope}))
        return ROPE_INIT_FUNCTIONS["yarn"](type(AutoConfig.for_model(model_type)).from_dict(config))

    inv_freq, attention = hf_yarn(raw["rope_parameters"])
    rounded, _ = hf_yarn({**raw["rope_parameters"], "truncate": True})
    assert (inv_freq - rounded).abs().max() > 1e-2
    ours, ours_attention = yarn_inv_freq(rotary_dim(cfg), cfg.rope_theta, cfg.rope_scaling, cfg.max_position_embeddings)
    np.testing.assert_allclose(ours, inv_freq.numpy(), rtol=1e-6, atol=0)
    assert ours_attention == pytest.approx(attention)
    cos, sin = rope_tables(cfg, 100, torch.device("cpu"))
    angles = torch.outer(torch.arange(100, dtype=torch.float32), inv_freq)
    torch.testing.assert_close(cos[:, : len(inv_freq)], angles.cos() * attention, rtol=0, atol=2e-6)
    torch.testing.assert_close(sin[:, : len(inv_freq)], angles.sin() * attention, rtol=0, atol=2e-6)


def test_untruncated_yarn_is_refused_for_gemma3():
    """transformers reads truncate from the top of Gemma 3's per-layer rope_parameters: never."""
    rope = {"full_attention": {**NO_TRUNC, "rope_theta": 1e6}, "sliding_attention": {"rope_type": "default"}}
    raw = _raw("gemma3_text", head_dim=16, max_position_embeddings=256, rope_parameters=rope)
    with pytest.raises(UnsupportedModelError, match=r"^rope_parameters\.full_attention\.truncate=false") as err:
        ModelConfig.from_hf(raw)
    assert "\n" not in str(err.value)

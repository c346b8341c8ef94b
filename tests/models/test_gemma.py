"""Gemma 2 / Gemma 3 (text): config.json read as transformers reads it (its config classes are the
reference, defaults included), refusals in one line naming the key, the (1 + w) norm and the
embedding scale as transformers rounds them, and bfloat16 generation on both backends.

Logits and greedy tokens against transformers run in tests/conformance (variants gemma2, gemma3)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from lantern.app.models.family_gemma import text_config_of, text_weight_name
from lantern.app.models.spec import ModelConfig, UnsupportedModelError

BASE = {
    "vocab_size": 400,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
}


def ours(model_type: str, **extra) -> ModelConfig:
    return ModelConfig.from_hf({"model_type": model_type, "num_hidden_layers": 6, **BASE, **extra})


def hf(model_type: str, **extra):
    """transformers' config of the same keys: from_dict, as from_pretrained reads a config.json."""
    from transformers import AutoConfig

    cls = type(AutoConfig.for_model(model_type, num_hidden_layers=6, **BASE))
    return cls.from_dict({"model_type": model_type, "num_hidden_layers": 6, **BASE, **extra})


def hf_windows(config) -> list[int | None]:
    return [config.sliding_window if t == "sliding_attention" else None for t in config.layer_types]


def hf_rope(config, layer_type: str) -> tuple[float, dict | None]:
    params = dict(config.rope_parameters[layer_type])
    theta, rope_type = params.pop("rope_theta"), params.pop("rope_type")
    return theta, (None if rope_type == "default" else {"rope_type": rope_type, **params})


NESTED = {
    "rope_parameters": {
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
    }
}
OLD = {"rope_theta": 500000.0, "rope_local_base_freq": 20000.0, "rope_scaling": {"rope_type": "linear", "factor": 4.0}}


@pytest.mark.parametrize("keys", [NESTED, OLD, {}], ids=["nested", "rope_local_base_freq", "defaults"])
def test_gemma3_rope_per_layer_type(keys):
    cfg, ref = ours("gemma3_text", **keys), hf("gemma3_text", **keys)
    theta, scaling = hf_rope(ref, "full_attention")
    assert (cfg.rope_theta, cfg.rope_scaling) == (theta, scaling)
    local_theta, local_scaling = hf_rope(ref, "sliding_attention")
    assert cfg.local_rope_theta == local_theta and local_scaling is None
    assert cfg.local_rope_theta != cfg.rope_theta  # the two layer types really differ


@pytest.mark.parametrize(
    "model_type,extra",
    [
        ("gemma2", {}),  # absent keys: transformers' defaults (caps 50 / 30, every other layer slides)
        ("gemma2", {"attn_logit_softcapping": None, "final_logit_softcapping": None, "sliding_window": 32}),
        ("gemma3_text", {}),  # five sliding layers, then a full one
        ("gemma3_text", {"sliding_window_pattern": 3, "sliding_window": 16, "final_logit_softcapping": 30.0}),
        ("gemma3_text", {"layer_types": ["full_attention"] * 6}),
        # Gemma 3's attention never applies this cap in transformers: neither does Lantern.
        ("gemma3_text", {"attn_logit_softcapping": 50.0, "query_pre_attn_scalar": 144}),
    ],
)
def test_fields_match_transformers(model_type, extra):
    cfg, ref = ours(model_type, **extra), hf(model_type, **extra)
    windows = hf_windows(ref)
    assert cfg.layer_windows == (windows if any(windows) else None)
    assert cfg.attn_scale == pytest.approx(ref.query_pre_attn_scalar**-0.5)
    assert cfg.final_softcap == ref.final_logit_softcapping
    assert cfg.attn_softcap == (ref.attn_logit_softcapping if model_type == "gemma2" else None)
    assert cfg.tie_word_embeddings is ref.tie_word_embeddings is True
    assert cfg.max_position_embeddings == ref.max_position_embeddings
    assert cfg.qk_norm is (model_type == "gemma3_text")
    assert (cfg.hidden_act, cfg.norm_offset, cfg.embed_scale, cfg.sandwich_norms) == ("gelu_tanh", True, True, True)


def test_head_dim_defaults_like_transformers():
    extra = {k: v for k, v in BASE.items() if k != "head_dim"}
    cfg = ModelConfig.from_hf({"model_type": "gemma2", "num_hidden_layers": 2, **extra})
    assert cfg.head_dim == 256 != extra["hidden_size"] // extra["num_attention_heads"]


@pytest.mark.parametrize(
    "model_type,extra,key",
    [
        ("gemma2", {"hidden_activation": "silu"}, "hidden_activation"),
        ("gemma3_text", {"attention_bias": True}, "attention_bias"),
        ("gemma2", {"use_bidirectional_attention": True}, "use_bidirectional_attention"),  # (EmbeddingGemma: gemma3)
        ("gemma2", {"sliding_window": None}, "sliding_window"),
        ("gemma2", {"layer_types": ["chunked_attention"] * 6}, "layer_types"),
        ("gemma3_text", {"rope_parameters": {"rope_type": "linear", "factor": 8.0}}, "rope_parameters.factor"),
        (
            "gemma3_text",
            {"rope_parameters": {"sliding_attention": {"rope_type": "linear", "factor": 2.0}}},
            "rope_parameters.sliding_attention.rope_type",
        ),
        (
            "gemma3_text",
            {"rope_parameters": {"full_attention": {"rope_type": "longrope", "factor": 2.0}}},
            "rope_scaling.rope_type",
        ),
    ],
)
def test_refused_in_one_line_naming_the_key(model_type, extra, key):
    with pytest.raises(UnsupportedModelError) as err:
        ours(model_type, **extra)
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(f"{key}=")


def test_multimodal_folder_text_part():
    wrapper = {
        "model_type": "gemma3",
        "eos_token_id": [1, 106],
        "text_config": {"model_type": "gemma3_text", "hidden_size": 64, "num_hidden_layers": 2, "head_dim": 16},
        "vision_config": {"model_type": "siglip_vision_model"},
    }
    text = text_config_of(wrapper)
    cfg = ModelConfig.from_hf(text)
    assert cfg.architecture == "gemma3_text" and cfg.eos_token_ids == [1, 106]
    assert (cfg.vocab_size, cfg.num_heads, cfg.num_kv_heads) == (262_208, 8, 4)  # Gemma3TextConfig's defaults
    assert text_weight_name("model.language_model.layers.0.self_attn.q_proj.weight") == (
        "model.layers.0.self_attn.q_proj.weight"
    )
    assert text_weight_name("language_model.model.norm.weight") == "model.norm.weight"
    assert text_weight_name("language_model.lm_head.weight") == "lm_head.weight"
    assert text_weight_name("vision_tower.vision_model.embeddings.patch_embedding.weight") is None
    assert text_weight_name("multi_modal_projector.mm_input_projection_weight") is None


# ---- the maths as transformers rounds it ------------------------------------------------------------
def _norm_inputs(dtype):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 3, 64, generator=g).to(dtype)
    residual = torch.randn(5, 3, 64, generator=g).to(dtype)
    weight = (0.3 * torch.randn(64, generator=g)).to(dtype)
    return x, residual, weight


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_torch_norm_is_transformers_norm(dtype):
    from transformers.models.gemma3.modeling_gemma3 import Gemma3RMSNorm

    from lantern.backends.torch.models.gemma import GemmaRMSNorm

    x, residual, weight = _norm_inputs(dtype)
    ref, norm = Gemma3RMSNorm(64, eps=1e-6).to(dtype), GemmaRMSNorm(64, 1e-6).to(dtype)
    ref.weight.data.copy_(weight)
    norm.weight.data.copy_(weight)
    with torch.no_grad():
        out, summed = norm(x, residual)
        torch.testing.assert_close(summed, x + residual, rtol=0, atol=0)
        torch.testing.assert_close(out, ref(x + residual), rtol=0, atol=0)  # the (1 + w) in float32, one rounding


def test_mlx_norm_is_transformers_norm():
    mx = pytest.importorskip("mlx.core")
    from transformers.models.gemma3.modeling_gemma3 import Gemma3RMSNorm

    from lantern.backends.mlx.models.gemma import GemmaRMSNorm

    x, _, weight = _norm_inputs(torch.float32)
    ref = Gemma3RMSNorm(64, eps=1e-6)
    ref.weight.data.copy_(weight)
    norm = GemmaRMSNorm(64, 1e-6)
    norm.weight = mx.array(weight.numpy())
    with torch.no_grad():
        np.testing.assert_allclose(np.array(norm(mx.array(x.numpy()))), ref(x).numpy(), atol=2e-6, rtol=0)


def test_embedding_scale_rounds_like_transformers():
    """sqrt(3072) is 55.5 in bfloat16: transformers multiplies by the rounded value, so do we."""
    from transformers.models.gemma3.modeling_gemma3 import Gemma3TextScaledWordEmbedding

    from lantern.backends.torch.models.llama import rounded as _rounded

    ref = Gemma3TextScaledWordEmbedding(4, 3072, 0, embed_scale=3072**0.5).to(torch.bfloat16)
    ids = torch.tensor([1, 3])
    with torch.no_grad():
        expected = ref(ids)
        ours_ = torch.nn.functional.embedding(ids, ref.weight) * _rounded(3072**0.5, torch.bfloat16)
    assert _rounded(3072**0.5, torch.bfloat16) == 55.5
    torch.testing.assert_close(ours_, expected, rtol=0, atol=0)


@pytest.mark.parametrize("backend", ["mlx", "torch"])
def test_tied_embeddings_match_transformers(tmp_path, backend):
    """Gemma's default: the head reads the embedding table (unscaled). The conformance variants are
    untied because a tied tiny Gemma repeats one token; logits still say whether the maths is right."""
    from lantern.app.engine import LLM
    from tests.conformance.test_parity import PROMPT, hf_greedy, hf_model
    from tests.fixtures.teacher_forcing import teacher_forced_logits
    from tests.fixtures.tiny_models import build_model

    path = str(build_model("gemma3", tmp_path / "tied", tie_word_embeddings=True))
    llm = LLM(path, backend=backend, dtype="float32", block_size=4, num_kv_blocks=64)
    assert llm.engine.backend.cfg.tie_word_embeddings
    prompt_ids = llm.tokenizer.encode(PROMPT)
    model = hf_model(path)
    forced = hf_greedy(model, prompt_ids, 6)
    with torch.no_grad():
        ref = model(torch.tensor([prompt_ids + forced])).logits[0].numpy()
    rows = list(teacher_forced_logits(llm.engine, prompt_ids, forced))
    assert len(rows) == len(forced)
    for pos, logits in rows:
        np.testing.assert_allclose(logits, ref[pos], atol=1e-4, rtol=0)


# ---- bfloat16 on both backends --------------------------------------------------------------------
@pytest.mark.parametrize("variant", ["gemma2", "gemma3"])
@pytest.mark.parametrize("backend", ["mlx", "torch"])
def test_bfloat16_generates_close_to_transformers(tiny_model_dir, variant, backend):
    from transformers import AutoModelForCausalLM

    from lantern.app.engine import LLM, SamplingParams

    path = tiny_model_dir(variant)
    llm = LLM(path, backend=backend, dtype="bfloat16", block_size=4, num_kv_blocks=64)
    prompt_ids = llm.tokenizer.encode("Paged attention stores keys and values in blocks, while continuous")
    out = llm.generate([prompt_ids], SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))
    tokens = out[0].outputs[0].token_ids
    assert len(tokens) == 24
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        ref = model(torch.tensor([prompt_ids + tokens])).logits[0, len(prompt_ids) - 1 :].numpy()
    # Each token we chose is at most a bfloat16 rounding away from float32 transformers' best
    # (exact greedy agreement is not expected in bfloat16 over 24 steps).
    chosen = ref[np.arange(len(tokens)), tokens]
    assert np.all(ref.max(axis=-1)[: len(tokens)] - chosen < 0.5)


# ---- a Gemma 3 vision-language folder serves its language model -----------------------------------
@pytest.mark.parametrize("backend", ["mlx", "torch"])
def test_multimodal_gemma3_folder_serves_its_language_model(tmp_path, backend):
    """A `gemma3` folder (Gemma3ForConditionalGeneration, what google/gemma-3-4b-it ships): the text
    part loads, the vision tower is skipped, and text-only logits are transformers' own."""
    import shutil

    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    from lantern.app.engine import LLM
    from tests.conformance.test_parity import PROMPT
    from tests.fixtures.teacher_forcing import teacher_forced_logits
    from tests.fixtures.tiny_models import ARCH_VARIANTS, build_model

    text_dir = build_model("gemma3", tmp_path / "text")  # for its tokenizer and text config
    text_cfg = json.loads((text_dir / "config.json").read_text())
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2)
    vision.update(image_size=28, patch_size=14)
    config = Gemma3Config(text_config=text_cfg, vision_config=vision, mm_tokens_per_image=4)
    torch.manual_seed(0)
    model = Gemma3ForConditionalGeneration(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.normal_(0, 0.2) if "norm" not in name else p.copy_(0.1 * torch.randn_like(p))
    folder = tmp_path / "mm"
    model.save_pretrained(folder)
    for f in text_dir.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "chat_template")):
            shutil.copy(f, folder / f.name)
    assert ARCH_VARIANTS["gemma3"][0] == "gemma3_text"
    assert json.loads((folder / "config.json").read_text())["model_type"] == "gemma3"

    llm = LLM(str(folder), backend=backend, dtype="float32", block_size=4, num_kv_blocks=64)
    prompt_ids = llm.tokenizer.encode(PROMPT)
    forced = [5, 17, 42, 99, 7, 120]
    with torch.no_grad():
        ref = model(input_ids=torch.tensor([prompt_ids + forced])).logits[0].numpy()
    rows = list(teacher_forced_logits(llm.engine, prompt_ids, forced))
    assert len(rows) == len(forced)
    for pos, logits in rows:
        np.testing.assert_allclose(logits, ref[pos], atol=1e-4, rtol=0)

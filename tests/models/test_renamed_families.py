"""Architectures whose maths is another family's under other config keys (app/models/family_renamed.py): InternLM3,
IQuest-Coder, Sarvam-30B / 105B, Youtu-LLM. Their config classes' defaults are the ones Lantern fills in, the
released configs' own key names (and Sarvam-30B's tensor names) are read, and what their classes refuse is refused.
The tiny folders' logits and greedy tokens run in tests/conformance (internlm3, sarvam_moe, sarvam_mla, youtu)."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from lantern.app.engine import LLM
from lantern.app.models.architectures import ARCHITECTURES
from lantern.app.models.family_renamed import RENAMED
from lantern.app.models.spec import ModelConfig, UnsupportedModelError
from tests.conformance.test_parity import PROMPT, hf_model
from tests.fixtures.teacher_forcing import assert_matches_reference
from tests.fixtures.tiny_models import build_model

# keys whose defaults do not change the maths (or that Lantern reads elsewhere)
_IGNORED = {"model_type", "architectures", "transformers_version", "initializer_range", "embedding_initializer_range"}
_IGNORED |= {"pad_token_id"}
# what a config.json always states (transformers' save_pretrained too): Lantern reads them, it does not default them
_STATED = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")


def _config_class(model_type: str):
    from transformers import AutoConfig

    return type(AutoConfig.for_model(model_type))


# (bailing_moe has no transformers class: test_bailing.py checks it against mlx_lm and SarvamMoE; minicpm and
# internlm2 neither: test_minicpm_internlm2_folders.py checks them against their remote code's defaults; hunyuan's
# remote HunYuanConfig: test_hunyuan_remote.py; telechat3, xverse: test_telechat3_xverse.py)
# (remote code only: no transformers config class to compare with)
WITH_CLASSES = sorted(
    set(RENAMED)
    - {
        "bailing_moe",
        "minicpm",
        "internlm2",
        "kimi_k2",
        "joyai_llm_flash",
        "mimo",
        "youtu_llm",
        "hunyuan",
        "telechat3",
        "xverse",
    }
)


@pytest.mark.parametrize("model_type", WITH_CLASSES)
def test_defaults_are_the_config_classes(model_type):
    """Every default the renamed class changes from its family's class is in RENAMED with the class's value (the
    family's configure then reads the rest as its own defaults)."""
    family = ARCHITECTURES[model_type]["same_as"]
    ours, theirs = _config_class(model_type)().to_dict(), _config_class(family)().to_dict()
    defaults = RENAMED[model_type][1]
    for key, value in ours.items():
        if key in _IGNORED or theirs.get(key) == value:
            continue
        if key == "rope_parameters":  # Sarvam-30B: another base, the rope over the whole head
            for sub in ("rope_theta", "partial_rotary_factor"):
                if value.get(sub) != theirs[key].get(sub):
                    assert defaults[sub] == value[sub], sub
            continue
        if key in ("num_key_value_heads", "head_dim", "qk_head_dim") and family == "deepseek_v3":  # (MLA: derived)
            continue
        if key == "v_head_dim" and model_type == "minicpm3":  # (hidden_size / heads unless stated: family_config)
            assert value == ours["hidden_size"] // ours["num_attention_heads"]
            continue
        assert key in defaults, f"{model_type}: {key}={value!r} (the family's is {theirs.get(key)!r})"
        assert defaults[key] == value, key


# (Gemma 4's heterogeneous config has no one head_dim to compare: test_model_type_aliases runs its model instead)
@pytest.mark.parametrize("model_type", [t for t in WITH_CLASSES if t != "gemma4_unified_text"])
def test_config_reads_as_its_family(model_type):
    """The defaults of the renamed class give the model its class builds (shape, experts, latent attention)."""
    cls = _config_class(model_type)
    ref = cls()
    raw = {key: getattr(ref, key) for key in _STATED}
    cfg = ModelConfig.from_hf({"model_type": model_type, **raw})
    assert cfg.architecture == model_type
    assert (cfg.num_layers, cfg.num_heads, cfg.vocab_size, cfg.hidden_size) == (
        ref.num_hidden_layers,
        ref.num_attention_heads,
        ref.vocab_size,
        ref.hidden_size,
    )
    assert cfg.tie_word_embeddings == ref.tie_word_embeddings
    experts = getattr(ref, "n_routed_experts", None) if model_type not in ("youtu", "minicpm3") else None
    assert (cfg.moe.num_experts if cfg.moe else None) == experts
    assert (cfg.mla is not None) == (model_type in ("sarvam_mla", "youtu", "minicpm3"))
    if cfg.mla is None:  # (ApertusConfig's head_dim is derived, not an attribute)
        head_dim = getattr(ref, "head_dim", None) or ref.hidden_size // ref.num_attention_heads
        assert cfg.head_dim == head_dim and cfg.num_kv_heads == ref.num_key_value_heads
    if model_type == "sarvam_moe":
        assert cfg.rope_theta == ref.rope_parameters["rope_theta"] == 8e6 and cfg.qk_norm


@pytest.mark.parametrize("extra", [{}, {"scale_depth": None, "dim_model_base": None}, {"v_head_dim": 48}])
def test_minicpm3_config_matches_transformers(extra):
    """muP's scalars (None: no scaling, as MiniCPM3Config fills them), the value heads' width, the rope on halves."""
    from transformers import MiniCPM3Config

    raw = {key: getattr(MiniCPM3Config(), key) for key in _STATED} | extra
    cfg, ref = ModelConfig.from_hf({"model_type": "minicpm3", **raw}), MiniCPM3Config(**raw)
    assert cfg.embed_multiplier == ref.scale_emb
    assert cfg.residual_multiplier == pytest.approx(ref.scale_depth / ref.num_hidden_layers**0.5)
    assert cfg.logits_divisor == pytest.approx(ref.logits_scaling)
    assert (cfg.mla.v_head_dim, cfg.mla.qk_rope_head_dim, cfg.mla.q_lora_rank) == (
        ref.v_head_dim,
        ref.qk_rope_head_dim,
        ref.q_lora_rank,
    )
    assert not cfg.mla.rope_interleave and cfg.moe is None and cfg.tie_word_embeddings


def test_released_key_names_are_read():
    """InternLM3's qkv_bias / bias and Sarvam's num_experts / num_shared_experts / use_qkv_bias, as their
    config classes' attribute_map reads them."""
    from transformers import SarvamMoEConfig

    stated = {key: getattr(SarvamMoEConfig(), key) for key in _STATED}
    raw = {"model_type": "sarvam_moe", "num_experts": 16, "num_shared_experts": 2, "use_qkv_bias": True, **stated}
    cfg, ref = ModelConfig.from_hf(raw), SarvamMoEConfig(**raw)
    assert (cfg.moe.num_experts, cfg.attention_bias) == (ref.n_routed_experts, ref.attention_bias) == (16, True)
    internlm = {key: getattr(_config_class("internlm3")(), key) for key in _STATED}
    with pytest.raises(UnsupportedModelError, match="mlp_bias"):
        ModelConfig.from_hf({"model_type": "internlm3", "qkv_bias": False, "bias": True, **internlm})
    with pytest.raises(UnsupportedModelError, match="attention_bias"):  # (Llama's bias on o_proj too)
        ModelConfig.from_hf({"model_type": "internlm3", "qkv_bias": True, "bias": False, **internlm})
    with pytest.raises(UnsupportedModelError, match="num_experts"):  # two values for one setting
        ModelConfig.from_hf({**raw, "num_experts": 16, "n_routed_experts": 8})


def test_sarvam_mla_legacy_config():
    """The original Sarvam-105B config.json: head_dim / q_head_dim derived, `deepseek_yarn` is YaRN (as
    SarvamMLAConfig converts it)."""
    from transformers import SarvamMLAConfig

    scaling = {"type": "deepseek_yarn", "factor": 40.0, "original_max_position_embeddings": 4096, "rope_theta": 1e4}
    raw = {"model_type": "sarvam_mla", "head_dim": 576, "q_head_dim": 192, "rope_scaling": scaling}
    raw |= {key: getattr(SarvamMLAConfig(), key) for key in _STATED}
    raw["max_position_embeddings"] = 163840
    cfg, ref = ModelConfig.from_hf(raw), SarvamMLAConfig(**raw)
    assert cfg.rope_scaling["rope_type"] == ref.rope_parameters["rope_type"] == "yarn"
    assert cfg.rope_scaling["factor"] == ref.rope_parameters["factor"] == 40.0
    assert cfg.head_dim == ref.qk_rope_head_dim  # the latent rope's width, not the legacy head_dim


def test_refused_keys_are_named():
    for key in ("clip_qkv", "use_sliding_window"):  # IQuestCoderConfig refuses them too
        with pytest.raises(UnsupportedModelError, match=key):
            raw = {key: getattr(_config_class("iquestcoder")(), key) for key in _STATED}
            ModelConfig.from_hf({"model_type": "iquestcoder", key: 8.0 if key == "clip_qkv" else True, **raw})


def test_youtu_ignores_mixture_keys():
    """YoutuConfig has no mixture keys: a config.json that states them still builds a dense MLP in every layer."""
    raw = {key: getattr(_config_class("youtu")(), key) for key in _STATED}
    cfg = ModelConfig.from_hf({"model_type": "youtu", "n_routed_experts": 64, "first_k_dense_replace": 1, **raw})
    assert cfg.moe is None and cfg.mla is not None and cfg.mtp_layers == 0


@pytest.fixture(scope="module")
def sarvam_original(tmp_path_factory):
    """A tiny Sarvam-30B folder in the released layout: Bailing's names, q/k/v fused in query_key_value (with its
    bias), the released config's key names."""
    src = build_model("sarvam_moe", tmp_path_factory.mktemp("sarvam-src"))
    out = tmp_path_factory.mktemp("sarvam-released")
    for f in src.iterdir():
        if f.name not in ("model.safetensors", "config.json"):
            out.joinpath(f.name).write_bytes(f.read_bytes())
    cfg = json.loads((src / "config.json").read_text())
    cfg["num_experts"], cfg["num_shared_experts"] = cfg.pop("n_routed_experts"), cfg.pop("n_shared_experts")
    cfg["use_qkv_bias"] = cfg.pop("attention_bias")
    (out / "config.json").write_text(json.dumps(cfg))
    tensors = load_file(str(src / "model.safetensors"))
    # (transformers already saves Sarvam-30B in its released names; the fused rows are checked here)
    assert any(".attention.query_key_value." in n for n in tensors) and "model.word_embeddings.weight" in tensors
    save_file(tensors, str(out / "model.safetensors"))
    return src, out


@pytest.mark.parametrize("backend", ["torch", "mlx"])
def test_sarvam_released_layout_answers_as_transformers(sarvam_original, backend):
    src, released = sarvam_original
    llm = LLM(str(released), backend=backend, dtype="float32", block_size=4, prefill_chunk_size=8, num_kv_blocks=64)
    assert_matches_reference(llm, hf_model(src), PROMPT)


def test_sarvam_qkv_rows_are_split_q_k_v(sarvam_original):
    """The fused query_key_value's rows are [q | k | v]: transformers' q_proj, k_proj and v_proj of the same file."""
    src, _ = sarvam_original
    hf = hf_model(src)
    fused = load_file(str(src / "model.safetensors"))["model.layers.0.attention.query_key_value.weight"]
    attn = hf.model.layers[0].self_attn
    torch.testing.assert_close(fused, torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]))


@pytest.mark.parametrize("partial", [1.0, 0.5])  # Sarvam-30B's full rope; Ling 2.0's half (llama.cpp's default)
@pytest.mark.parametrize("backend", ["torch", "mlx"])
def test_bailingmoe2_gguf_answers_as_transformers(tmp_path, monkeypatch, partial, backend):
    """A bailingmoe2 GGUF (llama.cpp's BailingMoeV2Model / SarvamMoEModel) computes what transformers' SarvamMoE
    computes on its checkpoint: q/k/v from attn_qkv, the rope on rope.dimension_count dims, the router's bias."""
    from tests.fixtures.gguf_renamed import convert_bailing

    monkeypatch.setenv("LANTERN_CACHE", str(tmp_path / "cache"))
    src = build_model("sarvam_moe", tmp_path / "hf", partial_rotary_factor=partial, attention_bias=False)
    path, ref = convert_bailing(src, tmp_path)
    llm = LLM(str(path), backend=backend, dtype="float32", block_size=4, prefill_chunk_size=8, num_kv_blocks=64)
    cfg = llm.engine.model_config
    assert cfg.architecture == "glm4_moe" and (cfg.moe.n_group, cfg.moe.topk_group) == (2, 1)  # (the variant's)
    assert not cfg.attention_bias and cfg.qk_norm  # (llama.cpp's bailingmoe2 loads no q/k/v biases: refused)
    assert_matches_reference(llm, hf_model(ref), PROMPT)


def test_minicpm3_released_longrope_config():
    """MiniCPM3-4B's config.json: LongRoPE over the rope's 32 dims (16 factors each), its pretraining length inside
    rope_scaling, no head_dim key (MiniCPM3Config sets it to qk_rope_head_dim)."""
    from transformers import MiniCPM3Config

    long = {"type": "longrope", "long_factor": [1.0 + i / 8 for i in range(16)], "short_factor": [1.0] * 16}
    long["original_max_position_embeddings"] = 32768
    raw = {key: getattr(MiniCPM3Config(), key) for key in _STATED} | {"rope_scaling": long}
    cfg, ref = ModelConfig.from_hf({"model_type": "minicpm3", **raw}), MiniCPM3Config(**raw)
    assert cfg.rope_scaling["long_factor"] == ref.rope_parameters["long_factor"]
    assert (
        cfg.rope_scaling["original_max_position_embeddings"] == ref.rope_parameters["original_max_position_embeddings"]
    )
    with pytest.raises(UnsupportedModelError, match="long_factor"):  # one factor per pair of the rope's 32 dims
        ModelConfig.from_hf({"model_type": "minicpm3", **raw, "rope_scaling": {**long, "long_factor": [1.0] * 32}})


@pytest.mark.parametrize("backend", ["torch", "mlx"])
def test_minicpm3_longrope_answers_as_transformers(tmp_path, backend):
    """Served within the pretraining length (--max-model-len 64): the short factors, as transformers' shared rope
    update picks them for a sequence that short; the attention factor from the whole context, as there."""
    long = {"rope_type": "longrope", "long_factor": [1.0, 1.5, 3.0, 6.0], "short_factor": [1.0, 1.1, 1.3, 2.0]}
    long |= {"original_max_position_embeddings": 64, "rope_theta": 10000.0}
    folder = build_model("minicpm3", tmp_path / "m", rope_parameters=long)
    llm = LLM(
        str(folder),
        backend=backend,
        dtype="float32",
        block_size=4,
        prefill_chunk_size=8,
        num_kv_blocks=64,
        max_model_len=64,
    )
    assert llm.engine.model_config.rope_scaling["rope_type"] == "longrope"
    assert_matches_reference(llm, hf_model(folder), PROMPT)


# llama.cpp's minicpm3 graph holds muP's scalars as constants: the folder takes those
_LLAMA_CPP_MINICPM3 = {"scale_emb": 12, "scale_depth": 1.4, "dim_model_base": 256}


@pytest.mark.parametrize("longrope", [False, True])
@pytest.mark.parametrize("backend", ["torch", "mlx"])
def test_minicpm3_gguf_answers_as_transformers(tmp_path, monkeypatch, longrope, backend):
    """A minicpm3 GGUF (llama.cpp's MiniCPM3Model) computes what MiniCPM3ForCausalLM computes on its checkpoint: the
    latent attention from its tensors, muP's scalars as llama.cpp's graph fixes them, LongRoPE from the factor tensors
    (the trained context as the pretraining length: the short factors)."""
    from tests.fixtures.gguf_renamed import convert_minicpm3

    monkeypatch.setenv("LANTERN_CACHE", str(tmp_path / "cache"))
    extra = dict(_LLAMA_CPP_MINICPM3)
    if longrope:
        extra["rope_parameters"] = {"rope_type": "longrope", "long_factor": [1.0, 1.5, 3.0, 6.0]}
        extra["rope_parameters"] |= {"short_factor": [1.0, 1.1, 1.3, 2.0], "original_max_position_embeddings": 256}
    path, ref = convert_minicpm3(build_model("minicpm3", tmp_path / "hf", **extra), tmp_path)
    llm = LLM(str(path), backend=backend, dtype="float32", block_size=4, prefill_chunk_size=8, num_kv_blocks=64)
    cfg = llm.engine.model_config
    assert cfg.architecture == "minicpm3" and cfg.mla is not None and not cfg.mla.rope_interleave
    assert (cfg.rope_scaling or {}).get("rope_type") == ("longrope" if longrope else None)
    assert_matches_reference(llm, hf_model(ref), PROMPT)


def test_bailingmoe2_gguf_with_qkv_biases_is_refused(tmp_path, monkeypatch):
    """llama.cpp's bailingmoe2 loads no attn_qkv bias (it refuses such a file): refused by name here too."""
    from lantern.app.models.loader import resolve_model
    from tests.fixtures.gguf_renamed import convert_bailing

    monkeypatch.setenv("LANTERN_CACHE", str(tmp_path / "cache"))
    path, _ = convert_bailing(build_model("sarvam_moe", tmp_path / "hf"), tmp_path)  # (the variant's biases)
    with pytest.raises(UnsupportedModelError, match="attn_qkv biases"):
        resolve_model(str(path))

"""What a backend is handed to load a model: normalized hyper-parameters plus where weights live."""

from __future__ import annotations

import importlib
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from lantern.app.models.errors import UnsupportedModelError
from lantern.app.models.errors import refuse as _refuse
from lantern.app.models.rope_config import longrope_factors, rope_scaling

if TYPE_CHECKING:
    from lantern.app.models.quant.hf_formats import QuantScheme

logger = logging.getLogger(__name__)

_QWEN3_VL_DEFAULTS = {"rope_theta": 500000.0, "head_dim": 128}  # Qwen3VLTextConfig's (default_theta)

# model_type -> what differs from plain Llama. One table instead of a class per architecture.
ARCHITECTURES: dict[str, dict[str, Any]] = {
    "llama": {},
    "mistral": {},
    "qwen2": {"attention_bias": True},
    "qwen3": {"qk_norm": True},
    # Phi-3 / Phi-3.5 / Phi-4: Llama maths with q/k/v and gate/up stored fused (split while
    # loading: weight_stream.split_fused); partial rotary (Phi-4-mini) and LongRoPE (the 128k variants).
    "phi3": {},
    # StableLM 2 / 3B / StableCode: Llama's layer under LayerNorms with biases, q/k/v biases, a partial rope
    "stablelm": {"family": "stablelm", "configure": "family_stablelm", "defaults": "family_stablelm"},
    # Phi-1 / 1.5 / 2: Cohere's parallel block under a LayerNorm with a bias, biased attention with a partial rope,
    # an ungated GELU MLP, a head with a bias
    "phi": {"family": "phi", "configure": "family_phi", "defaults": "family_phi", "names": True},
    # Phi-3.5-MoE: LayerNorms with biases, biased attention and head, Mixtral's experts under SparseMixer's routing
    "phimoe": {"family": "phimoe", "configure": "family_phimoe", "defaults": "family_phimoe", "own_rope": True},
    # Seed-OSS: Llama with q/k/v biases (attention_out_bias, an o_proj bias, is refused); SeedOssConfig's
    # defaults for the keys a config.json may omit.
    "seed_oss": {"attention_bias": True, "defaults": {"head_dim": 128, "max_position_embeddings": 524288}},
    # Other families: "family" names the model file both backends build (backends/*/models/),
    # "configure" the module whose configure(model_type, cfg, fields) reads the family's keys; "names": that
    # module's checkpoint_name(name) gives the model files' name of a checkpoint's tensor (weight_stream).
    # GPT-2 / StarCoder (GPT-BigCode) / OPT: Jais 2's layer, a learned position table, no rope; "tensors": the
    # configure module renames the checkpoint's tensors and changes their layout (checkpoint_name / _tensors)
    "gpt2": {"family": "jais2", "configure": "family_gpt2", "prepare": True, "tensors": True},
    "gpt_bigcode": {"family": "jais2", "configure": "family_gpt2", "prepare": True, "tensors": True},
    "opt": {"family": "jais2", "configure": "family_gpt2", "prepare": True, "tensors": True},
    # BLOOM / BLOOMZ: Jais 2's layer under an embedding LayerNorm, ALiBi instead of a rope
    "bloom": {"family": "jais2", "configure": "family_bloom", "prepare": True, "tensors": True},
    # MPT: Jais 2's layer without biases (LayerNorms of a weight only), ALiBi instead of a rope
    "mpt": {"family": "mpt", "configure": "family_mpt", "prepare": True, "tensors": True},
    # GPT-NeoX (Pythia) / Falcon: Phi's parallel block, the MLP under its own LayerNorm where the config says;
    # GPT-NeoX's sequential layers (use_parallel_residual false) in Jais 2's files (family_gptneox.configure)
    "gpt_neox": {"family": "phi", "configure": "family_gptneox", "prepare": True, "tensors": True},
    "falcon": {"family": "phi", "configure": "family_gptneox", "prepare": True, "tensors": True},
    # Gemma (1) / CodeGemma: no sandwich norms, no caps; its pre-MLP norm under Llama's name (checkpoint_name)
    "gemma": {"family": "gemma", "configure": "family_gemma", "names": True},
    "gemma2": {"family": "gemma", "configure": "family_gemma"},
    "gemma3_text": {"family": "gemma", "configure": "family_gemma"},
    "vaultgemma": {"family": "gemma", "configure": "family_gemma"},  # Gemma 2 without the sandwich's outer norms
    # Gemma 4: layers of two shapes (sliding / full), K/V shared by the last layers, per-layer
    # embeddings, a routed mixture beside the dense MLP (26B-A4B).
    "gemma4_text": {"family": "gemma4", "configure": "family_gemma4", "own_rope": True},
    # Gemma 3n (E2B / E4B): Gemma 4's skeleton with AltUp's residual streams, LAuReL and activation sparsity.
    "gemma3n_text": {
        "family": "gemma3n",
        "configure": "family_gemma3n",
        "own_rope": True,
        "defaults": "family_gemma3n",
    },
    "mixtral": {"configure": "family_moe"},
    "qwen2_moe": {"attention_bias": True, "configure": "family_moe"},
    "qwen3_moe": {"qk_norm": True, "configure": "family_moe"},
    "deepseek_v2": {"family": "deepseek", "configure": "family_deepseek"},
    "deepseek_v3": {"family": "deepseek", "configure": "family_deepseek"},
    # DeepSeek-V3.2: V3 with DeepSeek Sparse Attention (a lightning indexer per layer picks the keys each query reads)
    "deepseek_v32": {
        "family": "deepseek",
        "configure": "family_deepseek",
        "defaults": {"max_position_embeddings": 163840},
    },
    # GLM-5: DeepSeek-V3.2's attention (the indexer's rope in pairs, some layers reusing the previous choice)
    "glm_moe_dsa": {
        "family": "deepseek",
        "configure": "family_deepseek",
        "defaults": {"rms_norm_eps": 1e-5, "max_position_embeddings": 202752},
    },
    "glm4": {"family": "glm4", "configure": "family_glm"},
    "glm": {"configure": "family_glm"},  # glm-4-9b-chat-hf: GLM-4's rope on Llama's layer (no post-sublayer norms)
    # GLM-4.5 / 4.6 / 4.7: Llama's layer, partial rotary (halves), DeepSeek-V3's routed + shared experts.
    "glm4_moe": {"family": "llama_moe", "configure": "family_glm"},
    # GLM-4.7-Flash: DeepSeek-V3's attention and experts under other defaults (family_deepseek).
    "glm4_moe_lite": {"family": "deepseek", "configure": "family_deepseek"},
    # Mistral 4: DeepSeek-V3's attention and experts, a softmax router, YaRN and Llama 4's query temperature.
    "mistral4": {"family": "deepseek", "configure": "family_deepseek", "own_rope": True},
    # Hunyuan dense: Llama's layer with per-head q/k norms after the rope, NTK-alpha rope (family_hunyuan)
    "hunyuan_v1_dense": {"configure": "family_hunyuan", "own_rope": True, "defaults": "family_hunyuan", "names": True},
    # dots.llm1: Qwen3's attention over DeepSeek-V3's sigmoid-routed and shared experts past the first dense layers
    "dots1": {"family": "llama_moe", "configure": "family_llama_moe", "defaults": "family_llama_moe"},
    # Solar Open: Llama's attention over GLM-4.5's (DeepSeek-V3's) mixture in every layer
    "solar_open": {
        "family": "llama_moe",
        "configure": "family_llama_moe",
        "defaults": "family_llama_moe:SOLAR_OPEN_DEFAULTS",
    },
    # Arcee Trinity (AFMoE): Qwen3's q/k norms, a sigmoid gate on the attention's output, NoPE full layers among
    # sliding ones, Gemma 2's sandwich norms, DeepSeek-V3's sigmoid router (no groups) past the first dense layers
    "afmoe": {"family": "afmoe", "configure": "family_afmoe", "defaults": "family_afmoe", "names": True},
    # JetBrains Mellum 2: Qwen3-MoE's attention and mixture, sliding and full layers on ropes of their own bases,
    # dense layers where mlp_layer_types says
    "mellum": {"family": "mellum", "configure": "family_mellum", "own_rope": True, "defaults": "family_mellum"},
    # Poolside Laguna: per-layer query heads, a softplus gate on the attention's output, sliding and full layers on
    # ropes of their own bases and widths, DeepSeek-V3's sigmoid router (capped logits) beside a shared expert
    "laguna": {
        "family": "laguna",
        "configure": "family_laguna",
        "own_rope": True,
        "defaults": "family_laguna",
        "names": True,
    },
    # Hunyuan MoE (Hunyuan-A13B): the same attention over DeepSeek-V2's softmax routing (renormalised) and a shared MLP
    "hunyuan_v1_moe": {
        "family": "llama_moe",
        "configure": "family_hunyuan",
        "own_rope": True,
        "defaults": "family_hunyuan",
        "names": True,
    },
    # Apertus: Llama's layer with per-head q/k norms and an ungated xIELU MLP (two trained scalars per layer)
    "apertus": {
        "family": "apertus",
        "configure": "family_apertus",
        "own_rope": True,
        "defaults": "family_apertus",
        "names": True,
    },
    # Jais 2: Llama's layer under LayerNorms with biases, biased attention and ungated relu^2 MLP
    "jais2": {"family": "jais2", "configure": "family_jais2", "defaults": "family_jais2"},
    # StarCoder2: Jais 2's layer (LayerNorms and biases) with a GELU (tanh) MLP, a sliding window
    "starcoder2": {"family": "jais2", "configure": "family_starcoder2", "defaults": "family_starcoder2", "names": True},
    # Nemotron / Minitron: Jais 2's layer under LayerNorm1P (weights + 1 as they load), a partial rope
    "nemotron": {"family": "jais2", "configure": "family_nemotron", "defaults": "family_nemotron"},
    # NanoChat: Llama's layer under weightless RMSNorms (the embedding's too), a rope turning the other way, q/k norms
    # after it, an ungated relu^2 MLP, soft-capped logits
    "nanochat": {"family": "nanochat", "configure": "family_nanochat", "defaults": "family_nanochat", "names": True},
    # Arcee AFM: Llama's layer with Nemotron's ungated relu^2 MLP
    "arcee": {"family": "arcee", "configure": "family_arcee", "defaults": "family_arcee"},
    # CWM (Meta's Code World Model): Llama's layer, sliding and full layers alternating, a llama3 rope by default
    "cwm": {"configure": "family_cwm", "own_rope": True, "defaults": "family_cwm"},
    # EXAONE 3.0 / 3.5 / Deep: Llama under other tensor and key names (family_exaone3)
    "exaone": {"configure": "family_exaone3", "prepare": True, "defaults": "family_exaone3", "names": True},
    "smollm3": {"configure": "family_smollm3"},  # Llama's layer; some layers without rope (NoPE)
    "granite": {"configure": "family_granite"},  # Llama's layer with embedding / residual / logit scalars
    "granitemoe": {"configure": "family_granite"},  # the same over Mixtral's experts (softmax of the top-k)
    # Granite 4.0-H: Mamba-2 mixer layers (recurrent state) among attention layers, a dense MLP beside the experts.
    "granitemoehybrid": {"family": "granite_hybrid", "configure": "family_granite"},
    # Bamba: Granite 4.0-H's block without its scalars, attention rotating half of each head (family_bamba)
    "bamba": {"family": "granite_hybrid", "configure": "family_bamba", "defaults": "family_bamba", "names": True},
    # Nemotron-H: one mixer per block (Mamba-2, NoPE attention or a relu^2 MLP); "prepare" fills in what
    # transformers 5's saved configs leave out.
    "nemotron_h": {"family": "nemotron_h", "configure": "family_nemotron_h", "own_rope": True, "prepare": True},
    # Falcon-H1: a Mamba-2 mixer beside attention in every layer, μP multipliers (family_falcon_h1).
    "falcon_h1": {
        "family": "falcon_h1",
        "configure": "family_falcon_h1",
        "defaults": "family_falcon_h1",
        "names": True,
    },
    # ERNIE 4.5: Llama's layer with pair-wise rope (GLM-4's); the MoE's router is DeepSeek-V3's with a softmax.
    "ernie4_5": {"family": "ernie", "configure": "family_ernie"},
    "ernie4_5_moe": {"family": "ernie", "configure": "family_ernie"},
    # Mamba / Falcon-Mamba: Mamba-1 selective-scan mixers only (a state per sequence, no attention, no K/V)
    "mamba": {"family": "mamba", "configure": "family_mamba", "prepare": True, "names": True},
    "falcon_mamba": {"family": "mamba", "configure": "family_mamba", "prepare": True, "names": True},
    # Mamba-2 (Mamba-Codestral): Nemotron-H's files with a Mamba-2 block in every layer (family_mamba)
    "mamba2": {"family": "nemotron_h", "configure": "family_mamba", "prepare": True},
    # Jamba: Mamba-1 mixers among NoPE attention layers, a mixture of experts in every other layer
    "jamba": {"family": "jamba", "configure": "family_jamba", "defaults": "family_jamba", "names": True},
    # OLMo (1): Llama's layer under LayerNorms without weights, q/k/v clamped (clip_qkv)
    "olmo": {"family": "olmo1", "configure": "family_olmo1", "defaults": "family_olmo1"},
    # GPT-J (GPT4All-J, Pygmalion-6B): Phi's parallel block, the rope on pairs of the first rotary_dim dims
    "gptj": {"family": "phi", "configure": "family_gptj", "prepare": True, "tensors": True},
    # CodeGen: GPT-J's block, q/k/v fused in its 4 training shards' layout (reordered while loading)
    "codegen": {"family": "phi", "configure": "family_gptj", "prepare": True, "tensors": True},
    # Helium (Kyutai): Llama's layer with the rope on consecutive pairs
    "helium": {"configure": "family_helium", "defaults": "family_helium"},
    # OLMo 2 / 3: post-sublayer norms only, q/k norms over whole projections; OLMo 3's sliding layers.
    "olmo2": {"family": "olmo", "configure": "family_olmo"},
    "olmo3": {"family": "olmo", "configure": "family_olmo"},
    # OLMoE: Llama's layer with OLMo 2's q/k norms, Qwen2-MoE's softmax router over Mixtral-wide experts.
    "olmoe": {
        "family": "olmoe",
        "configure": "family_olmo",
        "defaults": {
            "vocab_size": 50304,
            "hidden_size": 2048,
            "intermediate_size": 2048,
            "num_hidden_layers": 16,
            "max_position_embeddings": 4096,
        },
    },
    # Command R7B / A: a parallel block under one LayerNorm, pair-wise rope on sliding layers only.
    "cohere2": {"family": "cohere", "configure": "family_cohere"},
    # Command R / R+ / Aya: the same block with the rope on every layer; R+'s per-head q/k LayerNorms.
    "cohere": {"family": "cohere", "configure": "family_cohere"},
    # EXAONE 4: OLMo 2's post-sublayer norms with per-head q/k norms; global layers without rope (NoPE).
    "exaone4": {"family": "olmo", "configure": "family_exaone"},
    # K-EXAONE: EXAONE 4's attention in Llama's pre-norm layer over DeepSeek-V3's mixture past the first dense layers
    "exaone_moe": {
        "family": "llama_moe",
        "configure": "family_exaone",
        "names": True,
        "defaults": {
            "vocab_size": 102400,
            "hidden_size": 4096,
            "intermediate_size": 16384,
            "num_hidden_layers": 32,
            "num_attention_heads": 32,
            "num_key_value_heads": 32,
        },
    },
    # Qwen3-Next / Qwen3.5: gated DeltaNet linear-attention layers (recurrent state) among gated full attention.
    # "defaults": the config classes' values for keys released configs may omit (head_dim is 256, not d / heads).
    "qwen3_next": {
        "family": "qwen3_next",
        "configure": "family_qwen3_next",
        "own_rope": True,
        "defaults": {"head_dim": 256},
    },
    "qwen3_5_text": {
        "family": "qwen3_next",
        "configure": "family_qwen3_next",
        "own_rope": True,
        "defaults": {"head_dim": 256},
    },
    "qwen3_5_moe_text": {
        "family": "qwen3_next",
        "configure": "family_qwen3_next",
        "own_rope": True,  # configure drops mrope's keys first (Qwen's YaRN configs keep them)
        "defaults": {"head_dim": 256, "intermediate_size": 0},  # every layer is sparse: no dense MLP
    },
    # LFM2: gated short-convolution layers (a conv state per sequence) among Llama-like attention layers.
    "lfm2": {"family": "lfm2", "configure": "family_lfm2", "defaults": {"intermediate_size": 12288, "rope_theta": 1e6}},
    # LFM2-MoE (LFM2-8B-A1B): the same layers, sigmoid-routed experts past the first num_dense_layers.
    "lfm2_moe": {
        "family": "lfm2",
        "configure": "family_lfm2",
        "defaults": {"intermediate_size": 7168, "rope_theta": 1e6, "max_position_embeddings": 128000},
    },
    # Qwen3-VL's language model: Qwen3 (or Qwen3-MoE with fused experts) under a multimodal rope that is
    # Qwen3's for text. "defaults": Qwen3VLTextConfig's rope base (default_theta) and head_dim.
    "qwen3_vl_text": {"configure": "family_qwen3_vl", "own_rope": True, "defaults": _QWEN3_VL_DEFAULTS},
    "qwen3_vl_moe_text": {"configure": "family_qwen3_vl", "own_rope": True, "defaults": _QWEN3_VL_DEFAULTS},
    # MiniMax-M2 / M2.1: OLMo 2's whole-projection q/k norms, a partial rope, DeepSeek-V3's sigmoid router
    # in every layer. "defaults" names the module whose DEFAULTS are MiniMaxM2Config's.
    "minimax_m2": {
        "family": "minimax_m2",
        "configure": "family_minimax",
        "own_rope": True,
        "defaults": "family_minimax",
        "names": True,
    },
    # Llama 4 (Scout / Maverick): pair-wise rope, NoPE layers with a query temperature, L2 q/k norms, sigmoid-routed
    # top-1 experts beside a shared expert, chunked attention (served within one chunk)
    "llama4_text": {"family": "llama4", "configure": "family_llama4", "defaults": "family_llama4"},
    "ministral3": {"configure": "family_ministral", "own_rope": True},  # Llama's layout, YaRN, query temperature
    "gpt_oss": {"family": "gptoss", "configure": "family_gptoss", "attention_bias": True},
    # BERT-style encoders: embeddings only (--task embed); family_bert says what each differs in
    "bert": {"family": "bert", "configure": "family_bert"},
    "roberta": {"family": "bert", "configure": "family_bert"},
    "xlm-roberta": {"family": "bert", "configure": "family_bert"},
    "camembert": {"family": "bert", "configure": "family_bert"},
    "mpnet": {"family": "bert", "configure": "family_bert"},
    "nomic_bert": {"family": "bert", "configure": "family_bert", "prepare": True},  # nomic-embed-text v1 / v1.5
    "distilbert": {"family": "bert", "configure": "family_bert", "prepare": True},  # msmarco-distilbert, ...
    "modernbert": {"family": "modernbert", "configure": "family_modernbert", "tensors": True, "own_rope": True},
}


_WRAPPER_KEYS = ("eos_token_id", "bos_token_id", "pad_token_id", "quantization_config", "quantization")


def wrapped_text_config(
    cfg: dict[str, Any], model_type: str, tie: bool, defaults: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The language model's config inside a vision-language config.json: its text_config as `model_type`,
    tied as the wrapper decides (`tie`: transformers ties by the outer config), the wrapper's token ids and
    quantization where text_config lacks them, and the text config class's `defaults` for keys it omits."""
    text = {**(cfg.get("text_config") or {}), "model_type": model_type, "tie_word_embeddings": bool(tie)}
    for key in _WRAPPER_KEYS:
        if key not in text and key in cfg:
            text[key] = cfg[key]
    for key, value in (defaults or {}).items():
        text.setdefault(key, value)
    return text


def _text_config(module: str) -> Any:
    return lambda cfg: importlib.import_module(f"lantern.app.models.{module}").text_config_of(cfg)


# Vision-language model_types whose language model Lantern serves: model_type -> its text config.
MULTIMODAL_WRAPPERS = {
    "gemma3": _text_config("family_gemma"),
    "gemma4": _text_config("family_gemma4"),
    "gemma3n": _text_config("family_gemma3n"),
    "mistral3": _text_config("family_ministral"),
    "qwen3_5": _text_config("family_qwen3_next"),
    "qwen3_5_moe": _text_config("family_qwen3_next"),
    "lfm2_vl": _text_config("family_lfm2"),
    "glm4v": _text_config("family_glm"),
    "glm46v": _text_config("family_glm"),
    "glm4v_moe": _text_config("family_glm"),
    "qwen2_vl": _text_config("family_qwen2_vl"),
    "qwen2_5_vl": _text_config("family_qwen2_vl"),
    "qwen3_vl": _text_config("family_qwen3_vl"),
    "qwen3_vl_moe": _text_config("family_qwen3_vl"),
    "llama4": _text_config("family_llama4"),
}


_ACTIVATIONS = {"silu", "swish"}  # the same function under two names in transformers' ACT2FN


def _layer_windows(model_type: str, cfg: dict[str, Any], num_layers: int) -> list[int | None] | None:
    """Each layer's attention window (keys a query sees, itself included) as transformers computes
    it; None for a full-attention layer, and None overall when no layer slides."""
    window: int | None = None
    slides = [True] * num_layers
    if model_type in ("mistral", "mixtral"):
        # MistralConfig's default is 4096 when the key is absent; null turns it off (v0.2 and later).
        window = cfg.get("sliding_window", 4096 if model_type == "mistral" else None)
    elif model_type == "phi3":  # Phi-3-mini-4k: 2047; Phi-4 and the 128k variants: none
        window = cfg.get("sliding_window")
    elif model_type in ("qwen2", "qwen3", "qwen2_moe", "qwen3_moe"):
        window = cfg.get("sliding_window", 4096) if cfg.get("use_sliding_window") else None
        layer_types = cfg.get("layer_types")
        if layer_types is not None:
            slides = [t == "sliding_attention" for t in layer_types]
        else:  # only layers from max_window_layers on slide
            first = cfg.get("max_window_layers", 28)
            slides = [i >= first for i in range(num_layers)]
    if not window or not any(slides):
        return None  # llama has no sliding window in transformers either
    return [int(window) if s else None for s in slides]


# Families with a configure module whose keys are otherwise Llama's, checked by _check_unimplemented too.
_LLAMA_CHECKED = ("mixtral", "qwen2_moe", "qwen3_moe", "qwen3_vl_text", "qwen3_vl_moe_text", "exaone")


def _check_unimplemented(model_type: str, cfg: dict[str, Any]) -> None:
    """Keys that change the maths of the Llama-like architectures in transformers but not in
    Lantern (other families check their own keys in their configure())."""
    act = cfg.get("hidden_act", "silu")
    if act not in _ACTIVATIONS:
        raise _refuse("hidden_act", act, "; Lantern's MLP is SiLU-gated")
    if cfg.get("mlp_bias"):
        raise _refuse("mlp_bias", cfg["mlp_bias"], " (biases on the MLP projections)")
    if model_type == "seed_oss" and cfg.get("attention_out_bias"):
        raise _refuse("attention_out_bias", cfg["attention_out_bias"], " (a bias on o_proj)")
    if model_type in ("llama", "qwen3") and cfg.get("attention_bias"):
        raise _refuse("attention_bias", cfg["attention_bias"], " (the o_proj bias it adds)")
    for key in ("attn_logit_softcapping", "final_logit_softcapping"):
        if cfg.get(key):
            raise _refuse(key, cfg[key], " (logit soft-capping)")


@dataclass
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict[str, Any] | None
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool = False
    qk_norm: bool = False
    qk_norm_after_rope: bool = False  # Hunyuan: the per-head q/k norms follow the rope
    rope_reversed: bool = False  # NanoChat: the rope turns the other way (its rotate_half is negated)
    # attention's output times a gate of x before o_proj (self_attn.gate_proj): "sigmoid" of one value per channel
    # (AFMoE), "softplus" of one per channel or "softplus_head" of one per head (Laguna); None: no gate
    attn_output_gate: str | None = None
    layer_heads: tuple[int, ...] | None = None  # per layer: its query heads where layers differ (Laguna)
    eos_token_ids: list[int] = field(default_factory=list)
    bos_token_id: int | None = None
    quantization: QuantScheme | None = None  # how a quantized HF folder stores its linears (hf_formats.py)
    dual_chunk_size: int | None = None  # Qwen's dual chunk attention: full attention up to this length
    family: str = "llama"  # the model file both backends build: backends/*/models/<family>.py
    # of the gated MLP: "silu" or "gelu_tanh"; "relu2": an ungated relu^2 MLP (Arcee); the ungated MLPs (Jais 2's,
    # Phi's) also "gelu" (erf) and "relu"
    hidden_act: str = "silu"
    # Per layer: the keys a query attends to (itself included), None for full attention; the
    # whole list is None when no layer slides.
    layer_windows: list[int | None] | None = None
    attn_scale: float | None = None  # query scale; None: head_dim ** -0.5
    attn_softcap: float | None = None  # scores -> cap * tanh(scores / cap) before the softmax
    final_softcap: float | None = None  # the same on the output logits
    local_rope_theta: float | None = None  # rope base of the sliding layers (Gemma 3), unscaled
    local_rope_dim: int | None = None  # dims of each head the sliding layers' rope turns, where not the full layers'
    norm_offset: bool = False  # Gemma's RMSNorm scales by (1 + weight)
    embed_scale: bool = False  # Gemma multiplies embeddings by sqrt(hidden_size)
    embed_multiplier: float = 1.0  # Granite: embeddings times this
    residual_multiplier: float = 1.0  # Granite: each sublayer's output times this before the residual add
    logits_divisor: float = 1.0  # Granite's logits_scaling: logits divided by this
    sandwich_norms: bool = False  # Gemma 2/3: norms after attention and before/after the MLP
    moe: Any = None  # family_moe.MoEConfig: the experts of a mixture-of-experts model
    mla: Any = None  # family_deepseek.MLAConfig: multi-head latent attention (DeepSeek V2/V3)
    mtp_layers: int = 0  # multi-token-prediction layers stored after the decoder's (skipped while loading)
    rope_layers: tuple[bool, ...] | None = None  # per layer: rotates q/k (SmolLM3's NoPE layers do not); None: all
    attn_temperature: Any = None  # family_ministral.AttnTemperature: per-position query scale (Ministral 3)
    linear_attn: Any = None  # family_qwen3_next.LinearAttnConfig: gated-DeltaNet layers with recurrent state
    short_conv: Any = None  # family_lfm2.ShortConvConfig: gated short-convolution layers with a conv state
    mamba: Any = None  # family_mamba2.Mamba2Config: Mamba-2 mixer layers with a conv and SSM state
    mamba1: Any = None  # family_mamba.Mamba1Config: Mamba-1 selective-scan mixer layers with a conv and SSM state
    falcon_h1: Any = None  # family_falcon_h1.FalconH1Scalars: Falcon-H1's per-layer multipliers
    lm_head_bias: bool = False  # PhiMoE: the head has a bias
    mlp_bias: bool = False  # Jais 2: its (ungated) MLP's projections have biases
    # GPT-2 / OPT / StarCoder: a learned table of max_position_embeddings rows added to the token embedding
    # (model.embed_positions; such models have no rope: rope_layers all False)
    learned_positions: bool = False
    mlp_norm: bool = False  # the parallel block's MLP reads a LayerNorm of its own (GPT-NeoX, Falcon 40B)
    rope_interleaved: bool = False  # the rope turns consecutive pairs (GPT-J, Helium), not the two halves
    clip_qkv: float | None = None  # OLMo 1: q, k and v clamped to [-clip_qkv, clip_qkv] after their projections
    # ALiBi (BLOOM, MPT): per query head, the slope times each key's position added to the scaled scores (no rope)
    alibi_slopes: tuple[float, ...] | None = None
    embed_norm: bool = False  # BLOOM: a LayerNorm of the token embedding (model.embed_norm) before the first layer
    # a bidirectional encoder, embeddings only (family_bert.EncoderConfig, family_modernbert.ModernBertConfig,
    # family_gemma.BidirectionalGemma)
    encoder: Any = None
    gemma4: Any = None  # family_gemma4.Gemma4Layers: Gemma 4's per-layer shapes, K/V sharing, PLE, experts
    gemma3n: Any = None  # family_gemma3n.Gemma3nBlocks: Gemma 3n's AltUp streams, LAuReL, activation sparsity
    # Per layer of the KV pool: (kv heads, head dim) where layers differ in shape (Gemma 4); None: every
    # layer is (num_kv_heads, head_dim) or the model's kv_layout.
    kv_shapes: tuple[tuple[int, int], ...] | None = None
    # Llama 4: its rope layers attend within chunks of this many tokens; served within one (check_servable)
    attention_chunk: int | None = None
    # The vision-language model_type whose folder this language model came from (its tensor names
    # carry the wrapper's prefixes; weight_stream renames them and skips the vision tower).
    multimodal_wrapper: str | None = None

    @property
    def sliding_window(self) -> int | None:
        """The widest window any layer uses; None when every layer attends to the whole context."""
        windows = [w for w in self.layer_windows or [] if w is not None]
        return max(windows) if windows else None

    @property
    def recurrent(self) -> bool:
        """Some layers keep a per-sequence state instead of K/V (the engine gives each running sequence a slot)."""
        return any(x is not None for x in (self.linear_attn, self.short_conv, self.mamba, self.mamba1))

    @property
    def num_kv_layers(self) -> int:
        """Layers that keep K/V in the paged pool (a linear-attention or short-conv layer keeps a state instead)."""
        if self.kv_shapes is not None:
            return len(self.kv_shapes)
        stateful = self.linear_attn or self.short_conv or self.mamba or self.mamba1
        return self.num_layers if stateful is None else len(stateful.attention_layers())

    @property
    def all_layers_slide(self) -> bool:
        """True when no layer reads past its window: KV blocks behind it can be freed."""
        return bool(self.layer_windows) and all(w is not None for w in self.layer_windows)

    @property
    def max_context(self) -> int:
        """Positions the rope can serve.

        YaRN's max_position_embeddings is the pre-scaling length when original_max_position_embeddings
        is absent or equal to it (Qwen2.5: 32768 x factor 4), so the context is their product;
        otherwise (llama3, YaRN configs that already state the extended length: DeepSeek's 163840
        from 4096, LongRoPE's 131072) it is max_position_embeddings. Linear scaling stays at
        max_position_embeddings: configs disagree on which length they state, and the shorter is
        never wrong. Dynamic NTK is plain rope up to max_position_embeddings (see rope_config.rope_scaling), so
        it stops there.
        """
        s = self.rope_scaling or {}
        if s.get("rope_type") == "yarn" and s.get("original_max_position_embeddings") in (
            None,
            self.max_position_embeddings,
        ):
            return int(self.max_position_embeddings * float(s.get("factor") or 1.0))
        return self.max_position_embeddings

    @property
    def servable_context(self) -> int:
        """The longest context Lantern computes exactly: max_context, within one attention chunk (Llama 4)."""
        return min(self.max_context, self.attention_chunk or self.max_context)

    def serve_context(self, max_model_len: int | None) -> None:
        """Called before the weights load with the user's --max-model-len: LongRoPE models served
        within their original length then use the short factors, exactly as transformers does."""
        if max_model_len and self.rope_scaling and self.rope_scaling.get("rope_type") == "longrope":
            self.rope_scaling = {**self.rope_scaling, "served_context": int(max_model_len)}

    @classmethod
    def from_hf(cls, cfg: dict[str, Any]) -> ModelConfig:
        model_type = cfg.get("model_type", "")
        wrapper = None
        # (Qwen2-VL's released configs are flat: the text keys beside vision_config)
        flat = model_type in ("qwen2_vl", "qwen2_5_vl") and "vision_config" in cfg
        if model_type in MULTIMODAL_WRAPPERS and (cfg.get("text_config") is not None or flat):
            # A vision-language folder: serve its language model (the vision tower is not loaded).
            wrapper, cfg = model_type, MULTIMODAL_WRAPPERS[model_type](cfg)
            model_type = cfg["model_type"]
        if model_type not in ARCHITECTURES:
            raise UnsupportedModelError(
                f"unsupported architecture {model_type!r} ({', '.join(cfg.get('architectures') or [])}); "
                f"supported: {', '.join(sorted(ARCHITECTURES))}"
            )
        traits = ARCHITECTURES[model_type]
        defaults = traits.get("defaults", {})
        if isinstance(defaults, str):  # a configure module's DEFAULTS (or "module:NAME", another table of it)
            module, _, name = defaults.partition(":")
            defaults = getattr(importlib.import_module(f"lantern.app.models.{module}"), name or "DEFAULTS")
        cfg = {**defaults, **cfg}
        if traits.get("prepare"):  # the configure module's prepare(cfg) states keys the others read
            cfg = importlib.import_module(f"lantern.app.models.{traits['configure']}").prepare(cfg)
        if "configure" not in traits or model_type in _LLAMA_CHECKED:
            _check_unimplemented(model_type, cfg)
        # Imported here: hf_formats raises this module's UnsupportedModelError (no import cycle).
        from lantern.app.models.quant.hf_formats import parse_quant_scheme

        heads = cfg["num_attention_heads"]
        kv_heads = cfg.get("num_key_value_heads") or heads
        head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
        if heads % kv_heads or head_dim % 2:
            raise UnsupportedModelError(
                f"num_attention_heads={heads}, num_key_value_heads={kv_heads}, head_dim={head_dim} in config.json "
                "are not implemented (query heads must be a multiple of KV heads, head_dim even)"
            )
        max_pos = cfg.get("max_position_embeddings", 4096)
        # transformers >= 5 folds rope_theta and rope_scaling into rope_parameters.
        rope = dict(cfg.get("rope_parameters") or {})
        # rope_parameters' base first: transformers fills it from the top-level key only when it is absent
        theta = rope.get("rope_theta") or cfg.get("rope_theta") or 10000.0
        eos = cfg.get("eos_token_id")
        eos_ids = [eos] if isinstance(eos, int) else list(eos or [])
        dca = cfg.get("dual_chunk_attention_config") or {}
        if model_type == "qwen2":
            bias = True  # Qwen2 always has q/k/v biases (and no config key for them)
        elif model_type == "mistral":
            bias = False  # transformers' Mistral has no attention biases whatever the config says
        else:
            bias = bool(cfg.get("attention_bias", traits.get("attention_bias", False)))
        fields: dict[str, Any] = dict(
            architecture=model_type,
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_layers=cfg["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            rope_theta=float(theta),
            rope_scaling=None if traits.get("own_rope") else rope_scaling(cfg, rope, max_pos),  # else configure's
            max_position_embeddings=max_pos,
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            attention_bias=bias,
            qk_norm=traits.get("qk_norm", False),
            eos_token_ids=eos_ids,
            bos_token_id=cfg.get("bos_token_id"),
            # gpt-oss's MXFP4 experts are read by family_gptoss.checkpoint_tensors, not as a QuantScheme.
            quantization=None if model_type == "gpt_oss" else parse_quant_scheme(cfg),
            layer_windows=_layer_windows(model_type, cfg, cfg["num_hidden_layers"]),
            dual_chunk_size=int(dca["chunk_size"]) if dca.get("chunk_size") else None,
            family=traits.get("family", "llama"),
            multimodal_wrapper=wrapper,
        )
        if "configure" in traits:
            module = importlib.import_module(f"lantern.app.models.{traits['configure']}")
            fields.update(module.configure(model_type, cfg, fields))
        return cls(**fields)


def check_servable(config: ModelConfig, max_model_len: int) -> None:
    """Refuse, in one line naming the key, a context whose maths Lantern does not implement yet.

    Sliding windows are implemented (both backends' paged attention masks per layer), so a window
    shorter than the context is served. Dual chunk attention is not: below its chunk size it is
    full attention, which is what Lantern computes.
    """
    if max_model_len > config.max_context:
        raise ValueError(
            f"max_model_len {max_model_len} is beyond the {config.max_context} positions this model's rope "
            f"serves; serve with --max-model-len {config.max_context} (or less)"
        )
    chunk = config.attention_chunk
    if chunk is not None and max_model_len > chunk:
        raise ValueError(
            f"attention_chunk_size={chunk} in config.json (chunked attention) is implemented within one chunk; "
            f"serve with --max-model-len {chunk} (or less)"
        )
    limit = config.dual_chunk_size
    if limit is not None and max_model_len > limit:
        raise ValueError(
            f"dual_chunk_attention_config.chunk_size={limit} in config.json is not implemented yet; "
            f"serve with --max-model-len {limit} (or less)"
        )
    rope = config.rope_scaling or {}
    longrope = rope.get("rope_type") == "longrope"
    if longrope and longrope_factors(rope, config.max_position_embeddings) == "long_factor":
        original = rope["original_max_position_embeddings"]
        logger.info(
            "LongRoPE: long factors at every position for this %d-token model (context served: %d); transformers "
            "takes the short ones while a sequence has at most %d tokens, so those sequences' logits differ",
            config.max_position_embeddings,
            max_model_len,
            original,
        )

"""A GGUF file's hyper-parameters as the Hugging Face config.json its model was converted from.

GGUF carries no config.json: llama.cpp's converter (convert_hf_to_gguf.py) writes the keys its own
runtime reads, under `{arch}.<key>` names. transformers rebuilds a config from those for some
architectures only, and leaves out keys that change the maths (Gemma's soft-caps and sliding
layers, Phi-3's partial rotary and LongRoPE factors, Qwen3's head_dim). For the families below (and
gguf_builders.py's) the config is built here from the metadata alone, with llama.cpp's runtime defaults where the
converter writes nothing (Gemma's query scale and sliding pattern), so a file means what it means
to llama.cpp. `hf_config_from_gguf` returns None for the rest; `missing_config_keys` then adds
what transformers' reader omits.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from lantern.app.models.gguf_rope import rope_freqs_scaling, stated_rope_scaling
from lantern.app.models.spec import UnsupportedModelError

_MISSING = object()


class _Meta:
    """The metadata of one file, keyed by llama.cpp's names without the `{arch}.` prefix."""

    def __init__(self, metadata: dict[str, Any], name: str) -> None:
        self.md, self.name = metadata, name
        self.arch = str(metadata.get("general.architecture", ""))

    @property
    def label(self) -> str:
        """The file's name as an error message's prefix ("" when unnamed)."""
        return f"{self.name}: " if self.name else ""

    def get(self, key: str, default: Any = None) -> Any:
        return self.md.get(f"{self.arch}.{key}", default)

    def need(self, key: str) -> Any:
        value = self.get(key, _MISSING)
        if value is _MISSING:
            raise UnsupportedModelError(f"{self.label}GGUF metadata key {self.arch}.{key} is missing")
        return value

    def scalar(self, key: str, default: Any = _MISSING) -> Any:
        """A per-model value; llama.cpp allows some (head counts) per layer, which Lantern does not."""
        value = self.need(key) if default is _MISSING else self.get(key, default)
        if isinstance(value, (list, tuple)):
            if len(set(value)) != 1:
                raise UnsupportedModelError(f"{self.label}{self.arch}.{key} differs per layer ({list(value)})")
            value = value[0]
        return value


def hf_config_from_gguf(metadata: dict[str, Any], tensors: dict[str, Any], name: str = "") -> dict[str, Any] | None:
    """The config.json dict of a GGUF whose architecture transformers' reader does not serve (gemma2 /
    gemma3 / phi3 / glm4 / chatglm / glm4moe / deepseek2 / gpt-oss / mistral3 / smollm3 / granite / granitemoe /
    granitehybrid / nemotron_h / olmo2 / ernie4_5 / exaone4 / cohere2 / lfm2 / qwen3next / qwen35 / gemma4 /
    jais2 / ...: _BUILDERS and gguf_builders.BUILDERS); None for the others. `tensors`: GGUF name -> GGUFTensor
    of every part (which tensors exist says what keys cannot: tying, biases, q LoRA; Phi-3's LongRoPE
    factors are tensors)."""
    from lantern.app.models.gguf_builders import BUILDERS  # the newer families' (it imports this module)

    meta = _Meta(metadata, name)
    builder = _BUILDERS.get(meta.arch) or BUILDERS.get(meta.arch)
    if builder is None:
        return None
    if meta.arch not in ("exaone", "exaone4", "exaone-moe", "gemma4", "deci", "nanbeige", "step35"):  # (builders: it)
        rope_freqs_scaling(meta, tensors, None)  # refuses a rope_freqs tensor: no other family here has one
    if meta.arch not in ("mistral3", "mistral4"):  # (their builders read it)
        _temperature(meta, refuse=True)
    cfg = _common(meta, tensors)
    cfg.update(builder(meta, tensors, cfg))
    return cfg


def _common(meta: _Meta, tensors: dict[str, Any]) -> dict[str, Any]:
    md = meta.md
    stated = meta.get("attention.head_count")
    # (Nemotron-NAS states heads per layer, 0 where a layer has no attention: the attention layers' count)
    # (their builders state each)
    per_layer = meta.arch in ("deci", "openelm", "laguna", "step35") and isinstance(stated, (list, tuple))
    heads = int(max(stated)) if per_layer else None
    heads = heads or int(meta.scalar("attention.head_count"))
    eos = [md.get(f"tokenizer.ggml.{k}_token_id") for k in ("eos", "eot", "eom")]
    layers = int(meta.need("block_count")) - int(meta.get("nextn_predict_layers") or 0)
    embd = tensors.get("token_embd.weight")
    return {
        # The embedding's rows, not the token list: llama.cpp trims Gemma 3's unused rows.
        "vocab_size": int(embd.shape[1]) if embd is not None else int(meta.need("vocab_size")),
        "hidden_size": int(meta.need("embedding_length")),
        "intermediate_size": _per_layer_width(meta, "feed_forward_length"),
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": _kv_heads(meta, heads),
        "max_position_embeddings": int(meta.need("context_length")),
        "rms_norm_eps": _norm_eps(meta),
        "rope_theta": float(meta.get("rope.freq_base", 10000.0)),
        # llama.cpp writes the output projection only when it is not the embedding.
        "tie_word_embeddings": "output.weight" not in tensors,
        "bos_token_id": md.get("tokenizer.ggml.bos_token_id"),
        # Every end-of-generation token llama.cpp stops at (its EOG set): eos, end of turn, end of message.
        "eos_token_id": list(dict.fromkeys(int(t) for t in eos if t is not None)) or None,
        "pad_token_id": md.get("tokenizer.ggml.padding_token_id"),
    }


def _kv_heads(meta: _Meta, heads: int) -> int:
    """KV heads; a per-layer list where 0 marks a layer without attention (LFM2's short-conv layers)
    gives the attention layers' count; Gemma 4's list (sliding and full layers differ) gives the first
    layer's, its builder states the rest."""
    value = meta.get("attention.head_count_kv", heads)
    if isinstance(value, (list, tuple)) and 0 in value and len({v for v in value if v}) == 1:
        return int(next(v for v in value if v))
    if isinstance(value, (list, tuple)) and meta.arch == "gemma4" and value:
        return int(value[0])
    if isinstance(value, (list, tuple)) and meta.arch in ("deci", "mimo2", "openelm") and value:  # (builders: each)
        return int(max(value))
    return int(meta.scalar("attention.head_count_kv", heads))


def _per_layer_width(meta: _Meta, key: str) -> int:
    """A width llama.cpp may state per layer: Gemma 4's MLP (its KV-sharing layers twice as wide: its builder
    says so) and Gemma 3n's (its builder states every layer's) take the narrowest; Nemotron-H's (0 on the layers
    without an MLP) the widest; elsewhere one value for every layer."""
    value = meta.get(key)
    if isinstance(value, (list, tuple)) and meta.arch in ("gemma4", "gemma3n") and value:
        return int(min(value))
    if isinstance(value, (list, tuple)) and meta.arch in ("nemotron_h", "nemotron_h_moe", "deci", "openelm") and value:
        return int(max(value))
    return int(meta.scalar(key, 0) or 0)


def _norm_eps(meta: _Meta) -> float:
    """The RMSNorm eps, or a LayerNorm family's (Command R7B states layer_norm_epsilon instead)."""
    eps = meta.get("attention.layer_norm_rms_epsilon")
    if eps is None and meta.get("attention.layer_norm_epsilon") is not None:
        eps = meta.get("attention.layer_norm_epsilon")
    return float(eps if eps is not None else meta.need("attention.layer_norm_rms_epsilon"))


def _head_dim(meta: _Meta, cfg: dict[str, Any]) -> int:
    return int(meta.get("attention.key_length") or cfg["hidden_size"] // cfg["num_attention_heads"])


def _rotary_fraction(meta: _Meta, head_dim: int) -> float:
    dims = meta.get("rope.dimension_count")
    return 1.0 if dims in (None, head_dim) else int(dims) / head_dim


def _gemma(meta: _Meta, tensors: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
    """Gemma (1) / 2 / 3. llama.cpp's runtime: query scale 1/sqrt(head_dim), except the 27B models
    (46 / 62 layers) whose query_pre_attn_scalar is hidden_size / heads; Gemma 2 alternates
    sliding/full layers, Gemma 3 has five sliding layers per full one and a 10000 rope base on them;
    Gemma (1) is Llama's layer under Gemma's norms, no caps, no windows."""
    gemma2 = meta.arch == "gemma2"
    head_dim = _head_dim(meta, cfg)
    if meta.arch == "gemma":
        rope = stated_rope_scaling(meta) or {"rope_type": "default"}
        return {
            "model_type": "gemma",
            "head_dim": head_dim,
            "hidden_act": "gelu_pytorch_tanh",
            "rope_parameters": {**rope, "rope_theta": cfg["rope_theta"]},
        }
    big = cfg["num_hidden_layers"] == (46 if gemma2 else 62)
    out: dict[str, Any] = {
        "model_type": "gemma2" if gemma2 else "gemma3_text",
        "head_dim": head_dim,
        "query_pre_attn_scalar": cfg["hidden_size"] // cfg["num_attention_heads"] if big else head_dim,
        "hidden_activation": "gelu_pytorch_tanh",
    }
    window = meta.get("attention.sliding_window", 4096 if gemma2 else None)
    out["sliding_window"] = int(window) if window else None
    out["layer_types"] = _layer_types(meta, cfg["num_hidden_layers"], 2 if gemma2 else 6, bool(window))
    rope = stated_rope_scaling(meta)
    if gemma2:
        # llama_hparams' defaults when the converter wrote none (Gemma2Config's too)
        out["attn_logit_softcapping"] = float(meta.get("attn_logit_softcapping", 50.0))
        out["final_logit_softcapping"] = float(meta.get("final_logit_softcapping", 30.0))
        if rope:
            out["rope_scaling"] = rope
        return out
    if meta.arch == "gemma-embedding":  # EmbeddingGemma: both ways, a symmetric window (llama.cpp's period 6 too)
        out["use_bidirectional_attention"] = True
    final = meta.get("final_logit_softcapping")
    out["final_logit_softcapping"] = float(final) if final else None
    out["rope_parameters"] = {
        "full_attention": {**(rope or {"rope_type": "default"}), "rope_theta": cfg["rope_theta"]},
        "sliding_attention": {"rope_type": "default", "rope_theta": float(meta.get("rope.freq_base_swa", 10000.0))},
    }
    return out


def _layer_types(meta: _Meta, layers: int, period: int, slides: bool) -> list[str]:
    """Per layer attention type from `attention.sliding_window_pattern` (a period, or one flag per
    layer) or the architecture's period (llama.cpp's set_swa_pattern: the last of each period is full)."""
    if not slides:
        return ["full_attention"] * layers
    pattern = meta.get("attention.sliding_window_pattern", period)
    if isinstance(pattern, (list, tuple)):
        if len(pattern) != layers:
            raise UnsupportedModelError(
                f"{meta.label}{meta.arch}.attention.sliding_window_pattern has {len(pattern)} flags for {layers} layers"
            )
        flags = [bool(p) for p in pattern]
    else:
        flags = [(i + 1) % int(pattern) != 0 for i in range(layers)] if int(pattern) else [True] * layers
    return ["sliding_attention" if f else "full_attention" for f in flags]


def _phi3(meta: _Meta, tensors: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
    """Phi-3 / 3.5 / 4: partial rotary from rope.dimension_count, sliding_window 0 meaning none
    (Phi-4), and LongRoPE as two factor tensors (rope_factors_long/short) plus an attention factor."""
    head_dim = _head_dim(meta, cfg)
    window = meta.get("attention.sliding_window")
    out: dict[str, Any] = {
        "model_type": "phi3",
        "head_dim": head_dim,
        "sliding_window": int(window) if window else None,
    }
    fraction = _rotary_fraction(meta, head_dim)
    if fraction != 1.0:
        out["partial_rotary_factor"] = fraction
    original = meta.get("rope.scaling.original_context_length")
    if original is not None:
        out["original_max_position_embeddings"] = int(original)
    long, short = tensors.get("rope_factors_long.weight"), tensors.get("rope_factors_short.weight")
    if long is None:
        return out
    if short is None or original is None:
        raise UnsupportedModelError(
            f"{meta.label}LongRoPE needs rope_factors_short and {meta.arch}.rope.scaling.original_context_length"
        )
    scaling: dict[str, Any] = {
        "type": "longrope",
        "long_factor": [float(x) for x in np.asarray(long.data, dtype=np.float32)],
        "short_factor": [float(x) for x in np.asarray(short.data, dtype=np.float32)],
    }
    # The converter stores transformers' default attention factor; keep it only where it differs.
    scale = cfg["max_position_embeddings"] / int(original)
    default = math.sqrt(1 + math.log(scale) / math.log(int(original))) if scale > 1 else 1.0
    stored = meta.get("rope.scaling.attn_factor")
    if stored is not None and abs(float(stored) - default) > 1e-5:
        scaling["attention_factor"] = float(stored)
    out["rope_scaling"] = scaling
    return out


def _glm4(meta: _Meta, tensors: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
    """GLM-4-0414: partial rotary (rope.dimension_count of head_dim), q/k/v biases where the file has them.
    GLM-4.1V / GLM-4.6V-Flash files state rope.dimension_sections (M-RoPE, GLM-4's rope for text); the
    converter moved their q/k rows to halves order for it, which the weight stream undoes
    (gguf_arch.pairs_from_halves)."""
    if meta.get("rope.dimension_sections") is not None:
        if "blk.0.attn_qkv.weight" in tensors:  # (--fuse-qkv: its q/k blocks reordered inside the fused rows)
            raise UnsupportedModelError(f"{meta.label}a GLM-4V file with fused attn_qkv is not implemented")
        meta.need("rope.dimension_count")  # the reordered width
    head_dim = _head_dim(meta, cfg)
    return {
        "model_type": "glm4",
        "head_dim": head_dim,
        "partial_rotary_factor": _rotary_fraction(meta, head_dim),
        "attention_bias": "blk.0.attn_q.bias" in tensors or "blk.0.attn_qkv.bias" in tensors,
        "hidden_act": "silu",
    }


def _chatglm(meta: _Meta, tensors: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
    """llama.cpp's chatglm: glm-4-9b-chat(-hf) and ChatGLM3 as conversion/chatglm.py writes them, served as
    transformers' Glm: GLM-4-0414's keys without its post-sublayer norms (attn_qkv / the gate and up rows of ffn_up
    split while loading). The converter states hidden_size / heads as the head width, the rope base as 10000 x
    rope_ratio and the context as seq_length (else hidden_size)."""
    return {**_glm4(meta, tensors, cfg), "model_type": "glm"}


def _deepseek2(meta: _Meta, tensors: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
    """DeepSeek V2 / V3 (and the models converted as them). llama.cpp's MLA files state the latent
    as one KV head of kv_lora_rank + rope dims (key_length_mla / value_length_mla hold the per-head
    sizes); older files state the per-head sizes in key_length / value_length. A sigmoid router is
    V3's (grouped top-k on bias-corrected scores), a softmax one (or none stated) V2's."""
    heads, rope_dims = cfg["num_attention_heads"], int(meta.need("rope.dimension_count"))
    qk_head = meta.get("attention.key_length_mla") or meta.need("attention.key_length")
    v_head = meta.get("attention.value_length_mla") or meta.need("attention.value_length")
    sigmoid = int(meta.get("expert_gating_func") or 1) == 2
    groups, used_groups = int(meta.get("expert_group_count") or 1), int(meta.get("expert_group_used_count") or 1)
    q_lora = meta.get("attention.q_lora_rank")
    out: dict[str, Any] = {
        "model_type": "deepseek_v3" if sigmoid else "deepseek_v2",
        "num_key_value_heads": heads,  # MLA: every query head reads the one latent
        "kv_lora_rank": int(meta.need("attention.kv_lora_rank")),
        "q_lora_rank": int(q_lora) if q_lora else None,
        "qk_rope_head_dim": rope_dims,
        "qk_nope_head_dim": int(qk_head) - rope_dims,
        "v_head_dim": int(v_head),
        "first_k_dense_replace": int(meta.get("leading_dense_block_count") or 0),
        "n_routed_experts": int(meta.get("expert_count") or 0),
        "n_shared_experts": int(meta.get("expert_shared_count") or 0),
        "num_experts_per_tok": meta.get("expert_used_count"),
        "moe_intermediate_size": int(meta.scalar("expert_feed_forward_length", 0) or 0),
        "routed_scaling_factor": float(meta.get("expert_weights_scale") or 1.0),
        "norm_topk_prob": bool(meta.get("expert_weights_norm", False)),
        "scoring_func": "sigmoid" if sigmoid else "softmax",
        "n_group": groups,
        "topk_group": used_groups,
        "topk_method": "noaux_tc" if sigmoid else ("group_limited_greedy" if groups > 1 else "greedy"),
        "rope_interleave": True,  # llama.cpp rotates adjacent pairs for deepseek2 and permutes nothing
        "latent_norm_eps": cfg["rms_norm_eps"],  # (llama.cpp norms the latents with the model's eps)
        "hidden_act": "silu",
    }
    if not cfg["intermediate_size"]:  # every layer a mixture: the dense width is never used
        out["intermediate_size"] = out["moe_intermediate_size"]
    rope = stated_rope_scaling(meta)
    if rope:
        rope["type"] = rope.pop("rope_type")
        out["rope_scaling"] = rope
    return out


def _mistral3(meta: _Meta, tensors: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
    """Ministral 3 (llama.cpp's Ministral3Model, and Mistral's own format through MistralModel):
    Llama's tensors with q/k permuted as Llama's, YaRN (yarn_log_multiplier: mscale_all_dim against
    an mscale of 1, read by stated_rope_scaling) and Llama 4's query temperature (_temperature).
    transformers has no GGUF reader for it, so the config is built here; no window (llama.cpp's
    mistral3 graph has none)."""
    rope = stated_rope_scaling(meta) or {"rope_type": "default"}
    return {
        "model_type": "ministral3",
        "head_dim": _head_dim(meta, cfg),
        "sliding_window": None,
        "rope_parameters": {**rope, "rope_theta": cfg["rope_theta"]},
        **_temperature(meta),
    }


def _temperature(meta: _Meta, refuse: bool = False) -> dict[str, Any]:
    """attention.temperature_scale (Llama 4's query temperature beta) as family_ministral reads it:
    llama_4_scaling {beta, original_max_position_embeddings}, the length llama.cpp's mistral3 graph
    steps at (n_ctx_orig_yarn: rope.scaling.original_context_length, else context_length). beta is
    float32 in the file: its shortest decimal is the config's (0.1, not 0.10000000149). refuse: the
    caller's architecture has no such temperature in Lantern (deepseek2: Mistral Large 3)."""
    beta = meta.get("attention.temperature_scale")
    if not beta:
        return {}
    if refuse:
        raise UnsupportedModelError(
            f"{meta.label}{meta.arch}.attention.temperature_scale={float(beta):g} is not implemented for "
            f"architecture {meta.arch} (Llama 4's query temperature: dense llama and mistral3 only)"
        )
    length = meta.get("rope.scaling.original_context_length") or meta.need("context_length")
    return {"llama_4_scaling": {"beta": float(str(np.float32(beta))), "original_max_position_embeddings": int(length)}}


def _gptoss(meta: _Meta, tensors: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
    """gpt-oss (llama.cpp's GptOssModel): llama.cpp slides every even layer (its swa pattern 2, as
    GptOssConfig's default layer_types) and fixes the SwiGLU's alpha 1.702 and limit 7.0 in its graph
    (GptOssConfig's defaults; no key states them). YaRN keeps OpenAI's untruncated correction range
    (truncate false, as every gpt-oss config.json states and transformers computes): ggml rounds the
    range's ends to whole dimensions for every model, which the converter cannot tell it not to do."""
    window = meta.get("attention.sliding_window")
    rope = stated_rope_scaling(meta)
    if rope and rope.get("rope_type") == "yarn":
        rope["truncate"] = False
    return {
        "model_type": "gpt_oss",
        "head_dim": _head_dim(meta, cfg),
        "num_local_experts": int(meta.need("expert_count")),
        "num_experts_per_tok": int(meta.need("expert_used_count")),
        "intermediate_size": int(meta.get("expert_feed_forward_length") or cfg["intermediate_size"]),
        "sliding_window": int(window) if window else None,
        "layer_types": _layer_types(meta, cfg["num_hidden_layers"], 2, bool(window)),
        "attention_bias": "blk.0.attn_q.bias" in tensors,
        # explicit: an absent rope means none to llama.cpp, not GptOssConfig's default YaRN x32
        "rope_scaling": rope or {"rope_type": "default"},
    }


_BUILDERS = {
    "gemma": _gemma,
    "gemma2": _gemma,
    "gemma3": _gemma,
    "gemma-embedding": _gemma,
    "phi3": _phi3,
    "glm4": _glm4,
    "chatglm": _chatglm,
    "deepseek2": _deepseek2,
    "gpt-oss": _gptoss,
    "mistral3": _mistral3,
}


def missing_config_keys(metadata: dict[str, Any], name: str, tensors: dict[str, Any]) -> dict[str, Any]:
    """What transformers' GGUF config reader leaves out, for the architectures it reads: head_dim
    (Qwen3's differs from hidden_size / heads; transformers maps key_length for few architectures),
    the mixture-of-experts keys (moe_config_from_gguf), rms_norm_eps as the decimal config.json
    stated (transformers keeps the float32 9.9999997e-06 for 1e-05), and the rope scaling (it reads
    rope.scaling.* for gpt-oss only: a YaRN Qwen2.5 or a linear-scaled Llama would lose it; it drops
    the rope_freqs tensor of Llama 3.1 / 3.2, which `tensors` (GGUF name -> GGUFTensor) carries)."""
    meta = _Meta(metadata, name)
    out: dict[str, Any] = {}
    rope = rope_freqs_scaling(meta, tensors or {}, stated_rope_scaling(meta))
    if rope:
        out["rope_scaling"] = rope
    if meta.get("attention.layer_norm_rms_epsilon") is not None:
        out["rms_norm_eps"] = float(meta.get("attention.layer_norm_rms_epsilon"))
    if meta.get("attention.key_length") is not None:
        out["head_dim"] = int(meta.get("attention.key_length"))
    out.update(moe_config_from_gguf(metadata))
    if out.get("moe_intermediate_size") and not meta.get("feed_forward_length"):
        out["intermediate_size"] = out["moe_intermediate_size"]  # all-expert files omit the dense width
    # Mistral's llama-arch conversions may state Llama 4's query temperature (llama.cpp's llama graph
    # never reads it; the checkpoint computes it): Ministral 3's maths, so its config. Mixtral: refused.
    temperature = _temperature(meta, refuse=meta.arch != "llama" or "model_type" in out)
    if temperature:
        theta = float(meta.get("rope.freq_base", 10000.0))
        embd, heads = int(meta.need("embedding_length")), int(meta.scalar("attention.head_count"))
        out.update(model_type="ministral3", head_dim=out.get("head_dim") or embd // heads, **temperature)
        out["rope_parameters"] = {**(rope or {"rope_type": "default"}), "rope_theta": theta}
    return out


def moe_config_from_gguf(metadata: dict[str, Any]) -> dict[str, Any]:
    """What transformers' GGUF config reader leaves out of a mixture of experts, from llama.cpp's keys:
    Mixtral is architecture "llama" with `llama.expert_count` (-> model_type "mixtral"), and the
    experts' own sizes (`expert_feed_forward_length`, Qwen2-MoE's `expert_shared_feed_forward_length`)
    are not mapped. Returns the keys to update in the HF config dict (empty for a dense model)."""
    meta = _Meta(metadata, "")
    experts = meta.get("expert_count")
    if not experts:
        return {}
    out: dict[str, Any] = {}
    if meta.arch == "llama":
        out.update(model_type="mixtral", num_local_experts=int(experts), sliding_window=None)
    if meta.get("expert_used_count") is not None:
        out["num_experts_per_tok"] = int(meta.get("expert_used_count"))
    if meta.arch in ("qwen2moe", "qwen3moe"):
        out["num_experts"] = int(experts)
        if meta.get("expert_feed_forward_length") is not None:
            out["moe_intermediate_size"] = int(meta.get("expert_feed_forward_length"))
        if meta.get("expert_shared_feed_forward_length") is not None:
            out["shared_expert_intermediate_size"] = int(meta.get("expert_shared_feed_forward_length"))
    if meta.arch == "qwen3moe":
        out["norm_topk_prob"] = True  # llama.cpp's qwen3moe graph always renormalises the top-k weights
    return out

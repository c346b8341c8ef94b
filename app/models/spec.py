"""What a backend is handed to load a model: normalized hyper-parameters plus where weights live."""

from __future__ import annotations

import importlib
import logging
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from lantern.app.models.architectures import ARCHITECTURES
from lantern.app.models.errors import UnsupportedModelError, check_attention_types
from lantern.app.models.errors import refuse as _refuse
from lantern.app.models.rope_config import longrope_factors, rope_scaling

if TYPE_CHECKING:
    from lantern.app.models.quant.hf_formats import QuantScheme

logger = logging.getLogger(__name__)


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


# Vision-language folders read by transformers' own config class (family_vl_wrappers), their language model a
# family Lantern serves.
VL_WRAPPERS = (
    *("llava", "llava_next", "llava_onevision", "llava_next_video", "video_llava", "vipllava", "aya_vision"),
    *("cohere2_vision", "idefics2", "idefics3", "smolvlm", "internvl", "kimi_k25", "exaone4_5", "minicpmv4_6"),
    *("minicpmv4_7", "hyperclovax_vision_v2", "ovis2", "video_llama_3", "deepseek_vl", "deepseek_vl_hybrid"),
    "gemma4_unified",
    "apertus1p5",
    "mllama",
    "muse_glimmer",
    "cohere_compass",
    "aria",
)

# Vision-language model_types whose language model Lantern serves: model_type -> its text config.
MULTIMODAL_WRAPPERS = {
    "gemma3": _text_config("family_gemma"),
    "gemma4": _text_config("family_gemma4"),
    "gemma3n": _text_config("family_gemma3n"),
    "mistral3": _text_config("family_ministral"),
    "qwen3_5": _text_config("family_qwen3_next"),
    "qwen3_5_moe": _text_config("family_qwen3_next"),
    "lfm2_vl": _text_config("family_lfm2"),
    "lfm3_vl": _text_config("family_lfm3"),
    "glm4v": _text_config("family_glm"),
    "glm46v": _text_config("family_glm"),
    "glm4v_moe": _text_config("family_glm"),
    "qwen2_vl": _text_config("family_qwen2_vl"),
    "qwen2_5_vl": _text_config("family_qwen2_vl"),
    "qwen3_vl": _text_config("family_qwen3_vl"),
    "qwen3_vl_moe": _text_config("family_qwen3_vl"),
    "llama4": _text_config("family_llama4"),
    **{wrapper: _text_config("family_vl_wrappers") for wrapper in VL_WRAPPERS},
    # Step 3.7 Flash: Step 3.5's language model (family_step3p5)
    "step3p7": lambda cfg: importlib.import_module("lantern.app.models.family_step3p5").step3p7_text_config(cfg),
    # Kimi-VL (remote code, no transformers class): its text_config is DeepSeek-V3's
    "kimi_vl": lambda cfg: importlib.import_module("lantern.app.models.family_vl_wrappers").kimi_vl_text_config(cfg),
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
    elif model_type == "ministral":  # Mistral's window on the layers layer_types says (default: every layer)
        window = cfg.get("sliding_window", 4096)
        types = cfg.get("layer_types")
        if types is not None:
            check_attention_types(types, num_layers)
            slides = [t == "sliding_attention" for t in types]
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
    attn_out_bias: bool | None = None  # o_proj's bias where it differs from attention_bias (GPT-Neo: o_proj's only)
    # MiMo-V2-Flash: value heads narrower than head_dim (the q/k width; held padded to it in the KV pool), and the
    # values times attn_value_scale before they are cached
    v_head_dim: int | None = None
    attn_value_scale: float = 1.0
    qk_norm: bool = False
    qk_norm_after_rope: bool = False  # Hunyuan: the per-head q/k norms follow the rope
    rope_reversed: bool = False  # NanoChat: the rope turns the other way (its rotate_half is negated)
    # attention's output times a gate of x before o_proj (self_attn.gate_proj): "sigmoid" of one value per channel
    # (AFMoE) or "sigmoid_head" of one per head (LFM3), "softplus" of one per channel or "softplus_head" of one per
    # head (Laguna); None: no gate
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
    # Per layer (of the KV pool, where it holds only the attention layers: RecurrentGemma): the keys a query attends
    # to (itself included), None for full attention; the whole list is None when no layer slides.
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
    attn_sinks: bool = False  # Granite Swash: one learned sink logit per head in every attention layer
    post_norms: bool = False  # HyperCLOVA X (Peri-LN): an RMSNorm on each sublayer's output before the residual add
    post_norm_eps: float | None = (
        None  # the sandwich's norms after each sublayer, where their eps differs (Muse Glimmer)
    )
    # BitNet's subln: an RMSNorm on the attention's output before o_proj (self_attn.attn_sub_norm) and on the gated
    # MLP's product before down_proj (mlp.ffn_sub_norm)
    sub_norms: bool = False
    rms_norm: bool = False  # Cohere2-MoE's rms_norm_eps: RMSNorms where its family's norms are LayerNorms
    # Apertus 1.5: the untied head's rows (output_vocab_size) where fewer than the vocabulary's (its multimodal code
    # ids are input-only): the logits past them are -inf, so those ids are never chosen
    head_rows: int | None = None
    # per layer: its index among the checkpoint's where they differ (Llama 3.2 Vision: the cross-attention layers
    # text never reaches are not loaded); None: the same
    checkpoint_layers: tuple[int, ...] | None = None
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
    rglru: Any = None  # family_recurrent_gemma.RGLRUConfig: RecurrentGemma's RG-LRU layers with a conv and a recurrence
    rwkv7: Any = None  # family_rwkv7.Rwkv7Config: RWKV-7's time and channel mixes, a state per layer and sequence
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
    kv_layers: int | None = None  # layers of the KV pool where not one per layer (HRM-Text: one per stack pass)
    hrm: Any = None  # family_hrm_text.HrmCycles: HRM-Text's two stacks and their cycles
    dory: Any = None  # family_dory.DoryLoops: Dory's looped section and nGPT's scales
    zamba2: Any = None  # family_zamba2.Zamba2Blocks: Zamba2's shared transformer blocks and per-layer adapters
    nas: Any = None  # family_deci.NASBlocks: Nemotron-NAS's per-layer attention kind, KV heads and MLP width
    openelm: Any = None  # family_openelm.OpenELMLayers: OpenELM's per-layer query / K/V heads and MLP widths
    loops: Any = None  # family_nanbeige.LayerLoops: Nanbeige 4.2's layer stack run several times over the tokens
    loop_window: int | None = None  # IQuest-Coder Loop: its second pass's local attention window (family_iquest_loop)
    swiglu_limits: Any = None  # family_step3p5.SwigluLimits: Step 3.5's per-layer clamps of its gated MLPs
    norm_head: bool = False  # Ling 1.x: the head's columns L2-normalised, as its code does (once, while loading)
    # A.X-K2: the input norm (and a mixture layer's post-attention norm) times sigmoid(W_up(silu(W_down(y)))) of its
    # output y, W_down of this rank (the backends' deepseek model files)
    gated_norm_rank: int | None = None
    # Llama 4: its rope layers attend within chunks of this many tokens; served within one (check_servable)
    attention_chunk: int | None = None
    # MiniCPM 4's InfLLM v2 (sparse_config): dense attention while a sequence holds fewer than dense_len tokens;
    # served within dense_len - 1 (check_servable)
    dense_limit: int | None = None
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
        stateful = (self.linear_attn, self.short_conv, self.mamba, self.mamba1, self.rglru, self.rwkv7)
        return any(x is not None for x in stateful)

    @property
    def num_kv_layers(self) -> int:
        """Layers that keep K/V in the paged pool (a linear-attention or short-conv layer keeps a state instead)."""
        if self.kv_shapes is not None:
            return len(self.kv_shapes)
        if self.kv_layers is not None:
            return self.kv_layers
        stateful = self.linear_attn or self.short_conv or self.mamba or self.mamba1 or self.rglru or self.rwkv7
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
        return min(self.max_context, self.attention_chunk or self.max_context, self.dense_limit or self.max_context)

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
        if "BitnetForCausalLM" in (cfg.get("architectures") or []):  # (transformers' own class is BitNetForCausalLM)
            raise _refuse(
                "architectures",
                ["BitnetForCausalLM"],
                " (1bitLLM's remote-code BitNet; transformers' `bitnet` folders and llama.cpp's bitnet GGUFs load)",
            )
        if model_type not in ARCHITECTURES:
            raise UnsupportedModelError(
                f"unsupported architecture {model_type!r} ({', '.join(cfg.get('architectures') or [])}); "
                f"supported: {', '.join(sorted(ARCHITECTURES))}"
            )
        traits = ARCHITECTURES[model_type]
        if "same_as" in traits:  # another family's maths under other key names (family_renamed)
            from lantern.app.models.family_renamed import extra_fields, family_config

            family = cls.from_hf(family_config(model_type, traits["same_as"], cfg))
            extra = {"multimodal_wrapper": wrapper, **extra_fields(model_type, cfg)}
            return replace(family, architecture=model_type, **extra)
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
        elif model_type in ("mistral", "ministral"):
            bias = False  # transformers' Mistral (and Ministral) has no attention biases whatever the config says
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
    dense = config.dense_limit
    if dense is not None and max_model_len > dense:
        raise ValueError(
            f"sparse_config.dense_len={dense + 1} in config.json: InfLLM v2's sparse attention is not implemented, "
            f"its dense attention below that length is; serve with --max-model-len {dense} (or less)"
        )
    limit = config.dual_chunk_size
    if limit is not None and max_model_len > limit:
        raise ValueError(
            f"dual_chunk_attention_config.chunk_size={limit} in config.json is not implemented yet; "
            f"serve with --max-model-len {limit} (or less)"
        )
    rope = config.rope_scaling or {}
    # (MiniCPM's remote code takes the long factors at every position: its two lists are then one)
    longrope = rope.get("rope_type") == "longrope" and rope["short_factor"] != rope["long_factor"]
    if longrope and longrope_factors(rope, config.max_position_embeddings) == "long_factor":
        original = rope["original_max_position_embeddings"]
        logger.info(
            "LongRoPE: long factors at every position for this %d-token model (context served: %d); transformers "
            "takes the short ones while a sequence has at most %d tokens, so those sequences' logits differ",
            config.max_position_embeddings,
            max_model_len,
            original,
        )

"""What llama.cpp's converter does per architecture, for the GGUF weight stream to undo: names
that differ from Llama's, Gemma's norms stored as 1 + w, DeepSeek's kv_b_proj split per head into
attn_k_b / attn_v_b, multi-token-prediction layers appended after the decoder stack, and gpt-oss's
experts (gate and up split apart, MXFP4 blocks in ggml's nibble order).

Facts from llama.cpp's convert_hf_to_gguf.py and the `gguf` package's tensor name map.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from lantern.app.models.gguf_names import GGUFIndex, GGUFTensor

logger = logging.getLogger(__name__)

# Where an architecture's HF checkpoint names a llama.cpp tensor differently from Llama's
# (gguf_names._LAYER).
_GEMMA = {
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
_FUSED = {"attn_qkv": "self_attn.qkv_proj", "ffn_up": "mlp.gate_up_proj"}  # split by weight_stream.split_fused
ARCH_LAYER: dict[str, dict[str, str]] = {
    "gemma2": _GEMMA,
    "gemma3": _GEMMA,
    "gemma-embedding": _GEMMA,  # EmbeddingGemma: Gemma 3's tensors
    "muse-glimmer": {**_GEMMA, "attn_gate": "self_attn.gate_proj"},  # (its q/k norms: gguf_names drops them)
    "phi3": _FUSED,
    "openelm": {"attn_qkv": "attn.qkv_proj"},  # (split per layer, by its own head counts: family_openelm)
    "chatglm": _FUSED,  # glm-4-9b-chat's attn_qkv (remote-code checkpoints) and gate + up in ffn_up
    "glm4": {**_FUSED, "post_attention_norm": "post_self_attn_layernorm", "post_ffw_norm": "post_mlp_layernorm"},
    "deepseek2": {
        "attn_q_a": "self_attn.q_a_proj",
        "attn_q_a_norm": "self_attn.q_a_layernorm",
        "attn_q_b": "self_attn.q_b_proj",
        "attn_kv_a_mqa": "self_attn.kv_a_proj_with_mqa",
        "attn_kv_a_norm": "self_attn.kv_a_layernorm",
        "attn_kv_b": "self_attn.kv_b_proj",
        # newer converters split kv_b_proj per head (k_b transposed); joined back in join_kv_b
        "attn_k_b": "self_attn.k_b_proj",
        "attn_v_b": "self_attn.v_b_proj",
        "exp_probs_b": "mlp.gate.e_score_correction",  # .bias -> e_score_correction_bias
        **{f"ffn_{p}_shexp": f"mlp.shared_experts.{p}_proj" for p in ("gate", "up", "down")},
    },
    # GLM-4.5: Llama's names but for the pre-MLP norm, DeepSeek's router bias and shared experts
    "glm4moe": {
        "post_attention_norm": "post_attention_layernorm",
        "exp_probs_b": "mlp.gate.e_score_correction",
        **{f"ffn_{p}_shexp": f"mlp.shared_experts.{p}_proj" for p in ("gate", "up", "down")},
    },
    # Ling / Ring 2.0, Sarvam-30B (bailingmoe2): GLM-4.5's names, q/k/v in one attn_qkv (weight_stream.split_fused)
    "bailingmoe2": {
        "attn_qkv": "self_attn.qkv_proj",
        "exp_probs_b": "mlp.gate.e_score_correction",
        **{f"ffn_{p}_shexp": f"mlp.shared_experts.{p}_proj" for p in ("gate", "up", "down")},
    },
    # dots.llm1 (llama.cpp's Dots1Model): DeepSeek's router bias and shared experts under Llama's other names
    "dots1": {
        "exp_probs_b": "mlp.gate.e_score_correction",
        **{f"ffn_{p}_shexp": f"mlp.shared_experts.{p}_proj" for p in ("gate", "up", "down")},
    },
    "ernie4_5-moe": {  # the router bias under ERNIE's own name (family_ernie.checkpoint_tensors renames it)
        "exp_probs_b": "mlp.moe_statics.e_score_correction",  # .bias -> e_score_correction_bias
        **{f"ffn_{p}_shexp": f"mlp.shared_experts.{p}_proj" for p in ("gate", "up", "down")},
    },
    "laguna": {  # the attention's gate, DeepSeek's router bias and shared expert
        "attn_gate": "self_attn.gate_proj",
        "exp_probs_b": "mlp.gate.e_score_correction",
        **{f"ffn_{p}_shexp": f"mlp.shared_experts.{p}_proj" for p in ("gate", "up", "down")},
    },
    "step35": {  # Step 3.5's attention gate, DeepSeek's router bias and shared expert
        "attn_gate": "self_attn.gate_proj",
        "exp_probs_b": "mlp.gate.e_score_correction",
        **{f"ffn_{p}_shexp": f"mlp.shared_experts.{p}_proj" for p in ("gate", "up", "down")},
    },
    "hy_v3": {f"ffn_{p}_shexp": f"mlp.shared_experts.{p}_proj" for p in ("gate", "up", "down")},  # (exp_probs_b bare)
    "deepseek": {f"ffn_{p}_shexp": f"mlp.shared_experts.{p}_proj" for p in ("gate", "up", "down")},  # DeepSeek-MoE
    "bailingmoe": {f"ffn_{p}_shexp": f"mlp.shared_experts.{p}_proj" for p in ("gate", "up", "down")},  # Ling 1.x
    "olmo2": {"post_attention_norm": "post_attention_layernorm", "post_ffw_norm": "post_feedforward_layernorm"},
    "minimax-m2": {"exp_probs_b": "mlp.gate.e_score_correction"},  # .bias -> e_score_correction_bias
    # Arcee Trinity: Gemma 2's four norms under AFMoE's names, the attention's output gate, the router as DeepSeek's
    "afmoe": {
        "post_attention_norm": "post_attention_layernorm",
        "ffn_norm": "pre_mlp_layernorm",
        "post_ffw_norm": "post_mlp_layernorm",
        "attn_gate": "self_attn.gate_proj",
        "ffn_gate_inp": "mlp.router.gate",
        "exp_probs_b": "mlp.gate.e_score_correction",  # .bias -> e_score_correction_bias (the model files' name)
        **{f"ffn_{p}_shexp": f"mlp.shared_experts.{p}_proj" for p in ("gate", "up", "down")},
    },  # .bias -> e_score_correction_bias
    "seed_oss": {"post_attention_norm": "post_attention_layernorm"},  # (the pre-MLP norm, Llama's ffn_norm)
    # the checkpoint's names (weight_stream renames them for the model files, as a folder's)
    "hunyuan-dense": {"attn_q_norm": "self_attn.query_layernorm", "attn_k_norm": "self_attn.key_layernorm"},
    "hunyuan-moe": {
        "attn_q_norm": "self_attn.query_layernorm",
        "attn_k_norm": "self_attn.key_layernorm",
        "ffn_gate_inp": "mlp.gate.wg",
        **{f"ffn_{p}_shexp": f"mlp.shared_mlp.{p}_proj" for p in ("gate", "up", "down")},
    },
    "exaone4": {"post_attention_norm": "post_attention_layernorm", "post_ffw_norm": "post_feedforward_layernorm"},
    # the pre-MLP norm; the sinks are a bare parameter in HF (gguf_names.hf_name drops ".weight")
    "gpt-oss": {"post_attention_norm": "post_attention_layernorm", "attn_sinks": "self_attn.sinks"},
}
# DeepSeek-V3.2 / GLM-5 (DeepseekV32Model / GlmMoeDsaModel, DeepseekV2Models): deepseek2's tensors and the indexer's
ARCH_LAYER["deepseek32"] = ARCH_LAYER["glm-dsa"] = {
    **ARCH_LAYER["deepseek2"],
    "indexer.attn_q_b": "self_attn.indexer.wq_b",
    "indexer.attn_k": "self_attn.indexer.wk",
    "indexer.k_norm": "self_attn.indexer.k_norm",
    "indexer.proj": "self_attn.indexer.weights_proj",
}
# Qwen3-Next / Qwen3.5 (family_qwen3_next.gguf_tensors undoes the rest: 1 + w norms, A = -exp(A_log), the
# convolution's squeezed kernel); ssm_a has no .weight suffix in the file (hf_name maps it bare).
_QWEN3NEXT = {
    "attn_qkv": "linear_attn.in_proj_qkv",
    "attn_gate": "linear_attn.in_proj_z",
    "ssm_in": "linear_attn.in_proj_qkvz",
    "ssm_ba": "linear_attn.in_proj_ba",
    "ssm_beta": "linear_attn.in_proj_b",
    "ssm_alpha": "linear_attn.in_proj_a",
    "ssm_conv1d": "linear_attn.conv1d",
    "ssm_dt": "linear_attn.dt",  # .bias -> dt_bias
    "ssm_norm": "linear_attn.norm",
    "ssm_out": "linear_attn.out_proj",
    "post_attention_norm": "post_attention_layernorm",
}
ARCH_LAYER.update({"qwen3next": _QWEN3NEXT, "qwen35": _QWEN3NEXT, "qwen35moe": _QWEN3NEXT})
# Cohere2-MoE's shared experts, MiMo-V2-Flash's sinks and router bias, DBRX's fused q/k/v and norm_2, BitNet's subln
ARCH_LAYER["cohere2moe"] = {f"ffn_{p}_shexp": f"mlp.shared_experts.{p}_proj" for p in ("gate", "up", "down")}
ARCH_LAYER["mimo2"] = {"attn_sinks": "self_attn.sinks", "exp_probs_b": "mlp.gate.e_score_correction"}
ARCH_LAYER["dbrx"] = {"attn_qkv": "self_attn.qkv_proj", "attn_output_norm": "post_attention_layernorm"}
# Kimi Linear: DeepSeek-V2's latent attention names, and KDA's under ssm_* (A bare: ARCH_BARE)
ARCH_LAYER["kimi-linear"] = {
    **ARCH_LAYER["deepseek2"],
    **{f"ssm_conv1d_{p}": f"self_attn.{p}_conv1d" for p in "qkv"},
    **{f"ssm_{p}": f"self_attn.{p}_proj" for p in ("f_a", "f_b", "g_a", "g_b")},
    "ssm_beta": "self_attn.b_proj",
    "ssm_dt": "self_attn.dt",  # .bias -> dt_bias
    "ssm_norm": "self_attn.o_norm",
}
ARCH_LAYER["hrm_text"] = {"attn_gate": "self_attn.gate_proj"}  # (its stacks' layers: L's first, then H's)
ARCH_LAYER["bitnet"] = {"attn_sub_norm": "self_attn.attn_sub_norm", "ffn_sub_norm": "mlp.ffn_sub_norm"}
# LFM2: the short-conv layers' tensors (the names hold a dot: hf_name's pattern allows it)
ARCH_LAYER["lfm2"] = {f"shortconv.{t}": f"conv.{t}" for t in ("conv", "in_proj", "out_proj")}
# K-EXAONE (llama.cpp's ExaoneMoEModel): Llama's pre-norm names, DeepSeek's router bias and shared experts
ARCH_LAYER["exaone-moe"] = {
    "exp_probs_b": "mlp.gate.e_score_correction",
    **{f"ffn_{p}_shexp": f"mlp.shared_experts.{p}_proj" for p in ("gate", "up", "down")},
}
# MiniCPM3 (llama.cpp's MiniCPM3Model): DeepSeek-V2's latent attention tensors (kv_b_proj whole)
ARCH_LAYER["minicpm3"] = ARCH_LAYER["mistral4"] = ARCH_LAYER["deepseek2"]  # (and Mistral4Model's, a DeepseekV2Model)
# LFM2-MoE: the same, and its router's bias (.bias -> e_score_correction_bias)
ARCH_LAYER["lfm2moe"] = {**ARCH_LAYER["lfm2"], "exp_probs_b": "mlp.gate.e_score_correction"}
# Granite 4.0-H (llama.cpp's GraniteHybridModel): the Mamba-2 mixer's tensors (family_mamba2.gguf_tensors
# undoes their shapes; ssm_a and ssm_d have no suffix: hf_name maps them bare), the dense shared_mlp written
# as ffn_gate / ffn_up / ffn_down, or as the _shexp tensors beside routed experts.
ARCH_LAYER["granitehybrid"] = {
    "ssm_in": "mamba.in_proj",
    "ssm_conv1d": "mamba.conv1d",
    "ssm_dt": "mamba.dt",  # .bias -> dt_bias
    "ssm_norm": "mamba.norm",
    "ssm_out": "mamba.out_proj",
    **{f"ffn_{p}{s}": f"shared_mlp.{p}_proj" for p in ("gate", "up", "down") for s in ("", "_shexp")},
}
# GraniteMoeShared (granitemoe with expert_shared_feed_forward_length): the dense shared_mlp as the _shexp tensors;
# Granite Swash (granite_swa): the sinks, the routed experts' gate and up rows in one tensor (split while read), the
# shared_mlp's too (ffn_up_shexp: weight_stream.split_fused)
ARCH_LAYER["granitemoe"] = {f"ffn_{p}_shexp": f"shared_mlp.{p}_proj" for p in ("gate", "up", "down")}
ARCH_LAYER["granite_swa"] = {
    "attn_sinks": "self_attn.sinks",
    "ffn_up_shexp": "shared_mlp.gate_up_proj",
    "ffn_down_shexp": "shared_mlp.down_proj",
}
# Nemotron-H (llama.cpp's NemotronHModel, a GraniteHybridModel): the same mixer tensors; its relu^2 MLP is
# Llama's ffn_up / ffn_down, each block's one norm attn_norm.
ARCH_LAYER["nemotron_h"] = {
    p: ARCH_LAYER["granitehybrid"][p] for p in ("ssm_in", "ssm_conv1d", "ssm_dt", "ssm_norm", "ssm_out")
}
# Nemotron 3 (nemotron_h_moe): DeepSeek's router bias, its relu^2 shared expert, LatentMoE's projections.
ARCH_LAYER["nemotron_h_moe"] = {
    **ARCH_LAYER["nemotron_h"],
    "exp_probs_b": "mlp.gate.e_score_correction",  # .bias -> e_score_correction_bias
    "ffn_up_shexp": "mlp.shared_experts.up_proj",
    "ffn_down_shexp": "mlp.shared_experts.down_proj",
    "ffn_latent_down": "mlp.fc1_latent_proj",
    "ffn_latent_up": "mlp.fc2_latent_proj",
}
# Falcon-H1 (llama.cpp's FalconH1Model): the same mixer tensors beside Llama's (its MLP and pre-MLP norm under
# Llama's GGUF names, which are the model files').
ARCH_LAYER["falcon-h1"] = ARCH_LAYER["nemotron_h"]
# Mamba-2 (Mamba2Model): the same mixer tensors, each block's norm as attn_norm.
ARCH_LAYER["mamba2"] = ARCH_LAYER["nemotron_h"]
# Mamba / Falcon-Mamba (MambaModel): the Mamba-1 mixer's tensors (family_mamba.gguf_tensors undoes A and the
# convolution's shape).
ARCH_LAYER["mamba"] = {
    "ssm_in": "mamba.in_proj",
    "ssm_conv1d": "mamba.conv1d",
    "ssm_x": "mamba.x_proj",
    "ssm_dt": "mamba.dt_proj",
    "ssm_out": "mamba.out_proj",
}
# Jamba (JambaModel): the same, and the mixer's weighted norms of dt, B and C.
ARCH_LAYER["jamba"] = {
    **ARCH_LAYER["mamba"],
    "ssm_dt_norm": "mamba.dt_layernorm",
    "ssm_b_norm": "mamba.b_layernorm",
    "ssm_c_norm": "mamba.c_layernorm",
}
# RWKV-7 (Rwkv7Model): flash-linear-attention's names; a LoRA's first map (`*1`), second (`*2`) and bias (`*0`,
# renamed lora.2.bias by family_rwkv7.gguf_tensors, which also splits the six fused token-shift mixes and drops layer
# 0's placeholder v LoRA)
ARCH_LAYER["rwkv7"] = {
    "attn_norm": "attn_norm",
    "attn_norm_2": "ffn_norm",
    "time_mix_lerp_fused": "attn.lerp_fused",
    **{
        f"time_mix_{x}{i}": f"attn.{x}_lora.{part}"
        for x in "wavg"
        for i, part in ((0, "bias0"), (1, "lora.0"), (2, "lora.2"))
    },
    "time_mix_k_k": "attn.k_k",
    "time_mix_k_a": "attn.k_a",
    "time_mix_r_k": "attn.r_k",
    "time_mix_key": "attn.k_proj",
    "time_mix_value": "attn.v_proj",
    "time_mix_receptance": "attn.r_proj",
    "time_mix_output": "attn.o_proj",
    "time_mix_ln": "attn.g_norm",
    "channel_mix_lerp_k": "ffn.x_k",
    "channel_mix_key": "ffn.key",
    "channel_mix_value": "ffn.value",
}
# Talkie (TalkieModel): its per-head query gain as attn_q_norm, the embedding's skip scale per layer (the sublayers'
# gains are `.scale` tensors: gguf_names.hf_name)
ARCH_LAYER["talkie"] = {"attn_q_norm": "self_attn.head_gain", "layer_output_scale": "embed_skip"}
# Suffix-less tensors (hf_name's bare pattern): Qwen3-Next's A, the Mamba-2 mixers' A and D.
_MAMBA_BARE = {"ssm_a": "mamba.A_log", "ssm_d": "mamba.D"}
ARCH_BARE: dict[str, dict[str, str]] = {
    "granitehybrid": _MAMBA_BARE,
    "nemotron_h": _MAMBA_BARE,
    "nemotron_h_moe": _MAMBA_BARE,
    "falcon-h1": _MAMBA_BARE,
    "mamba2": _MAMBA_BARE,
    "mamba": _MAMBA_BARE,
    "jamba": _MAMBA_BARE,
    "kimi-linear": {"ssm_a": "self_attn.A_log"},  # (-exp(A_log) as written: family_kimi_linear takes the log back)
    "hy_v3": {"exp_probs_b": "mlp.gate.e_score_correction_bias"},  # (HY-V3's converter names its router bias bare)
}
# Gemma 4: Gemma's sandwich norms, the MoE layers' extra norms, the per-layer-embedding tensors and the layer
# scalar; the router's and experts' scales (`.scale` tensors) and the fused gate/up experts are named in
# gguf_names.hf_name.
ARCH_LAYER["gemma4"] = {
    **_GEMMA,
    "pre_ffw_norm_2": "pre_feedforward_layernorm_2",
    "post_ffw_norm_1": "post_feedforward_layernorm_1",
    "post_ffw_norm_2": "post_feedforward_layernorm_2",
    "inp_gate": "per_layer_input_gate",
    "proj": "per_layer_projection",
    "post_norm": "post_per_layer_input_norm",
    "layer_output_scale": "layer_scalar",  # .weight dropped: a bare parameter in HF
    "attn_qkv": "self_attn.qkv_proj",  # --fuse-qkv files: split per layer by family_gemma4.gguf_tensors
}
# Plain TextModel converters whose --fuse-qkv (and Phi-2's older checkpoints) give attn_qkv: split by
# weight_stream.split_fused (their q/k rows are not permuted, so the split is the checkpoint's rows).
_PLAIN_QKV = ("gemma", "phi2", "stablelm", "starcoder2", "command-r", "nemotron", "exaone", "jais2")
# (and the GPT-2-era converters and Qwen (1)'s, which always fuse q/k/v: GPT-NeoX's and Falcon's regrouped to q, k, v
# rows)
for _arch in (*_PLAIN_QKV, "gpt2", "starcoder", "gptneox", "falcon", "bloom", "mpt", "qwen"):
    ARCH_LAYER[_arch] = {**ARCH_LAYER.get(_arch, {}), "attn_qkv": "self_attn.qkv_proj"}
# Falcon 40B's second norm (the gguf map's attn_norm_2 is ln_attn, attn_norm ln_mlp: family_gptneox swaps them back)
ARCH_LAYER["falcon"]["attn_norm_2"] = "post_attention_layernorm"
# Gemma 3n: Gemma 4's names for the sandwich norms and per-layer embeddings, AltUp's and LAuReL's tensors.
ARCH_LAYER["gemma3n"] = {
    **_GEMMA,
    "inp_gate": "per_layer_input_gate",
    "proj": "per_layer_projection",
    "post_norm": "post_per_layer_input_norm",
    "altup_correct_coef": "altup.correction_coefs",
    "altup_correct_scale": "altup.correct_output_scale",  # .weight dropped: a bare parameter in HF
    "altup_predict_coef": "altup.prediction_coefs",
    "altup_router": "altup.modality_router",
    "altup_router_norm": "altup.router_norm",
    "laurel_l": "laurel.linear_left",
    "laurel_r": "laurel.linear_right",
    "laurel_post_norm": "laurel.post_laurel_norm",
    "attn_qkv": "self_attn.qkv_proj",  # --fuse-qkv files: split per layer by family_gemma4.gguf_tensors
}
# Global tensors whose meaning differs by architecture: LFM2's token_embd_norm is its final norm
# (embedding_norm, applied after the last layer), not an embedding LayerNorm.
ARCH_GLOBAL: dict[str, dict[str, str]] = {
    "rwkv7": {"token_embd_norm": "model.layers.0.pre_norm"},  # (layer 0's LayerNorm of the embedding)
    "lfm2": {"token_embd_norm": "model.norm"},
    "bloom": {"token_embd_norm": "model.embed_norm"},  # BLOOM's word_embeddings_layernorm
    "lfm2moe": {"token_embd_norm": "model.norm"},
    "gemma4": {
        "per_layer_token_embd": "model.embed_tokens_per_layer",
        "per_layer_model_proj": "model.per_layer_model_projection",
        "per_layer_proj_norm": "model.per_layer_projection_norm",
    },
    "gemma3n": {
        "per_layer_token_embd": "model.embed_tokens_per_layer",
        "per_layer_model_proj": "model.per_layer_model_projection",
        "per_layer_proj_norm": "model.per_layer_projection_norm",
        # the streams' projections stacked [n - 1, d, d]: read as [(n - 1) d, d], split by family_gemma3n
        "altup_proj": "model.altup_projections",
        "altup_unembd_proj": "model.altup_unembed_projections",
    },
}
# Architectures whose converter stored every RMSNorm weight w as 1 + w (Gemma's norms scale by 1 + w).
NORM_PLUS_ONE = {"gemma", "gemma2", "gemma3", "gemma-embedding", "nemotron"}  # (Nemotron's LayerNorm1P: 1 + w too)
# ... only the layers' norms (`*layernorm.weight`): Muse Glimmer's (its final norm is a plain one)
LAYER_NORMS_PLUS_ONE = {"muse-glimmer"}


# ---- gpt-oss: experts in ggml's MXFP4, gate and up apart ----------------------------------------------
def gptoss_expert_tensor(arch: str, name: str, t: GGUFTensor) -> bool:
    """Whether `name` is a gpt-oss expert tensor gptoss_experts converts: an MXFP4 projection or an
    expert bias (float and block-quantized projections take the per-expert path of every mixture)."""
    return arch == "gpt-oss" and ".mlp.experts." in name and (name.endswith(".bias") or t.tensor_type.name == "MXFP4")


def gptoss_experts(pending: dict[str, Any], name: str, t: GGUFTensor) -> list[tuple[str, Any]]:
    """One of llama.cpp's gpt-oss expert tensors in the OpenAI checkpoint's terms, which
    family_gptoss.checkpoint_tensors reads (given interleaved=False): MXFP4 projections as
    `<layer>.mlp.experts.{gate_up,down}_proj_{blocks,scales}`, biases as `..._bias` [E, out].
    llama.cpp's GptOssModel split HF's interleaved gate_up rows into ffn_gate_exps / ffn_up_exps;
    they are joined back gate rows first, so the first half waits in `pending` ([] until its pair)."""
    stem, proj, kind = name.rsplit(".", 2)  # "model.layers.N.mlp.experts", "gate_proj", "weight" | "bias"
    if kind == "bias":
        from lantern.app.models.quant.gguf_blocks import gguf_to_weight

        experts, width = t.shape[1], t.shape[0]
        parts = {"_bias": np.asarray(gguf_to_weight(t.tensor_type.name, t.data, experts, width), dtype=np.float32)}
    else:
        blocks, scales = mxfp4_to_openai(t.data)
        parts = {"_blocks": blocks, "_scales": scales}
    if proj == "down_proj":
        return [(f"{stem}.down_proj{suffix}", value) for suffix, value in parts.items()]
    key = f"{stem}.gate_up_proj.{kind}"
    other = pending.pop(key, None)
    if other is None:
        pending[key] = (proj, parts)
        return []
    if other[0] == proj:
        raise ValueError(f"{name}: two {proj} tensors and no {'up' if proj == 'gate_proj' else 'gate'} half")
    gate, up = (other[1], parts) if other[0] == "gate_proj" else (parts, other[1])
    return [(f"{stem}.gate_up_proj{s}", np.concatenate([gate[s], up[s]], axis=1)) for s in parts]


def mxfp4_to_openai(data: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ggml MXFP4 blocks (uint8 [..., G * 17]: per 32 values an e8m0 exponent byte, then 16 bytes
    holding value j in the low nibble of byte j and value j + 16 in its high nibble) in the OpenAI
    checkpoint's layout: blocks uint8 [..., G, 16] with values 2k and 2k + 1 in the low and high
    nibble of byte k (MLX's mxfp4 order too), scales uint8 [..., G]. Both mean e2m1 code times
    2 ** (exponent - 127) (ggml halves the exponent and doubles its code table), so the codes and
    exponents only move: exact. One expert at a time keeps the unpacked codes small."""
    *lead, width = data.shape
    raw = data.reshape(-1, *lead[1:], width // 17, 17)
    blocks = np.empty((*raw.shape[:-1], 16), dtype=np.uint8)
    for e in range(raw.shape[0]):
        qs = raw[e, ..., 1:]
        codes = np.concatenate([qs & np.uint8(0x0F), qs >> np.uint8(4)], axis=-1)  # values 0..31 in order
        blocks[e] = codes[..., 0::2] | (codes[..., 1::2] << np.uint8(4))
    scales = np.ascontiguousarray(raw[..., 0])
    return blocks.reshape(*lead, width // 17, 16), scales.reshape(*lead, width // 17)


def layer_of(hf: str) -> int:
    """The decoder layer an HF name belongs to; -1 for the embedding, final norm and head."""
    return int(hf.split(".", 3)[2]) if hf.startswith("model.layers.") else -1


def decoder_layers(index: GGUFIndex) -> int:
    """block_count without the multi-token-prediction layers some converters append after the
    decoder stack (`{arch}.nextn_predict_layers`): those are never run, so never loaded."""
    md, arch = index.metadata, index.architecture
    blocks = md.get(f"{arch}.block_count")
    if blocks is None:
        return 1 << 30
    return int(blocks) - int(md.get(f"{arch}.nextn_predict_layers") or 0)


def join_kv_b(halves: dict[str, Any], name: str, t: GGUFTensor) -> tuple[str, Any] | None:
    """DeepSeek's kv_b_proj [H * (nope + v), kv_lora_rank] from llama.cpp's split halves:
    attn_k_b [H, kv_lora_rank, nope] (each head's key rows transposed, for MLA's absorbed form) and
    attn_v_b [H, v, kv_lora_rank]. The transposed half cannot stay in blocks, so the joined matrix is
    dense: exactly the file's values, held in the model dtype like any float weight.

    Requantizing it would save nothing: both backends' MLA attention runs in the absorbed form on
    kv_b_proj's dense matrix, so a quantized kv_b_proj is made dense after loading anyway
    (CausalLM.finish_load in the model files)."""
    from lantern.app.models.quant.affine import AffineWeight
    from lantern.app.models.quant.gguf_blocks import gguf_to_weight

    cols, rows, heads = t.shape
    w = gguf_to_weight(t.tensor_type.name, t.data, heads * rows, cols)
    w = (w.dequantize() if isinstance(w, AffineWeight) else np.asarray(w, dtype=np.float32)).reshape(heads, rows, cols)
    key = name.replace(".k_b_proj.", ".kv_b_proj.").replace(".v_b_proj.", ".kv_b_proj.")
    if ".k_b_proj." in name:
        w = w.transpose(0, 2, 1)  # [H, nope, rank]: the HF key rows of each head
    other = halves.pop(key, None)
    if other is None:
        halves[key] = (name, w)
        return None
    first, second = (other[1], w) if ".k_b_proj." in other[0] else (w, other[1])
    if first.shape[0] != second.shape[0] or first.shape[2] != second.shape[2]:
        raise ValueError(f"{key}: attn_k_b {first.shape} and attn_v_b {second.shape} do not fit together")
    joined = np.concatenate([first, second], axis=1)
    if layer_of(key) == 0:
        logger.info("GGUF attn_k_b / attn_v_b joined into kv_b_proj per layer, dense (the key half is transposed)")
    return key, np.ascontiguousarray(joined.reshape(-1, joined.shape[2]))


def glm4v_rotary(metadata: dict[str, Any], arch: str) -> int:
    """Dims per head whose q/k rows llama.cpp's converter reordered for M-RoPE (GLM-4.1V / GLM-4.6V-Flash:
    conversion/glm.py's normal_to_neox, consecutive pairs moved to halves); 0 for every other file."""
    if arch != "glm4" or metadata.get("glm4.rope.dimension_sections") is None:
        return 0
    return int(metadata.get("glm4.rope.dimension_count") or 0)


def pairs_from_halves(a: Any, n_heads: int, rotary: int) -> Any:
    """Rows (or a bias) of n_heads heads whose first `rotary` dims hold the even then the odd ones, back in
    pair order (x0, x1, x2, ...) as the checkpoint's: the inverse of that reordering."""
    rows = np.asarray(a)
    heads = rows.reshape(n_heads, rows.shape[0] // n_heads, -1)
    out = heads.copy()
    half = rotary // 2
    out[:, 0:rotary:2] = heads[:, :half]
    out[:, 1:rotary:2] = heads[:, half:rotary]
    return out.reshape(rows.shape)

"""StepFun Step 3.5 Flash (step3p5, remote code: no transformers causal-LM class): tiny random folders in the released
layout (zero-centred norms, experts stacked under `moe`, a prediction layer past the stack), checked against a
reference nobody here wrote -- mlx_lm's own step3p5 model, teacher-forced through the paged cache on both backends:
the float folder (per-type heads and ropes, llama3 scaling on the full layers only, the per-head sigmoid gate, the
clamped SwiGLUs, the biased sigmoid router) and a 4-bit folder mlx_lm's code quantized (its layout, norms with the 1
added)."""

from __future__ import annotations

import pytest

from lantern.app.models.errors import UnsupportedModelError
from lantern.app.models.spec import ModelConfig

PROMPT = "Paged attention stores keys and values in blocks, so sequences share memory"
CONFIG = {  # Step-3.5-Flash's keys, its sizes scaled down (one prediction layer's entries after the stack)
    "model_type": "step3p5",
    "architectures": ["Step3p5ForCausalLM"],
    "hidden_size": 64,
    "num_hidden_layers": 4,
    "num_nextn_predict_layers": 1,
    "num_attention_heads": 4,
    "num_attention_groups": 2,
    "head_dim": 16,
    "intermediate_size": 96,
    "rms_norm_eps": 1e-5,
    "rope_theta": [5000000.0, 10000.0, 10000.0, 10000.0, 5000000.0],
    "rope_scaling": {
        "rope_type": "llama3",
        "factor": 2.0,
        "original_max_position_embeddings": 16384,  # (two of the full layers' 4 frequencies on its ramp)
        "low_freq_factor": 1.0,
        "high_freq_factor": 128.0,
    },
    "max_position_embeddings": 256,
    "sliding_window": 8,
    "layer_types": ["full_attention"] + ["sliding_attention"] * 3 + ["full_attention"],
    "yarn_only_types": ["full_attention"],
    "partial_rotary_factors": [0.5, 1.0, 1.0, 1.0, 0.5],
    "attention_other_setting": {"num_attention_heads": 8, "num_attention_groups": 2},
    "use_head_wise_attn_gate": True,
    "moe_num_experts": 8,
    "moe_top_k": 2,
    "moe_intermediate_size": 32,
    "share_expert_dim": 48,
    "moe_layers_enum": "1,2,3,4",
    "moe_router_scaling_factor": 3.0,
    "norm_expert_weight": True,
    "use_moe_router_bias": True,
    "swiglu_limits": [0.0, 0.0, 0.0, 0.5, 0.0],
    "swiglu_limits_shared": [0.4, 0.0, 0.0, 0.5, 0.0],
    "tie_word_embeddings": False,
}


def step3p5_folder(out, **extra):
    """A released-layout folder: norms centred on 0, each MoE layer's experts stacked under `moe`."""
    from tests.fixtures.remote_code_folders import save_folder, start_folder

    cfg, w = start_folder(out, {**CONFIG, **extra})
    d, hd, v, kv = cfg["hidden_size"], cfg["head_dim"], cfg["vocab_size"], cfg["num_attention_groups"]
    e, inner = cfg["moe_num_experts"], cfg["moe_intermediate_size"]

    tensors = {"model.embed_tokens.weight": w(v, d, scale=0.5), "model.norm.weight": w(d, scale=0.3)}
    tensors["lm_head.weight"] = w(v, d, scale=0.5)
    sparse = {int(i) for i in cfg["moe_layers_enum"].split(",")}
    for i in range(cfg["num_hidden_layers"] + cfg["num_nextn_predict_layers"]):
        p, sliding = f"model.layers.{i}", cfg["layer_types"][i] == "sliding_attention"
        heads = cfg["attention_other_setting"]["num_attention_heads"] if sliding else cfg["num_attention_heads"]
        tensors |= {f"{p}.self_attn.q_proj.weight": w(heads * hd, d), f"{p}.self_attn.o_proj.weight": w(d, heads * hd)}
        tensors |= {f"{p}.self_attn.{n}_proj.weight": w(kv * hd, d) for n in "kv"}
        tensors |= {f"{p}.self_attn.g_proj.weight": w(heads, d, scale=0.3)}
        tensors |= {f"{p}.self_attn.{n}_norm.weight": w(hd, scale=0.3) for n in "qk"}
        tensors |= {f"{p}.{n}.weight": w(d, scale=0.3) for n in ("input_layernorm", "post_attention_layernorm")}
        if i not in sparse:
            tensors |= w.mlp(f"{p}.mlp", cfg["intermediate_size"], d)
            continue
        tensors |= {f"{p}.moe.gate_proj.weight": w(e, inner, d), f"{p}.moe.up_proj.weight": w(e, inner, d)}
        tensors |= {f"{p}.moe.down_proj.weight": w(e, d, inner), f"{p}.moe.gate.weight": w(e, d, scale=0.5)}
        tensors |= {f"{p}.moe.router_bias": w(e, scale=0.3)} | w.mlp(f"{p}.share_expert", cfg["share_expert_dim"], d)
    return save_folder(out, tensors)


def _assert_matches_mlx_lm(folder, backend, tolerance: float = 1e-4, model=None) -> None:
    """Lantern on `model` (default: the folder) against mlx_lm on the folder."""
    from lantern.app.engine import LLM
    from tests.fixtures.teacher_forcing import mlx_lm_error

    path = model or folder
    llm = LLM(str(path), backend=backend, dtype="float32", block_size=4, prefill_chunk_size=8, num_kv_blocks=64)
    try:
        cfg = llm.engine.model_config
        assert cfg.layer_heads == (4, 8, 8, 8) and cfg.layer_windows == [None, 8, 8, 8]
        assert cfg.rope_scaling["rope_type"] == "llama3" and cfg.local_rope_dim == 16
        assert cfg.swiglu_limits.routed == (None, None, None, 0.5) and cfg.swiglu_limits.shared[0] == 0.4
        forced = [5, 17, 42, 99, 7, 250, 31, 64, 120, 200, 3, 77]  # (past the window of 8)
        worst, scale = mlx_lm_error(llm, folder, PROMPT, forced)
        assert worst < tolerance * scale, (worst, scale)
    finally:
        llm.engine.shutdown()


def test_released_folder_matches_mlx_lm(tmp_path, backend, by_file_tokenizer):
    _assert_matches_mlx_lm(step3p5_folder(tmp_path / "step"), backend)


@pytest.mark.parametrize("mtp", [False, True])
def test_llama_cpp_gguf_matches_mlx_lm_on_the_folder(tmp_path, backend, mtp, by_file_tokenizer):
    """llama.cpp's Step35Model file (F32, with or without the prediction layer's block, which is never run) holds the
    folder's values: Lantern on it computes what mlx_lm computes on the folder (the llama3 scaling recovered from
    rope_freqs, norms taken back)."""
    from tests.fixtures.gguf_step35 import convert_step35

    folder = step3p5_folder(tmp_path / "step")
    _assert_matches_mlx_lm(folder, backend, model=convert_step35(folder, tmp_path / "tiny-step35.gguf", mtp))


def test_an_mlx_lm_quantized_folder_matches_mlx_lm(tmp_path, backend, by_file_tokenizer):
    """mlx-community's form: mlx_lm's names and its norms with the 1 added (read back centred on 0)."""
    from tests.fixtures.teacher_forcing import assert_close_to_mlx_lm, quantized_by_mlx_lm

    folder = quantized_by_mlx_lm(step3p5_folder(tmp_path / "step"), tmp_path / "q4")
    assert_close_to_mlx_lm(folder, backend, "step3p5")


def test_the_clamps_change_the_logits(tmp_path, by_file_tokenizer):
    """Not vacuous: the tiny model's activations pass the clamps (without them mlx_lm computes other logits)."""
    from lantern.app.engine import LLM
    from tests.fixtures.teacher_forcing import mlx_lm_error

    clamped = step3p5_folder(tmp_path / "clamped")
    free = step3p5_folder(tmp_path / "free", swiglu_limits=None, swiglu_limits_shared=None)
    llm = LLM(str(free), backend="torch", dtype="float32", block_size=4, prefill_chunk_size=8, num_kv_blocks=64)
    try:
        worst, scale = mlx_lm_error(llm, clamped, PROMPT, [5, 17, 42])
        assert worst > 1e-2 * scale, (worst, scale)
    finally:
        llm.engine.shutdown()


def _config(**extra) -> dict:
    return {**CONFIG, "vocab_size": 300, **extra}


@pytest.mark.parametrize(
    "extra, key",
    [
        ({"moe_layers_enum": None}, "moe_layers_enum"),
        ({"rope_theta": [1e6, 1e4, 2e4, 1e4, 1e6]}, "rope_theta"),
        ({"yarn_only_types": None}, "yarn_only_types"),
        ({"attention_other_setting": {"num_attention_heads": 8, "num_attention_groups": 4}}, "num_attention_groups"),
        ({"attention_other_setting": {"num_attention_heads": 5}}, "num_attention_heads"),
        ({"attention_other_setting": {"num_attention_heads": 8, "head_dim": 32}}, "head_dim"),
        ({"query_pre_attn_scalar": 64}, "query_pre_attn_scalar"),
        ({"use_rope_layers": [True, False, True, True, True]}, "use_rope_layers"),
        ({"swiglu_limits": [-1.0, 0, 0, 0, 0]}, "swiglu_limits"),
        ({"rope_parameters": {"factor": 2.0, "original_max_position_embeddings": 64}}, "rope_parameters"),
        ({"hidden_act": "gelu"}, "hidden_act"),
    ],
)
def test_what_it_cannot_compute_is_refused_by_name(extra, key):
    with pytest.raises(UnsupportedModelError, match=key):
        ModelConfig.from_hf(_config(**extra))


def step3p7_folder(out):
    """transformers' own Step 3.7 Flash (a tiny vision tower beside the language model) as its save_pretrained writes
    it: Step3p7TextConfig's keys, StepFun's tensor layout; norms, gates and router bias made non-trivial."""
    import torch
    from transformers import Step3p7Config, Step3p7ForConditionalGeneration

    from tests.fixtures.tiny_models import build_tokenizer

    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(out)
    text = {
        "vocab_size": len(tokenizer),
        **{
            k: CONFIG[k]
            for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "head_dim", "sliding_window")
        },
        **{k: CONFIG[k] for k in ("moe_intermediate_size", "share_expert_dim", "moe_router_scaling_factor")},
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "num_sliding_attention_heads": 8,
        "layer_types": CONFIG["layer_types"][:4],
        "n_routed_experts": 8,
        "num_experts_per_tok": 2,
        "mlp_layer_types": ["dense", "sparse", "sparse", "sparse"],
        "swiglu_limits": CONFIG["swiglu_limits"][:4],
        "swiglu_limits_shared": CONFIG["swiglu_limits_shared"][:4],
        "rope_theta": CONFIG["rope_theta"][:4],
        "partial_rotary_factors": CONFIG["partial_rotary_factors"][:4],
        "rope_scaling": CONFIG["rope_scaling"],
        "max_position_embeddings": 256,
        "initializer_range": 0.2,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
    }
    vision = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2}
    torch.manual_seed(0)
    model = Step3p7ForConditionalGeneration(Step3p7Config(text_config=text, vision_config=vision | {"image_size": 56}))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or ".g_proj." in name:
                p.copy_(torch.randn_like(p) * 0.3)
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(torch.randn_like(b) * 0.3)
    model.save_pretrained(out)
    return out


def test_step3p7_language_model_matches_transformers(tmp_path, backend):
    """Step 3.7 Flash's folder (transformers' keys and save_pretrained layout, a vision tower skipped): Lantern's
    logits equal transformers' Step3p7ForConditionalGeneration on text."""
    import torch
    from transformers import Step3p7ForConditionalGeneration

    from lantern.app.engine import LLM
    from tests.fixtures.teacher_forcing import assert_matches_reference

    folder = step3p7_folder(tmp_path / "step37")
    ref = Step3p7ForConditionalGeneration.from_pretrained(folder, dtype=torch.float32).eval()
    llm = LLM(str(folder), backend=backend, dtype="float32", block_size=4, prefill_chunk_size=8, num_kv_blocks=64)
    try:
        cfg = llm.engine.model_config
        assert cfg.multimodal_wrapper == "step3p7" and cfg.layer_heads == (4, 8, 8, 8)
        assert cfg.moe.routed_scaling_factor == 3.0 and cfg.swiglu_limits.routed[3] == 0.5
        assert_matches_reference(llm, ref, PROMPT, steps=12)
    finally:
        llm.engine.shutdown()

"""GGUF files of the families llama.cpp's converter transforms (Gemma 2/3, Phi-3, GLM-4, DeepSeek
V2/V3 MLA, the Qwen mixtures of experts, Qwen3's head_dim) load on both backends and compute what
transformers computes on the file's values.

Each file is written by tests/fixtures/gguf_families.py from a tiny transformers checkpoint the
way convert_hf_to_gguf.py writes it (metadata keys, tensor names from the `gguf` package's map,
Gemma's 1 + w norms, DeepSeek's attn_k_b / attn_v_b split); the reference is that checkpoint with
the values the file holds. The config read from the metadata alone must be the checkpoint's (every
ModelConfig field); logits match transformers' to 1e-4 through the paged cache, 64 greedy tokens equal.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import logging
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file

from lantern.app.engine import LLM, SamplingParams
from lantern.app.models.gguf_names import iter_gguf_weights
from lantern.app.models.loader import resolve_model
from lantern.app.models.quant.affine import quantize_affine
from lantern.app.models.spec import ARCHITECTURES, ModelConfig
from lantern.app.models.weight_stream import FUSED_CHECKPOINTS, split_fused
from tests.conformance.test_parity import PROMPT, hf_greedy, hf_model
from tests.fixtures.gguf_families import convert_to_gguf
from tests.fixtures.teacher_forcing import teacher_forced_logits
from tests.fixtures.tiny_models import CHATML, build_model
from tests.models.quant_logits import logits_error, reference_folder, tolerance, torch_cpu_vnni

EXAONE_35_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 1e6,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}
# kind -> (tiny variant, config overrides, --outtype, converter options)
FILES = {
    # query_pre_attn_scalar = head_dim: GGUF has no key for it (llama.cpp derives it); tied: the
    # converter drops Gemma 2's head
    "gemma": ("gemma1", {}, "f16", {}),  # Gemma (1): norms as 1 + w, the head dropped (tied), no rope base key
    "gemma2": ("gemma2", {"tie_word_embeddings": True, "query_pre_attn_scalar": 16}, "f32", {}),
    # llama.cpp's Gemma 3 layout: five sliding layers, then a full one (no key states it)
    "gemma3": ("gemma3", {"num_hidden_layers": 6, "layer_types": None}, "f16", {}),
    "phi3": ("phi3", {"sliding_window": 8, "partial_rotary_factor": 0.5}, "f16", {}),
    "glm4": ("glm4", {}, "f32", {}),
    # glm-4-9b-chat-hf (GlmForCausalLM) as llama.cpp's chatglm: gate and up in ffn_up, the context from seq_length
    "glm": ("glm", {"seq_length": 256}, "f16", {}),
    "deepseek_v2": ("deepseek_v2", {}, "f32", {}),
    "deepseek_v2_kv_b": ("deepseek_v2", {}, "f16", {"legacy_mla": True}),  # attn_kv_b whole: older files
    "deepseek_v3": ("deepseek_v3", {}, "f16", {"mtp_layers": 1}),  # a prediction layer after the stack
    "glm4_moe": ("glm4_moe", {}, "f16", {"mtp_layers": 1}),  # GLM-4.5's prediction layer after the stack
    # the indexer's tensors and keys (64 wide: llama.cpp's graph, which rotates index keys by a Hadamard matrix,
    # takes no narrower, and scripts/check_gguf_vs_llamacpp.py runs these files; 16 heads: with 8, index scores
    # tie at exactly 0 across the top-k boundary, which llama.cpp and torch break differently)
    "deepseek_v32": ("deepseek_v32", {"index_head_dim": 64, "index_n_heads": 16}, "f16", {}),
    "glm_moe_dsa": ("glm_moe_dsa", {"index_head_dim": 64}, "f32", {}),  # GLM-5: attention.indexer.types (shared)
    "olmo2": ("olmo2", {}, "f16", {}),
    "olmo3": ("olmo3", {}, "f32", {}),  # sliding layers on their own base, YaRN full layers
    "olmoe": ("olmoe", {"num_key_value_heads": 4}, "f16", {}),  # llama.cpp's olmoe: k_norm as wide as q_norm
    # dots.llm1: llama.cpp's graph routes without groups and attends to all: a checkpoint with one group, no window
    "dots1": ("dots1", {"n_group": 1, "topk_group": 1}, "f16", {}),
    "ernie4_5": ("ernie4_5", {}, "f16", {}),
    "ernie4_5_moe": ("ernie4_5_moe", {}, "f32", {}),
    # no expert_shared_count (a config.json without moe_num_shared_experts): the shared width from its tensors
    "ernie4_5_moe_unstated": ("ernie4_5_moe", {}, "f16", {"omit": ("expert_shared_count",)}),
    "exaone4": ("exaone4", {}, "f16", {}),  # sliding layers, NoPE global ones
    # llama.cpp's fixed 3:1 layers; tied (its cohere2 graph has no output tensor, Cohere's models tie)
    "cohere2": ("cohere2", {"num_hidden_layers": 4, "layer_types": None, "tie_word_embeddings": True}, "f32", {}),
    "cohere": ("cohere_qk", {"tie_word_embeddings": True}, "f16", {}),  # Command R+: per-head q/k norms [heads, dim]
    # StarCoder2: LayerNorm and MLP biases (c_fc / c_proj as ffn_up / ffn_down); no window (llama.cpp has none)
    "starcoder2": ("starcoder2", {"sliding_window": None}, "f16", {}),
    # Phi-2: a partial rope from rope.dimension_count, its head's bias, an MLP width only its tensors state
    "phi": ("phi", {"num_key_value_heads": 4, "partial_rotary_factor": 0.5}, "f16", {}),  # (the file states dims)
    # Phi-2 as its older checkpoints convert (and any --fuse-qkv file): q, k, v and their biases in attn_qkv
    "phi_fused": ("phi", {"num_key_value_heads": 4, "partial_rotary_factor": 0.5}, "f16", {"fuse_qkv": True}),
    "stablelm_fused": ("stablelm", {}, "f16", {"fuse_qkv": True}),
    "stablelm": ("stablelm", {}, "f32", {}),  # q/k/v biases, a quarter of each head rotating
    "nemotron": ("nemotron", {}, "f16", {}),  # LayerNorm1P stored as 1 + w, half of each head rotating
    # EXAONE 3.5: Llama's tensors unpermuted, its llama3 rope (its own numbers) as rope_freqs
    "exaone": ("exaone", {"rope_parameters": EXAONE_35_ROPE, "head_dim": 128}, "f16", {}),
    "qwen2_moe": ("qwen2_moe", {}, "f16", {}),
    "qwen3_moe": ("qwen3_moe", {"mlp_only_layers": []}, "f32", {}),  # llama.cpp's qwen3moe: every layer sparse
    "qwen3": ("qwen3", {}, "f16", {}),  # head_dim 32 != hidden / heads: transformers' reader drops it
    "seed_oss": ("seed_oss", {}, "f16", {}),  # q/k/v biases, head_dim 32
    "hunyuan_dense": ("hunyuan_dense", {}, "f16", {}),  # q/k norms after the rope, the NTK-alpha base stretched
    "hunyuan_moe": ("hunyuan_moe", {}, "f16", {}),  # the router as ffn_gate_inp, the shared MLP as ffn_*_shexp
    # Arcee Trinity: llama.cpp's fixed rope layers (every 4th NoPE, full), muP always; route_norm as released
    "afmoe": ("afmoe", {"global_attn_every_n_layers": 4, "layer_types": None, "route_norm": True}, "f16", {}),
}


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory):
    cache: dict[tuple[str, str], tuple[Path, Path]] = {}

    def get(kind: str, outtype: str | None = None) -> tuple[Path, Path]:
        variant, overrides, default_type, options = FILES[kind]
        outtype = outtype or default_type
        if (kind, outtype) not in cache:
            root = tmp_path_factory.mktemp(f"{kind}-{outtype}")
            src = build_model(variant, root / "hf", **overrides)
            cache[(kind, outtype)] = convert_to_gguf(src, root, outtype, **options)
        return cache[(kind, outtype)]

    return get


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LANTERN_CACHE", str(tmp_path / "cache"))


@pytest.mark.parametrize("kind", list(FILES))
def test_config_from_metadata_is_the_checkpoints(gguf_file, kind):
    path, ref = gguf_file(kind)
    loaded = resolve_model(str(path))
    expected = ModelConfig.from_hf(json.loads((ref / "config.json").read_text()))
    if expected.mla is not None:  # llama.cpp norms the latents with the model's eps (transformers with 1e-6)
        expected = dataclasses.replace(expected, mla=dataclasses.replace(expected.mla, norm_eps=expected.rms_norm_eps))
    assert loaded.spec.config == expected
    assert loaded.chat_template == CHATML
    assert loaded.tokenizer.eos_token_id in loaded.eos_token_ids
    # The weight stream gives back exactly the checkpoint's tensors, values included (norms less
    # the converter's 1, DeepSeek's halves joined, no prediction layer past the stack).
    reference = load_file(str(ref / "model.safetensors"))
    streamed = dict(iter_gguf_weights(str(path), expected.num_heads, expected.num_kv_heads))
    if expected.architecture not in FUSED_CHECKPOINTS:  # (a --fuse-qkv file's attn_qkv as the checkpoint's q, k, v)
        streamed = dict(split_fused(iter(streamed.items()), loaded.spec))
    traits = ARCHITECTURES[expected.architecture]
    if traits.get("names"):  # both in the model files' terms (StarCoder2's c_fc is the stream's up_proj)
        rename = importlib.import_module(f"lantern.app.models.{traits['configure']}").checkpoint_name
        reference = {rename(n): v for n, v in reference.items()}
        streamed = {rename(n): v for n, v in streamed.items()}
    assert sorted(streamed) == sorted(reference)
    for name, value in streamed.items():
        value = np.asarray(value, dtype=np.float32)
        if value.shape != reference[name].shape:  # the converter squeezes unit axes (ERNIE's [1, E] router bias)
            assert [d for d in reference[name].shape if d != 1] == list(value.shape), name
            value = value.reshape(reference[name].shape)
        np.testing.assert_array_equal(value, reference[name], err_msg=name)


@pytest.mark.parametrize("kind", list(FILES))
def test_logits_and_greedy_match_transformers(gguf_file, kind, backend):
    path, ref = gguf_file(kind)
    llm = LLM(str(path), backend=backend, dtype="float32", block_size=4, prefill_chunk_size=8, num_kv_blocks=64)
    try:
        prompt_ids = llm.tokenizer.encode(PROMPT)
        model = hf_model(str(ref))
        greedy = hf_greedy(model, prompt_ids, 64)
        forced = greedy[:32]
        with torch.no_grad():
            expected = model(torch.tensor([prompt_ids + forced])).logits[0].numpy()
        rows = list(teacher_forced_logits(llm.engine, prompt_ids, forced))
        assert len(rows) == len(forced)
        for pos, logits in rows:
            np.testing.assert_allclose(logits, expected[pos], atol=1e-4, rtol=0, err_msg=f"{kind} position {pos}")
        out = llm.generate([prompt_ids], SamplingParams(temperature=0, max_tokens=64, ignore_eos=True))
        assert out[0].outputs[0].token_ids == greedy
    finally:
        llm.engine.shutdown()


def test_q8_0_deepseek_matches_what_the_backend_holds(tmp_path_factory, backend, caplog, tmp_path):
    """A Q8_0 DeepSeek V3 file (ranks of 32 so attn_k_b / attn_v_b are whole blocks too): the split
    kv_b_proj halves come back as the float32 join of their blocks; the other Q8_0 tensors stay
    quantized. MLX and torch's VNNI layers hold Q8_0 exactly; aten's int8pack (torch without VNNI)
    requantizes it to int8 per channel (logged), so its reference holds that (as in test_quantized_gguf)."""
    root = tmp_path_factory.mktemp("deepseek-q8")
    src = build_model("deepseek_v3", root / "hf", kv_lora_rank=32, qk_nope_head_dim=32, q_lora_rank=32)
    path, ref = convert_to_gguf(src, root, "q8_0")
    types = json.loads((ref / "gguf_types.json").read_text())
    assert types["model.layers.1.self_attn.kv_b_proj.weight"] == "Q8_0"
    assert types["model.layers.1.mlp.experts.3.down_proj.weight"] == "Q8_0"

    exact_q8 = backend == "torch" and torch_cpu_vnni()

    def held(name: str, w: np.ndarray) -> np.ndarray:
        if backend == "mlx" or exact_q8 or types.get(name) != "Q8_0" or ".kv_b_proj." in name:
            return w
        return quantize_affine(w.astype(np.float32), 8, w.shape[1], symmetric=True).dequantize()

    reference = reference_folder(ref, tmp_path / "held", held)
    with caplog.at_level(logging.INFO):
        err = logits_error(str(path), str(reference), backend)
    assert err <= tolerance(backend, str(reference)), f"{backend}: {err:.4f}"
    assert "joined into kv_b_proj" in caplog.text
    # the file's values are what was loaded: the float checkpoint is several times further away
    assert logits_error(str(src), str(reference), backend) > 4 * err


# ---- metadata of real models (hyper-parameters copied from their config.json, no weights) ------------
def _metadata(tmp_path: Path, arch: str, write, tensors: dict[str, np.ndarray] | None = None, vocab: int = 0) -> dict:
    """The hf config read from a file whose metadata `write(writer)` adds with the converter's calls;
    `tensors`: small real tensors (Phi-3's rope factors); the head and (with `vocab` rows) the
    embedding only by shape."""
    from types import SimpleNamespace

    import gguf

    from lantern.app.models.gguf_config import hf_config_from_gguf
    from lantern.app.models.gguf_names import read_gguf_index

    writer = gguf.GGUFWriter(tmp_path / f"{arch}.gguf", arch)
    write(writer)
    for name, value in (tensors or {}).items():
        writer.add_tensor(name, value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    index = read_gguf_index(str(tmp_path / f"{arch}.gguf"))
    found = {t.name: t for t in index.tensors}
    found["output.weight"] = SimpleNamespace(shape=(1, 1))  # untied
    if vocab:
        found["token_embd.weight"] = SimpleNamespace(shape=(1, vocab))
    return hf_config_from_gguf(index.metadata, found, f"{arch}.gguf")


def _base(w, layers: int, ctx: int, hidden: int, ffn: int, heads: int, kv: int, eps: float, theta: float) -> None:
    w.add_block_count(layers)
    w.add_context_length(ctx)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_layer_norm_rms_eps(eps)
    w.add_rope_freq_base(theta)


def _deepseek(w, legacy: bool) -> None:
    import gguf

    if legacy:  # DeepSeek-V2-Lite as converters before the k_b / v_b split wrote it (no router keys)
        _base(w, 27, 163840, 2048, 10944, 16, 16, 1e-6, 10000.0)
        w.add_key_length(192)
        w.add_value_length(128)
        w.add_vocab_size(102400)
        w.add_leading_dense_block_count(1)
        w.add_expert_count(64)
        w.add_expert_used_count(6)
        w.add_expert_shared_count(2)
        w.add_expert_feed_forward_length(1408)
        w.add_expert_weights_scale(1.0)
        yarn_log_mul = 0.1 * 0.707
    else:  # DeepSeek-V3
        _base(w, 61, 163840, 7168, 18432, 128, 1, 1e-6, 10000.0)
        w.add_vocab_size(129280)
        w.add_leading_dense_block_count(3)
        w.add_q_lora_rank(1536)
        w.add_key_length(576)
        w.add_value_length(512)
        w.add_key_length_mla(192)
        w.add_value_length_mla(128)
        w.add_expert_count(256)
        w.add_expert_used_count(8)
        w.add_expert_group_count(8)
        w.add_expert_group_used_count(4)
        w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
        w.add_expert_shared_count(1)
        w.add_expert_feed_forward_length(2048)
        w.add_expert_weights_scale(2.5)
        w.add_expert_weights_norm(True)
        yarn_log_mul = 0.1 * 1.0
    w.add_kv_lora_rank(512)
    w.add_rope_dimension_count(64)
    w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    w.add_rope_scaling_factor(40.0)
    w.add_rope_scaling_orig_ctx_len(4096)
    w.add_rope_scaling_yarn_beta_fast(32.0)
    w.add_rope_scaling_yarn_beta_slow(1.0)
    w.add_rope_scaling_yarn_log_mul(yarn_log_mul)


def test_deepseek_v3_metadata_reads_as_its_config_json(tmp_path):
    cfg = _metadata(tmp_path, "deepseek2", lambda w: _deepseek(w, legacy=False))
    expected = {
        "model_type": "deepseek_v3", "first_k_dense_replace": 3, "hidden_size": 7168, "intermediate_size": 18432,
        "kv_lora_rank": 512, "max_position_embeddings": 163840, "moe_intermediate_size": 2048, "n_group": 8,
        "n_routed_experts": 256, "n_shared_experts": 1, "norm_topk_prob": True, "num_attention_heads": 128,
        "num_experts_per_tok": 8, "num_hidden_layers": 61, "num_key_value_heads": 128, "q_lora_rank": 1536,
        "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "rms_norm_eps": 1e-06, "rope_theta": 10000.0,
        "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 40.0, "mscale": 1.0, "mscale_all_dim": 1.0,
                         "original_max_position_embeddings": 4096, "type": "yarn"},
        "routed_scaling_factor": 2.5, "scoring_func": "sigmoid", "topk_group": 4, "topk_method": "noaux_tc",
        "v_head_dim": 128, "vocab_size": 129280, "tie_word_embeddings": False,
    }  # fmt: skip
    assert {k: cfg[k] for k in expected} == expected
    assert ModelConfig.from_hf(cfg) == ModelConfig.from_hf(expected)  # YaRN mscale, softmax scale included


def test_deepseek_v2_lite_legacy_metadata_reads_as_its_config_json(tmp_path):
    cfg = _metadata(tmp_path, "deepseek2", lambda w: _deepseek(w, legacy=True))
    expected = {
        "model_type": "deepseek_v2", "first_k_dense_replace": 1, "hidden_size": 2048, "kv_lora_rank": 512,
        "moe_intermediate_size": 1408, "n_routed_experts": 64, "n_shared_experts": 2, "norm_topk_prob": False,
        "num_attention_heads": 16, "num_experts_per_tok": 6, "num_hidden_layers": 27, "num_key_value_heads": 16,
        "q_lora_rank": None, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "routed_scaling_factor": 1.0,
        "scoring_func": "softmax", "topk_method": "greedy", "v_head_dim": 128, "vocab_size": 102400,
        "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 40.0, "mscale": 0.707, "mscale_all_dim": 0.707,
                         "original_max_position_embeddings": 4096, "type": "yarn"},
        "intermediate_size": 10944, "max_position_embeddings": 163840, "rms_norm_eps": 1e-06, "rope_theta": 10000.0,
        "n_group": 1, "topk_group": 1, "tie_word_embeddings": False,
    }  # fmt: skip
    assert {k: cfg[k] for k in expected} == expected
    assert ModelConfig.from_hf(cfg) == ModelConfig.from_hf(expected)


def test_phi_longrope_factors_and_partial_rotary(tmp_path):
    """Phi-3.5-mini: LongRoPE factors are tensors, the attention factor the converter's default
    (left out); Phi-4-mini: 3/4 of each head rotates, sliding_window 0 means none."""
    import math

    long, short = np.linspace(1.0, 40.0, 48, dtype=np.float32), np.linspace(1.0, 1.5, 48, dtype=np.float32)

    def phi35(w, attn_factor: float) -> None:
        _base(w, 32, 131072, 3072, 8192, 32, 32, 1e-5, 10000.0)
        w.add_rope_scaling_orig_ctx_len(4096)
        w.add_rope_dimension_count(96)
        w.add_sliding_window(262144)
        w.add_rope_scaling_attn_factors(attn_factor)

    factors = {"rope_factors_long.weight": long, "rope_factors_short.weight": short}
    default = math.sqrt(1 + math.log(131072 / 4096) / math.log(4096))
    cfg = _metadata(tmp_path, "phi3", lambda w: phi35(w, default), factors, vocab=32064)
    assert (cfg["max_position_embeddings"], cfg["original_max_position_embeddings"]) == (131072, 4096)
    assert cfg["sliding_window"] == 262144 and "partial_rotary_factor" not in cfg
    assert cfg["rope_scaling"] == {"type": "longrope", "long_factor": long.tolist(), "short_factor": short.tolist()}
    phi35_json = {
        "model_type": "phi3", "hidden_size": 3072, "intermediate_size": 8192, "num_attention_heads": 32,
        "num_key_value_heads": 32, "num_hidden_layers": 32, "max_position_embeddings": 131072,
        "original_max_position_embeddings": 4096, "rms_norm_eps": 1e-05, "rope_theta": 10000.0,
        "rope_scaling": {"type": "longrope", "long_factor": long.tolist(), "short_factor": short.tolist()},
        "sliding_window": 262144, "vocab_size": 32064, "tie_word_embeddings": False,
    }  # fmt: skip
    assert ModelConfig.from_hf(cfg) == ModelConfig.from_hf(phi35_json)
    cfg = _metadata(tmp_path, "phi3", lambda w: phi35(w, 1.25), factors, vocab=32064)
    assert cfg["rope_scaling"]["attention_factor"] == 1.25

    def phi4_mini(w) -> None:
        _base(w, 32, 131072, 3072, 8192, 24, 8, 1e-5, 10000.0)
        w.add_rope_scaling_orig_ctx_len(4096)
        w.add_rope_dimension_count(96)
        w.add_sliding_window(0)

    cfg = _metadata(tmp_path, "phi3", phi4_mini, vocab=200064)
    assert (cfg["head_dim"], cfg["partial_rotary_factor"], cfg["sliding_window"]) == (128, 0.75, None)


@pytest.mark.parametrize(
    "arch,layers,hidden,heads,head_dim,scalar",
    [("gemma2", 42, 3584, 16, 256, 256), ("gemma2", 46, 4608, 32, 128, 144), ("gemma3", 62, 5376, 32, 128, 168)],
)
def test_gemma_query_scale_and_layer_pattern_as_llama_cpp(tmp_path, arch, layers, hidden, heads, head_dim, scalar):
    """No key holds query_pre_attn_scalar: llama.cpp takes head_dim, hidden / heads for the 27B
    models (Gemma 2 27B: 144, Gemma 3 27B: 168, as their config.json say). Sliding layers: Gemma 2
    every other one, Gemma 3 five of each six; Gemma 3's full layers take the linear scaling."""
    import gguf

    def write(w) -> None:
        _base(w, layers, 131072, hidden, 4 * hidden, heads, heads // 2, 1e-6, 1e6 if arch == "gemma3" else 1e4)
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
        w.add_sliding_window(1024 if arch == "gemma3" else 4096)
        if arch == "gemma3":
            w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
            w.add_rope_scaling_factor(8.0)
        else:
            w.add_attn_logit_softcapping(50.0)
            w.add_final_logit_softcapping(30.0)

    cfg = _metadata(tmp_path, arch, write, vocab=262144)
    assert (cfg["query_pre_attn_scalar"], cfg["head_dim"]) == (scalar, head_dim)
    period = 2 if arch == "gemma2" else 6
    assert cfg["layer_types"] == [
        "full_attention" if (i + 1) % period == 0 else "sliding_attention" for i in range(layers)
    ]
    if arch == "gemma3":
        assert cfg["rope_parameters"] == {
            "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        }
        config = ModelConfig.from_hf(cfg)
        assert (config.rope_theta, config.local_rope_theta, config.rope_scaling["factor"]) == (1e6, 1e4, 8.0)
    else:
        assert (cfg["attn_logit_softcapping"], cfg["final_logit_softcapping"]) == (50.0, 30.0)


def test_sliding_window_pattern_key_is_honoured(tmp_path):
    def write(pattern):
        def go(w) -> None:
            _base(w, 4, 8192, 64, 128, 4, 2, 1e-6, 1e6)
            w.add_key_length(16)
            w.add_sliding_window(512)
            w.add_sliding_window_pattern(pattern)

        return go

    assert (
        _metadata(tmp_path, "gemma3", write(2), vocab=400)["layer_types"] == ["sliding_attention", "full_attention"] * 2
    )
    flags = [True, False, False, True]
    cfg = _metadata(tmp_path, "gemma3", write(flags), vocab=400)
    assert cfg["layer_types"] == ["sliding_attention" if f else "full_attention" for f in flags]


def test_glm4v_mrope_file_reads_as_glm4(tmp_path):
    """A GLM-4.1V file (M-RoPE sections beside GLM-4's keys) is GLM-4's language model, its rope on the
    dimension_count of each head (its q/k rows reordered by the converter: tests/models/test_glm4v.py)."""

    def write(w) -> None:
        _base(w, 40, 65536, 4096, 13696, 32, 2, 1e-5, 10000.0)
        w.add_vocab_size(151552)
        w.add_rope_dimension_count(64)
        w.add_rope_dimension_sections([8, 12, 12, 0])

    cfg = _metadata(tmp_path, "glm4", write)
    assert cfg["model_type"] == "glm4" and cfg["partial_rotary_factor"] == 0.5 and cfg["head_dim"] == 128


def test_unimplemented_key_is_refused_naming_the_file(gguf_file, tmp_path):
    """A key Lantern does not compute, read from the metadata, is refused in one line naming the
    file and the config.json key it reads as (DeepSeek V2 with renormalised top-k weights)."""
    import gguf

    from lantern.app.models.spec import UnsupportedModelError

    path, _ = gguf_file("deepseek_v2")
    reader = gguf.GGUFReader(str(path))
    writer = gguf.GGUFWriter(tmp_path / "renormalised.gguf", "deepseek2")
    for field in reader.fields.values():
        if field.name.startswith("general.") or field.name.startswith("GGUF."):
            continue
        value = field.contents()
        kind = field.types[0]
        if kind == gguf.GGUFValueType.ARRAY:
            writer.add_key_value(field.name, value, kind, sub_type=field.types[-1])
        else:
            writer.add_key_value(field.name, value, kind)
    writer.add_expert_weights_norm(True)
    for t in reader.tensors:
        writer.add_tensor(
            t.name, np.asarray(t.data), raw_shape=list(reversed(t.shape.tolist())), raw_dtype=t.tensor_type
        )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(
        UnsupportedModelError, match=r"renormalised\.gguf \(GGUF metadata read as config\.json\).*norm_topk_prob"
    ):
        resolve_model(str(tmp_path / "renormalised.gguf"))


def test_glm4v_file_with_fused_qkv_is_refused_naming_it(tmp_path):
    """--fuse-qkv reorders GLM-4V's q/k blocks inside attn_qkv: refused rather than read in the wrong order."""
    from lantern.app.models.spec import UnsupportedModelError

    def write(w) -> None:
        _base(w, 2, 4096, 64, 96, 4, 2, 1e-5, 10000.0)
        w.add_vocab_size(300)
        w.add_rope_dimension_count(8)
        w.add_rope_dimension_sections([2, 1, 1, 0])

    qkv = {"blk.0.attn_qkv.weight": np.zeros((128, 64), np.float32)}
    with pytest.raises(UnsupportedModelError, match="fused attn_qkv"):
        _metadata(tmp_path, "glm4", write, tensors=qkv)

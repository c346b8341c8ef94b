"""MiniCPM 1 / 2 / 4 folders (`minicpm`) and InternLM2 / 2.5 folders (`internlm2`): remote code only, no transformers
class. The references are transformers' classes for the maths that remote code computes (openbmb's
modeling_minicpm.py, InternLM's modeling_internlm2.py): GraniteForCausalLM with MiniCPM's muP scalars as Granite's
four, LlamaForCausalLM on the weights InternLM2's fused wqkv packs. Each tiny folder is written in the remote code's
layout (config.json as its config class writes it, its tensor names and fused rows) from the transformers model,
served on both backends, and compared with that model on its own folder."""

from __future__ import annotations

import json
import math
import re
import shutil
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file, save_file

from lantern.app.models.family_internlm2 import checkpoint_tensors
from lantern.app.models.spec import ModelConfig, UnsupportedModelError, check_servable
from tests.fixtures.teacher_forcing import assert_file_matches_folder
from tests.fixtures.tiny_models import build_model

# MiniCPM's three scalars, each far from 1 (2 layers of width 64, 4 heads of 16)
SCALE_EMB, SCALE_DEPTH, DIM_MODEL_BASE = 6.0, 0.6, 16
# ... as GraniteConfig's four: the query scale is head_dim ** -0.5 in MiniCPM's attention
GRANITE = {
    "embedding_multiplier": SCALE_EMB,
    "residual_multiplier": SCALE_DEPTH / math.sqrt(2),
    "logits_scaling": 64 / DIM_MODEL_BASE,
    "attention_multiplier": 16**-0.5,
}
_SHAPE = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
_SHAPE += ("num_key_value_heads", "max_position_embeddings", "rms_norm_eps", "bos_token_id", "eos_token_id")
_SHAPE += ("tie_word_embeddings", "hidden_act")


def _theta(cfg: dict) -> float:
    return (cfg.get("rope_parameters") or {}).get("rope_theta") or cfg.get("rope_theta") or 10000.0


def _copy_tokenizer(src, out) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.suffix != ".safetensors" and f.name != "config.json":
            shutil.copy(f, out / f.name)


def minicpm_folder(src, out, **extra):
    """A Granite folder as openbmb's MiniCPM folders state the same model: model_type minicpm with scale_emb /
    scale_depth / dim_model_base (and `extra`), Llama's tensor names (the Granite checkpoint's own)."""
    _copy_tokenizer(src, out)
    cfg = json.loads((src / "config.json").read_text())
    minicpm = {
        **{k: cfg[k] for k in _SHAPE},
        "model_type": "minicpm",
        "architectures": ["MiniCPMForCausalLM"],
        "auto_map": {"AutoModelForCausalLM": "modeling_minicpm.MiniCPMForCausalLM"},
        "rope_theta": _theta(cfg),
        "scale_emb": SCALE_EMB,
        "scale_depth": SCALE_DEPTH,
        "dim_model_base": DIM_MODEL_BASE,
        "torch_dtype": "float32",
        **extra,
    }
    (out / "config.json").write_text(json.dumps(minicpm))
    tensors = load_file(str(src / "model.safetensors"))
    assert "model.layers.0.self_attn.q_proj.weight" in tensors and "lm_head.weight" in tensors
    save_file(tensors, str(out / "model.safetensors"))
    return out


def _factors(seed: int) -> list[float]:
    g = torch.Generator().manual_seed(seed)
    return (1.0 + 3.0 * torch.rand(8, generator=g)).tolist()  # (one per rotated pair of a 16-wide head)


def _longrope(original: int) -> dict:
    return {"short_factor": _factors(1), "long_factor": _factors(2), "original_max_position_embeddings": original}


@pytest.fixture(scope="module")
def minicpm(tmp_path_factory):
    """(Granite folder, MiniCPM folder) pairs: plain rope; LongRoPE at its original length (the short factors) with
    InfLLM v2's sparse_config; LongRoPE past its original length (the long factors at every position)."""
    root = tmp_path_factory.mktemp("minicpm")
    pairs = {}
    src = build_model("granite", root / "granite", **GRANITE)
    pairs["plain"] = (src, minicpm_folder(src, root / "plain"))
    sparse = {"kernel_size": 32, "kernel_stride": 16, "init_blocks": 1, "block_size": 64, "window_size": 2048}
    sparse |= {"topk": 64, "use_nope": False, "dense_len": 128}
    for kind, original in (("short", 256), ("long", 8)):
        rope = {"rope_type": "longrope", "rope_theta": 10000.0, **_longrope(original)}
        src = build_model("granite", root / f"granite-{kind}", rope_parameters=rope, **GRANITE)
        stated = {"rope_scaling": {"rope_type": "longrope", **_longrope(original)}}
        if kind == "short":
            stated["sparse_config"] = sparse
        pairs[kind] = (src, minicpm_folder(src, root / kind, **stated))
    return pairs


@pytest.mark.parametrize("kind", ["plain", "short", "long"])
def test_minicpm_folder_answers_as_granite(minicpm, kind, backend):
    src, folder = minicpm[kind]
    assert_file_matches_folder(folder, src, backend, f"minicpm {kind}")


def test_minicpm_config_is_granites(minicpm):
    src, folder = minicpm["plain"]
    ours = ModelConfig.from_hf(json.loads((folder / "config.json").read_text()))
    theirs = ModelConfig.from_hf(json.loads((src / "config.json").read_text()))
    assert ours.architecture == "minicpm" and ours.embed_multiplier == SCALE_EMB
    assert ours.residual_multiplier == pytest.approx(theirs.residual_multiplier)
    assert (ours.logits_divisor, ours.attn_scale, ours.head_dim) == (theirs.logits_divisor, 0.25, 16)
    assert ours.rope_scaling is None and ours.dense_limit is None and not ours.tie_word_embeddings


def test_minicpm_longrope_as_its_remote_code_builds_it(minicpm):
    """The table MiniCPMLongRoPE builds once for max_position_embeddings positions: the short factors while that is
    within the original length, else the long ones at every position; cos / sin times sqrt(1 + log(max / original) /
    log(original)), whatever factor / attention_factor rope_scaling states."""
    short = ModelConfig.from_hf(json.loads((minicpm["short"][1] / "config.json").read_text()))
    assert short.rope_scaling["short_factor"] == pytest.approx(_factors(1))
    assert short.rope_scaling["attention_factor"] == 1.0
    raw = json.loads((minicpm["long"][1] / "config.json").read_text())
    raw["rope_scaling"] |= {"factor": 3.0, "attention_factor": 0.5}  # (read by neither)
    long = ModelConfig.from_hf(raw)
    assert long.rope_scaling["short_factor"] == long.rope_scaling["long_factor"] == pytest.approx(_factors(2))
    assert long.rope_scaling["attention_factor"] == pytest.approx(math.sqrt(1 + math.log(256 / 8) / math.log(8)))


def test_minicpm_sparse_attention_is_served_below_dense_len(minicpm):
    """InfLLM v2 (sparse_config) attends densely while a sequence holds fewer than dense_len tokens
    (`kv_seq_len < dense_len` in MiniCPMInfLLMv2Attention): the context served stops there."""
    raw = json.loads((minicpm["short"][1] / "config.json").read_text())
    cfg = ModelConfig.from_hf(raw)
    assert cfg.servable_context == 127
    check_servable(cfg, 127)
    with pytest.raises(ValueError, match=r"sparse_config\.dense_len=128 .*--max-model-len 127"):
        check_servable(cfg, 128)
    assert ModelConfig.from_hf({**raw, "sparse_config": {}}).servable_context == 256  # (dense_len 8192 by default)
    for dense in (-1, 0, None):  # (-1: sparse at every length)
        with pytest.raises(UnsupportedModelError, match=r"^sparse_config\.dense_len="):
            ModelConfig.from_hf({**raw, "sparse_config": {"dense_len": dense}})


# MiniCPMConfig's defaults (openbmb's configuration_minicpm.py) for what a config.json may leave out
_MINICPM_DEFAULTS = {"tie_word_embeddings": True, "rms_norm_eps": 1e-6, "max_position_embeddings": 2048}


def test_minicpm_unstated_keys_take_its_config_classes_defaults():
    stated = {"vocab_size": 500, "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 4}
    cfg = ModelConfig.from_hf({"model_type": "minicpm", **stated, "num_attention_heads": 8})
    got = {"tie_word_embeddings": cfg.tie_word_embeddings, "rms_norm_eps": cfg.rms_norm_eps}
    assert got | {"max_position_embeddings": cfg.max_position_embeddings} == _MINICPM_DEFAULTS
    assert (cfg.num_kv_heads, cfg.head_dim, cfg.rope_theta, cfg.bos_token_id, cfg.eos_token_ids) == (8, 32, 1e4, 1, [2])
    # scale_emb = scale_depth = dim_model_base = 1: embeddings as they are, sublayers times 1 / sqrt(layers), logits
    # divided by hidden_size
    assert (cfg.embed_multiplier, cfg.residual_multiplier, cfg.logits_divisor) == (1.0, 0.5, 256.0)
    assert cfg.attn_scale == 32**-0.5


_BASE = {"vocab_size": 400, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2}
_BASE |= {"num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256}
_LONGROPE = {"rope_type": "longrope", "short_factor": [1.0] * 8, "long_factor": [2.0] * 8}


@pytest.mark.parametrize(
    ("key", "extra"),
    [
        ("num_experts", {"num_experts": 8, "num_experts_per_tok": 2}),  # MiniCPM-MoE-8x2B
        ("use_mup", {"use_mup": False}),  # (VoxCPM's switch; openbmb's code has none)
        ("kv_channels", {"kv_channels": 32}),
        ("head_dim", {"head_dim": 32}),
        ("attention_bias", {"attention_bias": True}),
        ("hidden_act", {"hidden_act": "fatrelu"}),  # MiniCPM-S
        ("scale_emb", {"scale_emb": None}),
        ("dim_model_base", {"dim_model_base": 0}),
        ("rope_scaling.original_max_position_embeddings", {"rope_scaling": _LONGROPE}),
        ("sparse_config.dense_len", {"sparse_config": {"dense_len": -1}}),
    ],
)
def test_minicpm_refusals_name_the_key(key, extra):
    with pytest.raises(UnsupportedModelError, match=f"^{re.escape(key)}="):
        ModelConfig.from_hf({"model_type": "minicpm", **_BASE, **extra})


def test_minicpm_keys_its_code_reads_the_same_are_accepted():
    for extra in ({"use_mup": True}, {"kv_channels": 16}, {"head_dim": 16}, {"num_experts": 0}, {"mlp_bias": True}):
        assert ModelConfig.from_hf({"model_type": "minicpm", **_BASE, **extra}).head_dim == 16


# ---- InternLM2 ---------------------------------------------------------------------------------------------------
_INTERNLM2_NAMES = {
    "model.embed_tokens.": "model.tok_embeddings.",
    ".self_attn.o_proj.": ".attention.wo.",
    ".mlp.gate_proj.": ".feed_forward.w1.",
    ".mlp.up_proj.": ".feed_forward.w3.",
    ".mlp.down_proj.": ".feed_forward.w2.",
    ".input_layernorm.": ".attention_norm.",
    ".post_attention_layernorm.": ".ffn_norm.",
    "lm_head.": "output.",
}


def pack_wqkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_heads: int, head_dim: int) -> torch.Tensor:
    """q / k / v rows as InternLM2's wqkv holds them: [KV head][its query heads, its key head, its value head]
    [head_dim] rows (the remote code's "(h gs d)", llama.cpp's reshape to (groups, q_per_kv + 2, head_dim, hidden))."""
    hidden = q.shape[1]
    groups = [q.reshape(kv_heads, -1, head_dim, hidden), k.reshape(kv_heads, 1, head_dim, hidden)]
    groups.append(v.reshape(kv_heads, 1, head_dim, hidden))
    return torch.cat(groups, dim=1).reshape(-1, hidden)


def internlm2_folder(src, out, **extra):
    """A Llama folder as InternLM2's remote code saves the same model: InternLM2Config's keys, its tensor names, q/k/v
    packed into wqkv per KV group."""
    _copy_tokenizer(src, out)
    cfg = json.loads((src / "config.json").read_text())
    internlm2 = {
        **{k: cfg[k] for k in _SHAPE},
        "model_type": "internlm2",
        "architectures": ["InternLM2ForCausalLM"],
        "auto_map": {"AutoConfig": "configuration_internlm2.InternLM2Config"},
        "attn_implementation": "eager",
        "bias": False,
        "pad_token_id": 0,
        "rope_theta": _theta(cfg),
        "rope_scaling": {"type": "dynamic", "factor": 2.0},  # (internlm2_5-7b-chat's: plain within its context)
        "torch_dtype": "float32",
        **extra,
    }
    (out / "config.json").write_text(json.dumps(internlm2))
    kv, head_dim = cfg["num_key_value_heads"], cfg["hidden_size"] // cfg["num_attention_heads"]
    tensors, packed = load_file(str(src / "model.safetensors")), {}
    for name, value in tensors.items():
        if ".self_attn.q_proj." in name:
            layer = name.removesuffix("self_attn.q_proj.weight")
            qkv = [tensors[f"{layer}self_attn.{p}_proj.weight"] for p in "qkv"]
            packed[f"{layer}attention.wqkv.weight"] = pack_wqkv(*qkv, kv, head_dim)
        elif ".self_attn.k_proj." not in name and ".self_attn.v_proj." not in name:
            for old, new in _INTERNLM2_NAMES.items():
                name = name.replace(old, new)
            packed[name] = value
    assert "output.weight" in packed and "model.layers.1.feed_forward.w3.weight" in packed
    save_file(packed, str(out / "model.safetensors"))
    return out


@pytest.fixture(scope="module")
def internlm2(tmp_path_factory):
    root = tmp_path_factory.mktemp("internlm2")
    src = build_model("llama2", root / "llama")
    return src, internlm2_folder(src, root / "internlm2")


def test_internlm2_folder_answers_as_llama(internlm2, backend):
    src, folder = internlm2
    assert_file_matches_folder(folder, src, backend, "internlm2")


def test_internlm2_config_is_llamas(internlm2):
    src, folder = internlm2
    ours = ModelConfig.from_hf(json.loads((folder / "config.json").read_text()))
    theirs = ModelConfig.from_hf(json.loads((src / "config.json").read_text()))
    assert ours.architecture == "internlm2" and ours.rope_scaling is None  # (dynamic NTK: plain within 256)
    assert (ours.num_heads, ours.num_kv_heads, ours.head_dim, ours.attention_bias) == (4, 2, 16, False)
    assert ours.max_context == theirs.max_context == 256


@pytest.mark.parametrize(("heads", "kv_heads"), [(4, 2), (4, 1), (4, 4), (6, 2)])
def test_internlm2_wqkv_groups_split_into_q_k_v(heads, kv_heads):
    """checkpoint_tensors takes wqkv's KV groups back to the q, k and v rows packed into it."""
    head_dim, hidden = 8, 24
    q, k, v = (torch.randn(n * head_dim, hidden) for n in (heads, kv_heads, kv_heads))
    spec = SimpleNamespace(config=SimpleNamespace(num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim))
    spec.config.intermediate_size = 32
    source = [("model.layers.0.self_attn.qkv_proj.weight", pack_wqkv(q, k, v, kv_heads, head_dim))]
    out = dict(checkpoint_tensors(iter(source), spec))
    for name, want in (("q_proj", q), ("k_proj", k), ("v_proj", v)):
        torch.testing.assert_close(out[f"model.layers.0.self_attn.{name}.weight"], want, rtol=0, atol=0)


# InternLM2Config's defaults (InternLM's configuration_internlm2.py) for what a config.json may leave out
def test_internlm2_unstated_keys_take_its_config_classes_defaults():
    stated = {"hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 4, "num_attention_heads": 8}
    with pytest.raises(UnsupportedModelError, match=r"^bias=true"):  # (bias=True unless stated)
        ModelConfig.from_hf({"model_type": "internlm2", **stated})
    cfg = ModelConfig.from_hf({"model_type": "internlm2", **stated, "bias": False})
    assert (cfg.vocab_size, cfg.tie_word_embeddings, cfg.rms_norm_eps, cfg.max_position_embeddings) == (
        103168,
        False,
        1e-6,
        2048,
    )
    assert (cfg.num_kv_heads, cfg.head_dim, cfg.rope_theta, cfg.bos_token_id, cfg.eos_token_ids) == (8, 32, 1e4, 1, [2])
    linear = {"type": "linear", "factor": 2.0}  # (InternLM2's other rope: positions divided by the factor)
    raw = {"model_type": "internlm2", **stated, "bias": False, "rope_scaling": linear}
    assert ModelConfig.from_hf(raw).rope_scaling == {"rope_type": "linear", "factor": 2.0}


@pytest.mark.parametrize(
    ("key", "extra"),
    [
        ("bias", {"bias": True}),
        ("hidden_act", {"hidden_act": "gelu"}),
        ("head_dim", {"head_dim": 32}),
        ("rope_scaling.rope_type", {"rope_scaling": {"type": "yarn_like", "factor": 2.0}}),
    ],
)
def test_internlm2_refusals_name_the_key(key, extra):
    with pytest.raises(UnsupportedModelError, match=f"^{re.escape(key)}="):
        ModelConfig.from_hf({"model_type": "internlm2", **_BASE, "bias": False, **extra})


def test_internlm2_keys_its_code_does_not_read_are_not_llamas():
    """attention_bias / mlp_bias are LlamaConfig's keys, not InternLM2Config's (its one is `bias`): its code builds
    no such biases whatever they say."""
    raw = {"model_type": "internlm2", **_BASE, "bias": False, "attention_bias": True, "mlp_bias": True}
    cfg = ModelConfig.from_hf(raw)
    assert not cfg.attention_bias and not cfg.mlp_bias

"""Tencent's remote-code Hunyuan folders (model_type "hunyuan": Hunyuan-A13B as first released, Hunyuan-7B-0124):
each tiny folder is written in that layout (HunYuanConfig's keys, q/k/v fused per KV group and [up | gate] fused
where its checkpoints fuse them) from a transformers HunYuanMoEV1 / HunYuanDenseV1 model, served on both backends
and compared with that model on its own folder; the dense one also against mlx_lm's hunyuan on a 4-bit folder its
code made. What the remote code computes and Lantern does not is refused by key."""

from __future__ import annotations

import json
import re
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from lantern.app.models.spec import ModelConfig, UnsupportedModelError
from tests.fixtures.teacher_forcing import assert_close_to_mlx_lm, assert_file_matches_folder, quantized_by_mlx_lm
from tests.fixtures.tiny_models import build_model

_SHAPE = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
_SHAPE += ("num_key_value_heads", "max_position_embeddings", "rms_norm_eps", "bos_token_id", "eos_token_id")
_SHAPE += ("tie_word_embeddings", "hidden_act", "attention_bias")


def _grouped_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """q/k/v rows as the remote checkpoints fuse them: per KV head, its query heads' rows, its key's, its value's."""
    qs, ks, vs = q.chunk(kv_heads), k.chunk(kv_heads), v.chunk(kv_heads)
    return torch.cat([torch.cat([qs[g], ks[g], vs[g]]) for g in range(kv_heads)])


def remote_folder(src, out, fused: bool, **extra):
    """`src` (a transformers Hunyuan folder) as Tencent's remote-code folder of the same model."""
    out.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.suffix != ".safetensors" and f.name != "config.json":
            shutil.copy(f, out / f.name)
    cfg = json.loads((src / "config.json").read_text())
    moe = cfg["model_type"] == "hunyuan_v1_moe"
    layers = cfg["num_hidden_layers"]
    remote = {
        **{k: cfg[k] for k in _SHAPE},
        "model_type": "hunyuan",
        "architectures": ["HunYuanMoEV1ForCausalLM" if moe else "HunYuanDenseV1ForCausalLM"],
        "auto_map": {"AutoModelForCausalLM": "modeling_hunyuan.HunYuanMoEV1ForCausalLM"},
        "attention_head_dim": cfg["head_dim"],
        "rope_theta": cfg["rope_parameters"]["rope_theta"],
        "rope_scaling": {"alpha": cfg["rope_parameters"]["alpha"], "type": "dynamic", "factor": 1.0},
        "use_qk_norm": True,
        "use_cla": False,
        "cla_share_factor": 1,
        "num_experts": cfg.get("num_experts", 1),
        "moe_topk": cfg.get("moe_topk", [1] * layers),
        "num_shared_expert": [1] * layers,
        "moe_intermediate_size": [cfg["intermediate_size"]] * layers,
        "use_mixed_mlp_moe": moe,
        "norm_type": "hf_rms",
        "torch_dtype": "float32",
        **extra,
    }
    (out / "config.json").write_text(json.dumps(remote))
    tensors = load_file(str(src / "model.safetensors"))
    if fused:
        for name in [n for n in tensors if n.endswith(".self_attn.q_proj.weight")]:
            base = name[: -len("q_proj.weight")]
            parts = [tensors.pop(f"{base}{p}_proj.weight") for p in "qkv"]
            tensors[f"{base}qkv_proj.weight"] = _grouped_qkv(*parts, cfg["num_key_value_heads"])
        for name in [n for n in tensors if n.endswith(".gate_proj.weight")]:
            base = name[: -len("gate_proj.weight")]
            gate, up = tensors.pop(name), tensors.pop(f"{base}up_proj.weight")
            tensors[f"{base}gate_and_up_proj.weight"] = torch.cat([up, gate])
    save_file(tensors, str(out / "model.safetensors"))
    return out


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """(transformers folder, remote-code folder) pairs: the A13B layout (a mixture, separate tensors), the same
    with fused tensors, the dense 7B-0124 layout (fused)."""
    root = tmp_path_factory.mktemp("hunyuan")
    moe, dense = build_model("hunyuan_moe", root / "moe"), build_model("hunyuan_dense", root / "dense")
    return {
        "a13b": (moe, remote_folder(moe, root / "a13b", fused=False)),
        "a13b_fused": (moe, remote_folder(moe, root / "a13b_fused", fused=True)),
        "dense_fused": (dense, remote_folder(dense, root / "dense_fused", fused=True)),
    }


@pytest.mark.parametrize("kind", ["a13b", "a13b_fused", "dense_fused"])
def test_remote_folder_answers_as_transformers(folders, kind, backend):
    src, folder = folders[kind]
    assert_file_matches_folder(folder, src, backend, f"hunyuan {kind}")


def test_remote_config_reads_as_the_transformers_class(folders):
    for kind, family, experts in (("a13b", "llama_moe", 6), ("dense_fused", "llama", None)):
        src, folder = folders[kind]
        ours = ModelConfig.from_hf(json.loads((folder / "config.json").read_text()))
        theirs = ModelConfig.from_hf(json.loads((src / "config.json").read_text()))
        assert ours.architecture == "hunyuan" and ours.family == family
        assert (ours.moe.num_experts if ours.moe else None) == experts
        assert (ours.rope_theta, ours.head_dim, ours.qk_norm, ours.qk_norm_after_rope) == (
            theirs.rope_theta,
            theirs.head_dim,
            True,
            True,
        )
        assert ours.moe == theirs.moe


def test_mlx_lm_made_folder_matches_mlx_lm(tmp_path, backend, by_file_tokenizer):
    """mlx_lm's hunyuan (its head always the embedding: a tied model) splits the fused tensors its own way."""
    src = build_model("hunyuan_dense", tmp_path / "dense", tie_word_embeddings=True)
    folder = remote_folder(src, tmp_path / "remote", fused=True)
    assert_close_to_mlx_lm(quantized_by_mlx_lm(folder, tmp_path / "q4"), backend, "hunyuan dense")


_BASE = {"model_type": "hunyuan", "vocab_size": 400, "hidden_size": 64, "intermediate_size": 96}
_BASE |= {"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "use_qk_norm": True}
_MOE = {"num_experts": 4, "moe_topk": 2, "use_mixed_mlp_moe": True}


@pytest.mark.parametrize(
    ("key", "extra"),
    [
        ("use_cla", {"use_cla": True, "cla_share_factor": 2}),  # Hunyuan-Large's cross-layer attention
        ("use_mla", {"use_mla": True}),
        ("mamba", {"mamba": True}),
        ("moe_layer_num_skipped", {**_MOE, "moe_layer_num_skipped": 1}),
        ("routed_scaling_factor", {**_MOE, "routed_scaling_factor": 2.5}),
        ("moe_drop_tokens", {**_MOE, "moe_drop_tokens": True}),
        ("use_qk_norm", {"use_qk_norm": False}),
        ("attention_head_dim", {"attention_head_dim": 32, "head_dim": 16}),
        ("use_mixed_mlp_moe", {"num_experts": 4, "moe_topk": 2}),  # (HunYuanConfig's default: no shared MLP)
        ("num_experts", {"num_experts": 4, "architectures": ["HunYuanDenseV1ForCausalLM"]}),
        ("norm_type", {"norm_type": "fused"}),
    ],
)
def test_what_its_code_computes_and_lantern_does_not_is_refused(key, extra):
    with pytest.raises(UnsupportedModelError, match=f"^{re.escape(key)}="):
        ModelConfig.from_hf({**_BASE, **extra})


def test_unstated_keys_take_its_config_classes_defaults():
    """HunYuanConfig's: an untied head, eps 1e-5, 2048 positions, one expert (the dense class)."""
    cfg = ModelConfig.from_hf(_BASE)
    assert (cfg.tie_word_embeddings, cfg.rms_norm_eps, cfg.max_position_embeddings) == (False, 1e-5, 2048)
    assert cfg.family == "llama" and cfg.moe is None and cfg.rope_theta == 10000.0

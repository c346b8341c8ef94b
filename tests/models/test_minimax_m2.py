"""MiniMax-M2: whole-projection q/k norms, a partial rope and sigmoid-routed experts in every layer, on both backends.

A tiny random MiniMaxM2ForCausalLM saved by transformers (Mixtral's names, the router's bias beside the router)
is served from its folder; from the folder in FP8 with 128 x 128 block scales as MiniMax ships its releases
(against transformers on the values the backend holds: tests/models/test_quantized_folders.py's rule); from an
F32 GGUF written as llama.cpp's MiniMaxM2Model converts it; and with multi-token-prediction layers after the
decoder's (skipped). Lantern's logits through the paged cache must equal transformers' at the prompt's end and at
8 teacher-forced greedy tokens. Two mutants of the maths (per-head q/k norms, no routing bias) are far from the
checkpoint, so the comparison is not vacuous.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from lantern.app.engine import LLM
from lantern.app.models.spec import ModelConfig, UnsupportedModelError
from tests.fixtures.teacher_forcing import assert_matches_reference
from tests.fixtures.tiny_models import build_tokenizer

_FP8_PROJECTIONS = ("_proj.weight", ".w1.weight", ".w2.weight", ".w3.weight")  # what MiniMax's FP8 release quantizes
PROMPT = "Paged attention stores keys and values in blocks, while continuous batching"


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LANTERN_CACHE", str(tmp_path / "cache"))


def _config(vocab: int, **extra) -> dict:
    return dict(
        vocab_size=vocab,
        # whole 128 x 128 FP8 blocks in every projection, as in the released shapes
        hidden_size=128,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=32,
        rotary_dim=16,  # as the released configs state the partial rope
        num_local_experts=6,
        num_experts_per_tok=2,
        max_position_embeddings=256,
        rms_norm_eps=1e-5,
        initializer_range=0.2,
        **extra,
    )


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    from transformers import MiniMaxM2Config, MiniMaxM2ForCausalLM

    root = tmp_path_factory.mktemp("minimax-m2")
    tokenizer = build_tokenizer(root)
    cfg = MiniMaxM2Config(
        **_config(len(tokenizer)), bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id
    )
    torch.manual_seed(0)
    model = MiniMaxM2ForCausalLM(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):  # zeros at init: let the bias change choices
                b.copy_(0.5 * torch.randn_like(b))
    model.save_pretrained(str(root))
    return root


def _reference(path: Path):
    from transformers import MiniMaxM2ForCausalLM

    return MiniMaxM2ForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()


def _fp8(src: Path, out: Path) -> tuple[Path, Path]:
    """(src with its projections in FP8 e4m3 and 128 x 128 block weight_scale_inv, as MiniMax ships it; src with
    those weights dequantized: the reference)."""
    from safetensors.torch import load_file, save_file

    from tests.fixtures.hf_quant_writers import quantize_fp8

    quant, ref = shutil.copytree(src, out / "fp8"), shutil.copytree(src, out / "fp8-ref")
    stored, exact = {}, {}
    for name, t in load_file(src / "model.safetensors").items():
        if not name.endswith(_FP8_PROJECTIONS):
            stored[name] = exact[name] = t
            continue
        parts, dequantized = quantize_fp8(t.numpy(), {"block": (128, 128)}, None, name)
        prefix = name.removesuffix(".weight")
        stored.update({f"{prefix}.{suffix}": v for suffix, v in parts.items()})
        exact[name] = torch.from_numpy(dequantized)
    save_file(stored, quant / "model.safetensors", metadata={"format": "pt"})
    save_file(exact, ref / "model.safetensors", metadata={"format": "pt"})
    cfg = json.loads((src / "config.json").read_text())
    q = {"quant_method": "fp8", "fmt": "float8_e4m3fn", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}
    (quant / "config.json").write_text(json.dumps({**cfg, "quantization_config": q}))
    return quant, ref


def _with_mtp(src: Path, out: Path) -> Path:
    """src with use_mtp and one multi-token-prediction module stored as layer 2 (a copy of layer 1)."""
    from safetensors.torch import load_file, save_file

    folder = shutil.copytree(src, out)
    tensors = load_file(src / "model.safetensors")
    tensors.update({n.replace("layers.1.", "layers.2.", 1): t.clone() for n, t in tensors.items() if ".layers.1." in n})
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    cfg = json.loads((src / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "use_mtp": True, "num_mtp_modules": 1}))
    return folder


def _gguf(src: Path, out: Path) -> Path:
    """src as an F32 GGUF (llama.cpp's MiniMaxM2Model), through a per-expert mlp.* folder the fixture converts."""
    from safetensors.torch import load_file, save_file

    from tests.fixtures.gguf_families import convert_to_gguf

    text = shutil.copytree(src, out / "text", ignore=shutil.ignore_patterns("*.safetensors"))
    names = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}
    renamed = {}
    for name, t in load_file(src / "model.safetensors").items():
        name = name.replace(".block_sparse_moe.e_score_correction_bias", ".mlp.gate.e_score_correction_bias")
        name = name.replace(".block_sparse_moe.", ".mlp.")
        for old, new in names.items():
            name = name.replace(f".{old}.weight", f".{new}.weight")
        renamed[name] = t
    save_file(renamed, text / "model.safetensors", metadata={"format": "pt"})
    path, _ = convert_to_gguf(text, out)
    return path


@pytest.fixture(scope="module")
def sources(folder, tmp_path_factory):
    root = tmp_path_factory.mktemp("minimax-m2-variants")
    quant, dequantized = _fp8(folder, root)
    return {
        "folder": (folder, folder),
        "fp8": (quant, dequantized),
        "mtp": (_with_mtp(folder, root / "mtp"), folder),
        "gguf": (_gguf(folder, root / "gguf"), folder),
    }


def test_fp8_release_logits_match_what_the_backend_holds(backend, sources, tmp_path):
    """No FP8 matmul on MLX or a CPU: the FP8 projections are requantized to 8-bit codes (logged), as
    tests/models/test_quantized_folders.py documents; the reference holds those values."""
    from lantern.app.models.quant.affine import quantize_affine
    from tests.models.quant_logits import logits_error, reference_folder, tolerance
    from tests.models.test_quantized_folders import FP8_TORCH, torch_cpu_vnni

    quant, dequantized = sources["fp8"]
    bits, group, symmetric = (8, 32, False) if backend == "mlx" else FP8_TORCH[torch_cpu_vnni()]

    def held(name: str, w: np.ndarray) -> np.ndarray:
        if not name.endswith(_FP8_PROJECTIONS):
            return w
        return quantize_affine(w.astype("float32"), bits, group or w.shape[1], symmetric=symmetric).dequantize()

    ref = reference_folder(dequantized, tmp_path / "held", held)
    err = logits_error(str(quant), str(ref), backend)
    assert err <= tolerance(backend, str(ref)), f"{backend}: {err:.4f}"


@pytest.mark.parametrize("source", ["folder", "mtp", "gguf"])
def test_logits_match_transformers(source, backend, sources):
    path, ref_path = sources[source]
    llm = LLM(str(path), backend=backend, dtype="float32", block_size=4, prefill_chunk_size=8, num_kv_blocks=64)
    try:
        config = llm.engine.model_config
        assert config.family == "minimax_m2" and not config.qk_norm
        assert config.rope_scaling["partial_rotary_factor"] == 0.5
        assert (config.moe.scoring, config.moe.correction_bias, config.moe.norm_topk_prob) == ("sigmoid", True, True)
        assert_matches_reference(llm, _reference(ref_path), PROMPT, steps=8, atol=1e-4)
    finally:
        llm.engine.shutdown()


def _logits(model, ids: list[int]) -> np.ndarray:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].numpy()


def test_the_maths_each_part_changes(folder):
    """Not vacuous: per-head q/k norms or a router without its bias give other logits than the checkpoint."""
    from transformers import AutoTokenizer

    ids = AutoTokenizer.from_pretrained(str(folder)).encode(PROMPT)
    model = _reference(folder)
    expected = _logits(model, ids)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.mlp.e_score_correction_bias.zero_()
    assert np.abs(_logits(model, ids) - expected).max() > 1e-2
    model = _reference(folder)
    with torch.no_grad():  # the norms' weights tiled per head equal them only if every head's share is the same
        for layer in model.model.layers:
            attn = layer.self_attn
            attn.q_norm.weight.copy_(attn.q_norm.weight.view(8, 32)[0].repeat(8))
    assert np.abs(_logits(model, ids) - expected).max() > 1e-2


@pytest.mark.parametrize(
    "extra, key",
    [
        ({"attn_type_list": [0, 1]}, "attn_type_list"),
        ({"qk_norm_type": "per_head"}, "qk_norm_type"),
        ({"use_routing_bias": False}, "use_routing_bias"),
        ({"scoring_func": "softmax"}, "scoring_func"),
        ({"shared_intermediate_size": 64}, "shared_intermediate_size"),
        ({"num_experts_per_tok": 7}, "num_experts_per_tok"),
        ({"hidden_act": "gelu"}, "hidden_act"),
    ],
)
def test_unimplemented_keys_are_refused_by_name(extra, key):
    with pytest.raises(UnsupportedModelError, match=key):
        ModelConfig.from_hf({"model_type": "minimax_m2", **_config(300), **extra})


def test_defaults_are_minimax_m2_configs():
    """Keys a config.json omits take MiniMaxM2Config's values; the released attn_type_list of ones is served."""
    cfg = ModelConfig.from_hf(
        {"model_type": "minimax_m2", "vocab_size": 300, "hidden_size": 64, "num_hidden_layers": 2}
    )
    assert (cfg.head_dim, cfg.num_heads, cfg.num_kv_heads, cfg.intermediate_size) == (128, 48, 8, 1536)
    assert (cfg.rope_theta, cfg.max_position_embeddings, cfg.rms_norm_eps) == (5000000.0, 196608, 1e-6)
    assert cfg.rope_scaling is None and (cfg.moe.num_experts, cfg.moe.top_k) == (256, 8)
    released = ModelConfig.from_hf({"model_type": "minimax_m2", **_config(300), "attn_type_list": [1, 1]})
    assert released.rope_scaling["partial_rotary_factor"] == 0.5 and released.mtp_layers == 0


def test_rotary_dim_holds_beside_a_rope_scaling_and_prediction_modules_are_skipped_by_count():
    """YaRN added for context (a rope_scaling dict) keeps the partial rope rotary_dim states, as transformers reads
    it; the prediction modules' layers are skipped whether or not use_mtp is on."""
    from transformers import MiniMaxM2Config

    yarn = {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 128}
    extra = {"rope_scaling": yarn, "rope_theta": 5000000.0, "max_position_embeddings": 256}
    ref = MiniMaxM2Config(**_config(300), **{k: v for k, v in extra.items() if k != "max_position_embeddings"})
    cfg = ModelConfig.from_hf({"model_type": "minimax_m2", **_config(300), **extra})
    assert cfg.rope_scaling["rope_type"] == "yarn"
    assert cfg.rope_scaling["partial_rotary_factor"] == ref.rope_parameters["partial_rotary_factor"] == 0.5
    off = ModelConfig.from_hf({"model_type": "minimax_m2", **_config(300), "use_mtp": False, "num_mtp_modules": 3})
    assert off.mtp_layers == 3

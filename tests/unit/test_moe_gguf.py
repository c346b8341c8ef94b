"""GGUF mixture-of-experts tensors: llama.cpp's stacked 3-D expert tensors come out of the weight
stream as the per-expert Hugging Face weights the loaders stack, router and shared expert renamed.

The file is written with the `gguf` package (GGUFWriter, gguf.quants.quantize) from a tiny
transformers Qwen2-MoE checkpoint; the reference is that checkpoint's tensors (float types) and
gguf.quants.dequantize of the written blocks (Q8_0).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from lantern.app.models.gguf_names import iter_gguf_weights, moe_config_from_gguf
from lantern.app.models.quant.affine import AffineWeight

gguf = pytest.importorskip("gguf")


def write_moe_gguf(src: Path, out: Path, num_experts: int) -> dict[str, np.ndarray]:
    """Layer 1's MoE tensors of `src` as llama.cpp names them; returns the exact values written per
    HF name (per expert)."""
    from safetensors.numpy import load_file

    hf = load_file(str(src / "model.safetensors"))
    layer = "model.layers.1.mlp"
    writer = gguf.GGUFWriter(str(out), "qwen2moe")
    expected: dict[str, np.ndarray] = {}
    writer.add_tensor("blk.1.ffn_gate_inp.weight", hf[f"{layer}.gate.weight"])
    expected[f"{layer}.gate.weight"] = hf[f"{layer}.gate.weight"]
    # gate experts in Q8_0 (dequantized by the gguf package for the reference), up in F16, down in F32
    gate = np.stack([hf[f"{layer}.experts.{e}.gate_proj.weight"] for e in range(num_experts)])
    q8 = gguf.quants.quantize(gate, gguf.GGMLQuantizationType.Q8_0)
    writer.add_tensor("blk.1.ffn_gate_exps.weight", q8, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    gate_values = gguf.quants.dequantize(q8, gguf.GGMLQuantizationType.Q8_0)
    up = np.stack([hf[f"{layer}.experts.{e}.up_proj.weight"] for e in range(num_experts)]).astype(np.float16)
    writer.add_tensor("blk.1.ffn_up_exps.weight", up)
    down = np.stack([hf[f"{layer}.experts.{e}.down_proj.weight"] for e in range(num_experts)])
    writer.add_tensor("blk.1.ffn_down_exps.weight", down)
    for e in range(num_experts):
        expected[f"{layer}.experts.{e}.gate_proj.weight"] = gate_values[e]
        expected[f"{layer}.experts.{e}.up_proj.weight"] = up[e].astype(np.float32)
        expected[f"{layer}.experts.{e}.down_proj.weight"] = down[e]
    for proj in ("gate", "up", "down"):
        w = hf[f"{layer}.shared_expert.{proj}_proj.weight"]
        writer.add_tensor(f"blk.1.ffn_{proj}_shexp.weight", w)
        expected[f"{layer}.shared_expert.{proj}_proj.weight"] = w
    shared_gate = hf[f"{layer}.shared_expert_gate.weight"]
    writer.add_tensor("blk.1.ffn_gate_inp_shexp.weight", shared_gate.reshape(-1))  # a vector, as llama.cpp writes it
    expected[f"{layer}.shared_expert_gate.weight"] = shared_gate
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return expected


def test_stacked_gguf_experts_stream_as_per_expert_weights(tiny_model_dir, tmp_path):
    src = Path(tiny_model_dir("qwen2_moe"))
    expected = write_moe_gguf(src, tmp_path / "moe.gguf", num_experts=4)
    got = list(iter_gguf_weights(str(tmp_path / "moe.gguf"), 4, 2))
    assert sorted(name for name, _ in got) == sorted(expected)
    for name, w in got:
        values = w.dequantize() if isinstance(w, AffineWeight) else np.asarray(w, dtype=np.float32)
        assert values.shape == expected[name].shape, name
        np.testing.assert_allclose(values, expected[name], rtol=1e-6, atol=1e-6, err_msg=name)
    assert isinstance(dict(got)["model.layers.1.mlp.experts.2.gate_proj.weight"], AffineWeight)  # stays quantized


def test_moe_config_keys_transformers_leaves_out():
    mixtral = {"general.architecture": "llama", "llama.expert_count": 8, "llama.expert_used_count": 2}
    assert moe_config_from_gguf(mixtral) == {
        "model_type": "mixtral",
        "num_local_experts": 8,
        "num_experts_per_tok": 2,
        "sliding_window": None,
    }
    qwen3 = {
        "general.architecture": "qwen3moe",
        "qwen3moe.expert_count": 128,
        "qwen3moe.expert_used_count": 8,
        "qwen3moe.expert_feed_forward_length": 768,
    }
    assert moe_config_from_gguf(qwen3) == {
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "moe_intermediate_size": 768,
        "norm_topk_prob": True,
    }
    qwen2 = {
        "general.architecture": "qwen2moe",
        "qwen2moe.expert_count": 60,
        "qwen2moe.expert_feed_forward_length": 1408,
    }
    qwen2["qwen2moe.expert_shared_feed_forward_length"] = 5632
    assert moe_config_from_gguf(qwen2)["shared_expert_intermediate_size"] == 5632
    assert moe_config_from_gguf({"general.architecture": "llama", "llama.block_count": 2}) == {}  # dense


# HF -> llama.cpp names of the tiny Qwen2-MoE (written out here, not taken from the code under test).
_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "mlp.gate.weight": "ffn_gate_inp.weight",
    "mlp.shared_expert_gate.weight": "ffn_gate_inp_shexp.weight",
    **{f"self_attn.{p}_proj.{k}": f"attn_{p}.{k}" for p in "qkv" for k in ("weight", "bias")},
    **{f"mlp.shared_expert.{p}_proj.weight": f"ffn_{p}_shexp.weight" for p in ("gate", "up", "down")},
}


def write_full_gguf(src: Path, out: Path, ref: Path) -> None:
    """The whole tiny model as a qwen2moe GGUF, experts in Q4_0 and the rest in F32; `ref` gets an HF
    folder of the values the file holds (the experts dequantized by the gguf package)."""
    import shutil

    from safetensors.numpy import load_file, save_file

    hf = load_file(str(src / "model.safetensors"))
    shutil.copytree(src, ref)
    held = dict(hf)
    writer = gguf.GGUFWriter(str(out), "qwen2moe")
    writer.add_tensor("token_embd.weight", hf["model.embed_tokens.weight"])
    writer.add_tensor("output_norm.weight", hf["model.norm.weight"])
    writer.add_tensor("output.weight", hf["lm_head.weight"])
    q4 = gguf.GGMLQuantizationType.Q4_0
    for layer in range(2):
        stem = f"model.layers.{layer}"
        for name, gguf_name in _NAMES.items():
            w = hf[f"{stem}.{name}"]
            writer.add_tensor(f"blk.{layer}.{gguf_name}", w.reshape(-1) if "shared_expert_gate" in name else w)
        for proj in ("gate", "up", "down"):
            names = [f"{stem}.mlp.experts.{e}.{proj}_proj.weight" for e in range(4)]
            blocks = gguf.quants.quantize(np.stack([hf[n] for n in names]), q4)
            writer.add_tensor(f"blk.{layer}.ffn_{proj}_exps.weight", blocks, raw_dtype=q4)
            values = gguf.quants.dequantize(blocks, q4)
            held.update({n: values[e] for e, n in enumerate(names)})
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    save_file({k: np.ascontiguousarray(v, np.float32) for k, v in held.items()}, str(ref / "model.safetensors"))


@pytest.mark.parametrize("backend", ["mlx", "torch"])
def test_moe_gguf_model_matches_transformers_on_its_values(tiny_model_dir, tmp_path, monkeypatch, backend):
    """End to end through the loaders: a Qwen2-MoE GGUF with Q4_0 experts on each backend vs
    transformers on the file's dequantized values. The HF config comes from the tiny folder (what
    the loader's GGUF config reading plus moe_config_from_gguf give for such a file)."""
    import json

    from transformers import AutoTokenizer

    from lantern.app.models import loader
    from tests.models.quant_logits import logits_error, tolerance

    src = Path(tiny_model_dir("qwen2_moe"))
    path, ref = tmp_path / "tiny-moe.gguf", tmp_path / "ref"
    write_full_gguf(src, path, ref)
    cfg, tok = json.loads((src / "config.json").read_text()), AutoTokenizer.from_pretrained(str(src))
    monkeypatch.setattr(loader, "gguf_config_and_tokenizer", lambda _path: (dict(cfg), tok))
    err = logits_error(str(path), str(ref), backend)
    assert err <= tolerance(backend, str(ref)), f"{backend}: {err:.4f}"
    assert logits_error(str(src), str(ref), backend) > err  # the Q4_0 experts are what was loaded

"""EXAONE 3.0 / 3.5 / Deep: a folder in the released layout (transformer.h.N.attn.attention.*, ln_1 / ln_2,
c_fc_0 / c_fc_1 / c_proj, wte / ln_f; num_layers, layer_norm_epsilon, activation_function in config.json)
serves the same model as the folder transformers saves (Llama's names), on both backends. Logit parity with
transformers through the paged cache is in tests/conformance (variant exaone)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from lantern.app.models.spec import ModelConfig, UnsupportedModelError
from tests.fixtures.teacher_forcing import assert_same_greedy

_TO_RELEASED = (
    (r"^model\.embed_tokens\.", "transformer.wte."),
    (r"^model\.norm\.", "transformer.ln_f."),
    (r"^model\.layers\.", "transformer.h."),
    (r"\.self_attn\.o_proj\.", ".attn.attention.out_proj."),
    (r"\.self_attn\.", ".attn.attention."),
    (r"\.input_layernorm\.", ".ln_1."),
    (r"\.post_attention_layernorm\.", ".ln_2."),
    (r"\.mlp\.gate_proj\.", ".mlp.c_fc_0."),
    (r"\.mlp\.up_proj\.", ".mlp.c_fc_1."),
    (r"\.mlp\.down_proj\.", ".mlp.c_proj."),
)


def _released_layout(src: Path, out: Path) -> Path:
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, out)
    tensors = {}
    for name, value in load_file(str(src / "model.safetensors")).items():
        for pattern, replacement in _TO_RELEASED:
            name = re.sub(pattern, replacement, name)
        tensors[name] = value
    save_file(tensors, str(out / "model.safetensors"))
    cfg = json.loads((src / "config.json").read_text())
    for llama, theirs in (("num_hidden_layers", "num_layers"), ("rms_norm_eps", "layer_norm_epsilon")):
        cfg[theirs] = cfg.pop(llama)
    cfg["activation_function"] = cfg.pop("hidden_act", "silu")
    cfg["architectures"] = ["ExaoneForCausalLM"]
    (out / "config.json").write_text(json.dumps(cfg))
    return out


def test_released_layout_serves_the_same_model(tiny_model_dir, tmp_path, backend):
    src = Path(tiny_model_dir("exaone"))
    released = _released_layout(src, tmp_path / "released")
    assert "transformer.h.0.attn.attention.q_proj.weight" in (released / "model.safetensors").read_bytes().decode(
        "latin-1"
    )
    a = ModelConfig.from_hf(json.loads((src / "config.json").read_text()))
    b = ModelConfig.from_hf(json.loads((released / "config.json").read_text()))
    assert a == b and b.num_layers == 2 and b.rms_norm_eps == 1e-5
    assert_same_greedy(str(released), str(src), backend)


def test_defaults_and_refusals():
    released = {"model_type": "exaone", "vocab_size": 100, "hidden_size": 64, "num_layers": 3, "num_attention_heads": 4}
    cfg = ModelConfig.from_hf({**released, "num_key_value_heads": 4})
    assert cfg.num_layers == 3 and cfg.rope_theta == 500_000.0  # ExaoneConfig.default_theta
    with pytest.raises(UnsupportedModelError, match="hidden_act"):
        ModelConfig.from_hf({**released, "num_key_value_heads": 4, "activation_function": "gelu"})

"""Zyphra's Zamba2 (zamba2): Mamba-2 layers, some running one of a few shared transformer blocks on [x, embedding]
with per-layer adapters, each such layer keeping its own K/V. Tiny random models built and saved by transformers'
Zamba2ForCausalLM; Lantern's logits equal transformers' through the paged cache on both backends -- two shared
blocks with q/k/v adapters and a rope, and one block without either over grouped KV heads -- for transformers'
folder, for one repeating the shared tensors in every hybrid layer, and for Zyphra's original blocks layout; what
it cannot compute is refused by name."""

from __future__ import annotations

import json
import re

import pytest

from lantern.app.models.errors import UnsupportedModelError
from lantern.app.models.spec import ModelConfig
from tests.models.quant_logits import relaid_folder

SHAPE = {"hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 7, "num_attention_heads": 4}
SHAPE |= {"n_mamba_heads": 4, "mamba_d_state": 16, "mamba_ngroups": 2, "mamba_d_conv": 4, "adapter_rank": 8}
TYPES = ["mamba", "mamba", "hybrid", "mamba", "hybrid", "hybrid", "mamba"]
VARIANTS = {
    "adapters_rope": {"num_mem_blocks": 2, "use_shared_attention_adapter": True, "use_mem_rope": True},
    "plain_gqa": {"num_mem_blocks": 1, "num_key_value_heads": 2},
}


def _build(out, **variant):
    import torch
    from transformers import Zamba2Config, Zamba2ForCausalLM

    from tests.fixtures.tiny_models import build_tokenizer

    tokenizer = build_tokenizer(out)
    ids = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id, "pad_token_id": 0}
    config = Zamba2Config(vocab_size=len(tokenizer), layers_block_type=TYPES, **SHAPE, **variant, **ids)
    torch.manual_seed(0)
    model = Zamba2ForCausalLM(config).eval()
    with torch.no_grad():  # (norms, D, dt_bias start as constants: made to differ per channel, so each is read right)
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.mul_(1.0 + 0.3 * torch.rand_like(p))
            elif "adapter_list" in name:  # (adapters large enough to move the logits measurably)
                p.normal_(0.0, 0.2)
    model.save_pretrained(str(out), safe_serialization=True)
    return out, model


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def folder(request, tmp_path_factory):
    return _build(tmp_path_factory.mktemp(f"zamba2_{request.param}"), **VARIANTS[request.param])


def _assert_matches(folder, reference, backend) -> None:
    from tests.fixtures.teacher_forcing import assert_serves_like

    def check(cfg):  # one pool layer per hybrid layer
        assert (cfg.num_layers, cfg.num_kv_layers, cfg.head_dim) == (7, 3, 16)

    assert_serves_like(folder, reference, backend, check)


def test_logits_match_transformers(folder, backend):
    _assert_matches(*folder, backend)


def test_shared_blocks_repeated_in_every_hybrid_layer_are_read_once(folder, tmp_path, backend):
    """Released folders store each hybrid layer's shared_transformer (the same values for layers of one block):
    the first hybrid layer of each block is read, the others' copies skipped -- here made different, so reading
    a copy would change the logits."""
    out, model = folder
    hybrid = [i for i, t in enumerate(TYPES) if t == "hybrid"]
    blocks = model.config.num_mem_blocks

    def repeat(name, value):
        m = re.match(r"model\.layers\.(\d+)\.shared_transformer\.(.+)", name)
        if m is None:
            return {name: value}
        copies = {name: value}
        first = int(m.group(1))
        for i, layer in enumerate(hybrid):
            if layer != first and i % blocks == hybrid.index(first) % blocks:
                copies[f"model.layers.{layer}.shared_transformer.{m.group(2)}"] = value * 0 + 7.0
        return copies

    relaid_folder(out, tmp_path / "repeated", repeat)
    _assert_matches(tmp_path / "repeated", model, backend)


def test_zyphras_blocks_layout_reads_as_mlx_lm_reads_it(folder, tmp_path, backend):
    """model.blocks.{b} (linear_fc1 / fc2, linear_fc1_lora_A/B_list), model.mamba_layers.{L},
    model.linear_layers.{i}."""
    out, model = folder
    hybrid = [i for i, t in enumerate(TYPES) if t == "hybrid"]
    blocks = model.config.num_mem_blocks

    def zyphra(name, value):
        m = re.match(r"model\.layers\.(\d+)\.(.+)", name)
        if m is None:
            return {name: value}
        layer, rest = int(m.group(1)), m.group(2)
        if rest.startswith("shared_transformer."):
            rest = rest.removeprefix("shared_transformer.")
            rest = rest.replace("feed_forward.gate_up_proj.", "feed_forward.linear_fc1.")
            rest = rest.replace("feed_forward.down_proj.", "feed_forward.linear_fc2.")
            lora = re.fullmatch(r"feed_forward\.gate_up_proj_adapter_list\.(\d+)\.([01])\.weight", rest)
            if lora is not None:
                rest = f"feed_forward.linear_fc1_lora_{'AB'[int(lora.group(2))]}_list.{lora.group(1)}.weight"
            return {f"model.blocks.{hybrid.index(layer) % blocks}.{rest}": value}
        if rest.startswith("linear."):
            return {f"model.linear_layers.{hybrid.index(layer)}.{rest.removeprefix('linear.')}": value}
        return {f"model.mamba_layers.{layer}.{rest.removeprefix('mamba_decoder.')}": value}

    relaid_folder(out, tmp_path / "zyphra", zyphra)
    assert not any(n.startswith("model.layers.") for n in _names(tmp_path / "zyphra"))
    _assert_matches(tmp_path / "zyphra", model, backend)


def _names(folder) -> list[str]:
    from safetensors import safe_open

    with safe_open(str(folder / "model.safetensors"), "np") as f:
        return list(f.keys())


def _base(**extra) -> dict:
    return {"model_type": "zamba2", "vocab_size": 300, **SHAPE, "layers_block_type": TYPES, **extra}


def test_the_config_reads_as_zamba2_config_reads_it():
    from transformers import Zamba2Config

    ref = Zamba2Config(**{k: v for k, v in _base().items() if k != "model_type"})
    cfg = ModelConfig.from_hf(json.loads(ref.to_json_string()))  # (transformers' saved names: linear_attention)
    assert cfg.head_dim == ref.attention_head_dim and cfg.num_kv_heads == ref.num_key_value_heads
    assert cfg.zamba2.hybrid_layers == tuple(ref.hybrid_layer_ids) and cfg.kv_layers == 3
    assert cfg.mamba.head_dim == ref.mamba_headdim and cfg.mamba.dt_limit[0] == ref.time_step_min
    assert cfg.attn_scale == pytest.approx((ref.attention_head_dim / 2) ** -0.5)
    assert cfg.rope_layers == (False,) * 7 and cfg.tie_word_embeddings  # (use_mem_rope false: no rope)


@pytest.mark.parametrize(
    "extra, key",
    [
        ({"layers_block_type": ["mamba"] * 7}, "layers_block_type"),
        ({"layers_block_type": TYPES[:-1]}, "layers_block_type"),
        ({"use_shared_attention_adapter": True, "num_key_value_heads": 2}, "num_key_value_heads"),
        ({"use_mem_rope": True, "use_long_context": True}, "use_long_context"),
        ({"num_mem_blocks": 4}, "num_mem_blocks"),
        ({"hidden_act": "relu"}, "hidden_act"),
        ({"mamba_ngroups": 3}, "mamba_ngroups"),
    ],
)
def test_what_it_cannot_compute_is_refused_by_name(extra, key):
    with pytest.raises(UnsupportedModelError, match=key):
        ModelConfig.from_hf(_base(**extra))


def test_tensor_parallelism_is_refused():
    from lantern.backends.torch.parallel import local_config

    with pytest.raises(ValueError):
        local_config(ModelConfig.from_hf(_base()), 2)


@pytest.mark.parametrize("scheme", ["q4", "q8"])
def test_isq_matches_the_dequantized_reference(folder, tmp_path, backend, scheme, caplog):
    """--isq over the mixers, the shared blocks, the per-layer linears and adapters, every matrix counted."""
    from tests.models.quant_logits import assert_isq_matches_reference

    assert_isq_matches_reference(folder[0], tmp_path / "ref", backend, scheme, caplog)

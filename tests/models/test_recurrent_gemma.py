"""Google's RecurrentGemma (recurrent_gemma, Griffin): RG-LRU recurrent layers with a causal convolution beside local
multi-query attention, in Gemma's residual blocks. Tiny random models built and saved by transformers'
RecurrentGemmaForCausalLM; Lantern's logits equal transformers' through the paged cache on both backends, with a
window shorter than the prompt and prompts longer than a scan block; mlx_lm's layout of the convolution reads the
same; what it cannot compute is refused by name."""

from __future__ import annotations

import pytest

from lantern.app.models.errors import UnsupportedModelError
from lantern.app.models.spec import ModelConfig

SHAPE = {"hidden_size": 32, "intermediate_size": 96, "num_hidden_layers": 5, "num_attention_heads": 4}
SHAPE |= {"num_key_value_heads": 1, "lru_width": 48, "attention_window_size": 6, "conv1d_width": 4}
LONG = "Paged attention " * 40  # > 64 tokens: the prefill scan crosses its blocks


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    import torch
    from transformers import RecurrentGemmaConfig, RecurrentGemmaForCausalLM

    from tests.fixtures.tiny_models import build_tokenizer

    out = tmp_path_factory.mktemp("recurrent_gemma")
    tokenizer = build_tokenizer(out)
    ids = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id, "pad_token_id": 0}
    config = RecurrentGemmaConfig(vocab_size=len(tokenizer), **SHAPE, **ids)
    torch.manual_seed(0)
    model = RecurrentGemmaForCausalLM(config).eval()
    with torch.no_grad():  # (norms start at 0 and biases small: made to differ per channel, so each is read right)
        for name, p in model.named_parameters():
            if p.dim() == 1 or "gate_bias" in name:
                p.add_(0.3 * torch.randn_like(p))
    model.save_pretrained(str(out), safe_serialization=True)
    return out, model


def _assert_matches(folder, reference, backend) -> None:
    from tests.fixtures.teacher_forcing import assert_serves_like

    def check(cfg):  # one attention layer, its window
        assert (cfg.num_kv_layers, cfg.layer_windows) == (1, [6])

    assert_serves_like(folder, reference, backend, check)


def test_logits_match_transformers(folder, backend):
    _assert_matches(*folder, backend)


def test_a_prompt_longer_than_a_scan_block_matches(folder, backend):
    """One prefill chunk of 80 tokens: the scan runs over two blocks of 64."""
    from lantern.app.engine import LLM
    from tests.fixtures.teacher_forcing import assert_matches_reference

    out, model = folder
    llm = LLM(str(out), backend=backend, dtype="float32", block_size=16, prefill_chunk_size=256, num_kv_blocks=64)
    try:
        assert len(llm.tokenizer.encode(LONG)) > 64
        assert_matches_reference(llm, model, LONG, steps=4, atol=2e-4)
    finally:
        llm.engine.shutdown()


def test_mlx_lm_convolution_layout_reads_the_same(folder, tmp_path, backend):
    """mlx-community folders store conv_1d.weight [C, K, 1] (MLX's Conv1d layout)."""
    from tests.models.quant_logits import relaid_folder

    out, model = folder
    moved = []

    def mlx_layout(name, value):
        if name.endswith("conv_1d.weight"):
            value = value.swapaxes(1, 2).copy()
            moved.append(value.shape)
        return {name: value}

    dest = relaid_folder(out, tmp_path / "mlx_layout", mlx_layout)
    assert moved and all(shape[-1] == 1 for shape in moved)
    _assert_matches(dest, model, backend)


def _base(**extra) -> dict:
    return {"model_type": "recurrent_gemma", "vocab_size": 300, **SHAPE, **extra}


def test_the_config_reads_as_recurrent_gemma_config_reads_it():
    import torch
    from transformers import RecurrentGemmaConfig

    ref = RecurrentGemmaConfig(**{k: v for k, v in _base(num_hidden_layers=7).items() if k != "model_type"})
    cfg = ModelConfig.from_hf(_base(num_hidden_layers=7))
    assert cfg.rglru.recurrent_layers == tuple(t == "linear_attention" for t in ref.layers_block_type)
    assert cfg.intermediate_size == ref.intermediate_size // 2 and cfg.final_softcap == ref.logits_soft_cap
    normalizer = torch.tensor(ref.hidden_size**0.5, dtype=torch.bfloat16).item()  # (transformers' buffer)
    assert cfg.embed_multiplier == normalizer != ref.hidden_size**0.5
    assert cfg.rope_scaling["partial_rotary_factor"] == 0.5 and cfg.head_dim == 8


@pytest.mark.parametrize(
    "extra, key",
    [
        ({"block_types": ["recurrent"]}, "block_types"),
        ({"block_types": ["recurrent", "mlp"]}, "block_types"),
        ({"hidden_activation": "silu"}, "hidden_activation"),
        ({"embeddings_scale_by_sqrt_dim": False}, "embeddings_scale_by_sqrt_dim"),
        ({"lru_width": 30}, "lru_width"),
        ({"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}}, "rope_type"),
    ],
)
def test_what_it_cannot_compute_is_refused_by_name(extra, key):
    with pytest.raises(UnsupportedModelError, match=key):
        ModelConfig.from_hf(_base(**extra))


def test_tensor_parallelism_is_refused():
    from lantern.backends.torch.parallel import local_config

    with pytest.raises(ValueError, match="RG-LRU"):  # (its recurrent layers run whole on every rank)
        local_config(ModelConfig.from_hf(_base(num_key_value_heads=2)), 2)


@pytest.mark.parametrize("scheme", ["q4", "q8"])
def test_isq_matches_the_dequantized_reference(folder, tmp_path, backend, scheme, caplog):
    """--isq over the recurrent blocks' linears, attention and the MLPs, every matrix counted."""
    from tests.models.quant_logits import assert_isq_matches_reference

    assert_isq_matches_reference(folder[0], tmp_path / "ref", backend, scheme, caplog)

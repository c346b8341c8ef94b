"""JetMoE (jetmoe): a mixture of attention heads (routed query / output projections around one shared K/V, the K/V
heads tiled over the chosen experts' query heads) and a mixture of SiLU-gated experts, each plus a bias. Tiny random
models built and saved by transformers' JetMoeForCausalLM; Lantern's logits equal transformers' through the paged
cache on both backends; what it cannot compute is refused by name."""

from __future__ import annotations

import pytest

from lantern.app.models.errors import UnsupportedModelError
from lantern.app.models.spec import ModelConfig

SHAPE = {"hidden_size": 32, "intermediate_size": 24, "num_hidden_layers": 3, "num_key_value_heads": 2}
SHAPE |= {"kv_channels": 8, "num_local_experts": 4, "num_experts_per_tok": 2}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    import torch
    from transformers import JetMoeConfig, JetMoeForCausalLM

    from tests.fixtures.tiny_models import build_tokenizer

    out = tmp_path_factory.mktemp("jetmoe")
    tokenizer = build_tokenizer(out)
    ids = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id}
    config = JetMoeConfig(vocab_size=len(tokenizer), tie_word_embeddings=False, **SHAPE, **ids)
    torch.manual_seed(0)
    model = JetMoeForCausalLM(config).eval()
    with torch.no_grad():  # (norms start at 1, biases at 0, experts tiny: made to matter, so each is read right)
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.add_(0.3 * torch.randn_like(p))
            elif "input_linear" in name or "output_linear" in name or "router" in name:
                p.normal_(0.0, 0.2)
    model.save_pretrained(str(out), safe_serialization=True)
    return out, model


def test_logits_match_transformers(folder, backend):
    from tests.fixtures.teacher_forcing import assert_serves_like

    def check(cfg):  # k x K/V heads of queries per token
        assert (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (4, 2, 8)

    assert_serves_like(*folder, backend, check)


def _base(**extra) -> dict:
    return {"model_type": "jetmoe", "vocab_size": 300, **SHAPE, **extra}


def test_the_config_reads_as_jetmoe_config_reads_it():
    from transformers import JetMoeConfig

    ref = JetMoeConfig(**{k: v for k, v in _base().items() if k != "model_type"})
    cfg = ModelConfig.from_hf(_base())  # (no num_attention_heads key: JetMoeConfig derives it)
    assert (cfg.num_heads, cfg.head_dim) == (ref.num_attention_heads, ref.kv_channels)
    assert (cfg.moe.num_experts, cfg.moe.top_k, cfg.moe.softmax_after_topk) == (4, 2, True)


@pytest.mark.parametrize(
    "extra, key",
    [
        ({"activation_function": "gelu"}, "activation_function"),
        ({"rms_norm_eps": 1e-5}, "rms_norm_eps"),
        ({"num_experts_per_tok": 5}, "num_experts_per_tok"),
    ],
)
def test_what_it_cannot_compute_is_refused_by_name(extra, key):
    with pytest.raises(UnsupportedModelError, match=key):
        ModelConfig.from_hf(_base(**extra))


@pytest.mark.parametrize("scheme", ["q4", "q8"])
def test_isq_matches_the_dequantized_reference(folder, tmp_path, backend, scheme, caplog):
    """--isq over kv_proj and each MLP expert (the MoA's stacked query / output experts stay float), every matrix
    counted."""
    from tests.models.quant_logits import assert_isq_matches_reference

    def exact(name: str) -> bool:  # the MoA's stacked experts and both routers
        moa = ".self_attention.experts." in name and name.endswith("linear.weight")
        return moa or name.endswith("router.layer.weight")

    assert_isq_matches_reference(folder[0], tmp_path / "ref", backend, scheme, caplog, exact)

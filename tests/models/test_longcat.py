"""Meituan LongCat-Flash (longcat_flash): two latent-attention sublayers with their LoRA scales and two MLPs per
layer, a shortcut mixture whose router also picks zero experts, against transformers' LongcatFlashForCausalLM on both
backends; the config read as LongcatFlashConfig reads it, refusals by name."""

from __future__ import annotations

import pytest

from lantern.app.models.spec import ModelConfig, UnsupportedModelError
from tests.conformance.test_parity import PROMPT

CONFIG = {  # LongCat-Flash's keys, its sizes scaled down
    "model_type": "longcat_flash",
    "hidden_size": 64,
    "num_layers": 2,
    "num_attention_heads": 4,
    "ffn_hidden_size": 96,
    "expert_ffn_hidden_size": 32,
    "n_routed_experts": 6,
    "zero_expert_num": 2,
    "moe_topk": 3,
    "q_lora_rank": 32,
    "kv_lora_rank": 16,
    "qk_nope_head_dim": 8,
    "qk_rope_head_dim": 8,
    "head_dim": 8,  # (the rope's width in LongcatFlashConfig: qk_rope_head_dim's)
    "v_head_dim": 8,
    "routed_scaling_factor": 6.0,
    "max_position_embeddings": 256,
}


def longcat_folder(out, released: bool = False):
    """transformers' own model, saved: norms, router bias (the zero experts' high, so that they are picked) random.
    released: as meituan-longcat's folders hold it (the config's own keys beside transformers', no zero-expert slots),
    which mlx_lm also reads."""
    import torch
    from transformers import LongcatFlashConfig, LongcatFlashForCausalLM

    from tests.fixtures.tiny_models import build_tokenizer

    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(out)
    keys = {k: v for k, v in CONFIG.items() if k != "model_type"}
    cfg = LongcatFlashConfig(**keys, vocab_size=len(tokenizer), initializer_range=0.2)
    cfg.bos_token_id, cfg.eos_token_id = tokenizer.bos_token_id, tokenizer.eos_token_id
    torch.manual_seed(0)
    model = LongcatFlashForCausalLM(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + torch.randn_like(p) * 0.3)
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(torch.randn_like(b) * 0.05)
                b[-CONFIG["zero_expert_num"] :] += 0.15
    model.save_pretrained(out)
    if released:
        import json

        from safetensors.numpy import load_file, save_file

        path = out / "model.safetensors"
        kept = {k: v for k, v in load_file(str(path)).items() if not _zero_slot(k)}
        save_file(kept, str(path), metadata={"format": "pt"})
        saved = json.loads((out / "config.json").read_text())
        release = {"attention_method": "MLA", "zero_expert_type": "identity", "rope_theta": 10000000.0}
        release |= {"mla_scale_q_lora": True, "mla_scale_kv_lora": True}
        (out / "config.json").write_text(json.dumps({**saved, **release}))
    return out, model.eval()


def _zero_slot(name: str) -> bool:
    parts = name.split(".")
    return ".mlp.experts." in name and int(parts[parts.index("experts") + 1]) >= CONFIG["n_routed_experts"]


def test_logits_match_transformers(tmp_path, backend):
    import torch

    from lantern.app.engine import LLM
    from tests.fixtures.teacher_forcing import assert_matches_reference

    folder, ref = longcat_folder(tmp_path / "longcat")
    llm = LLM(str(folder), backend=backend, dtype="float32", block_size=4, prefill_chunk_size=8, num_kv_blocks=64)
    try:
        cfg = llm.engine.model_config
        assert (cfg.num_layers, cfg.num_kv_layers, cfg.moe.zero_experts) == (2, 4, 2)
        assert cfg.mla.q_scale == 2**0.5 and cfg.mla.kv_scale == 2.0
        with torch.no_grad():  # (not vacuous: the zero experts are picked for the prompt's tokens)
            hidden = ref.model.embed_tokens(torch.tensor([llm.tokenizer.encode(PROMPT)]))[0]
            router = ref.model.layers[0].mlp.router
            _, _, ids = router(ref.model.layers[0].input_layernorm[0](hidden))
        assert (ids >= CONFIG["n_routed_experts"]).any()
        assert_matches_reference(llm, ref, PROMPT, steps=12)
    finally:
        llm.engine.shutdown()


def test_an_mlx_lm_quantized_folder_matches_mlx_lm(tmp_path, backend):
    """mlx_lm's own 4-bit conversion of the released layout (experts stacked, kv_b_proj split per head)."""
    from tests.fixtures.teacher_forcing import assert_close_to_mlx_lm, quantized_by_mlx_lm

    folder, _ = longcat_folder(tmp_path / "longcat", released=True)
    assert_close_to_mlx_lm(quantized_by_mlx_lm(folder, tmp_path / "q4"), backend, "longcat_flash")


def test_num_hidden_layers_counts_the_sublayers():
    """A stated num_hidden_layers (LongcatFlashConfig: two sublayers per layer) reads as num_layers."""
    keys = {k: v for k, v in CONFIG.items() if k != "num_layers"}
    cfg = ModelConfig.from_hf({**keys, "vocab_size": 300, "num_hidden_layers": 4})
    assert cfg.num_layers == 2 and cfg.num_kv_layers == 4


@pytest.mark.parametrize(
    "extra, key",
    [
        ({"router_bias": True}, "router_bias"),
        ({"num_key_value_heads": 2}, "num_key_value_heads"),
        ({"moe_topk": 9}, "moe_topk"),
        ({"qk_head_dim": 12}, "qk_head_dim"),
        ({"head_dim": 16}, "head_dim"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"zero_expert_type": "zero"}, "zero_expert_type"),
        ({"norm_topk_prob": True}, "norm_topk_prob"),
    ],
)
def test_what_it_cannot_compute_is_refused_by_name(extra, key):
    with pytest.raises(UnsupportedModelError, match=key):
        ModelConfig.from_hf({**CONFIG, "vocab_size": 300, **extra})

"""A config.json that states only a model's shape reads as its transformers config class fills the rest in: the
keys that change the maths or the loading (tying, norm epsilon, KV heads, head width, context) for the families
whose config classes have their own defaults (MLA families: tests/models/test_renamed_families.py). (End tokens come
from generation_config.json and the tokenizer as well; a class's placeholder ids are not asserted.)"""

from __future__ import annotations

import pytest

from lantern.app.models.spec import ModelConfig

# what every config.json states (transformers' save_pretrained too): Lantern reads them, it does not default them
_STATED = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
TYPES = [
    "granite_swa",
    "granitemoe_swa",
    "granitemoeshared",
    "hyperclovax",
    "ministral",
    "flint",
    "kolibri1",
    "lfm3",
    "internlm3",
    "iquestcoder",
    "sarvam_moe",
    "mllama_text_model",
]


@pytest.mark.parametrize("model_type", TYPES)
def test_unstated_keys_take_the_config_classes_defaults(model_type):
    from transformers import AutoConfig

    ref = AutoConfig.for_model(model_type)
    raw = {key: getattr(ref, key) for key in _STATED if getattr(ref, key, None) is not None}
    cfg = ModelConfig.from_hf({"model_type": model_type, **raw})
    assert (cfg.tie_word_embeddings, cfg.rms_norm_eps, cfg.num_kv_heads, cfg.max_position_embeddings) == (
        ref.tie_word_embeddings,
        ref.rms_norm_eps,
        ref.num_key_value_heads,
        ref.max_position_embeddings,
    )
    assert cfg.head_dim == (getattr(ref, "head_dim", None) or ref.hidden_size // ref.num_attention_heads)

"""Llama 3.2 Vision (mllama) served on text: transformers' MllamaForConditionalGeneration and MllamaForCausalLM,
tiny and random, saved by transformers; Lantern serves their language model -- the self-attention layers, the
cross-attention layers between them skipped as transformers skips them without an image -- with logits over the
head's rows within 1e-4 of transformers' own text-only forward through the paged cache on both backends (two torch
ranks too); the embedding's 8 input-only rows are not loaded and a prompt holding one of their ids is refused."""

from __future__ import annotations

import json

import pytest

from lantern.app.engine.errors import InvalidRequestError
from lantern.app.models.errors import UnsupportedModelError
from lantern.app.models.spec import ModelConfig

CROSS = [1, 3]  # of 5 layers: the self-attention ones are 0, 2 and 4


def _text_fields(tokenizer) -> dict:
    from tests.fixtures.tiny_models import tiny_text_config

    fields = {**tiny_text_config(tokenizer), "num_hidden_layers": 5, "cross_attention_layers": CROSS}
    fields["rope_parameters"] = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0}
    fields["rope_parameters"] |= {"low_freq_factor": 1.0, "high_freq_factor": 4.0}
    fields["rope_parameters"]["original_max_position_embeddings"] = 64
    return fields | {"pad_token_id": 0}


def _perturb_norms(model) -> None:
    import torch

    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            elif "gate" in name and p.dim() == 1:  # the cross-attention gates (zero at init): never read on text
                p.fill_(0.5)


@pytest.fixture(scope="module")
def wrapper_folder(tmp_path_factory):
    import torch
    from transformers import CONFIG_MAPPING, MllamaForConditionalGeneration

    from tests.fixtures.tiny_models import build_tokenizer

    out = tmp_path_factory.mktemp("mllama")
    tokenizer = build_tokenizer(out)
    vision = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_global_layers": 1}
    vision |= {"attention_heads": 2, "image_size": 28, "patch_size": 14, "max_num_tiles": 4}
    vision |= {"intermediate_layers_indices": [0], "vision_output_dim": 64}
    config = CONFIG_MAPPING["mllama"](text_config=_text_fields(tokenizer), vision_config=vision)
    torch.manual_seed(0)
    model = MllamaForConditionalGeneration(config).eval()
    _perturb_norms(model)
    model.save_pretrained(str(out), safe_serialization=True)
    return out, model


def _assert_serves(folder, reference, backend, **options) -> None:
    from lantern.app.engine import LLM, SamplingParams
    from tests.conformance.test_parity import PROMPT
    from tests.fixtures.teacher_forcing import assert_matches_reference

    llm = LLM(
        str(folder), backend=backend, dtype="float32", block_size=4, prefill_chunk_size=8, num_kv_blocks=64, **options
    )
    try:
        cfg = llm.engine.model_config
        vocab = cfg.vocab_size
        assert cfg.num_layers == 3 and cfg.checkpoint_layers == (0, 2, 4) and cfg.head_rows is None
        assert vocab == reference.config.get_text_config().vocab_size  # (the head's width: the 8 image rows not loaded)
        assert_matches_reference(llm, reference, PROMPT, steps=10)
        ids = llm.tokenizer.encode(PROMPT)
        params = SamplingParams(temperature=1.0, max_tokens=24, ignore_eos=True, seed=0)
        assert len(llm.generate([ids], params)[0].outputs[0].token_ids) == 24
        with pytest.raises(InvalidRequestError, match="prompt token ids"):  # (the image token, an input-only row)
            llm.generate([ids + [vocab]], params)
    finally:
        llm.engine.shutdown()


def test_the_vision_folder_serves_its_language_model(wrapper_folder, backend):
    folder, model = wrapper_folder
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == "mllama" and "vision_config" in config
    _assert_serves(folder, model, backend)


def test_two_torch_ranks_serve_it(wrapper_folder):
    """Tensor parallelism splits the vocabulary's embedding and head alike (the input-only rows are not loaded)."""
    folder, model = wrapper_folder
    _assert_serves(folder, model, "torch", tensor_parallel_size=2)


def test_a_text_only_folder_serves_the_same_model(wrapper_folder, tmp_path, backend):
    """MllamaForCausalLM (model_type mllama_text_model): the language model saved alone, under its own names."""
    import torch
    from transformers import MllamaForCausalLM

    folder, wrapper = wrapper_folder
    text = MllamaForCausalLM(wrapper.config.text_config).eval()
    with torch.no_grad():
        text.model.load_state_dict(wrapper.model.language_model.state_dict())
        text.lm_head.weight.copy_(wrapper.lm_head.weight)
    out = tmp_path / "mllama_text"
    text.save_pretrained(str(out), safe_serialization=True)
    for f in folder.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "vocab", "merges")):
            (out / f.name).write_bytes(f.read_bytes())
    assert json.loads((out / "config.json").read_text())["model_type"] == "mllama_text_model"
    _assert_serves(out, text, backend)


def _base(**extra) -> dict:
    fields = {"model_type": "mllama_text_model", "hidden_size": 64, "num_hidden_layers": 4, "vocab_size": 300}
    return fields | {"num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 96, **extra}


def test_defaults_follow_transformers_config_class():
    """A text_config that leaves cross_attention_layers out gets MllamaTextConfig's eight (the 11B's)."""
    cfg = ModelConfig.from_hf(_base(num_hidden_layers=40))
    assert cfg.num_layers == 32 and 3 not in cfg.checkpoint_layers and 38 not in cfg.checkpoint_layers
    assert cfg.head_rows is None and cfg.vocab_size == 300 and cfg.rope_theta == 500000.0


@pytest.mark.parametrize(
    "extra, key",
    [
        ({"cross_attention_layers": [0, 7]}, "cross_attention_layers"),
        ({"cross_attention_layers": [0, 1, 2, 3]}, "cross_attention_layers"),
        ({"cross_attention_layers": [1], "tie_word_embeddings": True}, "tie_word_embeddings"),
        ({"cross_attention_layers": [1], "hidden_act": "gelu"}, "hidden_act"),
    ],
)
def test_what_it_cannot_compute_is_refused_by_name(extra, key):
    with pytest.raises(UnsupportedModelError, match=key):
        ModelConfig.from_hf(_base(**extra))

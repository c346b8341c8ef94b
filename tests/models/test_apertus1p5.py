"""Apertus 1.5's language model (model_type apertus1p5_text): Apertus's layer over a vocabulary extended by the
visual and audio codes, its head pruned to the text ids (output_vocab_size). Lantern's logits over the head's rows
equal transformers' (whose logits are that wide) through the paged cache, the ids past them are -inf (never chosen),
on both backends; the pruned head is refused where it cannot be (tied, out of range) and with tensor parallelism."""

from __future__ import annotations

import numpy as np
import pytest

from lantern.app.models.errors import UnsupportedModelError
from lantern.app.models.spec import ModelConfig

HEAD_ROWS = 300


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from tests.fixtures.tiny_models import build_tokenizer, tiny_text_config

    out = tmp_path_factory.mktemp("apertus1p5")
    tokenizer = build_tokenizer(out)
    fields = {**tiny_text_config(tokenizer), "pad_token_id": 0, "output_vocab_size": HEAD_ROWS}
    assert fields["vocab_size"] > HEAD_ROWS
    config = AutoConfig.for_model("apertus1p5_text", **fields)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
    assert model.lm_head.out_features == HEAD_ROWS
    model.save_pretrained(str(out), safe_serialization=True)
    return out


def test_logits_over_the_heads_rows_match_transformers(folder, backend):
    import torch

    from lantern.app.engine import LLM, SamplingParams
    from tests.conformance.test_parity import PROMPT, hf_greedy, hf_model
    from tests.fixtures.teacher_forcing import teacher_forced_logits

    llm = LLM(str(folder), backend=backend, dtype="float32", block_size=4, prefill_chunk_size=8, num_kv_blocks=64)
    try:
        assert llm.engine.backend.model.cfg.head_rows == HEAD_ROWS
        ids = llm.tokenizer.encode(PROMPT)
        ref = hf_model(str(folder))
        want = hf_greedy(ref, ids, 12)
        with torch.no_grad():
            expected = ref(torch.tensor([ids + want])).logits[0].numpy()
        rows = list(teacher_forced_logits(llm.engine, ids, want))
        assert len(rows) == len(want)
        for pos, logits in rows:
            np.testing.assert_allclose(logits[:HEAD_ROWS], expected[pos], atol=1e-4, rtol=0, err_msg=f"position {pos}")
            assert np.isneginf(logits[HEAD_ROWS:]).all()
        params = SamplingParams(temperature=1.0, max_tokens=32, ignore_eos=True, seed=0)
        sampled = llm.generate([ids], params)[0].outputs[0].token_ids
        assert len(sampled) == 32 and max(sampled) < HEAD_ROWS  # (sampled at temperature 1: never past the head)
    finally:
        llm.engine.shutdown()


@pytest.mark.parametrize(
    "extra",
    [{"output_vocab_size": 500}, {"output_vocab_size": 0}, {"output_vocab_size": 100, "tie_word_embeddings": True}],
)
def test_a_head_that_cannot_be_pruned_is_refused(extra):
    base = {"model_type": "apertus1p5_text", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4}
    with pytest.raises(UnsupportedModelError, match="output_vocab_size"):
        ModelConfig.from_hf({**base, "intermediate_size": 96, "vocab_size": 400, **extra})


def test_tensor_parallelism_is_refused_for_a_pruned_head():
    from lantern.backends.torch.parallel import local_config

    cfg = ModelConfig.from_hf(
        {
            "model_type": "apertus1p5_text",
            "hidden_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "intermediate_size": 96,
            "vocab_size": 400,
            "output_vocab_size": 300,
        }
    )
    with pytest.raises(ValueError, match="narrower than the vocabulary"):
        local_config(cfg, 2)


def test_the_multimodal_folder_serves_its_language_model(folder, tmp_path, backend):
    """An apertus1p5 folder (its image and audio tokenizers beside the language model, as transformers saves it):
    the language model and its pruned head, logits equal to the wrapper's own text-only forward."""
    import json

    import torch
    from safetensors.torch import load_file
    from transformers import CONFIG_MAPPING, AutoModelForImageTextToText

    from lantern.app.engine import LLM
    from tests.conformance.test_parity import PROMPT

    text = {k: v for k, v in json.loads((folder / "config.json").read_text()).items() if k != "architectures"}
    vocab = text["vocab_size"]
    vision = {"codebook_size": 40, "embed_dim": 32, "latent_channels": 32, "base_channels": 32}
    vision |= {"channel_multiplier": [1, 1], "num_res_blocks": 1, "attn_resolutions": [], "resolution": 32}
    audio = {"model_type": "wavtokenizer_encoder", "codebook_size": vocab - 340, "hidden_size": 16}
    audio |= {"codebook_dim": 16, "num_filters": 4, "num_lstm_layers": 1, "decoder_num_layers": 1}
    audio |= {"decoder_hidden_size": 16, "decoder_intermediate_size": 32, "decoder_attention_num_groups": 4}
    config = CONFIG_MAPPING["apertus1p5"](
        text_config=text, vision_config=vision, audio_config=audio, image_token_offset=300, audio_token_offset=340
    )
    torch.manual_seed(0)
    model = AutoModelForImageTextToText.from_config(config).eval()
    weights = load_file(folder / "model.safetensors")
    with torch.no_grad():
        model.get_decoder().load_state_dict(
            {k.removeprefix("model."): v for k, v in weights.items() if "lm_head" not in k}
        )
        model.lm_head.weight.copy_(weights["lm_head.weight"])
    out = tmp_path / "apertus1p5"
    model.save_pretrained(out)
    for f in folder.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "vocab", "merges")):
            (out / f.name).write_bytes(f.read_bytes())
    llm = LLM(str(out), backend=backend, dtype="float32", block_size=4, prefill_chunk_size=8, num_kv_blocks=64)
    try:
        cfg = llm.engine.model_config
        assert cfg.multimodal_wrapper == "apertus1p5" and cfg.head_rows == HEAD_ROWS
        ids = llm.tokenizer.encode(PROMPT)
        with torch.no_grad():
            expected = model(input_ids=torch.tensor([ids])).logits[0].numpy()
        from tests.fixtures.teacher_forcing import teacher_forced_logits

        rows = list(teacher_forced_logits(llm.engine, ids[:-4], ids[-4:]))
        assert len(rows) == 4
        for pos, logits in rows:
            np.testing.assert_allclose(logits[:HEAD_ROWS], expected[pos], atol=1e-4, rtol=0, err_msg=f"position {pos}")
    finally:
        llm.engine.shutdown()

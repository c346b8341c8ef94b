"""Ministral 3: Llama's layout with YaRN and Llama 4's attention temperature, on both backends.

transformers' Ministral3Attention multiplies each query, after its rope, by
1 + beta * log(1 + floor(position / original_max_position_embeddings)). A tiny random Ministral 3
with an original length of 16 runs a ~40-token prompt and 32 greedy tokens, so its queries cross
three temperature steps; it is served from its HF folder, from the Mistral3ForConditionalGeneration
folder wrapping it (vision tower skipped), and from GGUF files written the way llama.cpp's converter
writes them (arch mistral3: Ministral3Model, a LlamaModel that permutes q/k and adds
yarn_log_multiplier and attention.temperature_scale; and arch llama with the same keys, as Mistral's
llama-arch conversions may state them). Each must give transformers' logits within 1e-4 (float32)
and its 32 greedy tokens; the same weights without the temperature are > 1e-3 away, so the test is
not vacuous. Temperatures Lantern cannot place are refused naming the key.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from lantern.app.engine import LLM, SamplingParams
from lantern.app.models.family_ministral import AttnTemperature
from lantern.app.models.gguf_config import hf_config_from_gguf, missing_config_keys
from lantern.app.models.loader import resolve_model
from lantern.app.models.spec import ModelConfig, UnsupportedModelError
from tests.conformance.test_parity import hf_greedy
from tests.fixtures.gguf_writer import write_llama_hparams, write_llama_tensors, write_tokenizer
from tests.fixtures.teacher_forcing import teacher_forced_logits
from tests.fixtures.tiny_models import build_tokenizer

BETA = 0.1  # Ministral 3's llama_4_scaling_beta
ROPE = {
    "rope_type": "yarn",
    "rope_theta": 1000000.0,
    "factor": 16.0,
    "original_max_position_embeddings": 16,
    "max_position_embeddings": 256,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "mscale": 1.0,
    "mscale_all_dim": 1.0,
    "llama_4_scaling_beta": BETA,
}
PROMPT = "Paged attention stores keys and values in blocks, while continuous batching schedules"
N = 32


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LANTERN_CACHE", str(tmp_path / "cache"))


def _text_config(vocab: int, beta: float = BETA, **extra):
    from transformers import Ministral3Config

    return Ministral3Config(
        vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=256, rms_norm_eps=1e-5,
        initializer_range=0.2, rope_parameters={**ROPE, "llama_4_scaling_beta": beta}, **extra,
    )  # fmt: skip


def _randomize(model: torch.nn.Module) -> None:
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:  # exercise norm weights too, not just ones
                p.copy_(1.0 + 0.1 * torch.randn_like(p))


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """(the Ministral 3 folder, the Mistral3ForConditionalGeneration folder around the same weights)."""
    from transformers import Ministral3ForCausalLM, Mistral3Config, Mistral3ForConditionalGeneration

    root = tmp_path_factory.mktemp("ministral3")
    tok = build_tokenizer(root / "text")
    ids = {"bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id}
    torch.manual_seed(0)
    model = Ministral3ForCausalLM(_text_config(len(tok), **ids))
    _randomize(model)
    model.save_pretrained(str(root / "text"))
    vision = {"model_type": "pixtral", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1}
    vision.update(num_attention_heads=2, head_dim=16, image_size=28, patch_size=14)
    wrapper_cfg = Mistral3Config(
        text_config=_text_config(len(tok), **ids).to_dict(), vision_config=vision, tie_word_embeddings=False, **ids
    )
    wrapper = Mistral3ForConditionalGeneration(wrapper_cfg)
    wrapper.model.language_model.load_state_dict(model.model.state_dict())
    wrapper.lm_head.load_state_dict(model.lm_head.state_dict())
    build_tokenizer(root / "wrapper")
    wrapper.save_pretrained(str(root / "wrapper"))
    return root / "text", root / "wrapper"


def convert(src: Path, path: Path, arch: str = "mistral3") -> Path:
    """`src` (a float32 HF ministral3 folder) as an F32 GGUF, as convert_hf_to_gguf.py writes it:
    TextModel's and LlamaModel's keys, then Ministral3Model's yarn_log_multiplier and temperature."""
    import gguf
    from transformers import AutoTokenizer

    cfg = json.loads((src / "config.json").read_text())
    heads, kv, rope = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["rope_parameters"]
    w = gguf.GGUFWriter(path, arch)
    write_llama_hparams(w, cfg, rope["rope_theta"])
    w.add_key_length(cfg["head_dim"])
    w.add_value_length(cfg["head_dim"])
    w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    w.add_rope_scaling_factor(rope["factor"])
    w.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
    w.add_rope_scaling_yarn_beta_fast(rope["beta_fast"])
    w.add_rope_scaling_yarn_beta_slow(rope["beta_slow"])
    w.add_vocab_size(cfg["vocab_size"])
    w.add_rope_dimension_count(cfg["head_dim"])
    w.add_rope_scaling_yarn_log_mul(rope["mscale_all_dim"])
    w.add_attn_temperature_scale(rope["llama_4_scaling_beta"])
    fast = AutoTokenizer.from_pretrained(str(src))
    write_tokenizer(w, fast)
    write_llama_tensors(w, src, gguf.MODEL_ARCH.MISTRAL3, heads, kv)
    return path


@pytest.fixture(scope="module")
def ggufs(folders, tmp_path_factory):
    root = tmp_path_factory.mktemp("ministral3-gguf")
    return {arch: convert(folders[0], root / f"tiny-{arch}.gguf", arch) for arch in ("mistral3", "llama")}


@pytest.fixture(scope="module")
def reference(folders):
    """(prompt ids, transformers' 32 greedy tokens, its logits over prompt + greedy, the same
    weights' logits without the temperature)."""
    from transformers import AutoTokenizer, Ministral3ForCausalLM

    model = Ministral3ForCausalLM.from_pretrained(str(folders[0]), dtype=torch.float32).eval()
    prompt = AutoTokenizer.from_pretrained(str(folders[0])).encode(PROMPT)
    assert 36 <= len(prompt) <= 48, len(prompt)  # with 32 more tokens: positions 0..79, temperature steps 0..4
    greedy = hf_greedy(model, prompt, N)
    assert len(set(greedy)) > 8, "degenerate reference: the tiny model should produce varied tokens"
    ids = torch.tensor([prompt + greedy])
    with torch.no_grad():
        logits = model(ids).logits[0].numpy()
        model.config.rope_parameters["llama_4_scaling_beta"] = 0.0
        plain = model(ids).logits[0].numpy()
    return prompt, greedy, logits, plain


def test_temperature_changes_the_logits(reference):
    prompt, _, logits, plain = reference
    # Not vacuous: from position 16 on, the model without the temperature is far from the checkpoint
    # (before it the scale is exactly 1).
    assert np.abs(logits[:16] - plain[:16]).max() == 0.0
    assert np.abs(logits[len(prompt) - 1 :] - plain[len(prompt) - 1 :]).max() > 1e-3


@pytest.mark.parametrize("source", ["folder", "wrapper", "gguf-mistral3", "gguf-llama"])
def test_logits_and_greedy_match_transformers(source, backend, folders, ggufs, reference):
    path = {"folder": folders[0], "wrapper": folders[1]}.get(source) or ggufs[source.split("-")[1]]
    prompt, greedy, expected, _ = reference
    llm = LLM(str(path), backend=backend, dtype="float32", block_size=4, prefill_chunk_size=8, num_kv_blocks=64)
    try:
        assert llm.tokenizer.encode(PROMPT) == prompt
        assert llm.engine.model_config.attn_temperature == AttnTemperature(BETA, 16)
        out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=N, ignore_eos=True))
        assert out[0].outputs[0].token_ids == greedy
        rows = list(teacher_forced_logits(llm.engine, prompt, greedy))
        assert len(rows) == N
        err = max(float(np.abs(logits - expected[pos]).max()) for pos, logits in rows)
    finally:
        llm.engine.shutdown()
    assert err <= 1e-4, err


def test_configs_equal_the_checkpoints(folders, ggufs):
    expected = ModelConfig.from_hf(json.loads((folders[0] / "config.json").read_text()))
    assert expected.attn_temperature == AttnTemperature(BETA, 16)
    assert expected.rope_scaling["rope_type"] == "yarn" and expected.layer_windows is None
    for path in ggufs.values():
        assert resolve_model(str(path)).spec.config == expected
    wrapped = resolve_model(str(folders[1])).spec.config
    assert wrapped.multimodal_wrapper == "mistral3"
    assert dataclasses.replace(wrapped, multimodal_wrapper=None) == expected


def test_defaults_are_ministral3_configs():
    from transformers import Ministral3Config

    dims = {"vocab_size": 400, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2}
    ours = ModelConfig.from_hf({"model_type": "ministral3", **dims, "num_attention_heads": 8})
    hf = Ministral3Config(**dims, num_attention_heads=8)
    assert (ours.head_dim, ours.num_kv_heads, ours.max_position_embeddings) == (128, 8, 262144)
    assert (hf.head_dim, hf.num_key_value_heads, hf.max_position_embeddings) == (128, 8, 262144)
    rope = hf.rope_parameters
    assert ours.rope_theta == rope["rope_theta"] and ours.rope_scaling["factor"] == rope["factor"]
    assert ours.attn_temperature == AttnTemperature(rope["llama_4_scaling_beta"], 16384)
    # the wrapper ties by its own key (Mistral3Config's default: tied)
    text = hf.to_dict()
    assert ModelConfig.from_hf({"model_type": "mistral3", "text_config": text}).tie_word_embeddings is True


def test_unplaceable_temperatures_are_refused():
    rope = {"rope_type": "default", "rope_theta": 10000.0, "llama_4_scaling_beta": 0.1}
    cfg = {"model_type": "ministral3", "vocab_size": 400, "hidden_size": 64, "intermediate_size": 128}
    cfg.update(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16, rope_parameters=rope)
    with pytest.raises(UnsupportedModelError, match=r"^rope_parameters\.original_max_position_embeddings=null"):
        ModelConfig.from_hf(cfg)
    for arch, expert in (("qwen2", False), ("llama", True)):
        md = {"general.architecture": arch, f"{arch}.attention.temperature_scale": np.float32(0.1)}
        if expert:  # a Mixtral file
            md.update({f"{arch}.expert_count": 4, f"{arch}.expert_used_count": 2})
        with pytest.raises(UnsupportedModelError, match=rf"^f\.gguf: {arch}\.attention\.temperature_scale=0\.1 "):
            missing_config_keys(md, "f.gguf", {})
    md = {"general.architecture": "deepseek2", "deepseek2.attention.temperature_scale": np.float32(0.1)}
    with pytest.raises(UnsupportedModelError, match=r"temperature_scale=0\.1 is not implemented for architecture"):
        hf_config_from_gguf(md, {}, "f.gguf")


@pytest.fixture(scope="module")
def mistral_small(tmp_path_factory):
    """A Mistral Small 3.x-shaped folder: the mistral3 wrapper around a plain mistral text model,
    tied by the wrapper's default (no tie_word_embeddings key); with transformers' reference."""
    from transformers import AutoTokenizer, Mistral3Config, Mistral3ForConditionalGeneration, MistralConfig

    root = tmp_path_factory.mktemp("mistral-small")
    tok = build_tokenizer(root)
    ids = {"bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id}
    text = MistralConfig(
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=256, sliding_window=None,
        initializer_range=0.2, **ids,
    )  # fmt: skip
    vision = {"model_type": "pixtral", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1}
    vision.update(num_attention_heads=2, head_dim=16, image_size=28, patch_size=14)
    torch.manual_seed(1)
    model = Mistral3ForConditionalGeneration(Mistral3Config(text_config=text.to_dict(), vision_config=vision, **ids))
    _randomize(model)
    model.save_pretrained(str(root))
    config = json.loads((root / "config.json").read_text())
    config.pop("tie_word_embeddings", None)  # Mistral3Config's default (tied) decides
    (root / "config.json").write_text(json.dumps(config))
    model = Mistral3ForConditionalGeneration.from_pretrained(str(root), dtype=torch.float32).eval()
    assert model.lm_head.weight.data_ptr() == model.model.language_model.embed_tokens.weight.data_ptr()
    prompt = AutoTokenizer.from_pretrained(str(root)).encode(PROMPT)
    greedy = hf_greedy(model, prompt, N)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + greedy])).logits[0].numpy()
    return root, prompt, greedy, logits


def test_mistral_small_wrapper_serves_its_language_model(mistral_small, backend):
    root, prompt, greedy, expected = mistral_small
    llm = LLM(str(root), backend=backend, dtype="float32", block_size=4, prefill_chunk_size=8, num_kv_blocks=64)
    try:
        config = llm.engine.model_config
        assert (config.architecture, config.multimodal_wrapper, config.tie_word_embeddings) == (
            "mistral",
            "mistral3",
            True,
        )
        out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=N, ignore_eos=True))
        assert out[0].outputs[0].token_ids == greedy
        rows = list(teacher_forced_logits(llm.engine, prompt, greedy))
        err = max(float(np.abs(logits - expected[pos]).max()) for pos, logits in rows)
    finally:
        llm.engine.shutdown()
    assert err <= 1e-4, err

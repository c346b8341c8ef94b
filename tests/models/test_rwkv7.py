"""RWKV-7 folders (model_type rwkv7 in flash-linear-attention's layout: no transformers class): mlx_lm's rwkv7 model
is the reference. A tiny folder (2 layers of 2 heads of 64, random weights drawn where trained ones lie: mixes in
[0, 1], unit-norm-ish key scales) is served on both backends through 4-token prefill chunks (each chunk carries the
token shifts and wkv states of the one before) and compared, teacher-forced, with mlx_lm's forward on the float
folder and on a 4-bit folder its code made; sequences batched together answer as each alone."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from lantern.app.models.spec import ModelConfig, UnsupportedModelError
from tests.fixtures.remote_code_folders import save_folder, start_folder
from tests.fixtures.rwkv_world import convert_rwkv7, write_tokenizer
from tests.fixtures.teacher_forcing import (
    assert_batch_answers_as_each_alone,
    assert_close_to_mlx_lm,
    assert_files_agree,
    assert_float_folder_matches_mlx_lm,
    quantized_by_mlx_lm,
)

HIDDEN, HEAD_DIM, LAYERS, WIDTH = 128, 64, 2, 256  # (head_dim 64: every RWKV-7's, where mlx_lm's g_norm eps is fla's)
RANKS = {"decay_low_rank_dim": 8, "gate_low_rank_dim": 16, "a_low_rank_dim": 8, "v_low_rank_dim": 4}
PROMPT = "Paged attention stores keys and values in blocks of a fixed size"
FORCED = [5, 17, 42, 99, 7, 3, 250, 11, 60, 2, 33, 18]


def rwkv7_folder(out, tie: bool = False, world: int | None = None, **shape: int):
    """A folder as flash-linear-attention saves an RWKV7ForCausalLM (its mixes [1, 1, D], k_k, k_a and g_norm [D]);
    world: with RWKV's World tokenizer cut to that many tokens (rwkv_world.write_tokenizer), not the tests' BPE one.
    shape: hidden / head_dim / layers / width / vocab other than the tests' (scripts/bench_hybrid.py's real ones)."""
    d, head_dim = shape.get("hidden", HIDDEN), shape.get("head_dim", HEAD_DIM)
    layers, width = shape.get("layers", LAYERS), shape.get("width", WIDTH)
    ranks = {key: shape.get(key, rank) for key, rank in RANKS.items()}
    cfg = {"model_type": "rwkv7", "architectures": ["RWKV7ForCausalLM"], "hidden_size": d, "head_dim": head_dim}
    cfg |= {"num_hidden_layers": layers, "intermediate_size": width, "norm_eps": 1e-5, "hidden_act": "sqrelu"}
    cfg |= {"attn_mode": "chunk", "norm_first": True, "norm_bias": True, "tie_word_embeddings": tie, **ranks}
    cfg, w = start_folder(out, cfg)
    if world is not None:
        write_tokenizer(out, world)
        cfg |= {"vocab_size": world + 1, "bos_token_id": 0, "eos_token_id": 0}
    cfg["vocab_size"] = shape.get("vocab", cfg["vocab_size"])
    (out / "config.json").write_text(json.dumps(cfg))
    vocab, scale = cfg["vocab_size"], (HIDDEN / d) ** 0.5  # (wider matrices drawn smaller: outputs of one size)
    t = {"model.embeddings.weight": w(vocab, d, scale=1.0), "model.norm.weight": 1 + w(d), "model.norm.bias": w(d)}
    if not tie:
        t["lm_head.weight"] = w(vocab, d, scale=0.3 * scale)
    uniform = lambda *shape: w.rng.uniform(0, 1, shape).astype(np.float32)
    for i in range(layers):
        p = f"model.layers.{i}"
        norms = ("pre_norm", "attn_norm", "ffn_norm") if i == 0 else ("attn_norm", "ffn_norm")
        for norm in norms:
            t[f"{p}.{norm}.weight"], t[f"{p}.{norm}.bias"] = 1 + w(d), w(d)
        a = f"{p}.attn"
        for mu in ("x_r", "x_w", "x_k", "x_v", "x_a", "x_g"):
            t[f"{a}.{mu}"] = uniform(1, 1, d)
        t[f"{a}.k_k"], t[f"{a}.k_a"] = 0.85 + w(d), 1 + w(d)
        t[f"{a}.r_k"] = w(d // head_dim, head_dim, scale=0.5)  # (its own parameter is [heads, head_dim])
        for proj in ("r_proj", "k_proj", "v_proj", "o_proj"):
            t[f"{a}.{proj}.weight"] = w(d, d, scale=0.25 * scale)
        loras = [("w_lora", ranks["decay_low_rank_dim"], True), ("a_lora", ranks["a_low_rank_dim"], True)]
        loras += [("g_lora", ranks["gate_low_rank_dim"], False)] + ([("v_lora", ranks["v_low_rank_dim"], True)] * i)
        for name, rank, bias in loras:
            t[f"{a}.{name}.lora.0.weight"] = w(rank, d, scale=0.3 * scale)
            t[f"{a}.{name}.lora.2.weight"] = w(d, rank, scale=0.3)
            if bias:
                t[f"{a}.{name}.lora.2.bias"] = w(d, scale=0.5)
        t[f"{a}.g_norm.weight"], t[f"{a}.g_norm.bias"] = 1 + w(d), w(d)
        t[f"{p}.ffn.x_k"] = uniform(d)
        t[f"{p}.ffn.key.weight"] = w(width, d, scale=0.2 * scale)
        t[f"{p}.ffn.value.weight"] = w(d, width, scale=0.2 * (WIDTH / width) ** 0.5)
    return save_folder(out, t)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return rwkv7_folder(tmp_path_factory.mktemp("rwkv7"))


def test_float_folder_matches_mlx_lm(folder, backend, by_file_tokenizer):
    assert_float_folder_matches_mlx_lm(folder, backend, PROMPT, FORCED, prefill_chunk_size=4)


def test_tied_head_matches_mlx_lm(tmp_path, backend, by_file_tokenizer):
    assert_float_folder_matches_mlx_lm(rwkv7_folder(tmp_path / "tied", tie=True), backend, PROMPT, FORCED[:4])


def test_mlx_lm_made_folder_matches_mlx_lm(folder, tmp_path, backend, by_file_tokenizer):
    assert_close_to_mlx_lm(quantized_by_mlx_lm(folder, tmp_path / "q4"), backend, "rwkv7")


def test_a_batch_answers_as_each_prompt_alone(folder, backend):
    """Decode rows beside other sequences' prefill chunks each read and write only their own state slot."""
    prompts = ["Continuous batching lets new requests join", "Blocks", "A state per sequence, then more tokens"]
    assert_batch_answers_as_each_alone(folder, backend, prompts, prefill_chunk_size=4)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """(folder with a cut World vocabulary, its GGUF as llama.cpp's converter writes it)."""
    root = tmp_path_factory.mktemp("rwkv7_world")
    folder = rwkv7_folder(root / "hf", world=1000)
    return folder, convert_rwkv7(folder, root / "tiny-rwkv7.gguf")


def test_gguf_answers_as_its_folder(world, backend):
    """llama.cpp's rwkv7 GGUF (its names, fused mixes, escaped World tokens) reads as the folder it came from: the
    same tokenizer ids and, teacher-forced, the same logits. (llama-server computes the same tokens on it:
    scripts/check_gguf_vs_llamacpp.py --only rwkv7.)"""
    assert_files_agree(world, backend, PROMPT, FORCED, atol=1e-5)


def test_q8_0_gguf_answers_as_its_values(world, tmp_path, backend):
    """A Q8_0 file (its matrices quantized, as llama.cpp's quantizer leaves RWKV-7's vectors) served quantized
    computes what the same values in float32 compute, within the backends' int8 kernels' rounding."""
    from lantern.app.engine import LLM
    from tests.fixtures.teacher_forcing import teacher_forced_logits

    rows = []
    for dequantized in (True, False):
        path = convert_rwkv7(world[0], tmp_path / f"q8-{dequantized}.gguf", "q8_0", dequantized=dequantized)
        llm = LLM(str(path), backend=backend, dtype="float32", block_size=4, prefill_chunk_size=8, num_kv_blocks=64)
        try:
            ids = llm.tokenizer.encode(PROMPT, add_special_tokens=False)
            rows.append(np.array([logits for _, logits in teacher_forced_logits(llm.engine, ids, FORCED)]))
        finally:
            llm.engine.shutdown()
    reference, quantized = rows
    assert np.abs(quantized - reference).max() < 1e-2 * np.abs(reference).max()


def test_gguf_tokenizer_keeps_the_end_of_turn_an_ordinary_token(world):
    """ "\n\n" (261, the file's eot) is where generation stops, yet text holding it tokenizes as llama.cpp does (not
    split around it as a special token); a file naming llama.cpp's built-in "rwkv-world" format chats in it."""
    from rwkv.rwkv_tokenizer import TRIE_TOKENIZER

    from lantern.app.models.loader import gguf_config_and_tokenizer
    from tests.fixtures.rwkv_world import VOCAB_FILE

    cfg, tok = gguf_config_and_tokenizer(world[1])
    trie = TRIE_TOKENIZER(str(world[0] / VOCAB_FILE))
    for text in ("Hi\n\n\nthere", "a\n\nb", "\n\n\n\n"):
        assert tok.encode(text, add_special_tokens=False) == trie.encode(text), repr(text)
    assert 261 in cfg["eos_token_id"] and tok.eos_token_id == 0
    assert tok.decode(trie.encode("a\n\nb"), skip_special_tokens=True) == "a\n\nb"
    messages = [{"role": "system", "content": "Be brief."}, {"role": "tool", "content": "x"}]
    messages += [{"role": "user", "content": " Hi "}]  # (llama.cpp's format has no tool turns: skipped)
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == "System: Be brief.\n\nUser: Hi\n\nAssistant:"


_BASE = {"model_type": "rwkv7", "vocab_size": 400, "hidden_size": 64, "num_hidden_layers": 2, "head_dim": 16}


def test_config():
    cfg = ModelConfig.from_hf(_BASE)  # (RWKV7Config's defaults: hidden_ratio 4 up to a multiple of 32, its ranks)
    assert ModelConfig.from_hf({**_BASE, "value_dim": [64, 64]}).rwkv7 == cfg.rwkv7
    assert (cfg.intermediate_size, cfg.num_heads, cfg.num_kv_layers, cfg.recurrent) == (256, 4, 0, True)
    assert (cfg.rwkv7.decay_rank, cfg.rwkv7.gate_rank, cfg.rwkv7.a_rank, cfg.rwkv7.v_rank) == (64, 128, 64, 16)
    for key, value in (
        ("hidden_act", "relu"),
        ("norm_first", False),
        ("norm_bias", False),
        ("value_dim", 128),
        ("value_dim", [64, 128]),  # (newer configs state it per layer: [hidden_size] * layers is accepted)
        ("attn", {"layers": [1]}),
        ("head_dim", 24),
    ):
        with pytest.raises(UnsupportedModelError, match=f"^{re.escape(key)}="):
            ModelConfig.from_hf({**_BASE, key: value})


@pytest.mark.parametrize(
    ("raw", "part"),
    [
        (_BASE, "RWKV-7"),
        ({"model_type": "talkie", "num_hidden_layers": 2}, "Talkie"),
        ({"model_type": "iquestloopcoder", "vocab_size": 400, "hidden_size": 64, "intermediate_size": 96}, "IQuest"),
    ],
)
def test_tensor_parallelism_is_refused_for_per_head_vectors(raw, part):
    """(RWKV-7's state and vectors, Talkie's query gains and IQuest Loop's gates are per head: not split by rank)"""
    from lantern.backends.torch.parallel import local_config

    cfg = ModelConfig.from_hf({"num_attention_heads": 4, "num_hidden_layers": 2, **raw})
    with pytest.raises(ValueError, match=part):
        local_config(cfg, 2)

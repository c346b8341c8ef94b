"""Nemotron-NAS (DeciLM: Llama-3.1-Nemotron-51B, -3.3-Nemotron-Super-49B, -3.1-Nemotron-Ultra-253B): a folder of
six layers of every kind (tests/fixtures/nemotron_nas.py) and its `deci` GGUF as llama.cpp's converter writes it,
served on both backends: logits within 1e-4 of the reference forward composed of transformers' Llama modules through
the paged cache (chunked prefill, 4-token blocks), 32 greedy tokens equal; the config read per layer, refusals
naming the key."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest

from lantern.app.engine import LLM, SamplingParams
from lantern.app.models.spec import ModelConfig, UnsupportedModelError
from tests.fixtures.nemotron_nas import BLOCKS, convert_deci, write_folder
from tests.fixtures.teacher_forcing import teacher_forced_logits

PROMPT = [5, 77, 123, 42, 300, 17, 9, 250, 31, 64, 11]


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    root = tmp_path_factory.mktemp("nemotron_nas")
    folder, ref = write_folder(root / "hf")
    return folder, convert_deci(folder, root / "tiny-deci.gguf"), ref


def _check(path, ref, backend: str, forced: int = 32) -> None:
    want = ref.greedy(PROMPT, forced)
    expected = ref.logits(PROMPT + want)
    llm = LLM(str(path), backend=backend, dtype="float32", block_size=4, prefill_chunk_size=8, num_kv_blocks=64)
    try:
        rows = list(teacher_forced_logits(llm.engine, PROMPT, want))
        assert len(rows) == forced
        for pos, logits in rows:
            np.testing.assert_allclose(logits, expected[pos], atol=1e-4, rtol=0, err_msg=f"position {pos}")
        out = llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=forced, ignore_eos=True))
        assert out[0].outputs[0].token_ids == want
    finally:
        llm.engine.shutdown()


@pytest.mark.parametrize("kind", ["folder", "gguf"])
def test_matches_the_reference(made, kind, backend):
    folder, gguf_path, ref = made
    _check(folder if kind == "folder" else gguf_path, ref, backend)


def test_config_reads_each_layer(made):
    cfg = ModelConfig.from_hf(json.loads((made[0] / "config.json").read_text()))
    assert cfg.nas.attention == ("attention", "none", "linear", "attention", "attention", "none")
    assert cfg.nas.kv_heads == (2, 0, 0, 1, 4, 0)
    assert cfg.nas.mlp_widths == (256, 256, 0, 512, 0, 0)  # find_multiple(int(2 * mult * 64 / 3), 256)
    assert cfg.kv_shapes == ((2, 16), (1, 16), (4, 16))  # the attention layers only, each its own
    assert cfg.rope_scaling["rope_type"] == "llama3"


def test_gguf_reads_as_the_folder(made):
    from lantern.app.models.gguf_config import hf_config_from_gguf
    from lantern.app.models.gguf_names import read_gguf_index

    folder, path, _ = made
    index = read_gguf_index(str(path))
    from_file = ModelConfig.from_hf(hf_config_from_gguf(index.metadata, {t.name: t for t in index.tensors}))
    from_folder = ModelConfig.from_hf(json.loads((folder / "config.json").read_text()))
    assert (from_file.nas, from_file.kv_shapes) == (from_folder.nas, from_folder.kv_shapes)
    assert from_file.rope_scaling["factor"] == from_folder.rope_scaling["factor"]


def _with(block: int, part: str, **change):
    cfg = json.loads(json.dumps({"model_type": "nemotron-nas", "vocab_size": 400, "hidden_size": 64}))
    blocks = copy.deepcopy(BLOCKS)
    blocks[block][part].update(change)
    return {**cfg, "num_attention_heads": 4, "num_hidden_layers": len(blocks), "block_configs": blocks}


@pytest.mark.parametrize(
    "raw,key",
    [
        (_with(0, "attention", window_length=8, num_sink_tokens=4), "window_length"),
        (_with(0, "attention", n_heads_in_group=3), "n_heads_in_group"),
        (_with(1, "ffn", replace_with_linear=True, ffn_mult=None), "replace_with_linear"),
        (_with(1, "ffn", sparsify=["mlp"]), "sparsify"),
        (_with(1, "ffn", ffn_mult=0), "ffn_mult"),
        ({**_with(0, "ffn"), "num_hidden_layers": 5}, "block_configs"),
        ({**_with(0, "ffn"), "attention_bias": True}, "attention_bias"),
        ({**_with(0, "ffn"), "hidden_act": "gelu"}, "hidden_act"),
    ],
)
def test_unimplemented_keys_are_refused_by_name(raw, key):
    with pytest.raises(UnsupportedModelError, match=key):
        ModelConfig.from_hf(raw)


def test_tensor_parallelism_is_refused_in_one_line(made):
    from lantern.backends.torch.parallel import local_config

    cfg = ModelConfig.from_hf(json.loads((made[0] / "config.json").read_text()))
    with pytest.raises(ValueError, match="Nemotron-NAS"):
        local_config(cfg, 2)


def test_mlx_lm_made_folder_matches_mlx_lm(tmp_path, backend, monkeypatch):
    """A 4-bit folder mlx_lm's own code quantized and saved (its nemotron-nas model: no linear layer, which it names
    otherwise), served against mlx_lm's forward. (mlx_lm loads its tokenizer through AutoTokenizer, which
    transformers 5 cannot build from this remote-code config: the tokenizer file's own class instead.)"""
    import transformers

    from tests.fixtures.teacher_forcing import assert_close_to_mlx_lm, quantized_by_mlx_lm

    def by_file(path, *args, **kwargs):
        return transformers.PreTrainedTokenizerFast.from_pretrained(path)

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", by_file)
    blocks = copy.deepcopy(BLOCKS)
    blocks[2]["attention"] = {"no_op": True}
    src, _ = write_folder(tmp_path / "hf", blocks)
    assert_close_to_mlx_lm(quantized_by_mlx_lm(src, tmp_path / "q4"), backend, "nemotron-nas")


def test_mlx_lm_name_of_the_linear_layer_is_read(made, tmp_path):
    """mlx_lm saves the 51B's linear layer as self_attn.linear: read as the remote code's self_attn.linear_attn."""
    import shutil

    from safetensors.torch import load_file, save_file

    folder, _, ref = made
    renamed = tmp_path / "renamed"
    shutil.copytree(folder, renamed)
    tensors = load_file(renamed / "model.safetensors")
    tensors["model.layers.2.self_attn.linear.weight"] = tensors.pop("model.layers.2.self_attn.linear_attn.weight")
    save_file(tensors, renamed / "model.safetensors")
    _check(renamed, ref, "torch", forced=8)

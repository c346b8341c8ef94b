"""Nanbeige 4.2 (nanbeige, remote code: no transformers class): Llama's layers run num_loops times over the same
tokens, each pass with its own K/V, the final norm between loops unless skip_loop_final_norm. Tiny folders in the
released layout (a Llama checkpoint under Nanbeige's config), checked against a reference nobody here wrote: mlx_lm's
own nanbeige model, teacher-forced through the paged cache on both backends; the same values as llama.cpp's converter
writes them to GGUF (q/k permuted as a LlamaModel's, num_loops / skip_loop_final_norm keys) read the same."""

from __future__ import annotations

import json

import pytest

from lantern.app.models.errors import UnsupportedModelError
from lantern.app.models.spec import ModelConfig

CASES = {"norm_between": {"num_loops": 2}, "skip_norm": {"num_loops": 3, "skip_loop_final_norm": True}}
PROMPT = "Paged attention stores keys and values in blocks"


def nanbeige_folder(out, bias: bool = True, **loops):
    """A tiny Llama folder (with q/k/v and o biases unless bias is false: llama.cpp's graph has no o_proj bias)
    relabelled as Nanbeige 4.2 with `loops`."""
    from tests.fixtures.tiny_models import build_model

    folder = build_model("llama2", out, attention_bias=bias)
    cfg = json.loads((folder / "config.json").read_text())
    cfg |= {"model_type": "nanbeige", "architectures": ["NanbeigeForCausalLM"], **loops}
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


def convert_nanbeige(src, path):
    """As llama.cpp's NanbeigeModel (a LlamaModel) writes it: Llama's keys and permuted q/k, then its loop keys."""
    import gguf
    from transformers import PreTrainedTokenizerFast

    from tests.fixtures.gguf_writer import write_llama_hparams, write_llama_tensors, write_tokenizer

    cfg = json.loads((src / "config.json").read_text())
    w = gguf.GGUFWriter(path, "nanbeige")
    w.add_name("tiny-nanbeige")
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    write_llama_hparams(w, cfg, (cfg.get("rope_parameters") or {}).get("rope_theta", cfg.get("rope_theta", 10000.0)))
    w.add_uint32("nanbeige.num_loops", cfg.get("num_loops", 1))
    w.add_bool("nanbeige.skip_loop_final_norm", bool(cfg.get("skip_loop_final_norm", False)))
    write_tokenizer(w, PreTrainedTokenizerFast.from_pretrained(str(src)))
    heads, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    write_llama_tensors(w, src, gguf.MODEL_ARCH.LLAMA, heads, kv)  # (the same tensor names as llama's)
    return path


def _assert_matches_mlx_lm(model_path, folder, backend, loops: int) -> None:
    from lantern.app.engine import LLM
    from tests.fixtures.teacher_forcing import mlx_lm_error

    llm = LLM(str(model_path), backend=backend, dtype="float32", block_size=4, prefill_chunk_size=8, num_kv_blocks=128)
    try:
        cfg = llm.engine.model_config
        assert (cfg.loops.loops, cfg.num_kv_layers) == (loops, loops * cfg.num_layers)
        worst, scale = mlx_lm_error(llm, folder, PROMPT, [5, 17, 42, 99])
        assert worst < 1e-4 * scale, (worst, scale)
    finally:
        llm.engine.shutdown()


@pytest.mark.parametrize("case", sorted(CASES))
def test_logits_match_mlx_lm(case, tmp_path, backend, by_file_tokenizer):
    folder = nanbeige_folder(tmp_path / case, **CASES[case])
    _assert_matches_mlx_lm(folder, folder, backend, CASES[case]["num_loops"])


@pytest.mark.parametrize("case", sorted(CASES))
def test_llama_cpp_gguf_matches_mlx_lm_on_the_folder(case, tmp_path, backend, by_file_tokenizer):
    folder = nanbeige_folder(tmp_path / case, **CASES[case])
    path = convert_nanbeige(folder, tmp_path / "tiny-nanbeige.gguf")
    _assert_matches_mlx_lm(path, folder, backend, CASES[case]["num_loops"])


def _base(**extra) -> dict:
    base = {"model_type": "nanbeige", "vocab_size": 300, "hidden_size": 64, "intermediate_size": 96}
    return {**base, "num_hidden_layers": 2, "num_attention_heads": 4, **extra}


@pytest.mark.parametrize(
    "extra, key",
    [
        ({"enable_depth_attention": True}, "enable_depth_attention"),
        ({"loop_share_kv": True}, "loop_share_kv"),
        ({"num_loops": -1}, "num_loops"),
        ({"num_loops": 2, "loop_loss_weights": [0.5, 0.5]}, "loop_loss_weights"),
        ({"mlp_bias": True}, "mlp_bias"),
    ],
)
def test_what_it_cannot_compute_is_refused_by_name(extra, key):
    with pytest.raises(UnsupportedModelError, match=key):
        ModelConfig.from_hf(_base(**extra))

"""Llama 3.2 Vision's language model (model_type "mllama_text_model": the text_config of an "mllama" folder such as
meta-llama/Llama-3.2-11B-Vision-Instruct, or a MllamaForCausalLM folder), as transformers' MllamaTextConfig reads it.

Its decoder is Llama's with cross-attention layers (cross_attention_layers) between the self-attention ones. On text
alone transformers skips them (MllamaTextModel: no cross-attention states, none cached), so the served model is the
self-attention layers in order -- ModelConfig.checkpoint_layers says which checkpoint layer each one is. The
embedding has 8 rows more than the head (the image token and its reserved neighbours, read only with an image's
cross-attention): the vocabulary is the head's, the embedding loaded to its rows, so a prompt holding one of those
ids is refused as any id past the vocabulary is (and tensor parallelism splits both alike). The vision tower is not
loaded (an image in a request is refused, as for every text model).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from lantern.app.models.errors import check_silu, refuse
from lantern.app.models.spec import UnsupportedModelError

_EXTRA_EMBEDDING_ROWS = 8  # MllamaTextModel's embed_tokens: vocab_size + 8 rows

# MllamaTextConfig's defaults for the keys ModelConfig.from_hf reads (spec.ARCHITECTURES "defaults").
DEFAULTS: dict[str, Any] = {
    "vocab_size": 128256,
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 40,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,  # MllamaTextConfig.default_theta
    "bos_token_id": 128000,
    "eos_token_id": 128001,
}
_CROSS_DEFAULT = [3, 8, 13, 18, 23, 28, 33, 38]  # MllamaTextConfig's cross_attention_layers


def configure(model_type: str, cfg: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    """ModelConfig field overrides for an mllama_text_model config: its self-attention layers only, the embedding's
    extra rows past the head; refuses, naming the key, what it does not compute."""
    if model_type != "mllama_text_model":
        raise UnsupportedModelError(f"family_mllama does not configure model_type {model_type!r}")
    check_silu(cfg, "Llama 3.2 Vision")
    total = int(cfg.get("num_hidden_layers", DEFAULTS["num_hidden_layers"]))
    cross = cfg.get("cross_attention_layers")
    cross = _CROSS_DEFAULT if cross is None else cross
    if not isinstance(cross, list) or any(not isinstance(i, int) or not 0 <= i < total for i in cross):
        raise refuse("cross_attention_layers", cross, f" (indices of the {total} layers)")
    kept = tuple(i for i in range(total) if i not in set(cross))
    if not kept:
        raise refuse("cross_attention_layers", cross, " (every layer: no language model on text alone)")
    if cfg.get("tie_word_embeddings"):  # (the head is narrower than the embedding: transformers cannot tie them)
        raise refuse("tie_word_embeddings", True, " for Llama 3.2 Vision (its embedding has 8 input-only rows)")
    return {
        "num_layers": len(kept),
        "checkpoint_layers": kept,
        "head_dim": int(fields["hidden_size"]) // int(fields["num_heads"]),  # (MllamaTextSelfAttention's; no key)
    }


def checkpoint_tensors(source: Iterator[tuple[str, Any]], vocab: int) -> Iterator[tuple[str, Any]]:
    """The stream with the embedding cut to the vocabulary's rows (a quantized table by whole rows): the 8 past it
    are input-only rows text never reaches."""
    from lantern.app.models.weight_stream import _row_slice

    for name, value in source:
        if name == "model.embed_tokens.weight" and value.shape[0] == vocab + _EXTRA_EMBEDDING_ROWS:
            value = _row_slice(value, 0, vocab)
        yield name, value

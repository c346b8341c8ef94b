"""InternLM2 / 2.5 folders (model_type internlm2: internlm/internlm2-chat-7b, internlm2_5-7b-chat, -1.8b, -20b;
their remote code modeling_internlm2.py): Llama's layer under other tensor names. Its config keys are read by
family_renamed (RENAMED["internlm2"]); this module gives the tensors the Llama model files' names and layout.

- model.tok_embeddings / output: the embedding and the head; attention_norm / ffn_norm: the two pre-norms.
- feed_forward.w1 / w3 / w2: the gate, up and down projections (SiLU-gated).
- attention.wo: o_proj. attention.wqkv: q, k and v in one matrix grouped by KV head, as the remote code reads it
  (rearranging its rows "(h gs d)", gs = queries per KV head + 2): for each KV head, its query heads' rows, then
  its key head's, then its value head's (llama.cpp's InternLM2Model.modify_tensors cuts the same groups). The rows
  are regrouped to q, k, v (grouped_qkv: a row permutation, so an affine-quantized or MLX-packed weight stays
  quantized) and then split as weight_stream.split_fused splits any fused qkv_proj.

GGUFs of InternLM2 are read as llama (llama.cpp's converter splits wqkv itself): they never come here.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from lantern.app.models.grouped_qkv import reorder_rows, stacked_order

# InternLM2's tensor names -> Llama's (any last part: weight, and a quantized module's own tensors alike)
_NAMES = (
    (re.compile(r"^model\.tok_embeddings\."), "model.embed_tokens."),
    (re.compile(r"\.attention\.wqkv\."), ".self_attn.qkv_proj."),
    (re.compile(r"\.attention\.wo\."), ".self_attn.o_proj."),
    (re.compile(r"\.feed_forward\.w1\."), ".mlp.gate_proj."),
    (re.compile(r"\.feed_forward\.w3\."), ".mlp.up_proj."),
    (re.compile(r"\.feed_forward\.w2\."), ".mlp.down_proj."),
    (re.compile(r"\.attention_norm\."), ".input_layernorm."),
    (re.compile(r"\.ffn_norm\."), ".post_attention_layernorm."),
    (re.compile(r"^output\."), "lm_head."),
)


def checkpoint_name(name: str) -> str:
    """An InternLM2 checkpoint's tensor under the Llama model files' name (an unknown one is kept: the model files
    then refuse it by name)."""
    for pattern, new in _NAMES:
        name = pattern.sub(new, name)
    return name


def checkpoint_tensors(source: Iterator[tuple[str, Any]], spec: Any) -> Iterator[tuple[str, Any]]:
    """The stream with each layer's wqkv (renamed qkv_proj) regrouped to q, k, v rows and split into q_proj,
    k_proj and v_proj."""
    from lantern.app.models.weight_stream import split_fused

    cfg = spec.config
    order = stacked_order(cfg.num_kv_heads, cfg.num_heads // cfg.num_kv_heads, cfg.head_dim)

    def regrouped() -> Iterator[tuple[str, Any]]:
        for name, value in source:
            yield name, reorder_rows(value, order) if ".self_attn.qkv_proj." in name else value

    return split_fused(regrouped(), spec)

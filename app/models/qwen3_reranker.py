"""Qwen3-Reranker as released (Qwen3ForCausalLM, 0.6B / 4B / 8B): a causal LM asked, in a fixed prompt, whether a
document meets a query; the score is the probability of "yes" against "no" at the prompt's last position.

The facts, from the model card (and written the same way into GGUF files by llama.cpp's converter as the
`tokenizer.chat_template.rerank` template): the prompt is

    <|im_start|>system\\nJudge whether the Document meets the requirements based on the Query and the Instruct
    provided. Note that the answer can only be "yes" or "no".<|im_end|>\\n<|im_start|>user\\n<Instruct>: {instruction}
    \\n<Query>: {query}\\n<Document>: {document}<|im_end|>\\n<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n

with the instruction "Given a web search query, retrieve relevant passages that answer the query" unless the
caller has another, and the score softmax([logit_yes, logit_no])[0] = sigmoid((w_yes - w_no) . h), h the final
norm's output at the last token and w_* the LM head's rows for the tokens "yes" and "no". So the head is one row,
w_yes - w_no, under a sigmoid: the cross-encoder's shape (score_head.py), read from the LM head's two rows (an MLX
folder's quantized head dequantized for them); the LM head itself is not loaded. A folder is taken for a reranker
by its name, its config's _name_or_path or its README's title (as llama.cpp's converter decides), or by --task
score.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import numpy as np

from lantern.app.engine.contract import ModelSpec
from lantern.app.models.errors import UnsupportedModelError

logger = logging.getLogger(__name__)

DEFAULT_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"
TEMPLATE = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the Instruct "
    'provided. Note that the answer can only be "yes" or "no".<|im_end|>\n<|im_start|>user\n'
    f"<Instruct>: {DEFAULT_INSTRUCTION}\n<Query>: {{query}}\n<Document>: {{document}}<|im_end|>\n"
    "<|im_start|>assistant\n<think>\n\n</think>\n\n"
)
_HINT = "qwen3-reranker"


def _config(folder: Path) -> dict[str, Any]:
    try:
        return json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return {}


def is_qwen3_reranker(spec: ModelSpec) -> bool:
    """A released Qwen3-Reranker folder: a qwen3 causal LM named so (folder, _name_or_path) or titled so (README)."""
    if spec.weight_format != "safetensors" or not spec.weight_files or spec.config.architecture != "qwen3":
        return False
    folder = spec.weight_files[0].parent
    cfg = _config(folder)
    if not any(str(a).endswith("ForCausalLM") for a in cfg.get("architectures") or []):
        return False
    names = (folder.name, str(cfg.get("_name_or_path", "")), spec.name)
    if any(_HINT in n.lower() for n in names):
        return True
    readme = folder / "README.md"
    try:
        return readme.is_file() and f"# {_HINT}" in readme.read_text(errors="replace").lower()
    except OSError:
        return False


def _single_token(tokenizer: Any, text: str) -> int:
    ids = tokenizer.encode(text, add_special_tokens=False)
    if len(ids) != 1:
        raise UnsupportedModelError(f"a Qwen3-Reranker's tokenizer must hold {text!r} as one token; it gives {ids}")
    return int(ids[0])


def _rows(raw: Any, name: str, indices: list[int]) -> np.ndarray:
    """Rows of a 2-D tensor straight from the file's map (the vocabulary-sized head is never read whole), bf16
    widened to float32, anything else as stored (an MLX folder's packed words stay uint32)."""
    rows = np.array(raw.view(name)[indices])
    if raw.header[name]["dtype"] == "BF16":
        return (rows.astype(np.uint32) << 16).view(np.float32)
    return rows


def yes_no_row(spec: ModelSpec, tokenizer: Any) -> np.ndarray:
    """w_yes - w_no [H] in float64 from the LM head (the embedding table when the checkpoint ties them); an MLX
    folder's quantized head dequantized for those two rows."""
    from lantern.app.models.weight_stream import RawSafetensors

    cfg = _config(spec.weight_files[0].parent)
    prefix = "model.embed_tokens" if cfg.get("tie_word_embeddings") else "lm_head"
    yes, no = _single_token(tokenizer, "yes"), _single_token(tokenizer, "no")
    tensors: dict[str, np.ndarray] = {}
    for path in spec.weight_files:
        raw = RawSafetensors(path)
        try:
            for name in raw.names:
                if name.startswith(f"{prefix}.") and len(raw.header[name]["shape"]) == 2:
                    tensors[name] = _rows(raw, name, [yes, no])
        finally:
            raw.close()
    if f"{prefix}.weight" not in tensors:
        raise UnsupportedModelError(f"the Qwen3-Reranker's {prefix}.weight is missing from the checkpoint")
    if len(tensors) == 1:
        two = tensors[f"{prefix}.weight"].astype(np.float64)
    else:  # quantized: the two rows' words with their scales (and biases) are a two-row quantized module
        from lantern.app.models.quant.hf_formats import read_quantized_module

        scheme = spec.config.quantization
        if scheme is None:
            raise UnsupportedModelError(f"{prefix} has {sorted(tensors)} but config.json states no quantization")
        two = read_quantized_module(scheme, prefix, tensors).dequantize(np.float32).astype(np.float64)
    return two[0] - two[1]

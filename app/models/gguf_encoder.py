"""BERT-style encoders from GGUF files (llama.cpp's `bert` architecture: all-MiniLM, bge, mxbai-embed-large,
snowflake-arctic-embed, and XLM-RoBERTa's bge-m3 / multilingual-e5, which the converter writes as `bert` too;
`nomic-bert`: nomic-embed-text v1 / v1.5, LM Studio's and Ollama's default embedding model; `modern-bert`:
gte-modernbert, granite-embedding r2, gte-reranker-modernbert).

The config: what conversion/bert.py writes, read back as the BertModel config.json family_bert reads. A RoBERTa's
position table arrives already cut to start at row padding_idx + 1, so the file is served as plain BERT
(positions 0, 1, ...), which is what it means to llama.cpp.

The tokenizer: transformers builds none for these files (it knows no `bert` tokenizer model, and reads a `t5`
vocabulary as T5's, without <s>), so it is rebuilt here with the `tokenizers` library from the metadata:
- `bert` (WordPiece): the converter stored each piece in "phantom space" form (a word's first piece as
  "\u2581piece", a continuation without its "##"), undone here; BERT's normalizer with llama.cpp's reading of
  tokenizer.ggml.normalizer.lowercase / strip_accents (both true when absent), BERT's pre-tokenizer, and
  [CLS] text [SEP] from the file's bos / separator ids ([CLS] A [SEP] B [SEP] for a pair, B in segment 1).
- `t5` (Unigram, XLM-R): the pieces and scores as stored, the file's precompiled_charsmap as the normalizer,
  words split at whitespace (remove_extra_whitespaces: no empty pieces) then Metaspace with the file's
  add_space_prefix, and <s> text </s> as add_bos_token / add_eos_token say (<s> A </s></s> B </s> for a pair) —
  XLM-R's own tokenizer.json.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from lantern.app.models.errors import UnsupportedModelError
from lantern.app.models.gguf_config import _Meta

logger = logging.getLogger(__name__)

_PHANTOM = "\u2581"
_CONTROL = 3  # gguf.TokenType.CONTROL
_LAYER_NAMES = {  # GGUF layer tensor -> the encoder files' (backends/*/models/bert.py)
    "attn_q": "attention.q_proj",
    "attn_k": "attention.k_proj",
    "attn_v": "attention.v_proj",
    "attn_output": "attention.o_proj",
    "attn_output_norm": "attention_norm",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "layer_output_norm": "mlp_norm",
}
GLOBAL_NAMES = {
    "token_embd": "embeddings.word_embeddings",
    "token_types": "embeddings.token_type_embeddings",
    "position_embd": "embeddings.position_embeddings",
    "token_embd_norm": "embeddings.norm",
}


def _encoder_keys(meta: _Meta, tensors: dict[str, Any], cfg: dict[str, Any], model_type: str) -> dict[str, Any]:
    """What every encoder's config.json states here (family_bert reads them); an encoder: no KV heads of its own."""
    if meta.get("attention.causal", False):
        raise UnsupportedModelError(f"{meta.label}{meta.arch}.attention.causal=true is not implemented (an encoder)")
    types = tensors.get("token_types.weight")
    return {
        "model_type": model_type,
        "layer_norm_eps": float(meta.need("attention.layer_norm_epsilon")),
        "type_vocab_size": int(types.shape[1]) if types is not None else 0,
        "num_key_value_heads": cfg["num_attention_heads"],
    }


def _bert(meta: _Meta, tensors: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
    """BertModel's keys: absolute positions, biased linears, BERT's exact GELU (llama.cpp's graph computes the
    tanh approximation)."""
    if "blk.0.attn_qkv.weight" in tensors:
        raise UnsupportedModelError(f"{meta.label}a fused attn_qkv in a bert GGUF is not implemented")
    return {**_encoder_keys(meta, tensors, cfg, "bert"), "architectures": ["BertModel"], "hidden_act": "gelu"}


def _nomic_bert(meta: _Meta, tensors: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
    """NomicBertModel's keys (nomic-embed-text v1 / v1.5): a rope of the file's base, SwiGLU, no biases."""
    rope = {"rope_type": "default", "rope_theta": float(meta.get("rope.freq_base", 1000.0))}
    out = _encoder_keys(meta, tensors, cfg, "nomic_bert")
    return {**out, "architectures": ["NomicBertModel"], "hidden_act": "silu", "rope_parameters": rope}


def _modern_bert(meta: _Meta, tensors: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
    """ModernBertModel's keys (gte-modernbert, granite-embedding r2, gte-reranker-modernbert): the local window and
    the global layers' period (sliding_window, sliding_window_pattern: llama.cpp's symmetric window, the first layer
    global), the global and local ropes' bases (rope.freq_base, rope.freq_base_swa: the global one when absent, as
    llama.cpp reads it), the GLU's activation, biases where the file holds them."""
    if meta.get("attention.causal", False):
        raise UnsupportedModelError(f"{meta.label}{meta.arch}.attention.causal=true is not implemented (an encoder)")
    base = float(meta.get("rope.freq_base", 160_000.0))
    return {
        "model_type": "modernbert",
        "architectures": ["ModernBertModel"],
        "norm_eps": float(meta.need("attention.layer_norm_epsilon")),
        "local_attention": int(meta.need("attention.sliding_window")),
        "global_attn_every_n_layers": int(meta.get("attention.sliding_window_pattern", 3)),
        "global_rope_theta": base,
        "local_rope_theta": float(meta.get("rope.freq_base_swa", base)),
        "hidden_activation": str(meta.get("hidden_activation", "gelu")),
        "norm_bias": "token_embd_norm.bias" in tensors,
        "attention_bias": "blk.0.attn_qkv.bias" in tensors,
        "mlp_bias": "blk.0.ffn_up.bias" in tensors,
        "num_key_value_heads": cfg["num_attention_heads"],
    }


ENCODER_BUILDERS = {"bert": _bert, "nomic-bert": _nomic_bert, "modern-bert": _modern_bert}
ENCODER_ARCHITECTURES = tuple(ENCODER_BUILDERS)  # (gguf_names and the loader route these files here)
_NOMIC_LAYER_NAMES = {  # nomic-bert: q / k / v fused (weight_stream.split_fused cuts them), a gated MLP
    **_LAYER_NAMES,
    "attn_qkv": "attention.qkv_proj",
    "ffn_gate": "mlp.gate_proj",
}


_MODERN_LAYER_NAMES = {  # modern-bert GGUF layer tensor -> ModernBERT's (backends/*/models/modernbert.py)
    "attn_norm": "attn_norm",
    "attn_qkv": "attn.Wqkv",
    "attn_output": "attn.Wo",
    "ffn_norm": "mlp_norm",
    "ffn_up": "mlp.Wi",
    "ffn_down": "mlp.Wo",
}
_MODERN_GLOBAL_NAMES = {
    "token_embd": "embeddings.tok_embeddings",
    "token_embd_norm": "embeddings.norm",
    "output_norm": "final_norm",
}


def encoder_tensor_name(gguf_name: str, arch: str = "bert") -> str | None:
    """A `bert` / `nomic-bert` / `modern-bert` GGUF tensor under the encoder files' name; None for tensors not
    loaded (a reranker's cls head: gguf_score_head.py reads it)."""
    if arch == "modern-bert":
        layer_names, global_names = _MODERN_LAYER_NAMES, _MODERN_GLOBAL_NAMES
    else:
        layer_names, global_names = (_NOMIC_LAYER_NAMES if arch == "nomic-bert" else _LAYER_NAMES), GLOBAL_NAMES
    parts = gguf_name.split(".")
    if parts[0] == "blk" and len(parts) == 4 and parts[2] in layer_names:
        return f"layers.{parts[1]}.{layer_names[parts[2]]}.{parts[3]}"
    if len(parts) == 2 and parts[0] in global_names:
        return f"{global_names[parts[0]]}.{parts[1]}"
    return None


# ---- the tokenizer ---------------------------------------------------------------------------------
def _fields(path: Path) -> dict[str, Any]:
    """The tokenizer.ggml.* metadata, arrays in full (gguf's reader: the converter's own package)."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    out: dict[str, Any] = {}
    for key, field in reader.fields.items():
        if not key.startswith("tokenizer.ggml."):
            continue
        kinds = field.types
        if kinds and kinds[0] == gguf.GGUFValueType.ARRAY:
            if kinds[-1] == gguf.GGUFValueType.STRING:
                out[key] = [bytes(field.parts[i]).decode("utf-8", errors="replace") for i in field.data]
            else:
                out[key] = [field.parts[i].tolist()[0] for i in field.data]
        elif kinds and kinds[0] == gguf.GGUFValueType.STRING:
            out[key] = bytes(field.parts[field.data[0]]).decode("utf-8")
        else:
            out[key] = field.parts[field.data[0]].tolist()[0]
    return out


def _special(fields: dict[str, Any], key: str, default: int | None) -> int | None:
    value = fields.get(f"tokenizer.ggml.{key}")
    return int(value) if value is not None else default


def encoder_tokenizer(path: Path) -> Any:
    """A PreTrainedTokenizerFast equal to the file's tokenizer (see the module's docstring)."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    fields = _fields(path)
    kind = fields.get("tokenizer.ggml.model")
    if kind == "gpt2":  # (modern-bert: byte-level BPE, which transformers' GGUF reader builds; then [CLS] / [SEP])
        return _bpe_encoder_tokenizer(path, fields)
    tokens: list[str] = fields["tokenizer.ggml.tokens"]
    types: list[int] = fields.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    if kind == "bert":
        vocab = {}
        for i, (tok, typ) in enumerate(zip(tokens, types)):
            piece = tok if typ == _CONTROL else tok[1:] if tok.startswith(_PHANTOM) else f"##{tok}"
            vocab.setdefault(piece, i)
        unk = _special(fields, "unknown_token_id", 100)
        tok = Tokenizer(models.WordPiece(vocab, unk_token=tokens[unk]))
        lower = bool(fields.get("tokenizer.ggml.normalizer.lowercase", True))
        strip = bool(fields.get("tokenizer.ggml.normalizer.strip_accents", lower))
        tok.normalizer = normalizers.BertNormalizer(lowercase=lower, strip_accents=strip)
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.decoder = decoders.WordPiece()
        first, last = _special(fields, "bos_token_id", 101), _special(fields, "seperator_token_id", 102)
        add_first, add_last = bool(fields.get("tokenizer.ggml.add_bos_token", True)), True  # llama.cpp: add_sep
    elif kind == "t5":
        scores = fields.get("tokenizer.ggml.scores") or [0.0] * len(tokens)
        unk = _special(fields, "unknown_token_id", 2)
        tok = Tokenizer(models.Unigram(list(zip(tokens, scores)), unk_id=unk))
        charsmap = fields.get("tokenizer.ggml.precompiled_charsmap")
        if charsmap:
            tok.normalizer = normalizers.Precompiled(bytes(b & 0xFF for b in charsmap))
        scheme = "always" if fields.get("tokenizer.ggml.add_space_prefix", True) else "never"
        metaspace = pre_tokenizers.Metaspace(replacement=_PHANTOM, prepend_scheme=scheme)
        if fields.get("tokenizer.ggml.remove_extra_whitespaces", True):  # no empty pieces, as XLM-R's tokenizer.json
            metaspace = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), metaspace])
        tok.pre_tokenizer = metaspace
        tok.decoder = decoders.Metaspace(replacement=_PHANTOM, prepend_scheme=scheme)
        first, last = _special(fields, "bos_token_id", None), _special(fields, "eos_token_id", 1)
        add_first = bool(fields.get("tokenizer.ggml.add_bos_token", False)) and first is not None
        add_last = bool(fields.get("tokenizer.ggml.add_eos_token", True))
    else:
        raise UnsupportedModelError(f"{path.name}: tokenizer.ggml.model={kind!r} in a bert GGUF is not implemented")
    ends = ([(tokens[first], first)] if add_first else []), ([(tokens[last], last)] if add_last else [])
    head, tail = [t for t, _ in ends[0]], [t for t, _ in ends[1]]
    template = " ".join([*head, "$A", *tail])
    # A pair (a cross-encoder's query and document) as the model's own tokenizer joins one: BERT's [CLS] A [SEP]
    # B [SEP] with B's segment 1; XLM-R's <s> A </s></s> B </s>.
    if kind == "bert":
        pair = " ".join([*head, "$A", *tail, "$B:1", *(f"{t}:1" for t in tail)])
    else:
        pair = " ".join([*head, "$A", *tail, *tail, "$B", *tail])
    tok.post_processor = processors.TemplateProcessing(
        single=template, pair=pair, special_tokens=list(dict(ends[0] + ends[1]).items())
    )
    control = [t for t, typ in zip(tokens, types) if typ == _CONTROL]
    fast = PreTrainedTokenizerFast(tokenizer_object=tok)
    fast.add_special_tokens({"additional_special_tokens": control})
    names = {"unk_token": unk, "pad_token": _special(fields, "padding_token_id", None)}
    names.update(bos_token=first if add_first else None, eos_token=last if add_last else None)
    for name, i in names.items():
        if i is not None:
            setattr(fast, name, tokens[i])
    logger.info("GGUF %s tokenizer rebuilt from %s (%d pieces)", kind, path.name, len(tokens))
    return fast


def _bpe_encoder_tokenizer(path: Path, fields: dict[str, Any]) -> Any:
    """ModernBERT's byte-level BPE from the file: the vocabulary and merges as stored, GPT-2's byte-level split
    (llama.cpp's `modern-bert` pre-tokenizer is GPT-2's regex), the control tokens special, and [CLS] A [SEP]
    (B [SEP]) around it from the file's bos / eos ids (its cls / sep ids where it states none)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    tokens: list[str] = fields["tokenizer.ggml.tokens"]
    types: list[int] = fields.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    merges = [tuple(m.split(" ", 1)) for m in fields.get("tokenizer.ggml.merges") or []]
    vocab = {t: i for i, t in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab, merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    first = _special(fields, "bos_token_id", _special(fields, "cls_token_id", None))  # ([CLS] where no bos)
    last = _special(fields, "eos_token_id", _special(fields, "seperator_token_id", None))  # ([SEP] where no eos)
    head = [tokens[first]] if first is not None and fields.get("tokenizer.ggml.add_bos_token", True) else []
    tail = [tokens[last]] if last is not None and fields.get("tokenizer.ggml.add_eos_token", True) else []
    specials = {tokens[i]: i for i, on in ((first, head), (last, tail)) if on and i is not None}
    tok.post_processor = processors.TemplateProcessing(
        single=" ".join([*head, "$A", *tail]),
        pair=" ".join([*head, "$A", *tail, "$B:1", *(f"{t}:1" for t in tail)]),
        special_tokens=list(specials.items()),
    )
    fast = PreTrainedTokenizerFast(tokenizer_object=tok)
    fast.add_special_tokens({"additional_special_tokens": [t for t, k in zip(tokens, types) if k == _CONTROL]})
    names = {"unk_token": "unknown_token_id", "pad_token": "padding_token_id", "cls_token": "cls_token_id"}
    names.update(sep_token="seperator_token_id", mask_token="mask_token_id")
    for name, key in names.items():
        if (i := _special(fields, key, None)) is not None:
            setattr(fast, name, tokens[i])
    logger.info("GGUF gpt2 tokenizer of an encoder rebuilt from %s (%d pieces)", path.name, len(tokens))
    return fast

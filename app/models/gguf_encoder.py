"""BERT-style encoders from GGUF files (llama.cpp's `bert` architecture: all-MiniLM, bge, mxbai-embed-large,
snowflake-arctic-embed, and XLM-RoBERTa's bge-m3 / multilingual-e5, which the converter writes as `bert` too; and
`nomic-bert`: nomic-embed-text v1 / v1.5, LM Studio's and Ollama's default embedding model).

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


ENCODER_BUILDERS = {"bert": _bert, "nomic-bert": _nomic_bert}
ENCODER_ARCHITECTURES = tuple(ENCODER_BUILDERS)  # (gguf_names and the loader route these files here)
_NOMIC_LAYER_NAMES = {  # nomic-bert: q / k / v fused (weight_stream.split_fused cuts them), a gated MLP
    **_LAYER_NAMES,
    "attn_qkv": "attention.qkv_proj",
    "ffn_gate": "mlp.gate_proj",
}


def encoder_tensor_name(gguf_name: str, arch: str = "bert") -> str | None:
    """A `bert` / `nomic-bert` GGUF tensor under the encoder files' name; None for tensors not loaded (a
    reranker's cls head)."""
    layer_names = _NOMIC_LAYER_NAMES if arch == "nomic-bert" else _LAYER_NAMES
    parts = gguf_name.split(".")
    if parts[0] == "blk" and len(parts) == 4 and parts[2] in layer_names:
        return f"layers.{parts[1]}.{layer_names[parts[2]]}.{parts[3]}"
    if len(parts) == 2 and parts[0] in GLOBAL_NAMES:
        return f"{GLOBAL_NAMES[parts[0]]}.{parts[1]}"
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

"""BERT-style encoders: what config.json means, as transformers' config and model classes read it,
turned into ModelConfig fields; and the checkpoint's tensor names in the model files' terms.

- "bert": all-MiniLM, bge-*-en, e5, mxbai-embed-large, snowflake-arctic-embed (v1).
- "roberta", "xlm-roberta", "camembert": bge-m3, multilingual-e5, all-roberta-large: BERT's layer,
  positions counted from padding_idx + 1 over the non-padding tokens (padding sits at padding_idx),
  so a table of max_position_embeddings rows serves padding_idx + 1 fewer tokens.
- "mpnet": all-mpnet-base-v2, multi-qa-mpnet: RoBERTa's positions (padding_idx fixed at 1), no
  token types, and a relative-position bias shared by every layer: T5's bidirectional buckets (32,
  up to distance 128) of (key - query), one learned value per bucket and head, added to the scaled
  scores.
- "distilbert": msmarco-distilbert, multi-qa-distilbert: BERT's layer without token types, its own
  config keys (dim, n_layers, hidden_dim, ...: prepare reads them) and tensor names (q_lin, ffn.lin1, ...).
- "nomic_bert": nomic-embed-text v1 / v1.5 (transformers' NomicBertModel): BERT's post-LN layer with a
  rope (rotate_half, base 1000) instead of absolute positions, no linear biases, and a SwiGLU MLP
  (down(silu(gate(x)) * up(x))). Released folders state nomic's own keys (n_embd, rotary_emb_base, ...:
  prepare reads them) and tensor names (Wqkv fused, fc11 / fc12 / fc2, norm1 / norm2).

The maths (transformers' modeling_bert, BertModel): embeddings = LayerNorm(word + token type +
absolute position), then per layer bidirectional multi-head attention with q/k/v/o biases, a
post-LN residual (LayerNorm(x + attention)), an MLP of two biased linears around GELU and a
second post-LN residual. The last layer's output is the hidden state the pooling reads; the
pooler (a tanh dense on [CLS]) is not what sentence-transformers use, so it is not loaded.

An encoder keeps no KV cache and is served for embeddings (`--task embed`) or, as a cross-encoder
(XxxForSequenceClassification: ms-marco MiniLM, bge-reranker), for relevance scores (`--task score`:
app/models/score_head.py runs its classifier head on the pooled state).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from lantern.app.models.spec import UnsupportedModelError

# transformers' ACT2FN names for the two GELUs the model files compute.
_GELU = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh"}


# Served architectures: the base model, its MLM checkpoint (head skipped), a cross-encoder (score_head.py's head)
_SERVED = ("Model", "ForMaskedLM", "ForSequenceClassification")
MODEL_TYPES = ("bert", "roberta", "xlm-roberta", "camembert", "mpnet", "nomic_bert", "distilbert")
_PREFIXES = ("bert.", "roberta.", "mpnet.", "nomic_bert.", "distilbert.")  # an XxxForMaskedLM's base model
MPNET_BUCKETS = 32  # MPNetEncoder.compute_position_bias always buckets into 32 (its default argument)
MPNET_MAX_DISTANCE = 128


@dataclass(frozen=True)
class EncoderConfig:
    type_vocab_size: int  # 0: no token-type table (MPNet)
    layer_norm_eps: float
    hidden_act: str  # "gelu" (erf) or "gelu_tanh"
    position_rows: int = 512  # the absolute position table's rows
    padding_idx: int | None = None  # RoBERTa / MPNet: positions start after it and skip its tokens
    relative_buckets: int = 0  # MPNet: the relative-position bias's buckets (0: none)
    rope_theta: float | None = None  # Nomic BERT: a rope's base, no absolute position table
    gated_mlp: bool = False  # Nomic BERT: SwiGLU (gate, up, down) instead of up, act, down
    linear_bias: bool = True  # False: no biases on the attention's and MLP's linears (Nomic BERT)

    @property
    def matrices_per_layer(self) -> int:
        """q, k, v, o and the MLP's up and down (+ gate): what --isq quantizes per layer (isq_candidates)."""
        return 4 + (3 if self.gated_mlp else 2)


# nomic's released config.json keys (its remote code's, GPT-2's names) -> NomicBertConfig's
_NOMIC_KEYS = {
    "n_embd": "hidden_size",
    "n_layer": "num_hidden_layers",
    "n_head": "num_attention_heads",
    "n_inner": "intermediate_size",
    "layer_norm_epsilon": "layer_norm_eps",
    "max_trained_positions": "max_position_embeddings",  # (n_positions states 8192; trained for 2048)
}
# nomic's variations of its layer, each as the only value Lantern (and transformers' class) computes
_NOMIC_FIXED = {
    "rotary_emb_fraction": 1.0,
    "rotary_emb_interleaved": False,
    "rotary_scaling_factor": None,
    "qkv_proj_bias": False,
    "mlp_fc1_bias": False,
    "mlp_fc2_bias": False,
    "prenorm": False,
    "activation_function": "swiglu",
    "moe_every_n_layers": 0,
    "causal": False,
}


# DistilBertConfig's keys -> BERT's (its attribute_map, and the MLP width / activation under their own names)
_DISTILBERT_KEYS = {
    "dim": "hidden_size",
    "n_layers": "num_hidden_layers",
    "n_heads": "num_attention_heads",
    "hidden_dim": "intermediate_size",
    "activation": "hidden_act",
}
_DISTILBERT_DEFAULTS = {"dim": 768, "n_layers": 6, "n_heads": 12, "hidden_dim": 3072, "activation": "gelu"}


def prepare(cfg: dict[str, Any]) -> dict[str, Any]:
    """A distilbert or nomic_bert config in the keys ModelConfig.from_hf and configure read (DistilBERT states
    its own names; a released nomic folder nomic's); refuses the nomic variants its layer does not compute."""
    if cfg.get("model_type") == "distilbert":
        out = {**_DISTILBERT_DEFAULTS, **cfg}
        return {**out, **{key: out[short] for short, key in _DISTILBERT_KEYS.items()}, "layer_norm_eps": 1e-12}
    out = dict(cfg)
    for key, fixed in _NOMIC_FIXED.items():
        value = out.get(key, fixed)
        if value != fixed and not (fixed == 0 and value is None):
            raise _refuse(key, value, " (nomic_bert: Lantern computes transformers' NomicBertModel)")
    for short, key in _NOMIC_KEYS.items():
        if short in out:
            out.setdefault(key, out[short])
    if "rotary_emb_base" in out and not out.get("rope_parameters"):
        out["rope_theta"] = float(out["rotary_emb_base"])
    if out.get("activation_function") == "swiglu":
        out.setdefault("hidden_act", "silu")
    defaults = {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072}
    return {**defaults, **out, "max_position_embeddings": int(out.get("max_position_embeddings", 2048))}


def _refuse(key: str, value: Any, why: str) -> UnsupportedModelError:
    return UnsupportedModelError(f"{key}={json.dumps(value)} in config.json is not implemented{why}")


def configure(model_type: str, cfg: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    """ModelConfig field overrides for an encoder's config (called by spec.ModelConfig.from_hf)."""
    if model_type not in MODEL_TYPES:
        raise UnsupportedModelError(f"family_bert does not configure model_type {model_type!r}")
    heads = [a for a in cfg.get("architectures") or [] if not a.endswith(_SERVED)]
    if heads:
        raise UnsupportedModelError(
            f"architectures={json.dumps(heads)} in config.json is not implemented: Lantern serves {model_type} "
            "encoders for embeddings (XxxModel, XxxForMaskedLM) and cross-encoders (XxxForSequenceClassification)"
        )
    nomic = model_type == "nomic_bert"
    acts = {"silu": "silu"} if nomic else {**_GELU, "relu": "relu"}
    act = cfg.get("hidden_act", "silu" if nomic else "gelu")
    if act not in acts:
        raise _refuse("hidden_act", act, f"; supported: {', '.join(sorted(acts))}")
    position = cfg.get("position_embedding_type", "absolute")
    if position != "absolute":
        raise _refuse("position_embedding_type", position, " (only absolute position embeddings)")
    for key in ("is_decoder", "add_cross_attention"):
        if cfg.get(key):
            raise _refuse(key, cfg[key], " (Lantern serves BERT as an encoder)")
    if cfg.get("quantization_config"):
        raise _refuse("quantization_config", cfg["quantization_config"].get("quant_method"), " for encoders")
    if fields["hidden_size"] % fields["num_heads"]:
        raise _refuse("num_attention_heads", fields["num_heads"], " (it must divide hidden_size)")
    eps = float(cfg.get("layer_norm_eps", 1e-12))
    rows = int(cfg.get("max_position_embeddings", 512))
    padding_idx, buckets, types = None, 0, int(cfg.get("type_vocab_size", 2))
    if model_type == "distilbert":
        types = 0  # (no token-type table; a sinusoidal position table is saved as any weight)
    if model_type == "mpnet":
        padding_idx, types = 1, 0  # MPNetEmbeddings: padding_idx = 1 whatever pad_token_id says
        buckets = int(cfg.get("relative_attention_num_buckets", MPNET_BUCKETS))
        if buckets < MPNET_BUCKETS:
            raise _refuse("relative_attention_num_buckets", buckets, f" below {MPNET_BUCKETS} (MPNet buckets into 32)")
    elif model_type not in ("bert", "nomic_bert", "distilbert"):
        padding_idx = int(cfg.get("pad_token_id") if cfg.get("pad_token_id") is not None else 1)
    if padding_idx is not None and rows <= padding_idx + 1:
        raise _refuse("max_position_embeddings", rows, f" (positions start at padding_idx + 1 = {padding_idx + 1})")
    theta = None
    if nomic:  # a rope (rope_parameters, else rope_theta, else NomicBertConfig's default_theta)
        rope = cfg.get("rope_parameters") or {}
        if rope.get("rope_type", "default") != "default" or cfg.get("rope_scaling"):
            raise _refuse("rope_parameters", rope or cfg.get("rope_scaling"), " (nomic_bert: a plain rope only)")
        theta = float(rope.get("rope_theta") or cfg.get("rope_theta") or 1000.0)
    encoder = EncoderConfig(
        types, eps, acts[act], rows, padding_idx, buckets, rope_theta=theta, gated_mlp=nomic, linear_bias=not nomic
    )
    return {
        "encoder": encoder,
        "num_kv_heads": fields["num_heads"],
        "rms_norm_eps": eps,  # unused by the encoder (its norms are LayerNorms): kept equal to avoid a second value
        "rope_scaling": None,
        "tie_word_embeddings": False,  # BertConfig says True for its MLM head, which is not loaded
        "max_position_embeddings": rows - (0 if padding_idx is None else padding_idx + 1),  # the tokens served
        "eos_token_ids": [],
        "attention_bias": not nomic,
    }


def mpnet_buckets(length: int) -> np.ndarray:
    """[length, length] int64: the relative-position bucket of each (query, key) pair, as
    MPNetEncoder.relative_position_bucket computes it (bidirectional: 16 buckets each way, exact
    below distance 8, then logarithmic up to 128), in float32 as it does."""
    half = MPNET_BUCKETS // 2
    exact = half // 2
    pos = np.arange(length)
    n = pos[:, None] - pos[None, :]  # -(key - query)
    bucket = np.where(n < 0, half, 0)
    n = np.abs(n)
    far = np.maximum(n, exact).astype(np.float32)  # the log is read only where n >= exact
    scaled = np.log(far / np.float32(exact)) / np.float32(math.log(MPNET_MAX_DISTANCE / exact))
    large = np.minimum(exact + (scaled * np.float32(half - exact)).astype(np.int64), half - 1)
    return bucket + np.where(n < exact, n, large)


_LAYER = re.compile(r"^encoder\.layer\.(\d+)\.(.+)$")
# Per-layer tensors: HF module path -> the model files' (q/k/v named like the decoders', so the
# torch loader stacks them into one qkv_proj).
_LAYER_NAMES = {
    "attention.self.query": "attention.q_proj",
    "attention.self.key": "attention.k_proj",
    "attention.self.value": "attention.v_proj",
    "attention.output.dense": "attention.o_proj",
    "attention.output.LayerNorm": "attention_norm",
    "intermediate.dense": "mlp.up_proj",
    "output.dense": "mlp.down_proj",
    "output.LayerNorm": "mlp_norm",
}
# MPNet's attention names (MPNetAttention: attn.q/k/v/o, then its own LayerNorm).
_LAYER_NAMES.update(
    {
        "attention.attn.q": "attention.q_proj",
        "attention.attn.k": "attention.k_proj",
        "attention.attn.v": "attention.v_proj",
        "attention.attn.o": "attention.o_proj",
        "attention.LayerNorm": "attention_norm",
    }
)
_KINDS = {"gamma": "weight", "beta": "bias", "weight": "weight", "bias": "bias"}  # old checkpoints: gamma/beta
_BUFFERS = ("embeddings.position_ids", "embeddings.token_type_ids")
# Heads the model files do not load: the pooler, MLM / NSP heads, a cross-encoder's classifier (score_head.py)
_HEADS = ("pooler.", "cls.", "lm_head.", "classifier.", "pre_classifier.")


# Nomic BERT's per-layer tensors (nomic's names, which transformers also saves under) -> the model files' (the
# fused Wqkv as attention.qkv_proj, which weight_stream.split_fused cuts into q / k / v)
_NOMIC_LAYER = {
    "attn.Wqkv": "attention.qkv_proj",
    "attn.out_proj": "attention.o_proj",
    "norm1": "attention_norm",
    "norm2": "mlp_norm",
    "mlp.fc11": "mlp.up_proj",
    "mlp.fc12": "mlp.gate_proj",
    "mlp.fc2": "mlp.down_proj",
}
_NOMIC_RE = re.compile(r"^encoder\.layers\.(\d+)\.(.+)$")


# DistilBERT's per-layer modules -> the model files'
_DISTIL_LAYER = {
    "attention.q_lin": "attention.q_proj",
    "attention.k_lin": "attention.k_proj",
    "attention.v_lin": "attention.v_proj",
    "attention.out_lin": "attention.o_proj",
    "sa_layer_norm": "attention_norm",
    "ffn.lin1": "mlp.up_proj",
    "ffn.lin2": "mlp.down_proj",
    "output_layer_norm": "mlp_norm",
}
_DISTIL_RE = re.compile(r"^transformer\.layer\.(\d+)\.(.+)$")
# DistilBertForMaskedLM's head, DistilBertForSequenceClassification's (score_head.py reads that one)
_DISTIL_HEAD = ("vocab_transform.", "vocab_layer_norm.", "vocab_projector.", "pre_classifier.", "classifier.")


def _table_namer(
    family: str, norm: str, tables: tuple[str, ...], layer_re: re.Pattern, layers: dict[str, str], skip: tuple[str, ...]
) -> Callable[[str], str | None]:
    """A checkpoint-name map: its embedding norm module `norm`, the `tables` kept as named, per-layer modules
    through layer_re / layers, `skip` prefixes (heads) not loaded; anything else refused as unexpected."""

    def rename(name: str) -> str | None:
        if name.startswith(_PREFIXES):
            name = name.split(".", 1)[1]
        if name.startswith(skip) or name in _BUFFERS:
            return None
        module, _, kind = name.rpartition(".")
        if module == norm:
            return f"embeddings.norm.{kind}"
        if module in tables:
            return name
        m = layer_re.match(module)
        if m is None or m.group(2) not in layers:
            raise UnsupportedModelError(f"unexpected tensor {name} in a {family} checkpoint")
        return f"layers.{m.group(1)}.{layers[m.group(2)]}.{kind}"

    return rename


nomic_weight_name = _table_namer(
    "Nomic BERT",
    "emb_ln",
    ("embeddings.word_embeddings", "embeddings.token_type_embeddings"),
    _NOMIC_RE,
    _NOMIC_LAYER,
    _HEADS,
)
distilbert_weight_name = _table_namer(
    "DistilBERT",
    "embeddings.LayerNorm",
    ("embeddings.word_embeddings", "embeddings.position_embeddings"),
    _DISTIL_RE,
    _DISTIL_LAYER,
    _DISTIL_HEAD,
)


def weight_namer(model_type: str) -> Callable[[str], str | None]:
    """The checkpoint-name map of an encoder model_type."""
    return {"nomic_bert": nomic_weight_name, "distilbert": distilbert_weight_name}.get(model_type, bert_weight_name)


def bert_weight_name(name: str) -> str | None:
    """An encoder checkpoint tensor under the model files' name; None for tensors not loaded (the
    pooler, MLM / NSP heads, the position_ids buffer old checkpoints saved). A XxxForMaskedLM
    checkpoint's "bert." / "roberta." / "mpnet." prefix is dropped."""
    if name.startswith(_PREFIXES):
        name = name.split(".", 1)[1]
    if name.startswith(_HEADS) or name in _BUFFERS:
        return None
    if name == "encoder.relative_attention_bias.weight":
        return "relative_attention_bias.weight"
    module, _, kind = name.rpartition(".")
    if kind not in _KINDS:
        raise UnsupportedModelError(f"unexpected tensor {name} in a BERT checkpoint")
    kind = _KINDS[kind]
    if module == "embeddings.LayerNorm":
        return f"embeddings.norm.{kind}"
    if module.startswith("embeddings."):
        return f"{module}.{kind}"
    m = _LAYER.match(module)
    if m is None or m.group(2) not in _LAYER_NAMES:
        raise UnsupportedModelError(f"unexpected tensor {name} in a BERT checkpoint")
    return f"layers.{m.group(1)}.{_LAYER_NAMES[m.group(2)]}.{kind}"

"""One tensor at a time, under its Hugging Face name, whatever the checkpoint's format.

Backends load by iterating `iter_weights`: float tensors arrive in the backend's framework (or as
numpy from GGUF), quantized ones as the backend-neutral AffineWeight / Fp8Weight
(app/models/quant/affine.py), which each backend packs into its kernel layout; MLX folders' own
layouts reach MLX as stored (affine words as MlxPacked, microscaled modes as MxWeight) and the other
frameworks in the shared form. Nothing holds the whole model in float: peak memory while loading is
the backend's quantized copy plus one tensor.

`--isq q4|q8|fp8` (in-situ quantization) quantizes float checkpoints on the way through (isq.py).
"""

from __future__ import annotations

import importlib
import json
import logging
import mmap
import re
import struct
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from lantern.app.engine.contract import ModelSpec
from lantern.app.models.architectures import checkpoint_traits
from lantern.app.models.errors import UnsupportedModelError
from lantern.app.models.isq import IsqMode, quantize_stream
from lantern.app.models.quant.affine import AffineWeight, Fp8Weight
from lantern.app.models.quant.microscaled import MxWeight
from lantern.app.models.quant.mlx_packed import MlxPacked
from lantern.app.models.quant.stacked import StackedWeights

logger = logging.getLogger(__name__)


def iter_weights(
    spec: ModelSpec, framework: str, isq: IsqMode | None = None, progress: bool = True
) -> Iterator[tuple[str, Any]]:
    """(HF name, tensor) for every weight the model uses.

    framework: "pt" or "mlx" — what float safetensors entries are read as (GGUF floats are numpy).
    """
    if spec.weight_format == "gguf":
        from lantern.app.models.gguf_names import iter_gguf_weights

        cfg = spec.config
        source: Iterator[tuple[str, Any]] = iter_gguf_weights(
            str(spec.weight_files[0]), cfg.num_heads, cfg.num_kv_heads
        )
        idle = () if cfg.mla is None or cfg.mla.indexer is None else cfg.mla.indexer.idle_prefixes()
        if idle:  # GLM-5's layers that reuse the choice before: an indexer written there is not loaded
            source = ((n, v) for n, v in source if not n.startswith(idle))
    else:
        fused = spec.config.architecture != "gpt_oss"  # gpt-oss's fused experts: family_gptoss reads them
        source = _iter_safetensors(spec, framework, _text_name_map(spec))
        if spec.config.architecture == "qwen3_vl_moe_text":  # Qwen's fused experts as transformers lays them out
            from lantern.app.models.family_qwen3_vl import checkpoint_tensors as qwen3_vl_tensors

            source = qwen3_vl_tensors(source, spec.config.hidden_size)
        if spec.config.family == "llama4" or spec.config.architecture == "aria_text":  # fused [E, in, out] experts
            # as [E, out, in] (Aria's fc1 / fc2 renamed first)
            from lantern.app.models.family_aria import fused_expert_names
            from lantern.app.models.family_llama4 import checkpoint_tensors as llama4_tensors

            source = llama4_tensors(fused_expert_names(source) if spec.config.family != "llama4" else source)
        source = split_switch_mlp(source, fused)
        if spec.config.mla is not None:  # mlx_lm's DeepSeek-V3 conversions split kv_b_proj per head
            from lantern.app.models.family_deepseek import join_mla_heads

            source = join_mla_heads(source, spec.config.mla, spec.config.num_heads)
        if spec.config.architecture == "axk1":  # its mixture's output norm stored at the decoder layer
            from lantern.app.models.family_deepseek import axk1_tensors

            source = axk1_tensors(source, spec.config.moe)
        if spec.config.architecture == "mllama_text_model":  # its embedding's input-only rows past the vocabulary
            from lantern.app.models.family_mllama import checkpoint_tensors as mllama_tensors

            source = mllama_tensors(source, spec.config.vocab_size)
    traits = checkpoint_traits(spec.config.architecture)
    if traits.get("tensors"):  # the family's own layout changes (its configure module's checkpoint_tensors)
        module = importlib.import_module(f"lantern.app.models.{traits['configure']}")
        if hasattr(module, "checkpoint_tensors"):
            source = module.checkpoint_tensors(source, spec)
    if traits.get("names"):  # its checkpoint's names as the model files' (folders and GGUF alike)
        rename = importlib.import_module(f"lantern.app.models.{traits['configure']}").checkpoint_name
        source = ((rename(name), value) for name, value in source)
    if spec.config.family == "apertus":  # xIELU's constants checked, its scalars as vectors (Apertus 1.5 too)
        from lantern.app.models import family_apertus

        if spec.weight_format == "gguf":  # (llama.cpp keeps the scalars in metadata)
            from lantern.app.models.gguf_names import read_gguf_index

            metadata = read_gguf_index(str(spec.weight_files[0])).metadata
            source = family_apertus.gguf_tensors(source, metadata, spec.config.num_layers)
        else:
            source = family_apertus.checkpoint_tensors(source)
    if spec.config.nas is not None and spec.weight_format == "gguf":  # Nemotron-NAS's linear layers, renamed
        from lantern.app.models.family_deci import gguf_tensors as deci_tensors

        source = deci_tensors(source, spec.config.nas)
    if spec.config.architecture == "ernie4_5_moe" and spec.config.moe is not None:  # its router bias, renamed
        from lantern.app.models.family_ernie import checkpoint_tensors as ernie_tensors

        source = ernie_tensors(source, spec.config.moe, spec.config.num_layers)
    if spec.config.architecture == "nemotron":  # LayerNorm1P's 1 + w as the norms' weights
        from lantern.app.models.family_nemotron import checkpoint_tensors as nemotron_tensors

        source = nemotron_tensors(source)
    if spec.config.family == "lfm2":  # the convolution's weight from llama.cpp's or mlx_lm's layout
        from lantern.app.models.family_lfm2 import checkpoint_tensors as lfm2_tensors

        source = lfm2_tensors(source)
    if spec.config.gemma4 is not None and spec.weight_format == "gguf":  # shared layers' K/V, --fuse-qkv
        from lantern.app.models.family_gemma4 import gguf_tensors as gemma4_tensors

        source = gemma4_tensors(source, spec.config)
        if spec.config.gemma3n is not None:  # AltUp's stacked projections, one matrix per stream
            from lantern.app.models.family_gemma3n import gguf_tensors as gemma3n_tensors

            source = gemma3n_tensors(source, spec.config)
    if spec.config.family == "qwen3_next":  # llama.cpp's or mlx_lm's layout, if it is one of those
        from lantern.app.models import family_qwen3_next as qwen

        if spec.weight_format == "gguf":
            source = qwen.gguf_tensors(source)
        else:
            source = qwen.checkpoint_tensors(source, qwen.stored_by_mlx_lm(spec.weight_files))
    if spec.config.mamba is not None:  # llama.cpp's or mlx_lm's layout of the Mamba-2 mixer's tensors
        from lantern.app.models import family_mamba2

        source = (family_mamba2.gguf_tensors if spec.weight_format == "gguf" else family_mamba2.checkpoint_tensors)(
            source
        )
    if spec.config.mamba1 is not None:  # llama.cpp's A and convolution shapes, mlx_lm's convolution layout
        from lantern.app.models import family_mamba

        source = (family_mamba.gguf_tensors if spec.weight_format == "gguf" else family_mamba.checkpoint_tensors)(
            source
        )
    # (a GGUF's qkv_proj / gate_up_proj: the converters' fused tensors, gguf_arch naming which archs have them)
    if spec.config.architecture in FUSED_CHECKPOINTS or spec.weight_format == "gguf":
        source = split_fused(source, spec)
    if spec.config.architecture == "gpt_oss":  # stacked (and MXFP4) experts in the model files' layout
        from lantern.app.models.family_gptoss import checkpoint_tensors

        # GGUF joined gate and up gate rows first; OpenAI's checkpoints interleave their rows
        source = checkpoint_tensors(source, framework, interleaved=spec.weight_format != "gguf")
        if spec.weight_format != "gguf":
            from lantern.app.models.family_gptoss import mlx_expert_biases

            source = mlx_expert_biases(source)
    if isq is not None:
        source = quantize_stream(source, isq, spec, progress)
    for item in source:
        yield item
        del item
        release_freed_memory()


def release_freed_memory() -> None:
    """Give the C heap's free pages back to the system (glibc's malloc_trim).

    Converting a tensor frees several temporaries between the long-lived packed weights; glibc
    keeps such holes in its heap, so without this the resident size after loading SmolLM2's
    95 MB of weights was ~2x that. A no-op elsewhere.
    """
    global _TRIM
    if _TRIM is None:
        try:
            import ctypes

            _TRIM = ctypes.CDLL("libc.so.6").malloc_trim
        except (OSError, AttributeError):
            _TRIM = False
    if _TRIM:
        _TRIM(0)


_TRIM: Any = None


# q/k/v in one qkv_proj and/or gate/up in one gate_up_proj (GLM-4 fuses only gate/up; Granite 4.0-H its
# shared_mlp's, named so by family_granite.hybrid_name)
# (and the GPT-2-era families whose fused q/k/v their family modules reorder to q, k, v rows first)
FUSED_CHECKPOINTS = {
    "phi3",
    "nomic_bert",
    "glm",
    "glm4",
    "granitemoehybrid",
    "granitemoeshared",
    "granitemoe_swa",
    "gpt2",
    "gpt_bigcode",
    "gpt_neox",
    "falcon",
    "codegen",
    "bloom",
    "mpt",
    "sarvam_moe",
    "bailing_moe",
    "dbrx",
}


def split_fused(source: Iterator[tuple[str, Any]], spec: ModelSpec) -> Iterator[tuple[str, Any]]:
    """Phi-3's fused qkv_proj / gate_up_proj as the separate q/k/v and gate/up every model file
    takes (the torch model fuses them again its own way). Row slices of float, affine and FP8
    tensors alike, so a quantized checkpoint stays quantized."""
    cfg = spec.config
    q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    splits = {
        "shared_mlp.gate_up_proj": [
            ("shared_mlp.gate_proj", 0, cfg.intermediate_size),
            ("shared_mlp.up_proj", cfg.intermediate_size, 2 * cfg.intermediate_size),
        ],
        "self_attn.qkv_proj": [
            ("self_attn.q_proj", 0, q),
            ("self_attn.k_proj", q, q + kv),
            ("self_attn.v_proj", q + kv, q + 2 * kv),
        ],
        "attention.qkv_proj": [  # an encoder's (Nomic BERT's Wqkv)
            ("attention.q_proj", 0, q),
            ("attention.k_proj", q, q + kv),
            ("attention.v_proj", q + kv, q + 2 * kv),
        ],
        "mlp.gate_up_proj": [
            ("mlp.gate_proj", 0, cfg.intermediate_size),
            ("mlp.up_proj", cfg.intermediate_size, 2 * cfg.intermediate_size),
        ],
    }
    for name, value in source:
        prefix, _, kind = name.rpartition(".")
        fused = next((f for f in splits if prefix.endswith(f)), None)
        if fused is None:
            yield name, value
            continue
        if value.shape[0] != splits[fused][-1][2]:
            raise ValueError(f"{name} has {value.shape[0]} rows; the config implies {splits[fused][-1][2]}")
        base = prefix[: -len(fused)]
        for part, start, end in splits[fused]:
            yield f"{base}{part}.{kind}", _row_slice(value, start, end)


def _row_slice(value: Any, start: int, end: int) -> Any:
    if isinstance(value, Fp8Weight):
        try:
            return value.rows(start, end)
        except ValueError:  # q/k/v boundaries inside a scale block: exact values, in float
            return value.dequantize()[start:end]
    if isinstance(value, (AffineWeight, MxWeight, MlxPacked)):
        return value.rows(start, end)
    return value[start:end]


# ---- safetensors folders ---------------------------------------------------------------------------
def _text_name_map(spec: ModelSpec) -> Callable[[str], str | None] | None:
    """The model files' name of each checkpoint tensor (None: not loaded), its layer renumbered where the model
    keeps only some of the checkpoint's layers (ModelConfig.checkpoint_layers)."""
    names = _family_name_map(spec)
    kept = spec.config.checkpoint_layers
    if kept is None or names is None:
        return names
    served = {str(source): str(i) for i, source in enumerate(kept)}

    def renumbered(name: str) -> str | None:
        mapped = names(name)
        if mapped is None or not mapped.startswith("model.layers."):
            return mapped
        index, _, rest = mapped[len("model.layers.") :].partition(".")
        return None if index not in served else f"model.layers.{served[index]}.{rest}"

    return renumbered


def _family_name_map(spec: ModelSpec) -> Callable[[str], str | None] | None:
    """For a vision-language folder: its language model's tensor names (None: a vision tensor);
    for a BERT encoder: the encoder files' names (None: a tensor not loaded); else backbone names
    with their "model." prefix."""
    traits = checkpoint_traits(spec.config.architecture)
    if traits.get("tensors"):  # its checkpoint_name renames and skips (None) the family's tensors
        module = importlib.import_module(f"lantern.app.models.{traits['configure']}")
        return module.name_map(spec) if hasattr(module, "name_map") else module.checkpoint_name  # (by its config)
    base: Callable[[str], str | None] = _backbone_name
    if spec.config.multimodal_wrapper in ("qwen2_vl", "qwen2_5_vl"):  # also the released layout: model.layers.*
        from lantern.app.models.family_qwen2_vl import text_weight_name as qwen2_vl_name

        base = qwen2_vl_name
    elif spec.config.multimodal_wrapper is not None:  # the other wrappers: the same language_model prefixes
        from lantern.app.models.family_gemma import text_weight_name

        base = text_weight_name
    if spec.config.family == "lfm2":  # its attention / MLP / norm names as Llama's
        from lantern.app.models.family_lfm2 import checkpoint_name

        return lambda name: None if (text := base(name)) is None else checkpoint_name(text)
    if spec.config.gemma4 is not None:  # its experts and router under `mlp`; sharing layers' K/V skipped (3n too)
        from lantern.app.models.family_gemma4 import checkpoint_name as gemma4_name

        layers = spec.config.gemma4
        return lambda name: None if (text := base(name)) is None else gemma4_name(text, layers)
    if spec.config.family == "llama4":  # its MLP `feed_forward`, the router and shared expert under `mlp`
        from lantern.app.models.family_llama4 import checkpoint_name as llama4_name

        return lambda name: None if (text := base(name)) is None else llama4_name(text)
    if spec.config.multimodal_wrapper is not None:
        return base
    if spec.config.family == "bert":  # HF encoder names -> the encoder files' (pooler and MLM heads skipped)
        from lantern.app.models.family_bert import weight_namer

        return weight_namer(spec.config.architecture)
    if spec.config.architecture.startswith("granitemoe") and spec.config.family == "llama":  # its fused experts
        from lantern.app.models.family_granite import granitemoe_name

        return lambda name: granitemoe_name(_backbone_name(name))
    if spec.config.family == "nemotron_h":  # backbone.*, each block's `mixer` under its kind's name
        from lantern.app.models.family_nemotron_h import checkpoint_name as nemotron_name

        kinds = spec.config.mamba.layer_kinds
        return lambda name: nemotron_name(name, kinds)
    if spec.config.family == "granite_hybrid" and spec.config.architecture != "bamba":  # the same, its shared_mlp
        from lantern.app.models.family_granite import hybrid_name

        dense = spec.config.moe is None
        return lambda name: hybrid_name(_backbone_name(name), dense)
    return _backbone_name


def _backbone_name(name: str) -> str:
    """A base-model checkpoint (saved from XxxModel, as Qwen3-Embedding ships) stores the backbone
    without the "model." prefix of the *ForCausalLM names the model files use."""
    return f"model.{name}" if name.startswith(("layers.", "embed_tokens.", "norm.")) else name


def _iter_safetensors(
    spec: ModelSpec, framework: str, rename: Callable[[str], str | None] | None = None
) -> Iterator[tuple[str, Any]]:
    if rename is None:
        yield from _read_safetensors(spec, framework, skip=_unused_tensors(spec))
        return
    skip: set[str] = _unused_tensors(spec)  # vision tensors too: skipped by name, before they are read
    for path in spec.weight_files:
        raw = RawSafetensors(path)
        skip.update(n for n in raw.names if rename(n) is None)
        raw.close()
    for name, value in _read_safetensors(spec, framework, skip):
        yield rename(name), value  # type: ignore[misc]


# A decoder's XxxForSequenceClassification head: app/models/score_head.py reads it itself (--task score).
_DECODER_SCORE_HEAD = ("score.weight", "score.bias")


def _unused_tensors(spec: ModelSpec) -> set[str]:
    """Tensors the model files do not load: multi-token prediction layers, a decoder classifier's head, an indexer
    on a GLM-5 layer that reuses the choice of the layer before (transformers builds none there)."""
    names = _mtp_tensors(spec)
    mla = spec.config.mla
    idle = () if mla is None or mla.indexer is None else mla.indexer.idle_prefixes()
    if spec.config.encoder is None:
        for path in spec.weight_files:
            raw = RawSafetensors(path)
            names.update(n for n in raw.names if n in _DECODER_SCORE_HEAD or (idle and n.startswith(idle)))
            raw.close()
    return names


def _mtp_tensors(spec: ModelSpec) -> set[str]:
    """Multi-token-prediction weights: DeepSeek V3's and GLM-4.5's layers stored after the decoder's as
    model.layers.{num_hidden_layers}..., ERNIE 4.5's `mtp_*` tensors, Qwen3-Next's, Nemotron 3's, Mellum's and
    K-EXAONE's `mtp.*`. Next-token decoding does not use them (a whole MoE layer in these checkpoints), so they are
    skipped unread."""
    if spec.config.architecture in ("ernie4_5", "ernie4_5_moe"):
        from lantern.app.models.family_ernie import is_mtp_tensor

        wanted = is_mtp_tensor
    elif spec.config.family == "qwen3_next" or spec.config.architecture in (
        "nemotron_h",
        "mellum",
        "exaone_moe",
        "mimo_v2_flash",
    ):
        wanted = lambda n: n.startswith(("mtp.", "model.mtp."))  # (Qwen3.5 vision-language name maps drop them too)
    elif spec.config.architecture == "hy_v3":  # (however many: every layer past the stack)
        past = re.compile(r"^model\.layers\.(\d+)\.")
        stack = spec.config.num_layers
        wanted = lambda n: (m := past.match(n)) is not None and int(m.group(1)) >= stack
    else:
        first, count = spec.config.num_layers, spec.config.mtp_layers
        if not count:
            return set()
        prefixes = tuple(f"model.layers.{i}." for i in range(first, first + count))
        wanted = lambda n: n.startswith(prefixes)
    names: set[str] = set()
    for path in spec.weight_files:
        raw = RawSafetensors(path)
        names.update(n for n in raw.names if wanted(n))
        raw.close()
    if names:
        logger.info("skipping %d multi-token-prediction tensors, unused in decoding", len(names))
    return names


def _read_safetensors(spec: ModelSpec, framework: str, skip: set[str]) -> Iterator[tuple[str, Any]]:
    from safetensors import safe_open

    scheme = spec.config.quantization
    parts: set[str] = set(skip)
    if scheme is not None:
        from lantern.app.models.quant.hf_formats import quantized_module_names, read_quantized_module

        # One module's tensors may sit in different shards of a split checkpoint.
        raws = [RawSafetensors(path) for path in spec.weight_files]
        try:
            where = {name: raw for raw in raws for name in raw.names if name not in skip}
            kv_scales = [n for n in where if n.endswith(_KV_SCALES)]
            if kv_scales:  # FP8-KV-cache exports (ModelOpt, llm-compressor): the cache keeps the model dtype
                logger.info(
                    "%d KV-cache scale tensors are not used: the KV cache holds the model's dtype", len(kv_scales)
                )
                parts.update(kv_scales)
                where = {n: raw for n, raw in where.items() if not n.endswith(_KV_SCALES)}
            for prefix, names in quantized_module_names(scheme, list(where)).items():
                tensors = {n[len(prefix) + 1 :]: where[n].numpy(n) for n in names}
                weight = read_quantized_module(scheme, prefix, tensors, mlx_words=framework == "mlx")
                del tensors
                if framework != "mlx":  # only MLX computes on microscaled weights as stored
                    weight = weight.map(_portable) if isinstance(weight, StackedWeights) else _portable(weight)
                for n in names:
                    where[n].release()
                parts.update(names)
                yield f"{prefix}.weight", weight
        finally:
            for raw in raws:
                raw.close()
    if framework == "mlx":  # safetensors' MLX reader cannot read bf16, the dtype most checkpoints use
        yield from _iter_safetensors_mlx(spec, parts)
        return
    for path in spec.weight_files:
        with safe_open(str(path), framework=framework) as handle:
            for name in handle.keys():
                if name not in parts:
                    yield name, handle.get_tensor(name)


_KV_SCALES = (".k_scale", ".v_scale", ".q_scale", ".prob_scale")
_KV_SCALES += (".k_proj.output_scale", ".v_proj.output_scale", ".q_proj.output_scale", ".prob_output_scale")  # Quark
_KV_SCALES += (".k_proj.output_zero_point", ".v_proj.output_zero_point")  # (Quark's integer KV caches)


def _portable(weight: Any) -> Any:
    return weight.portable() if isinstance(weight, MxWeight) else weight


# mlx_lm stores a MoE layer's experts stacked: <moe>.switch_mlp.<proj>.<weight|bias> [E, ...] (gpt-oss:
# <moe>.experts.<proj>.weight; quantized ones read as StackedWeights), where checkpoints have
# <moe>.experts.<e>.<proj>.<weight|bias>.
_SWITCH_MLP = re.compile(r"^(.*)\.(switch_mlp|experts)\.(gate_proj|up_proj|down_proj)\.(weight|bias)$")


_FUSED_EXPERTS = re.compile(r"^(.*\.mlp\.experts)\.(gate_up_proj|up_proj|down_proj)$")
_FUSED_SCALES = re.compile(r"^.*\.mlp\.experts\.(gate_up_proj|up_proj|down_proj)_(scale_inv|scale|activation_scale)$")


def split_switch_mlp(source: Iterator[tuple[str, Any]], fused: bool = True) -> Iterator[tuple[str, Any]]:
    """MLX-format MoE folders (mlx-community's *-4bit MoE models, mlx_lm.convert output): each stacked
    expert weight as the per-expert tensors the models load (and stack again their own way). gpt-oss's
    stacked expert biases stay stacked (family_gptoss.mlx_expert_biases).

    fused: also transformers 5's own expert layout, which checkpoints without a conversion to
    per-expert names ship (Mistral 4): `<moe>.experts.gate_up_proj` [E, 2 * inner, hidden], gate rows
    first (ungated experts: `<moe>.experts.up_proj` [E, inner, hidden]), and `<moe>.experts.down_proj`
    [E, hidden, inner], without a `.weight` suffix."""
    for name, value in source:
        f = _FUSED_EXPERTS.match(name) if fused else None
        if fused and (_FUSED_SCALES.match(name) or (f is not None and "float8" in str(value.dtype))):
            raise UnsupportedModelError(
                f"{name}: scales of fused FP8 experts (Mistral 4's FP8 release) are not implemented yet; "
                "serve a bfloat16 or a GGUF / MLX-quantized copy of this model"
            )
        if f is not None and getattr(value, "ndim", 0) == 3:
            for e in range(len(value)):
                if f.group(2) != "gate_up_proj":  # (up_proj: ungated experts, Nemotron 3)
                    yield f"{f.group(1)}.{e}.{f.group(2)}.weight", value[e]
                else:
                    inner = value.shape[1] // 2
                    yield f"{f.group(1)}.{e}.gate_proj.weight", value[e][:inner]
                    yield f"{f.group(1)}.{e}.up_proj.weight", value[e][inner:]
            continue
        m = _SWITCH_MLP.match(name)
        # under `experts`, only stacked weights (a 2-D one is another checkpoint's; biases stay stacked)
        gptoss_stack = (
            m is not None and m.group(4) == "weight" and (isinstance(value, StackedWeights) or value.ndim == 3)
        )
        if m is None or (m.group(2) == "experts" and not gptoss_stack):
            yield name, value
            continue
        for e in range(len(value)):  # (numpy, torch and MLX arrays: their first axis)
            yield f"{m.group(1)}.experts.{e}.{m.group(3)}.{m.group(4)}", value[e]


def _iter_safetensors_mlx(spec: ModelSpec, skip: set[str]) -> Iterator[tuple[str, Any]]:
    """Float tensors as MLX arrays in their stored dtype (bf16 included), pages released per tensor."""
    import mlx.core as mx

    for path in spec.weight_files:
        raw = RawSafetensors(path)
        try:
            for name in raw.names:
                if name in skip:
                    continue
                value = mx.array(raw.view(name))  # a copy: the map's pages can go
                if raw.header[name]["dtype"] == "BF16":
                    value = value.view(mx.bfloat16)
                raw.release()
                yield name, value
        finally:
            raw.close()


_SAFETENSORS_DTYPES = {
    "F64": np.float64,
    "F32": np.float32,
    "F16": np.float16,
    "I64": np.int64,
    "I32": np.int32,
    "U32": np.uint32,
    "I16": np.int16,
    "I8": np.int8,
    "U8": np.uint8,
    "BOOL": np.bool_,
    "F8_E4M3": np.uint8,  # bit patterns; Fp8Weight decodes them
    "BF16": np.uint16,  # widened to float32 below
}


class RawSafetensors:
    """A safetensors file's tensors as numpy, any dtype (bf16 widened to float32, float8 as its
    bytes), from one memory map whose pages are given back after each module.

    The safetensors library reads bf16 and float8 only into torch or MLX; a quantized folder's
    scales are bf16 as often as not, and its FP8 weights float8, on either backend. The format is
    an 8-byte header length, a JSON header of dtype/shape/offsets, then the data.
    """

    def __init__(self, path: Path) -> None:
        with open(path, "rb") as f:
            self.buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        (n,) = struct.unpack_from("<Q", self.buf, 0)
        header = json.loads(bytes(self.buf[8 : 8 + n]))
        header.pop("__metadata__", None)
        self.start = 8 + n
        self.header: dict[str, dict[str, Any]] = header
        self.path = path

    @property
    def names(self) -> list[str]:
        return list(self.header)

    def numpy(self, name: str) -> np.ndarray:
        arr = self.view(name)
        if self.header[name]["dtype"] == "BF16":
            return (arr.astype(np.uint32) << 16).view(np.float32)
        return arr.copy()

    def view(self, name: str) -> np.ndarray:
        """The tensor in its stored width (bf16 as uint16 bit patterns), read-only over the map."""
        info = self.header[name]
        if info["dtype"] not in _SAFETENSORS_DTYPES:
            raise ValueError(f"{self.path}: tensor {name} has dtype {info['dtype']}, which Lantern cannot read")
        begin, end = info["data_offsets"]
        np_dtype = np.dtype(_SAFETENSORS_DTYPES[info["dtype"]])
        count = (end - begin) // np_dtype.itemsize
        return np.frombuffer(self.buf, dtype=np_dtype, count=count, offset=self.start + begin).reshape(info["shape"])

    def release(self) -> None:
        """Drop the pages read so far from this process's resident memory (they are file-backed)."""
        if hasattr(mmap, "MADV_DONTNEED"):
            self.buf.madvise(mmap.MADV_DONTNEED)

    def close(self) -> None:
        self.buf.close()

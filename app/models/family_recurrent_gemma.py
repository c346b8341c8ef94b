"""RecurrentGemma (Google's Griffin models recurrentgemma-2b / 9b and their -it; model_type "recurrent_gemma"), as
transformers' RecurrentGemmaConfig reads its config.json, turned into ModelConfig fields, and its checkpoint's tensors
under the model files' names.

The maths (transformers' modeling_recurrent_gemma): Gemma's residual block -- RMSNorm scaled by (1 + weight) in
float32, a temporal block, the residual add, the same norm, a tanh-GELU gated MLP of intermediate_size // 2 with
biases on all three projections -- where the temporal block follows block_types in turn (recurrent, recurrent,
attention by default):

* local attention: multi-query (or grouped) attention within attention_window_size tokens, the rope over the first
  half of each head, o_proj with a bias;
* recurrent (RG-LRU): y = gelu_tanh(linear_y(x)); u = depthwise causal conv1d(linear_x(x)) (width conv1d_width, a
  bias, no activation); per channel, with block-diagonal gates over num_attention_heads blocks (x_h @ W_h + b_h,
  W stored [in, out]),

      i = sigmoid(gate_x(u)),  r = sigmoid(gate_a(u)),  log a = -8 r softplus(recurrent_param)
      h_t = a_t h_{t-1} + sqrt(1 - a_t^2) (u_t i_t)      (at a sequence's first token: h = u i, no sqrt factor)

  and the block returns linear_out(h * y) (linear_x / y / out with biases). Each sequence keeps the convolution's
  last conv1d_width - 1 inputs and h (float32): a state slot, as the Mamba layers keep theirs.

The embedding is multiplied by sqrt(hidden_size) rounded to bfloat16 in every dtype (transformers' normalizer
buffer), the head is tied and its logits soft-capped at logits_soft_cap.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from lantern.app.models.errors import refuse
from lantern.app.models.spec import UnsupportedModelError

# RecurrentGemmaConfig's defaults for the keys ModelConfig.from_hf reads (spec.ARCHITECTURES "defaults"); it has no
# max_position_embeddings (attention is local, the recurrence unbounded): its training length is the default here.
DEFAULTS: dict[str, Any] = {
    "vocab_size": 256000,
    "hidden_size": 2560,
    "intermediate_size": 3 * 2560,
    "num_hidden_layers": 26,
    "num_attention_heads": 10,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "tie_word_embeddings": True,
    "max_position_embeddings": 8192,
}


@dataclass(frozen=True)
class RGLRUConfig:
    """The recurrent layers' shapes: which layers recur, the recurrence's width, its gate blocks and conv width."""

    recurrent_layers: tuple[bool, ...]
    width: int  # lru_width
    heads: int  # the gates' diagonal blocks (num_attention_heads)
    conv_kernel: int

    def attention_layers(self) -> list[int]:
        return [i for i, recurs in enumerate(self.recurrent_layers) if not recurs]

    def state_elements(self) -> tuple[int, int]:
        """Per recurrent layer and sequence: (convolution window values, recurrence values)."""
        return self.width * (self.conv_kernel - 1), self.width


def configure(model_type: str, cfg: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    """ModelConfig field overrides for a recurrent_gemma config.json; refuses, naming the key, what it does not
    compute."""
    import numpy as np

    if model_type != "recurrent_gemma":
        raise UnsupportedModelError(f"family_recurrent_gemma does not configure model_type {model_type!r}")
    layers, hidden, heads = fields["num_layers"], fields["hidden_size"], fields["num_heads"]
    types = list(cfg.get("block_types") or ("recurrent", "recurrent", "attention"))
    if not types or any(t not in ("recurrent", "attention") for t in types):
        raise refuse("block_types", types, " (recurrent or attention, repeated over the layers)")
    kinds = [types[i % len(types)] == "recurrent" for i in range(layers)]
    if all(kinds):
        raise refuse("block_types", types, " (no attention layer at all)")
    if cfg.get("embeddings_scale_by_sqrt_dim", True) is not True:  # (transformers scales whatever it says)
        raise refuse("embeddings_scale_by_sqrt_dim", cfg["embeddings_scale_by_sqrt_dim"], " (the embedding is scaled)")
    act = cfg.get("hidden_activation", "gelu_pytorch_tanh")
    if act != "gelu_pytorch_tanh":
        raise refuse("hidden_activation", act, " (gelu_pytorch_tanh)")
    width = int(cfg.get("lru_width") or hidden)
    if width % heads:
        raise refuse("lru_width", width, f" (must split into the {heads} num_attention_heads blocks)")
    conv = int(cfg.get("conv1d_width", 4))
    if conv < 2:
        raise refuse("conv1d_width", conv, " (must be at least 2)")
    rope = dict(fields["rope_scaling"] or {"rope_type": "default"})
    if rope.get("rope_type", "default") != "default":  # (transformers refuses them too)
        raise refuse("rope_parameters.rope_type", rope["rope_type"], " (RecurrentGemma's rope is the default one)")
    factor = float(
        (cfg.get("rope_parameters") or {}).get("partial_rotary_factor", cfg.get("partial_rotary_factor", 0.5))
    )
    window = int(cfg.get("attention_window_size", 2048))
    cap = cfg.get("logits_soft_cap", 30.0)
    return {
        "rglru": RGLRUConfig(tuple(kinds), width, heads, conv),
        "intermediate_size": int(cfg["intermediate_size"]) // 2,  # (RecurrentGemmaMlp's width)
        "hidden_act": "gelu_tanh",
        "embed_multiplier": float(np.float32(_bf16(hidden**0.5))),
        "final_softcap": float(cap) if cap else None,
        "rope_scaling": {**rope, "rope_type": "default", "partial_rotary_factor": factor},
        # one per pool layer (the attention layers: every one slides, so KV blocks behind the window are freed)
        "layer_windows": [window] * (len(kinds) - sum(kinds)),
    }


def _bf16(value: float) -> float:
    """value as bfloat16 holds it (round to nearest even)."""
    import numpy as np

    bits = int(np.array(value, dtype=np.float32).view(np.uint32))
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return float(np.array(bits, dtype=np.uint32).view(np.float32))


def checkpoint_name(name: str) -> str:
    """A RecurrentGemma tensor under the model files' name: the final norm as model.norm (the layers keep theirs)."""
    return "model.norm." + name.removeprefix("model.final_norm.") if name.startswith("model.final_norm.") else name


def checkpoint_tensors(source: Iterator[tuple[str, Any]], spec: Any) -> Iterator[tuple[str, Any]]:
    """mlx_lm's convolution kernels [C, K, 1] (MLX's Conv1d layout) as the checkpoint's [C, 1, K]."""
    for name, value in source:
        if name.endswith(".conv_1d.weight") and len(value.shape) == 3 and value.shape[-1] == 1:
            value = value.swapaxes(1, 2)
        yield name, value

"""DeepSeek Sparse Attention's indexer as DeepseekV32Config / GlmMoeDsaConfig read it (the rest of those models
is DeepSeek-V3's: family_deepseek). Maths in backends/*/dsa.py.

DeepSeek-V3.2 (deepseek_v32) and GLM-5 (glm_moe_dsa): per layer a lightning indexer scores each query against every
earlier token and the query attends to the index_topk best. GLM-5's indexer turns its rope in pairs (V3.2's in
halves), and its "shared" layers (indexer_types) run no indexer: they reuse the choice of the full layer before.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lantern.app.models.errors import refuse

# DeepseekV32Config's / GlmMoeDsaConfig's defaults for the indexer's keys
_DEFAULTS = {
    "deepseek_v32": {"index_topk": 2048, "index_head_dim": 128, "index_n_heads": 64, "qk_rope_head_dim": 64},
    "glm_moe_dsa": {"index_topk": 2048, "index_head_dim": 128, "index_n_heads": 32, "qk_rope_head_dim": 64},
    "axk2": {"index_topk": 2048, "index_head_dim": 128, "index_n_heads": 16, "qk_rope_head_dim": 32},  # (AXK2Config)
}
# GlmMoeDsaConfig's latent-attention and router defaults where they are not DeepseekV3Config's (family_deepseek)
GLM_DSA_DEFAULTS = dict(q_lora_rank=2048, qk_nope_head_dim=192, v_head_dim=256, n_group=1, topk_group=1)


@dataclass(frozen=True)
class DSAIndexer:
    """DeepSeek Sparse Attention's lightning indexer (DeepseekV32Indexer / GlmMoeDsaIndexer)."""

    n_heads: int  # index_n_heads
    head_dim: int  # index_head_dim: one key per token, the rope on its first qk_rope_head_dim
    topk: int  # index_topk: keys each query attends to
    interleaved: bool = False  # its rope turns pairs (GLM-5), not halves (DeepSeek-V3.2)
    # per layer: True where the layer runs its own indexer; False where it reads the previous such layer's choice
    # (GLM-5's "shared" indexer_types); None: every layer runs one
    own: tuple[bool, ...] | None = None

    def runs(self, layer: int) -> bool:
        return self.own is None or self.own[layer]

    def idle_prefixes(self) -> tuple[str, ...]:
        """Checkpoint name prefixes of indexers on layers that run none (a checkpoint may still carry them)."""
        return tuple(f"model.layers.{i}.self_attn.indexer." for i, own in enumerate(self.own or ()) if not own)


def indexer_config(model_type: str, cfg: dict[str, Any], q_lora_rank: Any) -> DSAIndexer:
    """The indexer of a deepseek_v32 / glm_moe_dsa config.json; refuses, naming the key, what is not computed."""
    get = lambda key: int(cfg.get(key, _DEFAULTS[model_type][key]))
    glm = model_type == "glm_moe_dsa"
    # mlx_lm reads indexer_rope_interleave (transformers fixes it per model: V3.2 halves, GLM-5 pairs)
    stated = cfg.get("indexer_rope_interleave", glm)
    if stated != glm:
        raise refuse(
            "indexer_rope_interleave",
            stated,
            f" for {model_type} (its indexer's rope turns {'pairs' if glm else 'halves'})",
        )
    indexer = DSAIndexer(
        n_heads=get("index_n_heads"),
        head_dim=get("index_head_dim"),
        topk=get("index_topk"),
        interleaved=glm,
        own=_indexer_layers(cfg, int(cfg["num_hidden_layers"])) if glm else None,
    )
    if q_lora_rank is None:  # the indexer's queries come from the query LoRA
        raise refuse("q_lora_rank", None, f" for {model_type} (its indexer reads the query LoRA)")
    rope = get("qk_rope_head_dim")
    if not rope <= indexer.head_dim or indexer.topk < 1 or indexer.n_heads < 1:
        raise refuse("index_head_dim", indexer.head_dim, f" with qk_rope_head_dim={rope}, index_topk={indexer.topk}")
    return indexer


def _indexer_layers(cfg: dict[str, Any], num_layers: int) -> tuple[bool, ...]:
    """GlmMoeDsaConfig's indexer_types: stated, or from index_topk_pattern ("F" full / "S" shared), or every
    index_topk_freq-th layer from index_skip_topk_offset - 1 on full (default: every layer)."""
    types = cfg.get("indexer_types")
    pattern = cfg.get("index_topk_pattern")
    if types is None and pattern is not None:
        types = [{"F": "full", "S": "shared"}.get(c, c) for c in pattern] if isinstance(pattern, str) else pattern
    if types is None:
        freq, offset = max(int(cfg.get("index_topk_freq", 1)), 1), int(cfg.get("index_skip_topk_offset", 2))
        types = ["full" if max(i - offset + 1, 0) % freq == 0 else "shared" for i in range(num_layers)]
    types = list(types)
    if len(types) != num_layers or set(types) - {"full", "shared"} or types[0] != "full":
        raise refuse("indexer_types", types, f" ('full' / 'shared' for each of {num_layers} layers, the first full)")
    return tuple(t == "full" for t in types)

"""DeepSeek-V3.2 (DeepSeek Sparse Attention): config.json read as DeepseekV32Config reads it, refusals naming the
key, the index key held beside the latent in the pool, and the sparse rows against transformers' own
DeepseekV32ForCausalLM where it matters most: sequences longer than index_topk decoding side by side, a prefix
read back from the cache, and prompts prefilled in chunks. (One prompt's logits and greedy tokens: the
deepseek_v32 variant in tests/conformance; the mlx_lm folder: test_mlx_moe_folders.py.)"""

from __future__ import annotations

import pytest
import torch

from lantern.app.engine import LLM, SamplingParams
from lantern.app.models.spec import ModelConfig, UnsupportedModelError
from tests.conformance.test_parity import hf_greedy, hf_model
from tests.models.test_deepseek import BASE

V32 = {
    **BASE,
    "q_lora_rank": 24,
    "n_routed_experts": 8,
    "num_experts_per_tok": 2,
    "n_group": 2,
    "topk_group": 1,
    "index_head_dim": 16,
}


def test_config_matches_deepseek_v32_config():
    from transformers import DeepseekV32Config

    ours = ModelConfig.from_hf({"model_type": "deepseek_v32", **V32, "index_topk": 6, "index_n_heads": 4})
    ref = DeepseekV32Config.from_dict({"model_type": "deepseek_v32", **V32, "index_topk": 6, "index_n_heads": 4})
    idx = ours.mla.indexer
    assert (idx.n_heads, idx.head_dim, idx.topk) == (ref.index_n_heads, ref.index_head_dim, ref.index_topk)
    assert [ours.moe.is_sparse(i) for i in range(ref.num_hidden_layers)] == [
        t == "sparse" for t in ref.mlp_layer_types
    ]  # 3 dense layers by default (first_k_dense_replace)
    assert ours.mla.rope_interleave and ours.mtp_layers == 1
    assert ours.mla.pool_dim == ref.kv_lora_rank + ref.qk_rope_head_dim + ref.index_head_dim
    defaults = ModelConfig.from_hf({"model_type": "deepseek_v32", **V32, "index_head_dim": 128})
    assert (defaults.mla.indexer.topk, defaults.mla.indexer.n_heads) == (2048, 64)  # DeepseekV32Config's


@pytest.mark.parametrize("model_type", ["deepseek_v32", "glm_moe_dsa"])
def test_defaults_are_the_config_classes(model_type):
    """Keys a config.json leaves out mean what DeepseekV32Config / GlmMoeDsaConfig default them to."""
    from transformers import AutoConfig

    shape = {"vocab_size": 400, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4,
             "num_attention_heads": 4, "n_routed_experts": 16}  # fmt: skip
    ours, ref = ModelConfig.from_hf({"model_type": model_type, **shape}), AutoConfig.for_model(model_type, **shape)
    m, moe, idx = ours.mla, ours.moe, ours.mla.indexer
    assert (m.q_lora_rank, m.kv_lora_rank, m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim) == (
        ref.q_lora_rank, ref.kv_lora_rank, ref.qk_nope_head_dim, ref.qk_rope_head_dim, ref.v_head_dim
    )  # fmt: skip
    assert (moe.n_group, moe.topk_group, moe.top_k, moe.routed_scaling_factor) == (
        ref.n_group, ref.topk_group, ref.num_experts_per_tok, ref.routed_scaling_factor
    )  # fmt: skip
    assert [moe.is_sparse(i) for i in range(4)] == [t == "sparse" for t in ref.mlp_layer_types]
    assert (ours.max_position_embeddings, ours.rms_norm_eps) == (ref.max_position_embeddings, ref.rms_norm_eps)
    assert (idx.n_heads, idx.head_dim, idx.topk) == (ref.index_n_heads, ref.index_head_dim, ref.index_topk)


@pytest.mark.parametrize(
    "extra,key",
    [
        ({"q_lora_rank": None}, "q_lora_rank"),  # the indexer reads the query LoRA
        ({"rope_interleave": False}, "rope_interleave"),  # V3.2's latent rope always turns pairs
        ({"index_head_dim": 4}, "index_head_dim"),  # narrower than the rope
        ({"index_topk": 0}, "index_head_dim"),
        ({"indexer_rope_interleave": True}, "indexer_rope_interleave"),  # (mlx_lm's key; V3.2's turns halves)
    ],
)
def test_unimplemented_keys_are_refused_by_name(extra, key):
    with pytest.raises(UnsupportedModelError, match=key):
        ModelConfig.from_hf({"model_type": "deepseek_v32", **V32, **extra})


def test_pool_row_holds_the_index_key(tiny_model_dir, backend):
    llm = LLM(tiny_model_dir("deepseek_v32"), backend=backend, dtype="float32", block_size=4, num_kv_blocks=16)
    b, cfg = llm.engine.backend, llm.engine.backend.cfg
    row = cfg.mla.kv_lora_rank + cfg.mla.qk_rope_head_dim + 16  # [c_kv, k_pe, index key]
    assert tuple(b.pool.k[0].shape[1:]) == (1, row)
    assert b.kv_bytes_per_block(4) == cfg.num_layers * 4 * row * 4  # float32 bytes per block: sized for it


PROMPTS = [
    "Paged attention stores keys and values in blocks",
    "Sparse attention reads the keys an indexer picks for each query, not all of them",
    "Continuous batching",
]


def test_sequences_past_index_topk_decode_together_as_transformers(tiny_model_dir, backend):
    """Three prompts of different lengths (index_topk 6: all but the first few positions are sparse), decoding in
    one batch, a block size that splits them over blocks, chunked prefill: each gets transformers' greedy tokens."""
    path = tiny_model_dir("deepseek_v32")
    llm = LLM(path, backend=backend, dtype="float32", block_size=4, prefill_chunk_size=8, num_kv_blocks=128)
    hf = hf_model(path)
    prompts = [llm.tokenizer.encode(p) for p in PROMPTS]
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))
    for ids, out in zip(prompts, outs):
        assert out.outputs[0].token_ids == hf_greedy(hf, ids, 24)


def test_cached_prefix_is_read_back_with_its_index_keys(tiny_model_dir, backend):
    """A second request extending the first one's prompt starts from the cached prefix (latent and index keys from
    the pool, none recomputed): its tokens are still transformers' over the whole prompt."""
    path = tiny_model_dir("deepseek_v32")
    llm = LLM(path, backend=backend, dtype="float32", block_size=4, num_kv_blocks=128, enable_prefix_caching=True)
    hf = hf_model(path)
    first = llm.tokenizer.encode(PROMPTS[1])
    llm.generate([first], SamplingParams(temperature=0, max_tokens=2))
    longer = first + llm.tokenizer.encode(" while the rest wait")
    out = llm.generate([longer], SamplingParams(temperature=0, max_tokens=16, ignore_eos=True))[0]
    assert out.num_cached_tokens >= 16  # (whole blocks of the first prompt)
    assert out.outputs[0].token_ids == hf_greedy(hf, longer, 16)


def test_indexer_picks_what_transformers_picks(tiny_model_dir):
    """The sparse mask itself, not only its effect: transformers' DeepseekV32Indexer on a 20-token sequence keeps,
    for each query past index_topk, the same keys as ours (torch's dsa.Indexer.scores over the same weights)."""
    from lantern.backends.torch.dsa import Indexer

    hf = hf_model(tiny_model_dir("deepseek_v32"))
    attn = hf.model.layers[1].self_attn
    cfg = hf.config
    torch.manual_seed(3)
    x = torch.randn(1, 20, cfg.hidden_size)
    positions = torch.arange(20)[None]
    cos, sin = hf.model.rotary_emb(x, positions)
    qr = attn.q_a_layernorm(attn.q_a_proj(x))
    mask = torch.tril(torch.ones(20, 20, dtype=torch.bool))[None]
    with torch.no_grad():
        theirs = attn.indexer(x, qr, (cos, sin), mask, positions)[0]  # [20, topk]
        spec = ModelConfig.from_hf(cfg.to_dict()).mla.indexer
        ours = Indexer(cfg.hidden_size, cfg.q_lora_rank, spec)
        ours.load_state_dict(attn.indexer.state_dict(), strict=False)
        ours.k_norm.weight.copy_(attn.indexer.k_norm.weight)
        ours.k_norm.bias.copy_(attn.indexer.k_norm.bias)
        # rope tables in the halves layout transformers' indexer uses: its cos / sin of the first rope dims
        c, s = cos[0, :, : cfg.qk_rope_head_dim], sin[0, :, : cfg.qk_rope_head_dim]
        keys = ours.keys(x[0], c, s)
        score = ours.scores(x[0], qr[0], c, s, keys)
    score = score.masked_fill(~mask[0], float("-inf"))
    for p in range(spec.topk, 20):
        assert set(score[p].topk(spec.topk).indices.tolist()) == set(theirs[p].tolist()), p


@pytest.mark.parametrize(
    "extra",
    [
        {},  # every layer runs its indexer
        {"index_topk_freq": 2, "index_skip_topk_offset": 2},
        {"index_topk_pattern": "FFSF"},
        {"indexer_types": ["full", "shared", "shared", "full"]},
    ],
)
def test_glm5_indexer_layers_are_glm_moe_dsa_configs(extra):
    """GLM-5: which layers run an indexer and which reuse the choice before, as GlmMoeDsaConfig derives it; its
    indexer's rope in pairs."""
    from transformers import GlmMoeDsaConfig

    keys = {**V32, "num_hidden_layers": 4, **extra}
    ours = ModelConfig.from_hf({"model_type": "glm_moe_dsa", **keys}).mla.indexer
    ref = GlmMoeDsaConfig(
        **{k: v for k, v in keys.items() if k not in ("index_topk_pattern",)},
        **({"index_topk_pattern": extra["index_topk_pattern"]} if "index_topk_pattern" in extra else {}),
    )
    assert [ours.runs(i) for i in range(4)] == [t == "full" for t in ref.indexer_types]
    assert ours.interleaved and ours.n_heads == ref.index_n_heads == 32  # GlmMoeDsaConfig's default


def test_glm5_first_layer_must_run_its_indexer():
    with pytest.raises(UnsupportedModelError, match="indexer_types"):
        ModelConfig.from_hf({"model_type": "glm_moe_dsa", **V32, "indexer_types": ["shared"] * 4})


def test_rows_recomputed_a_few_at_a_time_give_the_same_tokens(tiny_model_dir, backend, monkeypatch):
    """The sparse rows' index scores are bounded by _SCORE_BUDGET (a prefill chunk's rows are scored a few at a time):
    with a budget of one row per pass, a chunked prompt still gets transformers' tokens."""
    from lantern.backends.mlx import dsa as mlx_dsa
    from lantern.backends.torch import dsa as torch_dsa

    for module in (torch_dsa, mlx_dsa):
        monkeypatch.setattr(module, "_SCORE_BUDGET", 1)
    path = tiny_model_dir("glm_moe_dsa")
    llm = LLM(path, backend=backend, dtype="float32", block_size=4, prefill_chunk_size=16, num_kv_blocks=128)
    ids = llm.tokenizer.encode(PROMPTS[1])
    out = llm.generate([ids], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))[0]
    assert out.outputs[0].token_ids == hf_greedy(hf_model(path), ids, 12)


@pytest.fixture(scope="module")
def glm5_with_idle_indexer(tiny_model_dir, tmp_path_factory):
    """A GLM-5 folder whose "shared" layer 2 still carries indexer tensors (transformers builds no indexer there and
    ignores them), and its GGUF, which keeps them too."""
    import shutil

    from safetensors.torch import load_file, save_file

    from tests.fixtures.gguf_families import convert_to_gguf

    src = tmp_path_factory.mktemp("glm5-idle") / "hf"
    shutil.copytree(tiny_model_dir("glm_moe_dsa"), src)
    tensors = load_file(src / "model.safetensors")
    for name, value in list(tensors.items()):
        if name.startswith("model.layers.1.self_attn.indexer."):
            tensors[name.replace("layers.1.", "layers.2.")] = value.clone() * 3.0
    save_file(tensors, src / "model.safetensors", metadata={"format": "pt"})
    return src, convert_to_gguf(src, src.parent / "gguf", "f32")[0]


@pytest.mark.parametrize("kind", ["folder", "gguf"])
def test_indexer_tensors_on_a_shared_layer_are_left_unread(glm5_with_idle_indexer, backend, kind):
    folder, gguf_file = glm5_with_idle_indexer
    llm = LLM(str(folder if kind == "folder" else gguf_file), backend=backend, dtype="float32", num_kv_blocks=64)
    ids = llm.tokenizer.encode(PROMPTS[1])
    out = llm.generate([ids], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))[0]
    assert out.outputs[0].token_ids == hf_greedy(hf_model(str(folder)), ids, 8)


def test_axk2_config_reads_as_its_class():
    """A.X-K2's AXK2Config defaults (its shapes, the ungrouped router, index heads, the gated norms' rank) and its
    legacy first_k_dense_replace / moe_layer_freq read as the class derives mlp_layer_types from them."""
    from transformers import AXK2Config

    ref, ours = AXK2Config(), ModelConfig.from_hf({"model_type": "axk2"})
    m, moe = ours.mla, ours.moe
    assert (m.kv_lora_rank, m.q_lora_rank, m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim) == (
        ref.kv_lora_rank,
        ref.q_lora_rank,
        ref.qk_nope_head_dim,
        ref.qk_rope_head_dim,
        ref.v_head_dim,
    )
    assert m.q_gate and ours.gated_norm_rank == ref.gated_norm_rank
    assert (m.indexer.n_heads, m.indexer.head_dim, m.indexer.topk) == (ref.index_n_heads, ref.index_head_dim, 2048)
    assert (moe.num_experts, moe.top_k, moe.routed_scaling_factor) == (128, ref.num_experts_per_tok, 2.5)
    assert (moe.n_group, moe.topk_group, moe.intermediate_size) == (1, 1, ref.moe_intermediate_size)
    sparse = [moe.is_sparse(i) for i in range(ours.num_layers)]
    assert sparse == [kind == "sparse" for kind in ref.mlp_layer_types]
    legacy = {"num_hidden_layers": 6, "first_k_dense_replace": 2, "moe_layer_freq": 2}
    ref, ours = AXK2Config(**legacy), ModelConfig.from_hf({"model_type": "axk2", **legacy})
    assert [ours.moe.is_sparse(i) for i in range(6)] == [kind == "sparse" for kind in ref.mlp_layer_types]


def test_axk2_grouped_router_scores_unchosen_groups_zero_as_its_reference():
    """A.X-K2's router (AXK2TopkRouter) fills the experts of the groups it does not choose with 0, not V3's -inf:
    where a chosen group's experts score below 0, experts of the other groups win. A router whose logits are all 0
    (sigmoid 0.5) and biases set the choice: groups 0 and 1 chosen, only expert 0 above 0, so the top 5 are expert 0
    and the four zero-filled ones (no tie left to chance), weighted alike; both backends pick what transformers
    picks."""
    import mlx.core as mx
    from transformers import AXK2Config
    from transformers.models.axk2.modeling_axk2 import AXK2TopkRouter

    from lantern.backends.mlx.models.deepseek import DeepSeekMoE as MlxMoE
    from lantern.backends.torch.models.deepseek import DeepSeekMoE as TorchMoE
    from lantern.backends.torch.parallel import TPGroup

    keys = {"hidden_size": 16, "n_routed_experts": 8, "num_experts_per_tok": 5, "n_group": 4, "topk_group": 2}
    keys |= {"moe_intermediate_size": 8, "num_hidden_layers": 2, "num_attention_heads": 2, "q_lora_rank": 8}
    cfg = ModelConfig.from_hf({"model_type": "axk2", "vocab_size": 32, "intermediate_size": 16, **keys})
    bias = torch.tensor([0.9, -0.7, -0.6, -0.55, -0.7, -0.6, -0.8, -0.9]) - 0.5  # (biased scores: sigmoid 0.5 + bias)
    ref = AXK2TopkRouter(AXK2Config(**{k: v for k, v in keys.items() if k != "q_lora_rank"}, q_lora_rank=8))
    with torch.no_grad():
        ref.weight.zero_()
        ref.e_score_correction_bias.copy_(bias)
    x = torch.randn(3, 16)
    _, ref_weights, ref_ids = ref(x)
    want = sorted(zip(ref_ids[0].tolist(), ref_weights[0].tolist()))
    assert [i for i, _ in want] == [0, 4, 5, 6, 7]
    ours = TorchMoE(cfg, TPGroup())
    ours.gate.weight = torch.nn.Parameter(torch.zeros(8, 16), requires_grad=False)
    ours.gate.e_score_correction_bias = torch.nn.Parameter(bias.clone(), requires_grad=False)
    ids, weights = ours.route(x)
    assert sorted(zip(ids[0].tolist(), weights[0].tolist())) == pytest.approx(want)
    mlx_moe = MlxMoE(cfg)
    mlx_moe.gate.weight, mlx_moe.gate.e_score_correction_bias = mx.zeros((8, 16)), mx.array(bias.numpy())
    ids, weights = mlx_moe.route(mx.array(x.numpy()))
    assert sorted(zip(ids.tolist()[0], weights.tolist()[0])) == pytest.approx(want)

"""Model honesty: a config whose maths Lantern does not implement is refused in one line naming the
key; what is accepted means what transformers (the reference) makes of the same config."""

from __future__ import annotations

import importlib.util

import pytest

from lantern.app.models.spec import ModelConfig, UnsupportedModelError, check_servable

BASE = {
    "vocab_size": 400,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-5,
}
BACKENDS = [
    pytest.param(b, marks=pytest.mark.skipif(importlib.util.find_spec(m) is None, reason=f"{b} not installed"))
    for b, m in (("torch", "torch"), ("mlx", "mlx"))
]


def cfg(model_type: str, **extra) -> dict:
    return {"model_type": model_type, **BASE, **extra}


def hf_config(model_type: str, **extra):
    from transformers import AutoConfig

    return AutoConfig.for_model(model_type, **BASE, **extra)


def hf_window(model_type: str, **extra) -> int | None:
    """The window some layer of transformers' model attends within; None when every layer is full."""
    hf = hf_config(model_type, **extra)
    layer_types = getattr(hf, "layer_types", None)
    if layer_types is not None and "sliding_attention" not in layer_types:
        return None
    return hf.sliding_window


WINDOWS = [
    ("mistral", {"sliding_window": 64}),
    ("mistral", {"sliding_window": None}),  # v0.2 and later
    ("mistral", {}),  # absent: transformers' MistralConfig default (4096) applies
    ("qwen2", {"sliding_window": 64, "use_sliding_window": False}),  # Qwen2.5's shipped configs
    ("qwen2", {"sliding_window": 64, "use_sliding_window": True, "max_window_layers": 1}),
    ("qwen2", {"sliding_window": 64, "use_sliding_window": True, "max_window_layers": 2}),  # no layer slides
    ("qwen3", {"sliding_window": 64, "use_sliding_window": True, "max_window_layers": 0}),
    ("qwen3", {"sliding_window": 64, "use_sliding_window": True, "layer_types": ["full_attention", "full_attention"]}),
    ("llama", {"sliding_window": 64}),  # not a Llama key: transformers ignores it, so do we
    ("phi3", {"sliding_window": 2047}),  # Phi-3-mini-4k
    ("phi3", {}),  # Phi-4
]


@pytest.mark.parametrize("model_type, extra", WINDOWS)
def test_active_sliding_window_is_what_transformers_uses(model_type, extra):
    config = ModelConfig.from_hf(cfg(model_type, **extra))
    expected = hf_window(model_type, **extra) if model_type != "llama" else None
    assert config.sliding_window == expected


def test_a_window_shorter_than_the_context_is_served():
    config = ModelConfig.from_hf(cfg("mistral", sliding_window=64))
    assert config.layer_windows == [64, 64] and config.all_layers_slide
    check_servable(config, 256)  # sliding windows are implemented: the whole context is served
    check_servable(ModelConfig.from_hf(cfg("mistral", sliding_window=None)), 256)


def test_dual_chunk_attention_is_served_within_one_chunk_only():
    config = ModelConfig.from_hf(cfg("qwen2", dual_chunk_attention_config={"chunk_size": 128, "local_size": 32}))
    with pytest.raises(
        ValueError, match=r"^dual_chunk_attention_config.chunk_size=128 in config.json .* 128 \(or less\)$"
    ):
        check_servable(config, 129)
    check_servable(config, 128)


@pytest.mark.parametrize(
    "scaling, max_context",
    [
        (None, 256),
        ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256}, 1024),  # Qwen2.5 style
        ({"type": "yarn", "factor": 4.0}, 1024),  # original absent: max_position_embeddings is the original
        ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}, 256),  # already extended
        (
            {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 32,
            },
            256,
        ),  # Llama 3.1 states the extended length
        ({"rope_type": "linear", "factor": 2.0}, 256),
        ({"rope_type": "dynamic", "factor": 2.0}, 256),
    ],
)
def test_max_context_follows_the_rope_scaling(scaling, max_context):
    config = ModelConfig.from_hf(cfg("llama", rope_scaling=scaling))
    assert config.max_context == max_context
    check_servable(config, max_context)
    with pytest.raises(ValueError, match=f"serve with --max-model-len {max_context} "):
        check_servable(config, max_context + 1)


def test_normalized_rope_scaling_matches_transformers_defaults():
    # YaRN without original_max_position_embeddings: transformers takes max_position_embeddings
    # (mlx_lm alone would assume 4096), so the normalized dict states it for both backends.
    config = ModelConfig.from_hf(cfg("llama", rope_scaling={"type": "yarn", "factor": 4.0}))
    hf = hf_config("llama", rope_scaling={"type": "yarn", "factor": 4.0}).rope_parameters
    assert config.rope_scaling == {
        "rope_type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": hf["original_max_position_embeddings"],
    }
    # Dynamic NTK equals plain rope up to max_position_embeddings (transformers only rescales past
    # it), and max_context stops there, so it is computed as plain rope.
    assert ModelConfig.from_hf(cfg("llama", rope_scaling={"rope_type": "dynamic", "factor": 2.0})).rope_scaling is None


@pytest.mark.parametrize(
    "model_type, extra, key",
    [
        ("llama", {"mlp_bias": True}, "mlp_bias=true"),
        ("llama", {"attention_bias": True}, "attention_bias=true"),  # adds an o_proj bias Lantern lacks
        ("qwen3", {"attention_bias": True}, "attention_bias=true"),
        ("seed_oss", {"attention_out_bias": True}, "attention_out_bias=true"),
        ("hunyuan_v1_dense", {"attention_bias": True}, "attention_bias=true"),  # o_proj's too
        ("hunyuan_v1_dense", {"use_cla": True}, "use_cla=true"),
        ("hunyuan_v1_moe", {"moe_topk": [2, 4]}, "moe_topk=[2, 4]"),  # per-layer widths Lantern does not vary
        ("hunyuan_v1_moe", {"moe_intermediate_size": 96}, "moe_intermediate_size=96"),  # transformers ignores it
        ("hunyuan_v1_moe", {"num_shared_expert": 2}, "num_shared_expert=2"),
        ("apertus", {"hidden_act": "silu"}, 'hidden_act="silu"'),
        ("apertus", {"attention_bias": True}, "attention_bias=true"),
        ("llama", {"hidden_act": "gelu"}, 'hidden_act="gelu"'),
        (
            "qwen2",
            {
                "rope_scaling": {
                    "rope_type": "longrope",
                    "short_factor": [1.0],
                    "long_factor": [2.0],
                    "original_max_position_embeddings": 64,
                }
            },
            'rope_scaling.rope_type="longrope"',
        ),
        (
            "llama",
            {"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "attention_factor": -0.5}},
            "rope_scaling.attention_factor=-0.5",
        ),
        ("llama", {"partial_rotary_factor": 0.5}, "partial_rotary_factor=0.5"),
        (  # Phi-3's LongRoPE is implemented (tests/models/test_rope_variants.py), one factor per pair
            "phi3",
            {
                "rope_scaling": {"rope_type": "longrope", "short_factor": [1.0] * 4, "long_factor": [2.0] * 8},
                "original_max_position_embeddings": 64,
            },
            'rope_scaling.short_factor="4 numbers"',
        ),
        ("mistral", {"attn_logit_softcapping": 50.0}, "attn_logit_softcapping=50.0"),
        ("qwen2", {"final_logit_softcapping": 30.0}, "final_logit_softcapping=30.0"),
        (
            "llama",
            {"quantization_config": {"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "x"}},
            'quantization_config.bnb_4bit_quant_type="x"',
        ),
        ("llama", {"num_key_value_heads": 3}, "num_key_value_heads=3"),
    ],
)
def test_unimplemented_maths_is_refused_in_one_line_naming_the_key(model_type, extra, key):
    with pytest.raises(UnsupportedModelError) as err:
        ModelConfig.from_hf(cfg(model_type, **extra))
    message = str(err.value)
    assert key in message and "config.json" in message and "not implemented" in message
    assert "\n" not in message


@pytest.mark.parametrize(
    "model_type, extra",
    [
        ("llama", {}),
        ("llama", {"attention_bias": False, "mlp_bias": False}),
        ("mistral", {"attention_bias": True}),
        ("qwen2", {}),
        ("qwen3", {"head_dim": 32}),
        ("seed_oss", {"head_dim": 16}),  # q/k/v biases by default, none on o_proj
        ("seed_oss", {"head_dim": 16, "attention_bias": False}),
        ("llama", {"hidden_act": "silu", "pretraining_tp": 2}),
        (
            "llama",
            {"quantization_config": {"group_size": 64, "bits": 4}, "quantization": {"group_size": 64, "bits": 4}},
        ),
    ],
)
def test_accepted_configs_get_the_projection_biases_transformers_builds(model_type, extra):
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM

    config = ModelConfig.from_hf(cfg(model_type, **extra))
    hf_extra = {k: v for k, v in extra.items() if not k.startswith("quantization")}
    with torch.device("meta"):
        attn = AutoModelForCausalLM.from_config(hf_config(model_type, **hf_extra)).model.layers[0].self_attn
    assert config.attention_bias == (attn.q_proj.bias is not None)
    assert attn.o_proj.bias is None  # Lantern has no o_proj bias: configs that add one are refused
    assert config.head_dim == attn.head_dim


@pytest.mark.parametrize("backend", BACKENDS)
def test_engine_serves_a_sliding_window_model_past_its_window(backend, tmp_path):
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM

    from lantern.app.engine import LLM, SamplingParams
    from tests.fixtures.tiny_models import build_model

    folder = build_model("mistral", tmp_path / "mistral_sw", sliding_window=8)
    llm = LLM(str(folder), backend=backend, dtype="float32", block_size=4, num_kv_blocks=32)
    prompt = [5, 17, 42, 99, 120, 7, 64, 3, 88, 250, 11, 36]  # longer than the window
    out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))[0].outputs[0]
    # transformers applies the window (p - 8 < j <= p); so must Lantern, far past it.
    hf = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    with torch.no_grad():
        ref = hf.generate(torch.tensor([prompt]), max_new_tokens=24, do_sample=False, min_new_tokens=24)[0]
        hf.config.sliding_window = None  # the same weights attending to everything
        full = hf.generate(torch.tensor([prompt]), max_new_tokens=24, do_sample=False, min_new_tokens=24)[0]
    assert out.token_ids == ref[len(prompt) :].tolist()
    assert ref.tolist() != full.tolist()  # the window matters here: ignoring it would fail


def test_hunyuan_and_apertus_defaults_and_variants():
    """Keys a config.json omits take the config classes' values; Apertus's released variant keys are refused
    where they would mean maths nobody computes; bfloat16 xIELU constants are read as Apertus's."""
    import torch

    from lantern.app.models.family_apertus import checkpoint_tensors

    hunyuan = ModelConfig.from_hf(cfg("hunyuan_v1_dense"))
    ref = hf_config("hunyuan_v1_dense")
    assert (hunyuan.rms_norm_eps, hunyuan.max_position_embeddings) == (ref.rms_norm_eps, ref.max_position_embeddings)
    # dots.llm1: Dots1Config's defaults (no experts unless stated; no sliding layer below max_window_layers) and
    # DeepSeek-V3's router as its MoE block reads the keys
    from transformers.models.dots1.modeling_dots1 import Dots1MoE

    dots = {"n_routed_experts": 8, "n_shared_experts": 2, "num_experts_per_tok": 2, "first_k_dense_replace": 1}
    ours, ref = ModelConfig.from_hf(cfg("dots1", **dots)), hf_config("dots1", **dots)
    block = Dots1MoE(ref)
    assert ours.qk_norm and ours.layer_windows is None and ours.rms_norm_eps == ref.rms_norm_eps
    assert (ours.moe.num_experts, ours.moe.top_k, ours.moe.scoring) == (
        block.gate.num_experts,
        block.gate.top_k,
        "sigmoid",
    )
    assert ours.moe.shared_size == block.shared_experts.intermediate_size and not ours.moe.is_sparse(0)
    assert ModelConfig.from_hf(cfg("dots1")).moe is None  # (Dots1Config: no routed experts by default)
    sliding = ModelConfig.from_hf(cfg("dots1", **dots, max_window_layers=1, sliding_window=64))
    assert sliding.layer_windows == [
        None if t == "full_attention" else 64
        for t in hf_config("dots1", **dots, max_window_layers=1, sliding_window=64).layer_types
    ]
    # CWM: CwmConfig's defaults (every 4th layer full from the first, the rest sliding; the llama3 rope)
    cwm, ref = ModelConfig.from_hf(cfg("cwm")), hf_config("cwm")
    assert cwm.layer_windows == [ref.sliding_window if t == "sliding_attention" else None for t in ref.layer_types]
    assert cwm.rope_theta == ref.rope_parameters["rope_theta"] and cwm.rope_scaling["rope_type"] == "llama3"
    assert cwm.rope_scaling["factor"] == ref.rope_parameters["factor"] and not cwm.attention_bias
    # Solar Open: SolarOpenConfig's defaults (every layer sparse, GLM-4.5's router), refusing a partial rope
    solar, ref = ModelConfig.from_hf(cfg("solar_open")), hf_config("solar_open")
    assert (solar.num_heads, solar.num_kv_heads, solar.head_dim, solar.rope_theta) == (
        ref.num_attention_heads,
        ref.num_key_value_heads,
        ref.head_dim,
        ref.rope_parameters["rope_theta"],
    )
    assert (solar.moe.num_experts, solar.moe.top_k, solar.moe.intermediate_size) == (128, 8, ref.moe_intermediate_size)
    assert solar.moe.is_sparse(0) and solar.moe.shared_size == ref.moe_intermediate_size and not solar.qk_norm
    with pytest.raises(UnsupportedModelError, match="partial_rotary_factor"):
        ModelConfig.from_hf(cfg("solar_open", partial_rotary_factor=0.5))
    # Hunyuan MoE: transformers' gate, experts and shared MLP sizes (its defaults: one expert, top 1)
    from transformers.models.hunyuan_v1_moe.modeling_hunyuan_v1_moe import HunYuanMoEV1Moe

    for extra in ({}, {"num_experts": 8, "moe_topk": [2, 2], "moe_intermediate_size": [128, 128]}):
        moe, ref = ModelConfig.from_hf(cfg("hunyuan_v1_moe", **extra)).moe, hf_config("hunyuan_v1_moe", **extra)
        block = HunYuanMoEV1Moe(ref, layer_idx=0)
        assert (moe.num_experts, moe.top_k) == (block.gate.num_experts, block.gate.top_k)
        assert moe.intermediate_size == moe.shared_size == block.shared_mlp.intermediate_size
        assert moe.norm_topk_prob and moe.router_fp32 and block.gate.wg.weight.dtype == torch.float32
    for key, value in (("post_norm", True), ("qk_norm", False)):
        with pytest.raises(UnsupportedModelError, match=key):
            ModelConfig.from_hf(cfg("apertus", **{key: value}))
    stored = [
        ("m.act_fn.beta", torch.tensor(0.5, dtype=torch.bfloat16)),
        ("m.act_fn.eps", torch.tensor(-1e-6).bfloat16()),
    ]
    assert list(checkpoint_tensors(iter(stored))) == []
    with pytest.raises(UnsupportedModelError, match="xIELU constant"):
        list(checkpoint_tensors(iter([("m.act_fn.beta", torch.tensor(0.7))])))


def test_phi_refuses_what_it_does_not_compute():
    """Phi: qk_layernorm and a tied head (its bias would be dropped) are refused by name; the partial rope
    defaults to PhiConfig's 0.5."""
    base = {
        "model_type": "phi",
        "vocab_size": 100,
        "hidden_size": 64,
        "intermediate_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
    }
    assert ModelConfig.from_hf(base).rope_scaling["partial_rotary_factor"] == 0.5
    assert ModelConfig.from_hf({**base, "partial_rotary_factor": 1.0}).rope_scaling is None  # stated: whole heads
    for key, value in (("qk_layernorm", True), ("tie_word_embeddings", True), ("hidden_act", "relu")):
        with pytest.raises(UnsupportedModelError, match=key):
            ModelConfig.from_hf({**base, key: value})


def test_stablelm_refuses_the_12b_switches_by_name():
    """StableLM: use_parallel_residual and qk_layernorm (StableLM 2 12B) refused by name; the partial rope
    defaults to StableLmConfig's 0.25."""
    base = {
        "model_type": "stablelm",
        "vocab_size": 100,
        "hidden_size": 64,
        "intermediate_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
    }
    assert ModelConfig.from_hf(base).rope_scaling["partial_rotary_factor"] == 0.25
    for key in ("use_parallel_residual", "qk_layernorm"):
        with pytest.raises(UnsupportedModelError, match=key):
            ModelConfig.from_hf({**base, key: True})

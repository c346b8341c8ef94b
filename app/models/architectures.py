"""model_type -> what differs from plain Llama: one table instead of a class per architecture (spec.ModelConfig.from_hf
reads it; the keys a family's entry may carry are described in its comments)."""

from __future__ import annotations

from typing import Any

_QWEN3_VL_DEFAULTS = {"rope_theta": 500000.0, "head_dim": 128}  # Qwen3VLTextConfig's (default_theta)

# model_type -> what differs from plain Llama. One table instead of a class per architecture.
ARCHITECTURES: dict[str, dict[str, Any]] = {
    "llama": {},
    "mistral": {},
    # Ministral-8B-2410: Mistral with sliding and full layers (layer_types); MistralConfig's defaults
    "ministral": {"defaults": {"num_key_value_heads": 8, "max_position_embeddings": 131072}},
    "qwen2": {"attention_bias": True},
    "qwen3": {"qk_norm": True},
    # Phi-3 / Phi-3.5 / Phi-4: Llama maths with q/k/v and gate/up stored fused (split while
    # loading: weight_stream.split_fused); partial rotary (Phi-4-mini) and LongRoPE (the 128k variants).
    "phi3": {},
    # StableLM 2 / 3B / StableCode: Llama's layer under LayerNorms with biases, q/k/v biases, a partial rope
    "stablelm": {"family": "stablelm", "configure": "family_stablelm", "defaults": "family_stablelm"},
    # Phi-1 / 1.5 / 2: Cohere's parallel block under a LayerNorm with a bias, biased attention with a partial rope,
    # an ungated GELU MLP, a head with a bias
    "phi": {"family": "phi", "configure": "family_phi", "defaults": "family_phi", "names": True},
    # Phi-3.5-MoE: LayerNorms with biases, biased attention and head, Mixtral's experts under SparseMixer's routing
    "phimoe": {"family": "phimoe", "configure": "family_phimoe", "defaults": "family_phimoe", "own_rope": True},
    # BitNet b1.58: Llama with "subln" norms before o_proj and down_proj, a relu^2-gated MLP (its ternary weights:
    # the checkpoint's quant_method "bitnet")
    "bitnet": {"configure": "family_bitnet", "defaults": "family_bitnet"},
    # Llama 3.2 Vision's language model: Llama's layers, the cross-attention ones between them skipped on text alone
    "mllama_text_model": {"configure": "family_mllama", "defaults": "family_mllama"},
    # Kimi Linear: Kimi Delta Attention layers between rope-less latent-attention ones, DeepSeek-V3's mixture
    "kimi_linear": {"family": "kimi_linear", "configure": "family_kimi_linear", "prepare": True, "tensors": True},
    # Ling 3.0: Kimi Linear's layers with full-rank, bounded KDA gates and a rotated, head-gated latent attention
    "bailing_hybrid": {"family": "kimi_linear", "configure": "family_bailing_hybrid", "prepare": True, "tensors": True},
    # Dory (NVIDIA Nemotron Labs): nGPT's unit-sphere layers, a recurrent section run in loops (family_dory)
    "dory": {"family": "dory", "configure": "family_dory", "prepare": True, "tensors": True, "own_rope": True},
    # Lara Mini: Qwen3.5's gated delta nets beside sliding / rope-less full attention, a softmax mixture
    "lara_mini": {
        "family": "lara_mini",
        "configure": "family_lara_mini",
        "defaults": "family_lara_mini",
        "tensors": True,
    },
    # Muse Glimmer (Meta): Gemma's sandwich layer, weightless q/k norms, a sigmoid output gate, NoPE full layers, a
    # normed embedding (family_muse_glimmer); "muse_glimmer": mlx-community's flat text-only conversions
    "muse_glimmer_text": {
        "family": "muse_glimmer",
        "configure": "family_muse_glimmer",
        "defaults": "family_muse_glimmer",
    },
    "muse_glimmer": {"family": "muse_glimmer", "configure": "family_muse_glimmer", "defaults": "family_muse_glimmer"},
    # IQuest-Coder-V1 Loop: Llama's layers run twice, the second pass mixing attention to the first pass's K/V with
    # a sliding window over its own by a per-head gate (family_iquest_loop)
    "iquestloopcoder": {
        "family": "iquest_loop",
        "configure": "family_iquest_loop",
        "defaults": "family_iquest_loop",
        "names": True,
    },
    # Talkie: NanoChat's weightless norms and reversed rope with learned gains, the normed embedding added back after
    # every block (family_talkie)
    "talkie": {
        "family": "talkie",
        "configure": "family_talkie",
        "defaults": "family_talkie",
        "tensors": True,
        "names": True,
    },
    # RWKV-7 (flash-linear-attention's layout): token-shifted time and channel mixes with a state per layer
    "rwkv7": {"family": "rwkv7", "configure": "family_rwkv7", "prepare": True, "tensors": True, "names": True},
    # Nanbeige 4.2: Llama's layers run num_loops times, each pass with its own K/V (family_nanbeige)
    "nanbeige": {"family": "nanbeige", "configure": "family_nanbeige"},
    # OpenELM (Apple): Llama's layer scaled layer-wise (its own heads and MLP width each), q/k norms (family_openelm)
    "openelm": {
        "family": "openelm",
        "configure": "family_openelm",
        "prepare": True,
        "tensors": True,
    },
    # JetMoE: Llama's layer with a mixture of attention heads (routed query / output projections, one K/V) and of
    # SiLU-gated experts, each with a bias
    "jetmoe": {
        "family": "jetmoe",
        "configure": "family_jetmoe",
        "defaults": "family_jetmoe",
        "prepare": True,
        "tensors": True,
    },
    # RecurrentGemma (Griffin): Gemma's residual blocks around RG-LRU recurrent layers and local attention
    "recurrent_gemma": {
        "family": "recurrent_gemma",
        "configure": "family_recurrent_gemma",
        "defaults": "family_recurrent_gemma",
        "tensors": True,
    },
    # Step 3.5 Flash: Laguna's layer under zero-centred norms, a sigmoid gate per head, clamped SwiGLUs (family_step3p5)
    "step3p5": {
        "family": "step3p5",
        "configure": "family_step3p5",
        "defaults": "family_step3p5",
        "prepare": True,
        "own_rope": True,
        "tensors": True,
    },
    # LongCat-Flash: two latent-attention sublayers and two MLPs per layer, a shortcut mixture with zero experts
    "longcat_flash": {
        "family": "longcat",
        "configure": "family_longcat",
        "defaults": "family_longcat",
        "prepare": True,
        "tensors": True,
    },
    # Zamba2: Mamba-2 layers, some running one of a few shared attention blocks on [x, embedding] first
    "zamba2": {
        "family": "zamba2",
        "configure": "family_zamba2",
        "defaults": "family_zamba2",
        "prepare": True,
        "tensors": True,
    },
    # Zamba (v1): Zamba2's layout with multi-head Mamba-1 mixers, one shared block, no adapters (family_zamba)
    "zamba": {
        "family": "zamba",
        "configure": "family_zamba",
        "defaults": "family_zamba",
        "prepare": True,
        "tensors": True,
    },
    # HRM-Text: two stacks of gated-attention layers without norm weights, run in cycles (family_hrm_text)
    "hrm_text": {"family": "hrm_text", "configure": "family_hrm_text", "defaults": "family_hrm_text", "tensors": True},
    # Seed-OSS: Llama with q/k/v biases (attention_out_bias, an o_proj bias, is refused); SeedOssConfig's
    # defaults for the keys a config.json may omit.
    "seed_oss": {"attention_bias": True, "defaults": {"head_dim": 128, "max_position_embeddings": 524288}},
    # Other families: "family" names the model file both backends build (backends/*/models/),
    # "configure" the module whose configure(model_type, cfg, fields) reads the family's keys; "names": that
    # module's checkpoint_name(name) gives the model files' name of a checkpoint's tensor (weight_stream).
    # GPT-2 / StarCoder (GPT-BigCode) / OPT: Jais 2's layer, a learned position table, no rope; "tensors": the
    # configure module renames the checkpoint's tensors and changes their layout (checkpoint_name / _tensors)
    "gpt2": {"family": "jais2", "configure": "family_gpt2", "prepare": True, "tensors": True},
    # GPT-Neo: GPT-2's block with q/k/v unbiased, scores unscaled, local (sliding) layers between global ones
    "gpt_neo": {"family": "jais2", "configure": "family_gpt2", "prepare": True, "tensors": True},
    "gpt_bigcode": {"family": "jais2", "configure": "family_gpt2", "prepare": True, "tensors": True},
    "opt": {"family": "jais2", "configure": "family_gpt2", "prepare": True, "tensors": True},
    # BLOOM / BLOOMZ: Jais 2's layer under an embedding LayerNorm, ALiBi instead of a rope
    "bloom": {"family": "jais2", "configure": "family_bloom", "prepare": True, "tensors": True},
    # MPT: Jais 2's layer without biases (LayerNorms of a weight only), ALiBi instead of a rope
    "mpt": {"family": "mpt", "configure": "family_mpt", "prepare": True, "tensors": True},
    # GPT-NeoX (Pythia) / Falcon: Phi's parallel block, the MLP under its own LayerNorm where the config says;
    # GPT-NeoX's sequential layers (use_parallel_residual false) in Jais 2's files (family_gptneox.configure)
    "gpt_neox": {"family": "phi", "configure": "family_gptneox", "prepare": True, "tensors": True},
    "falcon": {"family": "phi", "configure": "family_gptneox", "prepare": True, "tensors": True},
    # Gemma (1) / CodeGemma: no sandwich norms, no caps; its pre-MLP norm under Llama's name (checkpoint_name)
    "gemma": {"family": "gemma", "configure": "family_gemma", "names": True},
    "gemma2": {"family": "gemma", "configure": "family_gemma"},
    "gemma3_text": {"family": "gemma", "configure": "family_gemma"},
    "vaultgemma": {"family": "gemma", "configure": "family_gemma"},  # Gemma 2 without the sandwich's outer norms
    # Gemma 4: layers of two shapes (sliding / full), K/V shared by the last layers, per-layer
    # embeddings, a routed mixture beside the dense MLP (26B-A4B).
    "gemma4_text": {"family": "gemma4", "configure": "family_gemma4", "own_rope": True},
    # Gemma 3n (E2B / E4B): Gemma 4's skeleton with AltUp's residual streams, LAuReL and activation sparsity.
    "gemma3n_text": {
        "family": "gemma3n",
        "configure": "family_gemma3n",
        "own_rope": True,
        "defaults": "family_gemma3n",
    },
    "mixtral": {"configure": "family_moe"},
    "qwen2_moe": {"attention_bias": True, "configure": "family_moe"},
    "qwen3_moe": {"qk_norm": True, "configure": "family_moe"},
    "deepseek_v2": {"family": "deepseek", "configure": "family_deepseek"},
    "deepseek_v3": {"family": "deepseek", "configure": "family_deepseek"},
    # A.X-K1 (SK Telecom): DeepSeek-V3 with an RMSNorm on the mixture's output
    "axk1": {
        "family": "deepseek",
        "configure": "family_deepseek",
        "defaults": {  # AXK1Config's
            "vocab_size": 163840,
            "hidden_size": 7168,
            "intermediate_size": 18432,
            "num_hidden_layers": 61,
            "num_attention_heads": 64,
            "max_position_embeddings": 32768,
            "rms_norm_eps": 1e-6,
        },
    },
    # A.X-K2 (SK Telecom): DeepSeek-V3.2's sparse attention with a gated query / output, sigmoid-gated norms
    "axk2": {
        "family": "deepseek",
        "configure": "family_deepseek",
        "defaults": {  # AXK2Config's
            "vocab_size": 163840,
            "hidden_size": 2048,
            "intermediate_size": 5120,
            "num_hidden_layers": 48,
            "num_attention_heads": 32,
            "max_position_embeddings": 131072,
            "rms_norm_eps": 1e-6,
            "bos_token_id": 163691,
            "eos_token_id": 163691,
        },
    },
    # DeepSeek-V3.2: V3 with DeepSeek Sparse Attention (a lightning indexer per layer picks the keys each query reads)
    "deepseek_v32": {
        "family": "deepseek",
        "configure": "family_deepseek",
        "defaults": {"max_position_embeddings": 163840},
    },
    # GLM-5: DeepSeek-V3.2's attention (the indexer's rope in pairs, some layers reusing the previous choice)
    "glm_moe_dsa": {
        "family": "deepseek",
        "configure": "family_deepseek",
        "defaults": {"rms_norm_eps": 1e-5, "max_position_embeddings": 202752},
    },
    "glm4": {"family": "glm4", "configure": "family_glm"},
    "glm": {"configure": "family_glm"},  # glm-4-9b-chat-hf: GLM-4's rope on Llama's layer (no post-sublayer norms)
    # GLM-4.5 / 4.6 / 4.7: Llama's layer, partial rotary (halves), DeepSeek-V3's routed + shared experts.
    "glm4_moe": {"family": "llama_moe", "configure": "family_glm"},
    # GLM-4.7-Flash: DeepSeek-V3's attention and experts under other defaults (family_deepseek).
    "glm4_moe_lite": {"family": "deepseek", "configure": "family_deepseek"},
    # Mistral 4: DeepSeek-V3's attention and experts, a softmax router, YaRN and Llama 4's query temperature.
    "mistral4": {"family": "deepseek", "configure": "family_deepseek", "own_rope": True},
    # Hunyuan dense: Llama's layer with per-head q/k norms after the rope, NTK-alpha rope (family_hunyuan)
    "hunyuan_v1_dense": {"configure": "family_hunyuan", "own_rope": True, "defaults": "family_hunyuan", "names": True},
    # dots.llm1: Qwen3's attention over DeepSeek-V3's sigmoid-routed and shared experts past the first dense layers
    # DeepSeek-MoE 16B (remote code): Llama's layer over DeepSeek's first mixture (softmax, shared experts)
    "deepseek": {
        "family": "llama_moe",
        "configure": "family_llama_moe",
        "defaults": "family_llama_moe:DEEPSEEK_DEFAULTS",
    },
    # Klear (Kwai, remote code): Qwen3's attention over a biased sigmoid router, shared experts mixed in by a softmax
    "Klear": {"family": "llama_moe", "configure": "family_llama_moe", "names": True},
    "dots1": {"family": "llama_moe", "configure": "family_llama_moe", "defaults": "family_llama_moe"},
    # Solar Open: Llama's attention over GLM-4.5's (DeepSeek-V3's) mixture in every layer
    "solar_open": {
        "family": "llama_moe",
        "configure": "family_llama_moe",
        "defaults": "family_llama_moe:SOLAR_OPEN_DEFAULTS",
    },
    # Kolibri-1: EXAONE 4's attention in GLM-4's sandwich layer (AFMoE's files), DeepSeek-V3's mixture choosing by
    # its logits
    "kolibri1": {"family": "afmoe", "configure": "family_kolibri", "defaults": "family_kolibri", "names": True},
    # Flint: Qwen3-MoE's attention with a sink logit per head, NoPE full layers among sliding ones, a sigmoid router
    # (no bias) beside an ungated shared expert
    "flint": {
        "family": "llama_moe",
        "configure": "family_llama_moe",
        "defaults": "family_llama_moe:FLINT_DEFAULTS",
        "names": True,
    },
    # HY-V3 (Hunyuan 3): Apertus's q/k norms in Llama's layer over DeepSeek-V3's sigmoid router (no groups), scaled,
    # beside shared experts, past the dense layers
    "hy_v3": {
        "family": "llama_moe",
        "configure": "family_llama_moe",
        "defaults": "family_llama_moe:HY_V3_DEFAULTS",
        "names": True,
    },
    # MiMo-V2-Flash: Laguna's layer types and ropes, the sliding layers' K/V heads doubled with sinks, narrower value
    # heads scaled, DeepSeek-V3's sigmoid router past the dense layers
    "mimo_v2_flash": {
        "family": "mimo_v2",
        "configure": "family_mimo_v2",
        "own_rope": True,
        "defaults": "family_mimo_v2",
        "names": True,
    },
    # Arcee Trinity (AFMoE): Qwen3's q/k norms, a sigmoid gate on the attention's output, NoPE full layers among
    # sliding ones, Gemma 2's sandwich norms, DeepSeek-V3's sigmoid router (no groups) past the first dense layers
    "afmoe": {"family": "afmoe", "configure": "family_afmoe", "defaults": "family_afmoe", "names": True},
    # JetBrains Mellum 2: Qwen3-MoE's attention and mixture, sliding and full layers on ropes of their own bases,
    # dense layers where mlp_layer_types says
    "mellum": {"family": "mellum", "configure": "family_mellum", "own_rope": True, "defaults": "family_mellum"},
    # Poolside Laguna: per-layer query heads, a softplus gate on the attention's output, sliding and full layers on
    # ropes of their own bases and widths, DeepSeek-V3's sigmoid router (capped logits) beside a shared expert
    "laguna": {
        "family": "laguna",
        "configure": "family_laguna",
        "own_rope": True,
        "defaults": "family_laguna",
        "names": True,
    },
    # Aria's language model: Llama's attention over a renormalised softmax mixture beside shared experts (family_aria)
    "aria_text": {"family": "llama_moe", "configure": "family_aria", "names": True, "defaults": "family_aria"},
    # Hunyuan MoE (Hunyuan-A13B): the same attention over DeepSeek-V2's softmax routing (renormalised) and a shared MLP
    "hunyuan_v1_moe": {
        "family": "llama_moe",
        "configure": "family_hunyuan",
        "own_rope": True,
        "defaults": "family_hunyuan",
        "names": True,
    },
    # Tencent's remote-code Hunyuan folders (A13B as released, 7B-0124, Hunyuan-Large): the class above or the dense
    # one by its experts (family_hunyuan_remote: its config defaults, its fused q/k/v and MLP tensors)
    "hunyuan": {"same_as": "hunyuan_v1_moe", "configure": "family_hunyuan_remote", "tensors": True},
    # Apertus: Llama's layer with per-head q/k norms and an ungated xIELU MLP (two trained scalars per layer)
    "apertus": {
        "family": "apertus",
        "configure": "family_apertus",
        "own_rope": True,
        "defaults": "family_apertus",
        "names": True,
    },
    # Jais 2: Llama's layer under LayerNorms with biases, biased attention and ungated relu^2 MLP
    "jais2": {"family": "jais2", "configure": "family_jais2", "defaults": "family_jais2"},
    # StarCoder2: Jais 2's layer (LayerNorms and biases) with a GELU (tanh) MLP, a sliding window
    "starcoder2": {"family": "jais2", "configure": "family_starcoder2", "defaults": "family_starcoder2", "names": True},
    # Nemotron / Minitron: Jais 2's layer under LayerNorm1P (weights + 1 as they load), a partial rope
    "nemotron": {"family": "jais2", "configure": "family_nemotron", "defaults": "family_nemotron"},
    # NanoChat: Llama's layer under weightless RMSNorms (the embedding's too), a rope turning the other way, q/k norms
    # after it, an ungated relu^2 MLP, soft-capped logits
    "nanochat": {"family": "nanochat", "configure": "family_nanochat", "defaults": "family_nanochat", "names": True},
    # Arcee AFM: Llama's layer with Nemotron's ungated relu^2 MLP
    "arcee": {"family": "arcee", "configure": "family_arcee", "defaults": "family_arcee"},
    # CWM (Meta's Code World Model): Llama's layer, sliding and full layers alternating, a llama3 rope by default
    "cwm": {"configure": "family_cwm", "own_rope": True, "defaults": "family_cwm"},
    # EXAONE 3.0 / 3.5 / Deep: Llama under other tensor and key names (family_exaone3)
    "exaone": {"configure": "family_exaone3", "prepare": True, "defaults": "family_exaone3", "names": True},
    "smollm3": {"configure": "family_smollm3"},  # Llama's layer; some layers without rope (NoPE)
    "granite": {"configure": "family_granite"},  # Llama's layer with embedding / residual / logit scalars
    "granitemoe": {"configure": "family_granite"},  # the same over Mixtral's experts (softmax of the top-k)
    # Granite Swash (granite_swa / granitemoe_swa): Granite's layer with sliding layers and a sink logit per head;
    # granitemoeshared (and a Swash MoE with shared_intermediate_size): Granite 4.0's dense MLP beside the experts
    "granite_swa": {"configure": "family_granite", "defaults": "family_granite:SWA_DEFAULTS"},
    "granitemoe_swa": {"configure": "family_granite"},
    "granitemoeshared": {"configure": "family_granite"},
    "hyperclovax": {"configure": "family_granite"},  # Granite's scalars (logits multiplied), norms on sublayer outputs
    # Granite 4.0-H: Mamba-2 mixer layers (recurrent state) among attention layers, a dense MLP beside the experts.
    "granitemoehybrid": {"family": "granite_hybrid", "configure": "family_granite"},
    # Bamba: Granite 4.0-H's block without its scalars, attention rotating half of each head (family_bamba)
    "bamba": {"family": "granite_hybrid", "configure": "family_bamba", "defaults": "family_bamba", "names": True},
    # Nemotron-H: one mixer per block (Mamba-2, NoPE attention or a relu^2 MLP); "prepare" fills in what
    # transformers 5's saved configs leave out.
    "nemotron_h": {"family": "nemotron_h", "configure": "family_nemotron_h", "own_rope": True, "prepare": True},
    # Falcon-H1: a Mamba-2 mixer beside attention in every layer, μP multipliers (family_falcon_h1).
    "falcon_h1": {
        "family": "falcon_h1",
        "configure": "family_falcon_h1",
        "defaults": "family_falcon_h1",
        "names": True,
    },
    # ERNIE 4.5: Llama's layer with pair-wise rope (GLM-4's); the MoE's router is DeepSeek-V3's with a softmax.
    "ernie4_5": {"family": "ernie", "configure": "family_ernie"},
    "ernie4_5_moe": {"family": "ernie", "configure": "family_ernie"},
    # Mamba / Falcon-Mamba: Mamba-1 selective-scan mixers only (a state per sequence, no attention, no K/V)
    "mamba": {"family": "mamba", "configure": "family_mamba", "prepare": True, "names": True},
    "falcon_mamba": {"family": "mamba", "configure": "family_mamba", "prepare": True, "names": True},
    # Mamba-2 (Mamba-Codestral): Nemotron-H's files with a Mamba-2 block in every layer (family_mamba)
    "mamba2": {"family": "nemotron_h", "configure": "family_mamba", "prepare": True},
    # Jamba: Mamba-1 mixers among NoPE attention layers, a mixture of experts in every other layer
    "jamba": {"family": "jamba", "configure": "family_jamba", "defaults": "family_jamba", "names": True},
    # OLMo (1): Llama's layer under LayerNorms without weights, q/k/v clamped (clip_qkv)
    "olmo": {"family": "olmo1", "configure": "family_olmo1", "defaults": "family_olmo1"},
    # GPT-J (GPT4All-J, Pygmalion-6B): Phi's parallel block, the rope on pairs of the first rotary_dim dims
    "gptj": {"family": "phi", "configure": "family_gptj", "prepare": True, "tensors": True},
    # CodeGen: GPT-J's block, q/k/v fused in its 4 training shards' layout (reordered while loading)
    "codegen": {"family": "phi", "configure": "family_gptj", "prepare": True, "tensors": True},
    # Helium (Kyutai): Llama's layer with the rope on consecutive pairs
    "helium": {"configure": "family_helium", "defaults": "family_helium"},
    # OLMo 2 / 3: post-sublayer norms only, q/k norms over whole projections; OLMo 3's sliding layers.
    "olmo2": {"family": "olmo", "configure": "family_olmo"},
    "olmo3": {"family": "olmo", "configure": "family_olmo"},
    # OLMoE: Llama's layer with OLMo 2's q/k norms, Qwen2-MoE's softmax router over Mixtral-wide experts.
    "olmoe": {
        "family": "olmoe",
        "configure": "family_olmo",
        "defaults": {
            "vocab_size": 50304,
            "hidden_size": 2048,
            "intermediate_size": 2048,
            "num_hidden_layers": 16,
            "max_position_embeddings": 4096,
        },
    },
    # DBRX: Llama's layer under weight-only LayerNorms, a clamped fused Wqkv, Mixtral's routing over fused experts
    "dbrx": {"family": "dbrx", "configure": "family_dbrx", "prepare": True, "tensors": True},
    # FlexOlmo: OLMo 2's layer (post-sublayer norms, whole-projection q/k norms) around OLMoE's experts and router
    "flex_olmo": {
        "family": "olmo",
        "configure": "family_olmo",
        "defaults": {  # FlexOlmoConfig's
            "vocab_size": 100352,
            "hidden_size": 4096,
            "intermediate_size": 11008,
            "num_hidden_layers": 32,
            "num_attention_heads": 32,
            "max_position_embeddings": 4096,
            "rms_norm_eps": 1e-6,
            "rope_theta": 500000.0,
            "num_experts": 7,
            "num_experts_per_tok": 5,
            "eos_token_id": 100257,
        },
    },
    # Command R7B / A: a parallel block under one LayerNorm, pair-wise rope on sliding layers only.
    "cohere2": {"family": "cohere", "configure": "family_cohere"},
    # Cohere2-MoE: Command A's parallel block over a mixture (its routing DeepSeek's), shared experts averaged in
    "cohere2_moe": {"family": "cohere", "configure": "family_cohere"},
    # Cohere Compass (North-*-Vision's language model): Command A's block, its rope on the halves, per layer type
    "cohere_compass_text": {"family": "cohere", "configure": "family_cohere"},
    # Command R / R+ / Aya: the same block with the rope on every layer; R+'s per-head q/k LayerNorms.
    "cohere": {"family": "cohere", "configure": "family_cohere"},
    # EXAONE 4: OLMo 2's post-sublayer norms with per-head q/k norms; global layers without rope (NoPE).
    "exaone4": {"family": "olmo", "configure": "family_exaone"},
    # K-EXAONE: EXAONE 4's attention in Llama's pre-norm layer over DeepSeek-V3's mixture past the first dense layers
    "exaone_moe": {
        "family": "llama_moe",
        "configure": "family_exaone",
        "names": True,
        "defaults": {
            "vocab_size": 102400,
            "hidden_size": 4096,
            "intermediate_size": 16384,
            "num_hidden_layers": 32,
            "num_attention_heads": 32,
            "num_key_value_heads": 32,
        },
    },
    # Qwen3-Next / Qwen3.5: gated DeltaNet linear-attention layers (recurrent state) among gated full attention.
    # "defaults": the config classes' values for keys released configs may omit (head_dim is 256, not d / heads).
    "qwen3_next": {
        "family": "qwen3_next",
        "configure": "family_qwen3_next",
        "own_rope": True,
        "defaults": {"head_dim": 256},
    },
    "qwen3_5_text": {
        "family": "qwen3_next",
        "configure": "family_qwen3_next",
        "own_rope": True,
        "defaults": {"head_dim": 256},
    },
    "qwen3_5_moe_text": {
        "family": "qwen3_next",
        "configure": "family_qwen3_next",
        "own_rope": True,  # configure drops mrope's keys first (Qwen's YaRN configs keep them)
        "defaults": {"head_dim": 256, "intermediate_size": 0},  # every layer is sparse: no dense MLP
    },
    # LFM2: gated short-convolution layers (a conv state per sequence) among Llama-like attention layers.
    "lfm2": {"family": "lfm2", "configure": "family_lfm2", "defaults": {"intermediate_size": 12288, "rope_theta": 1e6}},
    # LFM2-MoE (LFM2-8B-A1B): the same layers, sigmoid-routed experts past the first num_dense_layers.
    "lfm2_moe": {
        "family": "lfm2",
        "configure": "family_lfm2",
        "defaults": {"intermediate_size": 7168, "rope_theta": 1e6, "max_position_embeddings": 128000},
    },
    # LFM3: LFM2's layers plus sliding-window layers, a rope per attention type, a per-head sigmoid gate, sandwich norms
    "lfm3": {"family": "lfm2", "configure": "family_lfm3", "own_rope": True, "defaults": "family_lfm3"},
    # Qwen3-VL's language model: Qwen3 (or Qwen3-MoE with fused experts) under a multimodal rope that is
    # Qwen3's for text. "defaults": Qwen3VLTextConfig's rope base (default_theta) and head_dim.
    "qwen3_vl_text": {"configure": "family_qwen3_vl", "own_rope": True, "defaults": _QWEN3_VL_DEFAULTS},
    "qwen3_vl_moe_text": {"configure": "family_qwen3_vl", "own_rope": True, "defaults": _QWEN3_VL_DEFAULTS},
    # MiniMax-M2 / M2.1: OLMo 2's whole-projection q/k norms, a partial rope, DeepSeek-V3's sigmoid router
    # in every layer. "defaults" names the module whose DEFAULTS are MiniMaxM2Config's.
    "minimax_m2": {
        "family": "minimax_m2",
        "configure": "family_minimax",
        "own_rope": True,
        "defaults": "family_minimax",
        "names": True,
    },
    # Llama 4 (Scout / Maverick): pair-wise rope, NoPE layers with a query temperature, L2 q/k norms, sigmoid-routed
    # top-1 experts beside a shared expert, chunked attention (served within one chunk)
    "llama4_text": {"family": "llama4", "configure": "family_llama4", "defaults": "family_llama4"},
    "ministral3": {"configure": "family_ministral", "own_rope": True},  # Llama's layout, YaRN, query temperature
    # OLMo Hybrid: OLMo 3's attention layers between Llama-style layers around Qwen3.5's gated delta net
    "olmo_hybrid": {
        "family": "olmo_hybrid",
        "configure": "family_olmo_hybrid",
        "tensors": True,
        "defaults": "family_olmo_hybrid",
    },
    # Nemotron-NAS (Llama-3.1-Nemotron-51B, -3.3-Nemotron-Super-49B, -3.1-Nemotron-Ultra-253B): Llama 3.1 with each
    # layer's attention (its KV heads, a linear map, none) and MLP width its own (block_configs)
    "nemotron-nas": {
        "family": "deci",
        "configure": "family_deci",
        "prepare": True,
        "names": True,  # (mlx_lm's name for the linear layer)
        "defaults": {"max_position_embeddings": 2048, "rms_norm_eps": 1e-6},  # (DeciLMConfig is a LlamaConfig)
    },
    # Another family's maths under other key names and defaults (family_renamed): InternLM3, IQuest-Coder, TeleChat3,
    # XVERSE (Llama), Sarvam-30B (GLM-4.5's mixture), Sarvam-105B (DeepSeek-V3), Youtu-LLM and MiniCPM3 (DeepSeek-V3's
    # attention, dense MLPs)
    "internlm3": {"same_as": "llama"},
    "telechat3": {"same_as": "llama"},  # TeleChat3 (Tele-AI): Llama under its own YaRN (rope_config: telechat3-yarn)
    "xverse": {"same_as": "llama"},  # XVERSE-7B / 13B / 65B (remote code): Llama under XverseConfig's defaults
    "iquestcoder": {"same_as": "llama"},
    "sarvam_moe": {"same_as": "glm4_moe", "configure": "family_renamed", "names": True},  # (Bailing's tensor names)
    # Ling / Ring 2.0 (Ling 1.x: DeepSeek-MoE's maths, family_renamed)
    "bailing_moe": {"same_as": "glm4_moe", "configure": "family_renamed", "names": True, "tensors": True},
    "sarvam_mla": {"same_as": "deepseek_v3"},
    "youtu": {"same_as": "deepseek_v3"},
    "youtu_llm": {"same_as": "deepseek_v3"},
    # Gemma 4 unified (the encoder-free Gemma 4, google/gemma-4-12B-it): Gemma 4's text layers, no per-layer
    # embeddings, no experts (its language model; `gemma4_unified` folders through spec.VL_WRAPPERS)
    "gemma4_unified_text": {"same_as": "gemma4_text"},  # (the released folders' name for it: their remote code's)
    # Kimi K2 / K2-Thinking and JoyAI-LLM-Flash: DeepSeek-V3 under their own names (as mlx_lm maps them)
    "kimi_k2": {"same_as": "deepseek_v3"},
    "joyai_llm_flash": {"same_as": "deepseek_v3"},
    # MiMo-7B: Qwen2 with multi-token-prediction layers (model.mtp_layers.*, never run: skipped)
    "mimo": {"same_as": "qwen2", "configure": "family_renamed", "tensors": True},
    "apertus1p5_text": {"same_as": "apertus"},  # (Apertus 1.5: Apertus's layer, a pruned head: family_renamed)
    "minicpm3": {"same_as": "deepseek_v3"},  # (and muP's scalars, LongRoPE: family_renamed.extra_fields)
    "minicpm": {"same_as": "granite"},  # MiniCPM 1 to 4.1: muP's scalars as Granite's; LongRoPE, InfLLM v2's bound
    # InternLM2 / 2.5: Llama under InternLM2's tensor names, q/k/v fused per KV group (family_internlm2's layout)
    "internlm2": {"same_as": "llama", "configure": "family_internlm2", "tensors": True},
    "gpt_oss": {"family": "gptoss", "configure": "family_gptoss", "attention_bias": True},
    # BERT-style encoders: embeddings only (--task embed); family_bert says what each differs in
    "bert": {"family": "bert", "configure": "family_bert"},
    "roberta": {"family": "bert", "configure": "family_bert"},
    "xlm-roberta": {"family": "bert", "configure": "family_bert"},
    "camembert": {"family": "bert", "configure": "family_bert"},
    "mpnet": {"family": "bert", "configure": "family_bert"},
    "nomic_bert": {"family": "bert", "configure": "family_bert", "prepare": True},  # nomic-embed-text v1 / v1.5
    "distilbert": {"family": "bert", "configure": "family_bert", "prepare": True},  # msmarco-distilbert, ...
    "modernbert": {"family": "modernbert", "configure": "family_modernbert", "tensors": True, "own_rope": True},
}


def checkpoint_traits(model_type: str) -> dict[str, Any]:
    """The traits that say how a `model_type` checkpoint's tensors read: a renamed one's family's, with its own
    ("names": its tensors' names) over them."""
    traits = ARCHITECTURES[model_type]
    return {**ARCHITECTURES[traits["same_as"]], **traits} if "same_as" in traits else traits

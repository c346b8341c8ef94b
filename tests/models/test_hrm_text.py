"""HRM-Text (hrm_text): its L and H stacks run in cycles, each pass keeping its own K/V. Tiny random models built and
saved by transformers' HrmTextForCausalLM (fused gqkv / gate_up as it saves them, a random z_L_init); Lantern's
logits equal transformers' through the paged cache (prefill in chunks, then decode) on both backends, for the
config as transformers saves it and as the released (training) configs state it; what it cannot compute is refused
by name."""

from __future__ import annotations

import json

import pytest

from lantern.app.models.errors import UnsupportedModelError
from lantern.app.models.spec import ModelConfig
from tests.fixtures.gguf_hrm_text import SHAPE


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    from tests.fixtures.gguf_hrm_text import hrm_text_folder

    return hrm_text_folder(tmp_path_factory.mktemp("hrm_text"))


def _assert_matches(folder, reference, backend) -> None:
    from tests.fixtures.teacher_forcing import assert_serves_like

    def check(cfg):  # 2 stacks of 2; 2 per pass x 2 x (2 + 1) passes
        assert (cfg.num_layers, cfg.num_kv_layers) == (4, 12)

    assert_serves_like(folder, reference, backend, check, atol=1e-4)


def test_logits_match_transformers(folder, backend):
    out, model = folder
    saved = json.loads((out / "config.json").read_text())
    assert (saved["num_hidden_layers"], saved["num_layers_per_stack"]) == (12, 2)
    _assert_matches(out, model, backend)


def test_a_released_config_states_the_per_stack_count_as_num_hidden_layers(folder, tmp_path, backend):
    """The training configs (HRM-Text-1B's) carry the stack's layer count in num_hidden_layers alone."""
    out, model = folder
    legacy = tmp_path / "released"
    legacy.mkdir()
    for f in out.iterdir():
        (legacy / f.name).write_bytes(f.read_bytes())
    cfg = json.loads((out / "config.json").read_text())
    cfg["num_hidden_layers"] = cfg.pop("num_layers_per_stack")
    (legacy / "config.json").write_text(json.dumps(cfg))
    _assert_matches(legacy, model, backend)


def _base(**extra) -> dict:
    return {"model_type": "hrm_text", "vocab_size": 300, "num_hidden_layers": 2, **SHAPE, **extra}


def test_defaults_follow_transformers_config_class():
    from transformers import HrmTextConfig

    ref = HrmTextConfig(num_hidden_layers=2, **SHAPE)
    cfg = ModelConfig.from_hf(_base())
    assert cfg.hrm.kv_layers == ref.num_hidden_layers == 16  # H 2 x (L 3 + 1) x 2
    assert cfg.embed_multiplier == ref.embedding_scale == 50.0 and cfg.rms_norm_eps == ref.rms_norm_eps
    assert cfg.num_kv_heads == cfg.num_heads == 4 and cfg.rope_theta == 10000.0
    assert ModelConfig.from_hf(_base(num_layers_per_stack=None)).hrm == cfg.hrm  # (a null: the released reading)


@pytest.mark.parametrize(
    "extra, key",
    [
        ({"attention_bias": True}, "attention_bias"),
        ({"mlp_bias": True}, "mlp_bias"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"L_cycles": 0}, "L_cycles"),
        ({"num_layers_per_stack": 2, "num_hidden_layers": 7}, "num_hidden_layers"),
    ],
)
def test_what_it_cannot_compute_is_refused_by_name(extra, key):
    with pytest.raises(UnsupportedModelError, match=key):
        ModelConfig.from_hf(_base(**extra))


def test_tensor_parallelism_is_refused():
    from lantern.backends.torch.parallel import local_config

    with pytest.raises(ValueError, match="HRM-Text"):
        local_config(ModelConfig.from_hf(_base()), 2)


def test_llama_cpp_gguf_matches_transformers(folder, tmp_path, backend):
    """The folder as llama.cpp's HrmTextModel converts it: the same logits (its stacks as blocks, z_L_init as
    hrm.z_l_init, the split gqkv / gate_up)."""
    from tests.fixtures.gguf_hrm_text import convert_hrm_text

    out, model = folder
    _assert_matches(convert_hrm_text(out, tmp_path / "tiny-hrm-text.gguf"), model, backend)


@pytest.mark.parametrize("scheme", ["q4", "q8"])
def test_isq_matches_the_dequantized_reference(folder, tmp_path, backend, scheme, caplog):
    """--isq over the split gqkv / gate_up (rows quantized alike fused or apart), every matrix counted."""
    from tests.models.quant_logits import assert_isq_matches_reference

    assert_isq_matches_reference(folder[0], tmp_path / "ref", backend, scheme, caplog)

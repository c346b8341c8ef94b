"""Llama 3.1 / 3.2 GGUF files: the llama3 rope lives in the rope_freqs tensor, not in metadata.

llama.cpp's converter (LlamaModel.generate_extra_tensors) writes a checkpoint's
`rope_scaling {rope_type: llama3, factor, low_freq_factor, high_freq_factor,
original_max_position_embeddings}` as `rope_freqs.weight`: F32 [rope dims / 2], the divisor of each
inverse frequency, and no rope.scaling.* key beside it. transformers' GGUF reader drops it, so such a
file ran as plain rope. Here tiny llamas with 3.1's (8 / 1 / 4 / 8192) and 3.2's (32 / 1 / 4 / 8192)
scaling are written the converter's way (q/k rows permuted, the divisors computed by the
converter's formula, transcribed below) and must load as their checkpoint's config, with logits
within 1e-4 of transformers' and the same greedy tokens on both backends; the file without the
tensor is far from the checkpoint (the test is not vacuous); rope_freqs that is no llama3 scaling,
or on another architecture, is refused naming the tensor.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from lantern.app.engine import LLM, SamplingParams
from lantern.app.models.gguf_config import hf_config_from_gguf, missing_config_keys
from lantern.app.models.gguf_names import read_gguf_index
from lantern.app.models.gguf_rope import _divisors, _numpy_divisors
from lantern.app.models.loader import resolve_model
from lantern.app.models.spec import ModelConfig, UnsupportedModelError
from tests.conformance.test_parity import PROMPT, hf_greedy, hf_model
from tests.fixtures.gguf_writer import write_llama_hparams, write_llama_tensors, write_tokenizer
from tests.fixtures.teacher_forcing import teacher_forced_logits
from tests.fixtures.tiny_models import build_model

LLAMA31 = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
LLAMA32 = {**LLAMA31, "factor": 32.0}
THETA = 500000.0


def converter_divisors(dim: int, base: float, rope: dict) -> np.ndarray:
    """LlamaModel.generate_extra_tensors of llama.cpp's convert_hf_to_gguf.py, step by step."""
    freqs = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    factor, low, high = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
    old = rope["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old / low, old / high
    out = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < high_wavelen:
            out.append(1)
        elif wavelen > low_wavelen:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return torch.tensor(out, dtype=torch.float32).numpy()


def _bands(divisors: np.ndarray, factor: float) -> tuple[int, int, int]:
    """(unscaled, ramp, fully scaled) frequency counts."""
    high, low = int((divisors == 1).sum()), int((divisors == np.float32(factor)).sum())
    return high, divisors.size - high - low, low


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LANTERN_CACHE", str(tmp_path / "cache"))


# ---- the tensor alone: real Llama 3.x shapes ------------------------------------------------------
def _read(tmp_path: Path, arch: str, dims: int, divisors: np.ndarray | None, write=None) -> dict:
    """missing_config_keys of a file holding an `arch` model's rope metadata and `divisors` as rope_freqs."""
    import gguf

    path = tmp_path / f"{arch}-rope.gguf"
    w = gguf.GGUFWriter(path, arch)
    w.add_head_count(1)
    w.add_embedding_length(dims)
    w.add_rope_dimension_count(dims)
    w.add_rope_freq_base(THETA)
    if write:
        write(w)
    if divisors is not None:
        w.add_tensor("rope_freqs.weight", np.asarray(divisors, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    index = read_gguf_index(str(path))
    return missing_config_keys(index.metadata, path.name, {t.name: t for t in index.tensors})


@pytest.mark.parametrize(
    "dims, rope, bands",
    [
        (128, LLAMA31, (29, 6, 29)),  # Llama 3.1 8B / 70B / 405B
        (64, LLAMA32, (15, 3, 14)),  # Llama 3.2 1B
        (128, LLAMA32, (29, 6, 29)),  # Llama 3.2 3B
        (16, LLAMA31, (4, 1, 3)),  # one ramp frequency: Meta's low_freq_factor 1 fixes the other
    ],
)
def test_recovered_rope_is_the_checkpoints(tmp_path, dims, rope, bands):
    from transformers import LlamaConfig

    divisors = converter_divisors(dims, THETA, rope)
    assert _bands(divisors, rope["factor"]) == bands
    got = _read(tmp_path, "llama", dims, divisors)["rope_scaling"]
    assert got == {"rope_type": "llama3", **rope}
    # what the checkpoint's config.json normalizes to, as Lantern reads it
    hf = LlamaConfig(hidden_size=dims, num_attention_heads=1, rope_parameters={"rope_type": "llama3", **rope})
    assert ModelConfig.from_hf({**hf.to_dict(), "rope_scaling": got}).rope_scaling == (
        ModelConfig.from_hf(hf.to_dict()).rope_scaling
    )
    # without torch (an MLX-only install) the same arithmetic in numpy gives the same divisors
    assert np.allclose(_numpy_divisors(got, THETA, dims), _divisors(got, THETA, dims), rtol=1e-6, atol=0)


def test_recovery_without_torch(tmp_path, monkeypatch):
    divisors = converter_divisors(64, THETA, LLAMA32)
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` raises ImportError
    assert _read(tmp_path, "llama", 64, divisors)["rope_scaling"] == {"rope_type": "llama3", **LLAMA32}


def test_equivalent_divisors_map_to_plain_and_linear_rope(tmp_path):
    assert "rope_scaling" not in _read(tmp_path, "llama", 64, np.ones(32))
    assert _read(tmp_path, "llama", 64, np.full(32, 2.5))["rope_scaling"] == {"rope_type": "linear", "factor": 2.5}
    # no frequency on the ramp: the file fixes only the gap the band edges lie in, and any pair there
    # gives the checkpoint's divisors (high 1.5 here; Meta's 1 / 4 would put one frequency on the ramp)
    divisors = converter_divisors(16, THETA, {**LLAMA31, "high_freq_factor": 1.5})
    assert _bands(divisors, 8.0) == (5, 0, 3)
    got = _read(tmp_path, "llama", 16, divisors)["rope_scaling"]
    assert got["rope_type"] == "llama3" and got["factor"] == 8.0
    assert np.allclose(_divisors(got, THETA, 16), divisors, rtol=1e-6, atol=0)


def _refused(tmp_path, arch: str, dims: int, divisors, write=None) -> str:
    with pytest.raises(UnsupportedModelError) as err:
        _read(tmp_path, arch, dims, divisors, write)
    message = str(err.value)
    assert message.startswith(f"{arch}-rope.gguf: tensor rope_freqs.weight") and "\n" not in message
    return message


def test_rope_freqs_that_is_no_llama3_scaling_is_refused_naming_it(tmp_path):
    # a ramp that is not llama3's smooth one (1 / divisor affine in the frequency)
    assert "no llama3 rope scaling" in _refused(tmp_path, "llama", 64, [1.0] * 14 + [1.5, 3.0, 2.0, 5.0] + [8.0] * 14)
    ramp_reversed = converter_divisors(64, THETA, LLAMA31)[::-1]
    assert "no llama3 rope scaling" in _refused(tmp_path, "llama", 64, ramp_reversed)
    assert "each of the 16 rope frequencies" in _refused(tmp_path, "llama", 32, converter_divisors(64, THETA, LLAMA31))
    assert "not implemented for architecture qwen2" in _refused(
        tmp_path, "qwen2", 64, converter_divisors(64, THETA, LLAMA31)
    )


def test_rope_freqs_beside_stated_scaling_is_refused(tmp_path):
    import gguf

    def linear(w):
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(2.0)

    message = _refused(tmp_path, "llama", 64, converter_divisors(64, THETA, LLAMA31), linear)
    assert "beside llama.rope.scaling.type=linear" in message


def test_rope_freqs_on_a_family_gguf_config_builds_is_refused(tmp_path):
    from types import SimpleNamespace

    tensor = SimpleNamespace(data=np.ones(8, np.float32), tensor_type=SimpleNamespace(name="F32"))
    md = {"general.architecture": "gemma3"}
    with pytest.raises(UnsupportedModelError, match=r"^g\.gguf: tensor rope_freqs\.weight .*architecture gemma3$"):
        hf_config_from_gguf(md, {"rope_freqs.weight": tensor}, "g.gguf")


# ---- a tiny Llama 3.x written as the converter writes it, on both backends ------------------------
def convert_llama(src: Path, path: Path, rope_freqs: bool = True) -> Path:
    """`src` (a float32 HF llama folder) as an F32 GGUF, as convert_hf_to_gguf.py writes it."""
    import gguf
    from transformers import AutoTokenizer

    cfg = json.loads((src / "config.json").read_text())
    heads, kv, hidden = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["hidden_size"]
    rope = cfg["rope_parameters"]
    w = gguf.GGUFWriter(path, "llama")
    write_llama_hparams(w, cfg, rope["rope_theta"])
    w.add_vocab_size(cfg["vocab_size"])
    w.add_rope_dimension_count(hidden // heads)
    fast = AutoTokenizer.from_pretrained(str(src))
    write_tokenizer(w, fast)
    if rope_freqs:
        w.add_tensor("rope_freqs.weight", converter_divisors(hidden // heads, rope["rope_theta"], rope))
    write_llama_tensors(w, src, gguf.MODEL_ARCH.LLAMA, heads, kv)
    return path


@pytest.fixture(scope="module", params=["3.1", "3.2"])
def llama3_gguf(request, tmp_path_factory):
    """(the tiny file, the same without rope_freqs, the HF checkpoint): head_dim 64 (Llama 3.2 1B's),
    whose 32 frequencies fall in all three bands (15 unscaled, 3 on the ramp, 14 fully scaled)."""
    rope = {"rope_type": "llama3", "rope_theta": THETA, **(LLAMA31 if request.param == "3.1" else LLAMA32)}
    root = tmp_path_factory.mktemp(f"llama{request.param}")
    src = build_model(
        "llama2", root / "hf", seed=1, hidden_size=128, num_attention_heads=2, num_key_value_heads=1,
        rope_parameters=rope,
    )  # fmt: skip
    assert _bands(converter_divisors(64, THETA, rope), rope["factor"]) == (15, 3, 14)
    return convert_llama(src, root / "tiny-llama3.gguf"), convert_llama(src, root / "plain.gguf", False), src


def test_file_loads_as_its_checkpoints_config(llama3_gguf):
    path, _, src = llama3_gguf
    expected = ModelConfig.from_hf(json.loads((src / "config.json").read_text()))
    assert expected.rope_scaling["rope_type"] == "llama3"
    assert resolve_model(str(path)).spec.config == expected


def test_logits_and_greedy_match_transformers(llama3_gguf, backend):
    path, plain, src = llama3_gguf
    model = hf_model(str(src))
    results = {}
    for name, file in (("rope_freqs", path), ("dropped", plain)):
        llm = LLM(str(file), backend=backend, dtype="float32", block_size=4, prefill_chunk_size=8, num_kv_blocks=64)
        try:
            prompt = llm.tokenizer.encode(PROMPT)
            if name == "rope_freqs":
                greedy = hf_greedy(model, prompt, 32)
                assert len(set(greedy)) > 8, "degenerate reference: the tiny model should produce varied tokens"
                with torch.no_grad():
                    expected = model(torch.tensor([prompt + greedy])).logits[0].numpy()
                out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=32, ignore_eos=True))
                assert out[0].outputs[0].token_ids == greedy
            rows = list(teacher_forced_logits(llm.engine, prompt, greedy, request_id=name))
            assert len(rows) == 32
            results[name] = max(float(np.abs(logits - expected[pos]).max()) for pos, logits in rows)
        finally:
            llm.engine.shutdown()
    assert results["rope_freqs"] <= 1e-4, results
    # Not vacuous: the same weights read as plain rope (the tensor dropped) are far from the checkpoint.
    assert results["dropped"] > 1e-2, results

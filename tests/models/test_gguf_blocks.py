"""GGUF blocks -> AffineWeight, and the GGUF weight stream (names, q/k order, split files, memory).

The truth is code nobody here wrote: `gguf.quants.dequantize` for block values, transformers'
GGUF loader and un-permute for names and row order.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest
from safetensors.numpy import load_file

from lantern.app.models.gguf_names import (
    gguf_split_parts,
    gguf_tensor_names,
    iter_gguf_weights,
    read_gguf_index,
)
from lantern.app.models.quant.affine import AffineWeight
from lantern.app.models.quant.gguf_blocks import BLOCK_LAYOUT, gguf_to_weight
from lantern.app.models.spec import UnsupportedModelError
from tests.fixtures.gguf_writer import dequantize, random_blocks, write_gguf_model

# type -> (bits, group size) of its exact affine form
MODES = {
    "Q4_0": (4, 32),
    "Q4_1": (4, 32),
    "Q5_0": (5, 32),
    "Q5_1": (5, 32),
    "Q8_0": (8, 32),
    "Q2_K": (2, 16),
    "Q3_K": (3, 16),
    "Q4_K": (4, 32),
    "Q5_K": (5, 32),
    "Q6_K": (6, 16),
    "Q1_0": (2, 128),  # 1-bit signs held as 2-bit codes 0 / 1
}
# the codebook and float-4 types: exact, wider than in the file (quant/gguf_decoded.py)
DECODED_MODES = {
    "IQ4_NL": (8, 32),
    "IQ4_XS": (8, 32),
    "IQ3_XXS": (8, 32),
    "IQ3_S": (5, 32),
    "IQ2_XXS": (8, 32),
    "IQ2_XS": (8, 16),
    "IQ2_S": (8, 16),
    "IQ1_S": (5, 32),
    "IQ1_M": (5, 16),
    "TQ1_0": (2, 32),
    "TQ2_0": (2, 32),
    "MXFP4": (5, 32),
    "NVFP4": (5, 16),
}
# how many distinct levels each decodes to (a random block uses them all): IQ4's table (read from the
# nibbles, also under a zero scale), the grids' signed values, ternary plus TQ2_0's spare code
LEVELS = {"IQ4_NL": 16, "IQ4_XS": 16, "IQ3_XXS": 16, "IQ3_S": 16, "IQ2_XXS": 6, "IQ2_XS": 6, "IQ2_S": 6}
LEVELS |= {"IQ1_S": 6, "IQ1_M": 6, "TQ1_0": 3, "TQ2_0": 4, "MXFP4": 15, "NVFP4": 15, "Q1_0": 2}
MIXED = {"token_embd": "Q8_0", "attn_v": "Q6_K", "ffn_down": "Q6_K"}  # like a Q4_K_M file


def _close(got: np.ndarray, ref: np.ndarray) -> None:
    """Equal to float32 rounding: one part in 1e6 of the tensor's largest value."""
    assert got.shape == ref.shape
    assert np.isfinite(ref).all()
    assert float(np.abs(got - ref).max()) <= 1e-6 * float(np.abs(ref).max())


def _dense(w: AffineWeight | np.ndarray) -> np.ndarray:
    return w.dequantize() if isinstance(w, AffineWeight) else np.asarray(w, dtype=np.float32)


# ---- one tensor -----------------------------------------------------------------------------------
@pytest.mark.parametrize("qtype", [*BLOCK_LAYOUT, *DECODED_MODES])
@pytest.mark.parametrize("rows", [1, 7])
def test_block_type_is_exact_affine(qtype, rows):
    rng = np.random.default_rng(rows)
    per_block = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[qtype]][0]
    cols = 3 * per_block if rows == 1 else 2048  # odd block counts, and enough weights to hit every code
    raw = random_blocks(qtype, rows, cols, rng, rms=0.5)
    ref = dequantize(raw, qtype)  # the gguf package's decoder (Q1_0: ggml's definition, gguf_writer.py)
    w = gguf_to_weight(qtype, raw, rows, cols)
    assert isinstance(w, AffineWeight)
    assert w.mode == {**MODES, **DECODED_MODES}[qtype] and w.shape == (rows, cols) and qtype in w.source
    assert w.codes.dtype == np.uint8 and int(w.codes.max()) < 2**w.bits
    if rows > 1:  # random blocks use every code (level), so every bit of the unpacking is exercised
        assert len(np.unique(w.codes)) == LEVELS.get(qtype, 2**w.bits)
    assert w.scales.dtype == np.float32 and w.biases.dtype == np.float32
    _close(w.dequantize(), ref)


def test_a_damaged_codebook_block_is_refused_not_misread():
    """A value that is not a level of its block's scale (here: a scale field changed after the values
    were decoded, as a reader of the wrong layout would see it) raises instead of loading wrong."""
    from lantern.app.models.quant import gguf_decoded

    rng = np.random.default_rng(0)
    raw = random_blocks("IQ3_S", 2, 256, rng)
    real = gguf_decoded.DECODED["IQ3_S"]
    wrong = (*real[:3], lambda b: real[3](b) * np.float32(1.37))
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(gguf_decoded.DECODED, "IQ3_S", wrong)
        with pytest.raises(ValueError, match=r"IQ3_S.*not whole levels"):
            gguf_to_weight("IQ3_S", raw, 2, 256)


def test_block_type_accepts_the_enum_and_flat_bytes():
    rng = np.random.default_rng(3)
    raw = random_blocks("Q5_K", 3, 256, rng)
    w = gguf_to_weight(gguf.GGMLQuantizationType.Q5_K, raw.reshape(-1), 3, 256)
    _close(w.dequantize(), gguf.quants.dequantize(raw, gguf.GGMLQuantizationType.Q5_K))


@pytest.mark.parametrize("qtype", ["F32", "F16", "BF16"])
def test_plain_types(qtype):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(5, 24)).astype(np.float32)
    data = gguf.quants.quantize(x, gguf.GGMLQuantizationType[qtype])
    ref = gguf.quants.dequantize(data, gguf.GGMLQuantizationType[qtype])
    w = gguf_to_weight(qtype, data, 5, 24)
    assert isinstance(w, np.ndarray) and w.shape == (5, 24)
    assert w.dtype == (np.float16 if qtype == "F16" else np.float32)
    np.testing.assert_array_equal(w.astype(np.float32), ref)
    vec = gguf_to_weight(qtype, data[0], 1, 24)  # a 1-D tensor (norm weight) stays 1-D
    assert vec.shape == (24,)
    np.testing.assert_array_equal(vec.astype(np.float32), ref[0])


def test_q1_0_signs_by_hand():
    """One block: d = 0.5 and sign bytes 0b101, 0x80, then zeros: weights 0, 2 and 15 are +0.5, the other
    125 are -0.5 (ggml: bit j % 8 of byte j / 8, set -> +d). The reference decoder agrees."""
    block = np.zeros((1, 18), np.uint8)
    block[0, 0:2] = np.array([0.5], np.float16).view(np.uint8)
    block[0, 2], block[0, 3] = 0b101, 0x80
    w = gguf_to_weight("Q1_0", block, 1, 128)
    expected = np.full(128, -0.5, np.float32)
    expected[[0, 2, 15]] = 0.5
    np.testing.assert_array_equal(w.dequantize()[0], expected)
    np.testing.assert_array_equal(dequantize(block, "Q1_0")[0], expected)


@pytest.mark.parametrize("qtype", ["Q8_K", "Q8_1"])
def test_unsupported_type_is_refused_by_name(qtype):
    per_block, nbytes = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[qtype]]
    raw = np.zeros((2, 256 // per_block * nbytes), dtype=np.uint8)
    with pytest.raises(UnsupportedModelError) as err:
        gguf_to_weight(qtype, raw, 2, 256)
    message = str(err.value)
    assert qtype in message and "Q4_K" in message and "\n" not in message


# ---- whole files ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """Written tiny GGUF models, one per (arch, qtype, overrides, split), built on first use."""
    cache: dict = {}

    def get(arch="llama", qtype="Q4_K", overrides=None, split=1, seed=0):
        key = (arch, qtype, tuple(sorted((overrides or {}).items())), split, seed)
        if key not in cache:
            cache[key] = write_gguf_model(tmp_path_factory.mktemp("gguf"), arch, qtype, overrides, seed, split)
        return cache[key]

    return get


CASES = [
    ("llama", "Q4_K", MIXED),
    # Q3_K (group 16) on the permuted q rows; Q5_1 on k; BF16/F16 plain tensors
    ("llama", "Q4_0", {"attn_q": "Q3_K", "attn_k": "Q5_1", "token_embd": "BF16", "output": "F16"}),
    # qwen2: biases, no permutation; every remaining type somewhere
    ("qwen2", "Q5_K", {"attn_q": "Q2_K", "attn_k": "Q4_1", "ffn_up": "Q5_0", "ffn_gate": "F32"}),
    # codebook and float-4 types, on permuted q/k rows and the embedding too
    ("llama", "IQ4_XS", {"attn_q": "IQ2_XXS", "attn_k": "IQ1_M", "token_embd": "IQ4_NL", "ffn_up": "MXFP4"}),
]


@pytest.mark.parametrize("arch,qtype,overrides", CASES)
def test_iter_gguf_weights_equals_reference(written, arch, qtype, overrides):
    path, ref_dir = written(arch, qtype, overrides)
    ref = load_file(str(ref_dir / "model.safetensors"))
    got = dict(iter_gguf_weights(path, 4, 2))
    assert sorted(got) == sorted(ref)
    for name, w in got.items():
        _close(_dense(w), ref[name])
        if isinstance(w, AffineWeight):
            assert w.mode == {**MODES, **DECODED_MODES}[w.source.split()[-1]]
        else:
            assert w.ndim == 2 or "norm" in name or name.endswith(".bias")
    # the types asked for are the types that came back
    expect = {
        "model.layers.0.self_attn.q_proj.weight": overrides.get("attn_q", qtype),
        "model.layers.1.mlp.up_proj.weight": overrides.get("ffn_up", qtype),
        "model.embed_tokens.weight": overrides.get("token_embd", qtype),
    }
    for name, t in expect.items():
        w = got[name]
        if t in MODES or t in DECODED_MODES:
            assert isinstance(w, AffineWeight) and w.source == f"GGUF {t}"
        else:
            assert isinstance(w, np.ndarray) and w.dtype == (np.float16 if t == "F16" else np.float32)


def test_q_k_rows_are_unpermuted_for_llama(written):
    """The file's own q rows differ from HF order (so the check below means something)."""
    path, ref_dir = written("llama", "Q4_K", MIXED)
    ref = load_file(str(ref_dir / "model.safetensors"))
    index = read_gguf_index(str(path))
    raw_q = next(t for t in index.tensors if t.name == "blk.0.attn_q.weight")
    as_stored = gguf.quants.dequantize(raw_q.data, raw_q.tensor_type)
    assert not np.array_equal(as_stored, ref["model.layers.0.self_attn.q_proj.weight"])
    got = dict(iter_gguf_weights(path, 4, 2))
    for name in ("model.layers.0.self_attn.q_proj.weight", "model.layers.1.self_attn.k_proj.weight"):
        np.testing.assert_array_equal(got[name].dequantize(), ref[name])


def test_written_file_reads_like_its_reference(written, tmp_path, monkeypatch):
    """The fixture itself: transformers' GGUF loader sees the reference weights, and the loader
    reads the file's hyper-parameters and tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lantern.app.models.loader import resolve_model
    from tests.fixtures.tiny_models import CORPUS

    monkeypatch.setenv("LANTERN_CACHE", str(tmp_path))
    path, ref_dir = written("llama", "Q4_K", MIXED)
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name)
    ref = load_file(str(ref_dir / "model.safetensors"))
    state = model.state_dict()
    assert sorted(state) == sorted(ref)
    for name, values in ref.items():
        np.testing.assert_array_equal(state[name].float().numpy(), values)

    loaded = resolve_model(str(path))
    cfg = loaded.spec.config
    assert (cfg.architecture, cfg.hidden_size, cfg.intermediate_size, cfg.num_layers) == ("llama", 256, 512, 2)
    assert (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.tie_word_embeddings) == (4, 2, 64, False)
    ref_tok = AutoTokenizer.from_pretrained(str(ref_dir))
    assert cfg.vocab_size == len(ref_tok)
    for text in CORPUS:
        assert loaded.tokenizer.encode(text) == ref_tok.encode(text)
    assert loaded.chat_template == ref_tok.chat_template
    assert loaded.eos_token_ids == [ref_tok.eos_token_id]


def test_unsupported_type_in_a_file_is_refused_before_converting(written):
    path, _ = written("llama", "Q4_K", {"ffn_down": "Q8_K"})
    with pytest.raises(UnsupportedModelError, match=r"blk\.0\.ffn_down\.weight is GGUF type Q8_K"):
        next(iter_gguf_weights(path, 4, 2))


# ---- split files ------------------------------------------------------------------------------------
def test_split_file_reads_like_the_whole_file(written):
    whole, _ = written("llama", "Q4_K", MIXED)
    first, _ = written("llama", "Q4_K", MIXED, split=3)
    parts = gguf_split_parts(first)
    assert [p.name for p in parts] == [f"tiny-llama-q4_k-{i:05d}-of-00003.gguf" for i in (1, 2, 3)]
    assert gguf_split_parts(parts[2]) == parts  # naming any part finds them all
    assert gguf_split_parts(whole) == [whole]
    assert all(len(read_gguf_index(str(p)).tensors) > 0 for p in parts)
    assert "output.weight" not in [t.name for t in read_gguf_index(str(first)).tensors]
    assert sorted(gguf_tensor_names(first)) == sorted(gguf_tensor_names(whole))
    a = dict(iter_gguf_weights(whole, 4, 2))
    b = dict(iter_gguf_weights(first, 4, 2))
    assert sorted(a) == sorted(b)
    for name, w in a.items():
        np.testing.assert_array_equal(_dense(w), _dense(b[name]))


def test_split_file_with_a_missing_part_is_refused(written, tmp_path):
    first, _ = written("llama", "Q4_K", MIXED, split=3)
    for p in gguf_split_parts(first):
        if "-00002-" not in p.name:
            shutil.copy(p, tmp_path / p.name)
    with pytest.raises(FileNotFoundError, match=r"tiny-llama-q4_k-00002-of-00003\.gguf"):
        next(iter_gguf_weights(tmp_path / first.name, 4, 2))


def test_split_count_must_match_the_files(written, tmp_path):
    whole, _ = written("llama", "Q4_K", MIXED)
    for i in (1, 2):  # an unsplit file renamed as parts: its metadata has no split.count
        shutil.copy(whole, tmp_path / f"m-{i:05d}-of-00002.gguf")
    with pytest.raises(ValueError, match=r"split\.count"):
        next(iter_gguf_weights(tmp_path / "m-00001-of-00002.gguf", 4, 2))


def test_split_file_config_sees_every_part(written, tmp_path, monkeypatch):
    """transformers infers tie_word_embeddings from the first part's tensors only (output.weight
    lives in a later part): the loader decides it from every part, whichever part is named."""
    from lantern.app.models.loader import resolve_model

    monkeypatch.setenv("LANTERN_CACHE", str(tmp_path))
    first, _ = written("llama", "Q4_K", MIXED, split=3)
    for named in (first, first.with_name(first.name.replace("-00001-", "-00002-"))):
        spec = resolve_model(str(named)).spec
        assert spec.config.tie_word_embeddings is False
        assert [p.name for p in spec.weight_files] == [first.name.replace("-00001-", f"-0000{i}-") for i in (1, 2, 3)]
        assert "-of-" not in spec.name


# ---- the default model's real file ------------------------------------------------------------------
def test_smollm2_q4_1_converts_exactly(gguf_path):
    from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor

    got = dict(iter_gguf_weights(gguf_path, 9, 3))
    modes = {w.source: w.mode for w in got.values() if isinstance(w, AffineWeight)}
    assert modes == {"GGUF Q4_1": (4, 32), "GGUF Q8_0": (8, 32)}
    assert all(w.ndim == 1 for w in got.values() if isinstance(w, np.ndarray))  # only norms stay float
    assert len(got) == 2 + 30 * 9
    index = {t.name: t for t in read_gguf_index(str(gguf_path)).tensors}
    unpermute = LlamaTensorProcessor()._reverse_permute_weights
    checks = {
        "token_embd.weight": ("model.embed_tokens.weight", None),
        "blk.0.attn_q.weight": ("model.layers.0.self_attn.q_proj.weight", (9, 9)),
        "blk.29.attn_k.weight": ("model.layers.29.self_attn.k_proj.weight", (9, 3)),
        "blk.7.ffn_down.weight": ("model.layers.7.mlp.down_proj.weight", None),
    }
    for gguf_name, (name, heads) in checks.items():
        t = index[gguf_name]
        ref = gguf.quants.dequantize(t.data, t.tensor_type)
        if heads:
            ref = unpermute(ref, *heads)
        _close(got[name].dequantize(), ref)


_RSS_PROBE = """
import sys
import numpy as np
from lantern.app.models import gguf_names
from lantern.app.models.quant import gguf_blocks

def rss_file():
    for line in open("/proc/self/status"):
        if line.startswith("RssFile:"):
            return int(line.split()[1]) * 1024

base = rss_file()
peak = base
for _name, _w in gguf_names.iter_gguf_weights(sys.argv[1], 9, 3):
    peak = max(peak, rss_file())
print(peak - base)
"""


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads RssFile from /proc")
def test_file_pages_are_released_while_streaming(gguf_path):
    """Without releasing, every page of the mapped file stays resident (~the file size)."""
    out = subprocess.run(
        [sys.executable, "-c", _RSS_PROBE, str(gguf_path)], capture_output=True, text=True, check=True, timeout=120
    )
    grown = int(out.stdout.strip().splitlines()[-1])
    assert grown < 0.3 * Path(gguf_path).stat().st_size, f"file-backed RSS grew by {grown / 2**20:.0f} MiB"


@pytest.mark.parametrize("qtype", ["IQ4_XS", "IQ2_XXS"])
def test_a_codebook_block_with_a_non_finite_scale_is_refused_by_name(qtype):
    raw = random_blocks(qtype, 2, 256, np.random.default_rng(0))
    raw[1, 0:2] = np.array([np.inf], np.float16).view(np.uint8)  # the second row's first d
    with pytest.raises(ValueError, match=rf"GGUF {qtype}: rows 0..2: a block scale is not a finite number"):
        gguf_to_weight(qtype, raw, 2, 256)

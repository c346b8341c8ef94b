"""GGUF files of every supported block type load quantized and compute what their blocks mean.

Files are written by tests/fixtures/gguf_writer.py with the `gguf` package; the reference is
transformers, through Lantern's paged cache, on the file's exact values (gguf.quants.dequantize),
with one change where a backend has no exact layout for a type and says so in the log: those
tensors are round-to-nearest quantized to the mode the backend documents (below), so the test
checks that the backend computes exactly what it claims to hold. (A random 2-layer model turns a
3% weight change into a different model, so "close to the file" would be a meaningless bound.)
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from lantern.app.models.quant.affine import quantize_affine
from lantern.app.models.quant.gguf_decoded import DECODED, HELD_WIDER
from tests.fixtures.gguf_writer import write_gguf_model
from tests.models.quant_logits import logits_error, reference_folder, tolerance, torch_cpu_vnni

FILES = {
    # like llama.cpp's Q4_K_M: Q4_K with Q6_K for v/down and a Q8_0 embedding
    "q4_k_m": ("llama", "Q4_K", {"token_embd": "Q8_0", "attn_v": "Q6_K", "ffn_down": "Q6_K"}),
    "legacy": ("llama", "Q4_0", {"attn_k": "Q4_1", "attn_v": "Q5_0", "ffn_up": "Q5_1", "token_embd": "Q8_0"}),
    "q5_k": ("qwen2", "Q5_K", {"output": "Q8_0"}),
    "low_bit_k": ("llama", "Q3_K", {"ffn_down": "Q2_K", "attn_output": "Q2_K"}),
    # the codebook and float-4 types (held exactly, wider: quant/gguf_decoded.py), like an IQ4_XS file
    "iq4": ("llama", "IQ4_XS", {"token_embd": "IQ4_NL", "attn_v": "IQ3_S", "ffn_down": "IQ3_XXS"}),
    "iq_low": ("qwen2", "IQ2_XXS", {"attn_q": "IQ2_XS", "attn_k": "IQ2_S", "attn_v": "IQ1_S", "ffn_down": "IQ1_M"}),
    "ternary_fp4": ("llama", "TQ2_0", {"attn_q": "TQ1_0", "ffn_up": "MXFP4", "ffn_down": "NVFP4", "output": "Q8_0"}),
    "one_bit": ("llama", "Q1_0", {"token_embd": "Q8_0", "output": "Q8_0"}),  # PrismML's 1-bit sign models
}
_GROUP16 = ("IQ2_XS", "IQ2_S", "IQ1_M", "NVFP4")  # decoded types held in group 16
_WIDE = ("IQ4_NL", "IQ4_XS", "IQ3_XXS", "IQ3_S", "IQ2_XXS", "IQ1_S", "MXFP4", *_GROUP16)  # 5 or 8 bits
_HF = {
    "token_embd": "model.embed_tokens.",
    "output": "lm_head.",
    "attn_q": ".self_attn.q_proj.",
    "attn_k": ".self_attn.k_proj.",
    "attn_v": ".self_attn.v_proj.",
    "attn_output": ".self_attn.o_proj.",
    "ffn_gate": ".mlp.gate_proj.",
    "ffn_up": ".mlp.up_proj.",
    "ffn_down": ".mlp.down_proj.",
}
# (bits, group (0: per row), symmetric) each backend converts a type to when it has no exact layout.
CONVERTED = {
    "mlx": {
        "Q2_K": (4, 32, False),
        "Q3_K": (5, 32, False),
        "Q6_K": (8, 32, False),
        **dict.fromkeys(_GROUP16, (8, 32, False)),
    },
    "torch": {
        "Q2_K": (4, 32, False),
        "Q3_K": (4, 32, False),
        **{t: (8, 0, True) for t in ("Q5_0", "Q5_1", "Q5_K", "Q6_K", "Q8_0", *_WIDE)},
    },
    # the VNNI layers hold every 32-multiple group as it is: only the group-16 types are converted
    "torch-vnni": {
        "Q2_K": (4, 32, False),
        "Q3_K": (4, 32, False),
        "Q6_K": (8, 32, False),
        **dict.fromkeys(_GROUP16, (8, 32, False)),
    },
}


def converted(backend: str) -> dict[str, tuple[int, int, bool]]:
    return CONVERTED["torch-vnni" if backend == "torch" and torch_cpu_vnni() else backend]


def _qtype(kind: str, name: str) -> str | None:
    _, default, overrides = FILES[kind]
    if not name.endswith(".weight") or "norm" in name:
        return None
    for stem, hf in _HF.items():
        if hf in name or name.startswith(hf):
            return overrides.get(stem, default)
    return None


def held_reference(kind: str, backend: str, ref: Path, out: Path) -> Path:
    """The file's values, with the tensors the backend converts put in the mode it converts to."""

    def held(name, w):
        mode = converted(backend).get(_qtype(kind, name) or "")
        if mode is None:
            return w
        bits, group, symmetric = mode
        return quantize_affine(w.astype("float32"), bits, group or w.shape[1], symmetric=symmetric).dequantize()

    return reference_folder(ref, out, held)


@pytest.fixture(scope="module")
def gguf_files(tmp_path_factory):
    cache = {}

    def get(kind: str, split: int = 1):
        if (kind, split) not in cache:
            arch, qtype, overrides = FILES[kind]
            out = tmp_path_factory.mktemp(f"{kind}-{split}")
            cache[(kind, split)] = write_gguf_model(out, arch=arch, qtype=qtype, overrides=overrides, split=split)
        return cache[(kind, split)]

    return get


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LANTERN_CACHE", str(tmp_path / "cache"))


@pytest.mark.parametrize("kind", list(FILES))
def test_gguf_logits_match_what_the_backend_holds(gguf_files, backend, kind, caplog, tmp_path):
    path, ref = gguf_files(kind)
    held = held_reference(kind, backend, Path(ref), tmp_path / "held")
    with caplog.at_level(logging.WARNING):
        err = logits_error(str(path), str(held), backend)
    assert err <= tolerance(backend, str(held)), f"{backend} {kind}: {err:.4f}"
    _, default, overrides = FILES[kind]
    for qtype in {default, *overrides.values()}:
        lines = [line for line in caplog.text.splitlines() if f"GGUF {qtype} tensor(s)" in line]
        # torch/CPU also logs what storing scales in 16 bits costs: a rounding, not a conversion
        conversions = [line for line in lines if backend == "mlx" or "requantized" in line]
        assert bool(conversions) == (qtype in converted(backend)), (qtype, caplog.text)
    widened = [line for line in caplog.text.splitlines() if "read as exact affine codes wider than the file" in line]
    decoded = sorted(t for t in {default, *overrides.values()} if t in DECODED or t in HELD_WIDER)
    assert [all(t in line for t in decoded) for line in widened] == ([True] if decoded else [])


def test_split_gguf_serves_like_the_whole_file(gguf_files, backend, tmp_path):
    _, ref = gguf_files("q4_k_m")
    first, _ = gguf_files("q4_k_m", split=3)
    held = held_reference("q4_k_m", backend, Path(ref), tmp_path / "held")
    assert logits_error(str(first), str(held), backend) <= tolerance(backend, str(held))


@pytest.mark.parametrize("kind", ["q4_k_m", "q5_k"])  # a tied head (the Q8_0 embedding), an untied Q8_0 output
def test_a_bfloat16_model_gets_float32_logits_from_the_vnni_head(gguf_files, kind):
    """bfloat16 logits step by 1/128 of their value and tie close candidates (the default model's
    first answer token was such a tie): the VNNI head makes float32 logits at no cost."""
    if not torch_cpu_vnni():
        pytest.skip("the VNNI CPU kernels are not available on this machine")
    import torch

    from lantern.app.engine import LLM
    from tests.fixtures.teacher_forcing import teacher_forced_logits

    path, _ = gguf_files(kind)
    llm = LLM(str(path), backend="torch", dtype="bfloat16", block_size=8, num_kv_blocks=16)
    try:
        _, row = next(iter(teacher_forced_logits(llm.engine, [5, 6, 7, 8], [9])))
    finally:
        llm.engine.shutdown()
    logits = torch.from_numpy(row)
    assert (logits.bfloat16().float() != logits).sum() > len(logits) // 2


def test_codebook_types_take_4_bits_a_weight_on_the_vnni_layers(gguf_files, tmp_path):
    """On torch's VNNI layers the IQ4 file (IQ4_XS, IQ4_NL, IQ3_S, IQ3_XXS: at most 16 levels each)
    is held at 4 bits a weight, as a Q4_K file of the same shapes is (both 32-wide groups with float16
    scales and biases): codebook indices, not the 8-bit codes the other backends hold."""
    from lantern.app.engine import LLM

    if not torch_cpu_vnni():
        pytest.skip("the codebook layout is the VNNI layers' (x86-64 with AVX512-VNNI)")
    q4_k, _ = write_gguf_model(tmp_path / "q4_k", arch="llama", qtype="Q4_K")
    iq4, _ = gguf_files("iq4")
    held = {}
    for path in (q4_k, iq4):
        llm = LLM(str(path), backend="torch", dtype="float32", num_kv_blocks=16, block_size=4)
        try:
            held[path] = llm.engine.weight_bytes
        finally:
            llm.engine.shutdown()
    assert held[iq4] <= 1.02 * held[q4_k], held

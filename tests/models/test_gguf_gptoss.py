"""gpt-oss from a GGUF file (llama.cpp's architecture "gpt-oss") on both backends.

The file is written here from a tiny transformers gpt_oss checkpoint the way llama.cpp's
convert_hf_to_gguf.py GptOssModel writes it: its metadata keys, tensor names from the `gguf`
package's map (sinks as attn_sinks.weight, the router as ffn_gate_inp, the pre-MLP norm as
post_attention_norm), HF's interleaved gate_up rows split into ffn_gate_exps / ffn_up_exps (biases
too), and the experts either float or quantized with gguf.quants.quantize(..., MXFP4). The reference
is transformers' GptOss on the values the file holds (gguf.quants.dequantize), gate and up
interleaved back.

MLX keeps the MXFP4 experts MXFP4 (their nibbles repacked): logits within 1e-4 and greedy tokens
equal. torch keeps their values too, as for OpenAI's MXFP4 folders (family_gptoss; 4-bit
codebook indices on the VNNI CPU kernels, requantized and logged without them): checked as
tests/models/test_gptoss_mxfp4.py checks those folders.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer

from lantern.app.engine import LLM, SamplingParams
from lantern.app.models.loader import resolve_model
from lantern.app.models.quant.microscaled import E2M1_VALUES
from lantern.app.models.spec import ModelConfig
from tests.conformance.test_parity import PROMPT, hf_greedy, hf_model
from tests.fixtures.teacher_forcing import teacher_forced_logits
from tests.models.test_gptoss_mxfp4 import check_torch_experts, torch_reference

LLM_OPTIONS = dict(dtype="float32", block_size=4, prefill_chunk_size=8, num_kv_blocks=64)


def _store(writer, name: str, value: np.ndarray, qtype: str) -> np.ndarray:
    """Write one tensor as `qtype`; returns the values the file holds (float32)."""
    import gguf

    value = np.ascontiguousarray(value, dtype=np.float32)
    if qtype == "MXFP4":
        mxfp4 = gguf.GGMLQuantizationType.MXFP4
        raw = gguf.quants.quantize(value, mxfp4)
        writer.add_tensor(name, raw, raw_dtype=mxfp4)
        return np.asarray(gguf.quants.dequantize(raw, mxfp4), dtype=np.float32).reshape(value.shape)
    stored = value.astype(np.float16) if qtype == "F16" else value
    writer.add_tensor(name, stored)
    return stored.astype(np.float32)


def convert_gptoss(src: Path, out: Path, experts: str) -> tuple[Path, Path]:
    """`src` as `<out>/tiny-gpt-oss.gguf`: experts "F32" or "MXFP4" (then the other matrices and
    the expert biases F16, as llama.cpp's MXFP4_MOE files mix them); norms, sinks, the router and
    1-D biases F32. Returns (the file, a reference folder of the values it holds)."""
    import gguf
    from safetensors.numpy import load_file, save_file

    from tests.fixtures.gguf_writer import write_tokenizer

    cfg = json.loads((src / "config.json").read_text())
    rope, layers = cfg["rope_parameters"], cfg["num_hidden_layers"]
    path = out / f"tiny-gpt-oss-{experts.lower()}.gguf"
    w = gguf.GGUFWriter(path, "gpt-oss")
    # TextModel.set_gguf_parameters' keys, then GptOssModel's two (sliding window, expert width)
    for add, value in (
        (w.add_block_count, layers), (w.add_context_length, cfg["max_position_embeddings"]),
        (w.add_embedding_length, cfg["hidden_size"]), (w.add_feed_forward_length, cfg["intermediate_size"]),
        (w.add_head_count, cfg["num_attention_heads"]), (w.add_head_count_kv, cfg["num_key_value_heads"]),
        (w.add_rope_scaling_type, gguf.RopeScalingType.YARN), (w.add_rope_scaling_factor, rope["factor"]),
        (w.add_rope_scaling_orig_ctx_len, rope["original_max_position_embeddings"]),
        (w.add_rope_scaling_yarn_beta_fast, rope["beta_fast"]), (w.add_rope_scaling_yarn_beta_slow, rope["beta_slow"]),
        (w.add_rope_freq_base, rope["rope_theta"]), (w.add_layer_norm_rms_eps, cfg["rms_norm_eps"]),
        (w.add_expert_count, cfg["num_local_experts"]), (w.add_expert_used_count, cfg["num_experts_per_tok"]),
        (w.add_key_length, cfg["head_dim"]), (w.add_value_length, cfg["head_dim"]),
        (w.add_sliding_window, cfg["sliding_window"]), (w.add_expert_feed_forward_length, cfg["intermediate_size"]),
    ):  # fmt: skip
        add(value)
    fast = AutoTokenizer.from_pretrained(str(src))
    write_tokenizer(w, fast)

    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.GPT_OSS, layers)
    matrix = "F32" if experts == "F32" else "F16"
    held: dict[str, np.ndarray] = {}
    for name, value in load_file(str(src / "model.safetensors")).items():
        if ".mlp.experts." not in name:
            gguf_name = names.get_name(name + (".weight" if name.endswith("sinks") else ""), (".weight", ".bias"))
            qtype = matrix if value.ndim == 2 and ".router." not in name else "F32"
            held[name] = _store(w, gguf_name, value, qtype)
            continue
        stem = name.rsplit(".", 1)[0]  # model.layers.N.mlp.experts
        if name.endswith("down_proj"):  # [E, in, out] -> llama.cpp's [E, out, in]
            gguf_name = names.get_name(f"{stem}.down_proj.weight", (".weight",))
            held[name] = _store(w, gguf_name, value.transpose(0, 2, 1), experts).transpose(0, 2, 1)
        elif name.endswith("down_proj_bias"):
            held[name] = _store(w, names.get_name(f"{stem}.down_proj.bias", (".bias",)), value, matrix)
        else:  # gate_up_proj [E, in, 2I] / gate_up_proj_bias [E, 2I]: gate the even outputs, up the odd
            bias = name.endswith("_bias")
            back = np.empty_like(value)
            for half, proj in ((0, "gate_proj"), (1, "up_proj")):
                part = value[..., half::2]
                gguf_name = names.get_name(f"{stem}.{proj}.{'bias' if bias else 'weight'}", (".weight", ".bias"))
                if bias:
                    back[..., half::2] = _store(w, gguf_name, part, matrix)
                else:
                    back[..., half::2] = _store(w, gguf_name, part.transpose(0, 2, 1), experts).transpose(0, 2, 1)
            held[name] = back
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    ref = out / "reference"
    ref.mkdir()
    for f in src.iterdir():
        if f.is_file() and f.suffix != ".safetensors":
            shutil.copy(f, ref / f.name)
    save_file({k: np.ascontiguousarray(v) for k, v in held.items()}, str(ref / "model.safetensors"))
    return path, ref


@pytest.fixture(scope="module")
def gptoss_gguf(tmp_path_factory):
    """(GGUF file, reference folder) per expert type, built once per module."""
    from tests.fixtures.tiny_models import build_model

    cache: dict[str, tuple[Path, Path]] = {}

    def get(experts: str) -> tuple[Path, Path]:
        if experts not in cache:
            root = tmp_path_factory.mktemp(f"gguf-gptoss-{experts}")
            # llama.cpp fixes the SwiGLU limit at 7 (no key states it): the checkpoint must have it.
            src = build_model("gpt_oss", root / "hf", swiglu_limit=7.0)
            cache[experts] = convert_gptoss(src, root, experts)
        return cache[experts]

    return get


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LANTERN_CACHE", str(tmp_path / "cache"))


def openai_mxfp4_folder(path: Path, ref: Path, out: Path) -> Path:
    """The reference folder as OpenAI ships gpt-oss: experts as `*_blocks` / `*_scales` (HF's
    nibble order and interleaved gate/up rows) with quantization_config mxfp4, built from the values
    the file holds and each of its blocks' e8m0 exponent byte (read with gguf.GGUFReader). For
    torch's reference without the VNNI kernels: test_gptoss_mxfp4.torch_reference requantizes such a
    folder as torch does."""
    import gguf
    from safetensors.numpy import load_file, save_file

    from tests.models.test_gptoss import REAL_20B

    reader = gguf.GGUFReader(path)
    exponents = {
        t.name: np.asarray(t.data).reshape(*t.data.shape[:-1], -1, 17)[..., 0]
        for t in reader.tensors
        if t.tensor_type == gguf.GGMLQuantizationType.MXFP4
    }
    magnitudes = np.array(E2M1_VALUES[:8], np.float64)
    tensors = load_file(str(ref / "model.safetensors"))
    for name in [n for n in tensors if n.endswith(("experts.gate_up_proj", "experts.down_proj"))]:
        layer = name.split(".")[2]
        halves = ("ffn_gate_exps", "ffn_up_exps") if name.endswith("gate_up_proj") else ("ffn_down_exps",)
        w = tensors.pop(name).transpose(0, 2, 1).astype(np.float64)  # [E, out, in], out interleaved
        scales = np.empty((*w.shape[:2], w.shape[2] // 32), np.uint8)
        for k, half in enumerate(halves):
            scales[:, k :: len(halves)] = exponents[f"blk.{layer}.{half}.weight"]
        scaled = w.reshape(*scales.shape, 32) / np.exp2(scales.astype(np.float64) - 127)[..., None]
        codes = np.abs(np.abs(scaled)[..., None] - magnitudes).argmin(axis=-1).astype(np.uint8)
        codes |= np.signbit(scaled).astype(np.uint8) << 3
        tensors[f"{name}_blocks"] = np.ascontiguousarray(codes[..., 0::2] | (codes[..., 1::2] << 4))
        tensors[f"{name}_scales"] = scales
    shutil.copytree(ref, out, ignore=shutil.ignore_patterns("*.safetensors"))
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((out / "config.json").read_text())
    config["quantization_config"] = REAL_20B["quantization_config"]
    (out / "config.json").write_text(json.dumps(config))
    return out


# ---- what the file means ------------------------------------------------------------------------------
def test_config_and_tokenizer_from_metadata(gptoss_gguf):
    """Every ModelConfig field as the checkpoint's config.json gives it: YaRN untruncated, the
    window on even layers, experts and their width, biases; the tokenizer and template embedded."""
    path, ref = gptoss_gguf("MXFP4")
    loaded = resolve_model(str(path))
    expected = ModelConfig.from_hf(json.loads((ref / "config.json").read_text()))
    assert loaded.spec.config == expected
    assert expected.layer_windows == [8, None] and expected.rope_scaling["truncate"] is False
    assert loaded.tokenizer.encode(PROMPT) == AutoTokenizer.from_pretrained(str(ref)).encode(PROMPT)
    assert loaded.chat_template is not None and loaded.tokenizer.eos_token_id in loaded.eos_token_ids


@pytest.mark.parametrize("experts", ["F32", "MXFP4"])
def test_streamed_experts_are_the_files_values(gptoss_gguf, experts):
    """The GGUF stream hands the experts on in the OpenAI checkpoint's terms: MXFP4 as blocks and
    scales whose dequantized values are exactly gguf's (gate rows, then up rows), float ones per
    expert; the gate/up biases joined, sinks and router under their model names."""
    from safetensors.numpy import load_file

    from lantern.app.models.family_gptoss import dequantize_mxfp4
    from lantern.app.models.gguf_names import iter_gguf_weights

    def gate_first(a: np.ndarray) -> np.ndarray:  # HF's interleaved gate/up outputs, gate ones first
        return np.concatenate([a[:, 0::2], a[:, 1::2]], axis=1)

    path, ref = gptoss_gguf(experts)
    reference = load_file(str(ref / "model.safetensors"))
    streamed = dict(iter_gguf_weights(str(path), 4, 2))
    for layer in range(2):
        p = f"model.layers.{layer}."
        gate_up = gate_first(reference[p + "mlp.experts.gate_up_proj"].transpose(0, 2, 1))  # [E, 2I, H]
        down = reference[p + "mlp.experts.down_proj"].transpose(0, 2, 1)
        for name, want in (
            ("mlp.experts.gate_up_proj_bias", gate_first(reference[p + "mlp.experts.gate_up_proj_bias"])),
            ("mlp.experts.down_proj_bias", reference[p + "mlp.experts.down_proj_bias"]),
            ("self_attn.sinks", reference[p + "self_attn.sinks"]),
            ("mlp.gate.bias", reference[p + "mlp.router.bias"]),
        ):
            np.testing.assert_array_equal(streamed[p + name], want, err_msg=p + name)
        if experts == "MXFP4":
            for proj, want in (("gate_up_proj", gate_up), ("down_proj", down)):
                blocks, scales = streamed[f"{p}mlp.experts.{proj}_blocks"], streamed[f"{p}mlp.experts.{proj}_scales"]
                got = dequantize_mxfp4(torch.from_numpy(blocks), torch.from_numpy(scales)).float().numpy()
                np.testing.assert_array_equal(got, want, err_msg=f"{p}{proj}")
            continue
        inner = gate_up.shape[1] // 2
        for e in range(gate_up.shape[0]):
            np.testing.assert_array_equal(streamed[f"{p}mlp.experts.{e}.gate_proj.weight"], gate_up[e, :inner])
            np.testing.assert_array_equal(streamed[f"{p}mlp.experts.{e}.up_proj.weight"], gate_up[e, inner:])
            np.testing.assert_array_equal(streamed[f"{p}mlp.experts.{e}.down_proj.weight"], down[e])


def test_real_20b_metadata_reads_as_its_config_json(tmp_path):
    """openai/gpt-oss-20b's keys as convert_hf_to_gguf.py writes them read as its config.json."""
    import gguf

    from tests.models.test_gguf_families import _metadata
    from tests.models.test_gptoss import REAL_20B

    def write(w) -> None:
        for add, value in (
            (w.add_block_count, 24), (w.add_context_length, 131072), (w.add_embedding_length, 2880),
            (w.add_feed_forward_length, 2880), (w.add_head_count, 64), (w.add_head_count_kv, 8),
            (w.add_rope_scaling_factor, 32.0), (w.add_rope_scaling_orig_ctx_len, 4096),
            (w.add_rope_scaling_yarn_beta_fast, 32.0), (w.add_rope_scaling_yarn_beta_slow, 1.0),
            (w.add_rope_freq_base, 150000.0), (w.add_layer_norm_rms_eps, 1e-5), (w.add_expert_count, 32),
            (w.add_expert_used_count, 4), (w.add_key_length, 64), (w.add_value_length, 64),
            (w.add_sliding_window, 128), (w.add_expert_feed_forward_length, 2880),
        ):  # fmt: skip
            add(value)
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_eos_token_id(200002)
        w.add_pad_token_id(199999)

    # attn_q.bias: only its presence matters (attention_bias); the rest are shapes
    cfg = _metadata(tmp_path, "gpt-oss", write, {"blk.0.attn_q.bias": np.zeros(4, np.float32)}, vocab=201088)
    sizes = {
        "hidden_size": 2880, "intermediate_size": 2880, "num_attention_heads": 64, "num_key_value_heads": 8,
        "num_hidden_layers": 24, "head_dim": 64, "num_local_experts": 32, "num_experts_per_tok": 4,
        "experts_per_token": 4, "layer_types": ["sliding_attention", "full_attention"] * 12,
    }  # fmt: skip
    released = {**REAL_20B, **sizes, "quantization_config": None}
    assert ModelConfig.from_hf(cfg) == ModelConfig.from_hf(released)


def test_mxfp4_outside_the_experts_is_read_as_exact_affine_codes(tmp_path):
    """Outside gpt-oss's experts (where the MXFP4 path keeps blocks for MLX's mxfp4 kernel) an MXFP4
    tensor is read like any codebook type: exact 5-bit codes with a scale per 32 weights."""
    import gguf

    from lantern.app.models.gguf_names import iter_gguf_weights

    w = gguf.GGUFWriter(tmp_path / "mixed.gguf", "gpt-oss")
    w.add_block_count(1)
    mxfp4 = gguf.GGMLQuantizationType.MXFP4
    values = np.random.default_rng(0).normal(size=(32, 64)).astype(np.float32)
    blocks = gguf.quants.quantize(values, mxfp4)
    w.add_tensor("blk.0.attn_q.weight", blocks, raw_dtype=mxfp4)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    name, got = next(iter_gguf_weights(str(tmp_path / "mixed.gguf"), 4, 2))
    assert name == "model.layers.0.self_attn.q_proj.weight" and got.mode == (5, 32)
    np.testing.assert_array_equal(got.dequantize(), gguf.quants.dequantize(blocks, mxfp4))


# ---- both backends against transformers ---------------------------------------------------------------
def test_float_experts_match_transformers(gptoss_gguf, backend):
    """Float experts (F32): exact on both backends, 1e-4 through the paged cache (the 36-token prompt
    outruns layer 0's 8-token window), 64 greedy tokens equal."""
    path, ref = gptoss_gguf("F32")
    llm = LLM(str(path), backend=backend, **LLM_OPTIONS)
    try:
        prompt_ids = llm.tokenizer.encode(PROMPT)
        assert len(prompt_ids) > 4 * 8
        model = hf_model(str(ref))
        greedy = hf_greedy(model, prompt_ids, 64)
        with torch.no_grad():
            expected = model(torch.tensor([prompt_ids + greedy[:32]])).logits[0].numpy()
        rows = list(teacher_forced_logits(llm.engine, prompt_ids, greedy[:32]))
        assert len(rows) == 32
        for pos, logits in rows:
            np.testing.assert_allclose(logits, expected[pos], atol=1e-4, rtol=0, err_msg=f"position {pos}")
        out = llm.generate([prompt_ids], SamplingParams(temperature=0, max_tokens=64, ignore_eos=True))
        assert out[0].outputs[0].token_ids == greedy
    finally:
        llm.engine.shutdown()


def test_mxfp4_experts_match_transformers(gptoss_gguf, backend, tmp_path, caplog):
    """MXFP4 experts, logits teacher-forced on transformers' greedy tokens over the file's values.
    MLX: kept MXFP4 (gather_qmm's mxfp4 mode), 1e-4 and 32 greedy tokens equal. torch with the VNNI
    CPU kernels: the MXFP4 values kept too (4-bit indices into 16 codes; its int8 inputs cost 1e-3 of
    the logits' largest magnitude at most, measured 7e-5), the same top token at every position.
    Without them, requantized to int8 per channel (logged with its error, < 1%): within 1% of the
    largest logit of transformers holding the requantized values, the same top token everywhere."""
    path, ref = gptoss_gguf("MXFP4")
    llm = LLM(str(path), backend=backend, **LLM_OPTIONS)
    try:
        experts = llm.engine.backend.model.model.layers[0].mlp.experts
        weight_error = 0.0
        if backend == "mlx":
            from lantern.backends.mlx.moe import QuantExpertLinear

            projs = (experts.gate_proj, experts.up_proj, experts.down_proj)
            assert all(isinstance(p, QuantExpertLinear) and p.mode == "mxfp4" for p in projs)
        else:
            weight_error = check_torch_experts(experts, caplog.records)
            assert weight_error < 0.01
        prompt_ids = llm.tokenizer.encode(PROMPT)
        model = hf_model(str(ref))
        greedy = hf_greedy(model, prompt_ids, 32)
        rows = list(teacher_forced_logits(llm.engine, prompt_ids, greedy))
        positions, ours = [pos for pos, _ in rows], np.stack([logits for _, logits in rows])
        with torch.no_grad():
            expected = model(torch.tensor([prompt_ids + greedy])).logits[0].numpy()[positions]
        if backend == "mlx":
            np.testing.assert_allclose(ours, expected, atol=1e-4, rtol=0)
            out = llm.generate([prompt_ids], SamplingParams(temperature=0, max_tokens=32, ignore_eos=True))
            assert out[0].outputs[0].token_ids == greedy
            return
        if weight_error == 0.0:
            np.testing.assert_allclose(ours, expected, atol=1e-3 * np.abs(expected).max(), rtol=0)
            assert np.array_equal(ours.argmax(axis=-1), expected.argmax(axis=-1))
            return
        folder = openai_mxfp4_folder(path, ref, tmp_path / "openai")
        held = hf_model(str(folder))  # transformers' own MXFP4 reading of the blocks: the file's values
        assert all(torch.equal(a, b) for a, b in zip(held.parameters(), model.parameters()))
        with torch.no_grad():
            tokens = torch.tensor([prompt_ids + greedy])
            torch_ref = torch_reference(held, str(folder))(tokens).logits[0].numpy()[positions]
        np.testing.assert_allclose(ours, torch_ref, atol=0.01 * np.abs(torch_ref).max(), rtol=0)
        assert np.array_equal(ours.argmax(axis=-1), torch_ref.argmax(axis=-1))
    finally:
        llm.engine.shutdown()


def test_mxfp4_gguf_served_over_http(gptoss_gguf, backend):
    """A real server on 127.0.0.1 with the MXFP4 file, driven by the openai client: the streamed
    completion is the offline engine's greedy text (on MLX transformers' greedy tokens too)."""
    import openai

    from tests.server.conftest import start_server

    path, ref = gptoss_gguf("MXFP4")
    llm = LLM(str(path), backend=backend, **LLM_OPTIONS)
    prompt_ids = llm.tokenizer.encode(PROMPT)
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    offline = llm.generate([prompt_ids], params)[0].outputs[0]
    llm.engine.shutdown()
    if backend == "mlx":
        assert offline.token_ids == hf_greedy(hf_model(str(ref)), prompt_ids, 16)
    srv = start_server(str(path), backend=backend)
    try:
        client = openai.OpenAI(base_url=f"{srv.base_url}/v1", api_key="unused")
        stream = client.completions.create(
            model="tiny", prompt=prompt_ids, max_tokens=16, temperature=0, stream=True, extra_body={"ignore_eos": True}
        )
        text = "".join(chunk.choices[0].text for chunk in stream if chunk.choices)
    finally:
        srv.stop()
    assert text == offline.text

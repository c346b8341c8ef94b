"""gpt-oss's OpenAI MXFP4 experts (`*_blocks` / `*_scales`, packed here the way the released
checkpoints are) on both backends against transformers' own MXFP4 loading: kept MXFP4 on MLX,
dequantized (and said so) on torch; bfloat16 and concurrent sequences against transformers; the
model over HTTP; --isq on its stacked experts. (Config reading and refusals: test_gptoss.py.)"""

from __future__ import annotations

import json
import logging
import shutil

import numpy as np
import pytest
import torch

from lantern.app.models.family_gptoss import dequantize_mxfp4
from lantern.app.models.quant.affine import AffineWeight, quantize_affine
from lantern.app.models.quant.microscaled import E2M1_VALUES
from lantern.app.models.spec import ModelConfig
from tests.models.test_gptoss import REAL_20B


def mxfp4_pack(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """[..., cols] float -> (blocks uint8 [..., cols / 32, 16], scales uint8 [..., cols / 32]) in the
    OCP MX layout of OpenAI's checkpoints: per 32 values one power-of-two scale (e8m0, bias 127)
    chosen so the largest fits e2m1's 6.0, each value rounded to the nearest e2m1 code (sign in
    bit 3), two codes a byte with the even-indexed value in the low nibble."""
    magnitudes = np.array(E2M1_VALUES[:8], np.float32)
    *lead, cols = w.shape
    groups = w.reshape(*lead, cols // 32, 32)
    amax = np.abs(groups).max(axis=-1)
    exponent = np.clip(np.ceil(np.log2(np.maximum(amax, 1e-30) / 6.0)), -127, 127).astype(np.int32)
    scaled = groups / np.exp2(exponent)[..., None]
    codes = np.abs(np.abs(scaled)[..., None] - magnitudes).argmin(axis=-1).astype(np.uint8)
    codes = np.where(scaled < 0, codes | 8, codes).astype(np.uint8)
    blocks = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return np.ascontiguousarray(blocks, np.uint8), np.ascontiguousarray(exponent + 127, np.uint8)


def test_dequantize_is_transformers():
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    g = torch.Generator().manual_seed(0)
    blocks = torch.randint(0, 256, (3, 40, 4, 16), generator=g, dtype=torch.uint8)
    scales = torch.randint(100, 150, (3, 40, 4), generator=g, dtype=torch.uint8)
    ours = dequantize_mxfp4(blocks, scales)  # [E, rows, cols]
    ref = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)  # transposed: [E, cols, rows]
    torch.testing.assert_close(ours.float(), ref.transpose(1, 2), rtol=0, atol=0)


@pytest.fixture(scope="module")
def mxfp4_folder(tiny_model_dir, tmp_path_factory):
    """The tiny gpt_oss model with its experts packed to MXFP4 (stacked names + _blocks/_scales, as
    openai/gpt-oss-* ship them) and quantization_config quant_method mxfp4."""
    from safetensors.torch import load_file, save_file

    src = tiny_model_dir("gpt_oss")
    folder = tmp_path_factory.mktemp("gpt_oss_mxfp4")
    shutil.copytree(src, folder, dirs_exist_ok=True)
    tensors = {}
    for name, value in load_file(f"{src}/model.safetensors").items():
        if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            # transformers holds [E, in, out]; the checkpoint packs [E, out, in] along `in`.
            blocks, scales = mxfp4_pack(value.transpose(1, 2).numpy())
            tensors[f"{name}_blocks"], tensors[f"{name}_scales"] = torch.from_numpy(blocks), torch.from_numpy(scales)
        else:
            tensors[name] = value
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = REAL_20B["quantization_config"]
    (folder / "config.json").write_text(json.dumps(config))
    return str(folder)


def check_torch_experts(experts, records) -> float:
    """What the torch backend holds gpt-oss's MXFP4 experts as, asserted; returns the logged
    requantization error (0.0 where exact). With the VNNI CPU kernels: the MXFP4 values exactly, as
    4-bit indices into a table of 16 codes; without (no native kernels): requantized to int8 per
    channel and logged once."""
    from lantern.backends.torch.moe import QuantExperts
    from lantern.backends.torch.quant_linear import Int8PackLinear
    from lantern.backends.torch.vnni_linear import VnniLinear
    from tests.models.quant_logits import torch_cpu_vnni

    assert isinstance(experts, QuantExperts)
    layers = [*experts.gate_up_proj, *experts.down_proj]
    warned = [r.getMessage() for r in records if "MXFP4 tensor" in r.getMessage()]
    if torch_cpu_vnni():
        assert all(isinstance(m, VnniLinear) and m.lut is not None and m.bits == 4 for m in layers)
        assert not warned
        return 0.0
    assert all(isinstance(m, Int8PackLinear) for m in layers) and len(warned) == 1
    return float(warned[0].rsplit("up to ", 1)[1])


def torch_reference(model, folder):
    """transformers' model holding what torch computes from the MXFP4 folder: the MXFP4 values
    themselves where the VNNI layers keep them (the model as it is); else each expert requantized to
    int8 per channel as Int8PackLinear holds it, in transformers' [E, in, out] interleaved layout."""
    from tests.models.quant_logits import torch_cpu_vnni

    if torch_cpu_vnni():
        return model
    from safetensors.torch import load_file

    from lantern.app.models.family_gptoss import mxfp4_weight
    from lantern.app.models.quant.affine import requantize

    tensors = load_file(f"{folder}/model.safetensors")
    for name, param in model.named_parameters():
        if not name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            continue
        blocks, scales = tensors[f"{name}_blocks"], tensors[f"{name}_scales"]
        for e in range(blocks.shape[0]):
            w = requantize(mxfp4_weight(blocks[e], scales[e]), 8, 0, symmetric=True)[0]  # codes centred on 128
            values = (torch.from_numpy(w.codes.astype(np.float32)) - 128) * torch.from_numpy(w.scales)
            with torch.no_grad():
                param[e] = values.T  # rows in the checkpoint's (interleaved) order, as the blocks are
    return model


def test_mxfp4_folder_matches_transformers(tiny_model_dir, mxfp4_folder, backend, caplog):
    """Logits through the paged cache, teacher-forced on the float model's greedy tokens, against
    transformers loading the same MXFP4 folder (on a CPU it dequantizes the blocks itself).

    MLX keeps the experts MXFP4: 1e-4. torch keeps the MXFP4 values too (`check_torch_experts`): the
    VNNI layers quantize their inputs to int8 in two levels, so 1e-3 of the logits' largest magnitude
    (measured 6.6e-5). Without those kernels (LANTERN_CPU_KERNELS=0) the experts are requantized to
    int8 per channel (logged): against transformers holding the requantized values 5e-2 (int8pack rounds
    activations to bf16), against the MXFP4 values under 4x the logged weight error (measured 1.7% for
    a weight error of 0.68%).
    The top token agrees at every forced position."""
    from transformers import AutoModelForCausalLM

    from lantern.app.engine import LLM
    from tests.conformance.test_parity import PROMPT, hf_greedy, hf_model
    from tests.fixtures.teacher_forcing import teacher_forced_logits

    ref_model = AutoModelForCausalLM.from_pretrained(mxfp4_folder, dtype=torch.float32).eval()
    experts = ref_model.model.layers[0].mlp.experts
    assert experts.gate_up_proj.dtype == torch.float32  # transformers dequantized the blocks
    llm = LLM(mxfp4_folder, backend=backend, dtype="float32", block_size=4, prefill_chunk_size=8, num_kv_blocks=64)
    layer = llm.engine.backend.model.model.layers[1].mlp.experts
    if backend == "mlx":  # kept MXFP4: gather_qmm reads the packed codes
        from lantern.backends.mlx.moe import QuantExpertLinear

        for proj in (layer.gate_proj, layer.up_proj, layer.down_proj):
            assert isinstance(proj, QuantExpertLinear) and proj.mode == "mxfp4"
        weight_error = 0.0
    else:
        weight_error = check_torch_experts(layer, caplog.records)
        assert weight_error < 0.1
    prompt_ids = llm.tokenizer.encode(PROMPT)
    forced = hf_greedy(hf_model(tiny_model_dir("gpt_oss")), prompt_ids, 16)  # varied tokens to force
    with torch.no_grad():
        ref = ref_model(torch.tensor([prompt_ids + forced])).logits[0].numpy()
    rows = list(teacher_forced_logits(llm.engine, prompt_ids, forced))
    assert len(rows) == len(forced)
    ours = np.stack([logits for _, logits in rows])
    ref = ref[[pos for pos, _ in rows]]
    if backend == "mlx":
        np.testing.assert_allclose(ours, ref, atol=1e-4, rtol=0)
        return
    if weight_error == 0.0:
        np.testing.assert_allclose(ours, ref, atol=1e-3 * np.abs(ref).max(), rtol=0)
        assert np.array_equal(ours.argmax(axis=-1), ref.argmax(axis=-1))
        return
    with torch.no_grad():
        requantized = torch_reference(ref_model, mxfp4_folder)(torch.tensor([prompt_ids + forced])).logits[0]
    requantized = requantized.numpy()[[pos for pos, _ in rows]]
    np.testing.assert_allclose(ours, requantized, atol=8e-2, rtol=0)  # measured 5.3e-2 (|logits| <= 6.2)
    assert np.array_equal(ours.argmax(axis=-1), requantized.argmax(axis=-1))
    assert np.linalg.norm(ours - ref) / np.linalg.norm(ref) < 4 * weight_error


def test_mxfp4_experts_stay_quantized_on_torch(mxfp4_folder):
    """The experts' device bytes within 1.3x of the checkpoint's MXFP4 blocks + scales: 20 bytes per 32
    weights against 17 (4-bit codebook indices with float16 scales and biases on the VNNI layers).
    Without those kernels int8 per channel: 32 bytes per 32 weights plus a scale per row (2.03x here)."""
    from safetensors.torch import load_file

    from lantern.app.engine import LLM
    from lantern.backends.torch.quant_linear import quantized_bytes

    mxfp4 = sum(
        t.nbytes
        for n, t in load_file(f"{mxfp4_folder}/model.safetensors").items()
        if n.endswith(("_blocks", "_scales"))
    )
    llm = LLM(mxfp4_folder, backend="torch", dtype="bfloat16", block_size=4, num_kv_blocks=64)
    ours = 0
    for layer in llm.engine.backend.model.model.layers:
        experts = layer.mlp.experts
        ours += sum(quantized_bytes(m) for m in [*experts.gate_up_proj, *experts.down_proj])
        assert not any(p.dtype.is_floating_point and p.dim() == 3 for p in experts.parameters())
    from tests.models.quant_logits import torch_cpu_vnni

    assert mxfp4 < ours <= (1.3 if torch_cpu_vnni() else 2.1) * mxfp4


# ---- bfloat16 and batching on both backends -----------------------------------------------------------
def test_bfloat16_generates_close_to_transformers(tiny_model_dir, backend):
    from transformers import AutoModelForCausalLM

    from lantern.app.engine import LLM, SamplingParams

    path = tiny_model_dir("gpt_oss")
    llm = LLM(path, backend=backend, dtype="bfloat16", block_size=4, num_kv_blocks=64)
    prompt_ids = llm.tokenizer.encode("Paged attention stores keys and values in blocks, while continuous")
    out = llm.generate([prompt_ids], SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))
    tokens = out[0].outputs[0].token_ids
    assert len(tokens) == 24
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        ref = model(torch.tensor([prompt_ids + tokens])).logits[0, len(prompt_ids) - 1 :].numpy()
    # Each token chosen is at most a bfloat16 rounding away from float32 transformers' best.
    chosen = ref[np.arange(len(tokens)), tokens]
    assert np.all(ref.max(axis=-1)[: len(tokens)] - chosen < 0.5)


def test_concurrent_sequences_match_transformers(tiny_model_dir, backend):
    """Three prompts decoded together (experts shared across sequences in every step; the prefill's
    token-expert pairs take MLX's sorted path) each give transformers' greedy tokens."""
    from lantern.app.engine import LLM, SamplingParams
    from tests.conformance.test_parity import hf_greedy, hf_model
    from tests.fixtures.tiny_models import CORPUS

    path = tiny_model_dir("gpt_oss")
    llm = LLM(path, backend=backend, dtype="float32", block_size=8, num_kv_blocks=96)
    prompts = [llm.tokenizer.encode(text[:60]) for text in CORPUS[:3]]
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))
    model = hf_model(path)
    for prompt, out in zip(prompts, outs):
        assert out.outputs[0].token_ids == hf_greedy(model, prompt, 20)


def test_mxfp4_model_served_over_http(mxfp4_folder, backend):
    """A real server on 127.0.0.1 with the MXFP4 folder, driven by the openai client: the streamed
    completion is transformers' greedy continuation of the same tokens (its own MXFP4 loading; for
    torch without the VNNI kernels, with the experts as requantized)."""
    import openai

    from lantern.app.engine import LLM, SamplingParams
    from tests.conformance.test_parity import PROMPT, hf_greedy, hf_model
    from tests.server.conftest import start_server

    llm = LLM(mxfp4_folder, backend=backend, dtype="float32", block_size=4, num_kv_blocks=64)
    prompt_ids = llm.tokenizer.encode(PROMPT)
    reference = hf_model(mxfp4_folder)
    if backend == "torch":  # (the MXFP4 values, or their requantization: test_mxfp4_folder_matches_transformers)
        reference = torch_reference(reference, mxfp4_folder)
    ref_tokens = hf_greedy(reference, prompt_ids, 16)
    offline = llm.generate([prompt_ids], SamplingParams(temperature=0, max_tokens=16, ignore_eos=True))[0].outputs[0]
    assert offline.token_ids == ref_tokens
    srv = start_server(mxfp4_folder, backend=backend)
    try:
        client = openai.OpenAI(base_url=f"{srv.base_url}/v1", api_key="unused")
        stream = client.completions.create(
            model="tiny", prompt=prompt_ids, max_tokens=16, temperature=0, stream=True, extra_body={"ignore_eos": True}
        )
        text = "".join(chunk.choices[0].text for chunk in stream if chunk.choices)
    finally:
        srv.stop()
    assert text == offline.text


# ---- --isq on the stacked experts -------------------------------------------------------------------
@pytest.mark.parametrize("scheme", ["q4", "q8"])
def test_isq_quantizes_stacked_experts(tiny_model_dir, tmp_path, backend, scheme, caplog):
    """`--isq` on the float gpt-oss folder: the stacked experts are quantized expert by expert and
    stay quantized on the device; the logits match transformers on the same float folder with each
    quantized matrix replaced by its dequantized value (experts per expert along their inputs),
    within tests/models/quant_logits.tolerance, and the float model's own logits are further away.
    The progress total is exact: every matrix counted was seen."""
    from pathlib import Path

    from lantern.app.engine import LLM
    from lantern.app.models import isq
    from tests.models.quant_logits import logits_error, reference_folder, tolerance
    from tests.models.test_isq import MODES

    bits, group, symmetric = MODES[(backend, scheme)]
    src = Path(tiny_model_dir("gpt_oss"))

    def rtn(w: np.ndarray) -> np.ndarray:  # [out, in] round-to-nearest as --isq does it
        return quantize_affine(w.astype("float32"), bits, group or w.shape[1], symmetric=symmetric).dequantize()

    def quantized(name: str, w: np.ndarray) -> np.ndarray:
        if name.endswith(("experts.gate_up_proj", "experts.down_proj")):  # [E, in, out]
            return np.stack([rtn(w[e].T).T for e in range(w.shape[0])])
        if w.ndim == 2 and name.endswith(".weight") and ".mlp.router." not in name:
            return rtn(w)
        return w

    ref = reference_folder(src, tmp_path / "ref", quantized)
    with caplog.at_level(logging.DEBUG, logger=isq.__name__):
        err = logits_error(str(src), str(ref), backend, quantization=scheme)
    assert err <= tolerance(backend, str(ref)), f"{backend} {scheme}: logits differ by {err:.4f} of their spread"
    assert logits_error(str(src), str(ref), backend) > err  # the quantization is real
    assert "were expected" not in caplog.text  # quantize_stream saw exactly isq_candidates' matrices
    assert "34 tensors to" in caplog.text and "2 router matrices kept in float" in caplog.text  # 2 layers

    llm = LLM(str(src), backend=backend, dtype="float32", num_kv_blocks=8, quantization=scheme)
    experts = llm.engine.backend.model.model.layers[0].mlp.experts
    if backend == "torch":
        from lantern.backends.torch.moe import QuantExperts
        from lantern.backends.torch.quant_linear import QuantLayer, quantized_bytes

        assert isinstance(experts, QuantExperts)
        assert all(isinstance(m, QuantLayer) for m in [*experts.gate_up_proj, *experts.down_proj])
        ours = sum(quantized_bytes(m) for m in [*experts.gate_up_proj, *experts.down_proj])
    else:
        from lantern.backends.mlx.moe import QuantExpertLinear

        projs = (experts.gate_proj, experts.up_proj, experts.down_proj)
        assert all(isinstance(p, QuantExpertLinear) and p.bits == bits for p in projs)
        ours = sum(p.weight.nbytes + p.scales.nbytes + p.biases.nbytes for p in projs)
    cfg = ModelConfig.from_hf(json.loads((src / "config.json").read_text()))
    float_bytes = 4 * 3 * cfg.moe.num_experts * cfg.hidden_size * cfg.moe.intermediate_size  # float32
    assert ours < (0.3 if scheme == "q4" else 0.55) * float_bytes


def test_isq_progress_total_counts_stacked_experts(tiny_model_dir):
    """isq_candidates counts gpt-oss's experts one by one (3 per expert and layer), as quantize_stream
    updates its bar when it splits the stacked tensors."""
    from lantern.app.models.isq import IsqMode, isq_candidates
    from lantern.app.models.loader import resolve_model
    from lantern.app.models.weight_stream import iter_weights

    spec = resolve_model(tiny_model_dir("gpt_oss")).spec
    cfg = spec.config
    expected = 2 + cfg.num_layers * (4 + 3 * cfg.moe.num_experts)  # embed, head; q k v o; experts
    assert isq_candidates(cfg) == expected
    out = list(iter_weights(spec, "pt", IsqMode(4, 32), progress=False))
    quantized = [n for n, v in out if isinstance(v, AffineWeight)]
    assert len(quantized) == expected
    assert sum(".mlp.experts." in n for n in quantized) == 3 * cfg.moe.num_experts * cfg.num_layers

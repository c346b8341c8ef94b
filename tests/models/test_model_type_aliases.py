"""Folders whose model_type names a family Lantern serves under another name (family_renamed): Kimi K2 and JoyAI-LLM-
Flash (DeepSeek-V3), Youtu-LLM's released `youtu_llm`, MiMo-7B (Qwen2 with prediction layers that are skipped) and
Kimi K2.5's language model (transformers' kimi_k25 wrapper). Each is the tests' tiny folder of the family with its
config renamed (and the wrapper's names and tensors where it has them); served on both backends it computes what
transformers computes on the original folder: logits within 1e-4 through the paged cache, 64 greedy tokens equal."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from tests.fixtures.teacher_forcing import assert_file_matches_folder
from tests.fixtures.tiny_models import build_model

CASES = {  # alias -> the tests' variant of its family
    "kimi_k2": "deepseek_v3",
    "joyai_llm_flash": "deepseek_v3",
    "youtu_llm": "youtu",
    "mimo": "qwen2",
    "kimi_k25": "deepseek_v3",
}


def _aliased(case: str, src, out):
    """`src` as a `case` folder: the config renamed (Kimi K2.5: nested as its text_config beside a vision config,
    the language model's tensors under language_model.*, a vision tensor beside them; MiMo: a prediction layer)."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, out)
    cfg = json.loads((src / "config.json").read_text())
    tensors = load_file(src / "model.safetensors")
    if case == "kimi_k25":
        text = {**cfg, "model_type": "kimi_k2"}  # (as the released config names it; transformers reads deepseek_v3)
        cfg = {"model_type": "kimi_k25", "text_config": text, "vision_config": {}, "tie_word_embeddings": False}
        tensors = {f"language_model.{k}": v for k, v in tensors.items()}
        tensors["vision_tower.patch_embed.proj.weight"] = torch.zeros(8, 3, 2, 2)
    else:
        cfg = {**cfg, "model_type": case}
    if case == "mimo":  # (MiMo-7B's one prediction layer: tensors the Qwen2 layers never read)
        cfg["num_nextn_predict_layers"] = 1
        tensors["model.mtp_layers.0.token_layernorm.weight"] = torch.ones(cfg["hidden_size"])
        tensors["model.mtp_layers.0.input_proj.weight"] = torch.zeros(cfg["hidden_size"], 2 * cfg["hidden_size"])
    (out / "config.json").write_text(json.dumps(cfg))
    save_file(tensors, out / "model.safetensors")
    return out


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("aliases")
    made = {}
    for case, variant in CASES.items():
        src = build_model(variant, root / f"{case}-src")
        made[case] = _aliased(case, src, root / case), src
    return made


@pytest.mark.parametrize("case", list(CASES))
def test_alias_computes_its_family(folders, case, backend):
    folder, src = folders[case]
    assert_file_matches_folder(folder, src, backend, case, forced=32, greedy=64)


def test_the_alias_keeps_its_name(folders):
    from lantern.app.models.spec import ModelConfig

    assert (
        ModelConfig.from_hf(json.loads((folders["kimi_k2"][0] / "config.json").read_text())).architecture == "kimi_k2"
    )
    raw = json.loads((folders["kimi_k25"][0] / "config.json").read_text())
    cfg = ModelConfig.from_hf(raw)
    assert (cfg.architecture, cfg.multimodal_wrapper, cfg.mla is not None) == ("deepseek_v3", "kimi_k25", True)
    del raw["tie_word_embeddings"]  # (Kimi_K25Config ties unless told not to)
    assert ModelConfig.from_hf(raw).tie_word_embeddings


def test_gemma4_unified_text_computes_transformers_model(tmp_path, backend):
    """Gemma 4 unified's language model (no per-layer embeddings, no experts) against transformers' own
    Gemma4UnifiedForCausalLM on the same folder."""
    folder = build_model("gemma4_unified", tmp_path / "gemma4_unified")
    assert_file_matches_folder(folder, folder, backend, "gemma4_unified", forced=32, greedy=64)

"""Model resolution: HF folders (sharded), hub ids from the user's cache offline, clear errors."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys

import pytest

from lantern.app.engine import LLM, SamplingParams
from lantern.app.models.loader import ModelNotFoundError, resolve_model
from lantern.app.models.spec import UnsupportedModelError

BACKENDS = [
    pytest.param(b, marks=pytest.mark.skipif(importlib.util.find_spec(b) is None, reason=f"{b} not installed"))
    for b in ("torch", "mlx")
]
PARAMS = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
PROMPT = [5, 17, 42, 99, 120, 7]


@pytest.mark.parametrize("backend", BACKENDS)
def test_sharded_folder_loads_the_same_model(tiny_model_dir, tmp_path, backend):
    import torch
    from transformers import AutoModelForCausalLM

    src = tiny_model_dir("qwen2")
    sharded = tmp_path / "sharded"
    shutil.copytree(src, sharded, ignore=shutil.ignore_patterns("*.safetensors"))
    AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).save_pretrained(sharded, max_shard_size="50KB")
    assert len(list(sharded.glob("*.safetensors"))) > 1 and (sharded / "model.safetensors.index.json").exists()
    a = LLM(src, backend=backend, dtype="float32", num_kv_blocks=32).generate([PROMPT], PARAMS)
    b = LLM(str(sharded), backend=backend, dtype="float32", num_kv_blocks=32).generate([PROMPT], PARAMS)
    assert a[0].outputs[0].token_ids == b[0].outputs[0].token_ids
    # ... and it is the model transformers loads from the original folder.
    hf = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()
    with torch.no_grad():
        ref = hf.generate(torch.tensor([PROMPT]), max_new_tokens=12, min_new_tokens=12, do_sample=False)[0]
    assert b[0].outputs[0].token_ids == ref[len(PROMPT) :].tolist()


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_bfloat16_checkpoint_loads_with_its_exact_values(tiny_model_dir, tmp_path, backend):
    """Most published checkpoints are bf16 (safetensors' MLX reader cannot read that dtype)."""
    import torch
    from transformers import AutoModelForCausalLM

    src = tiny_model_dir("qwen2")
    bf16 = tmp_path / "bf16"
    shutil.copytree(src, bf16, ignore=shutil.ignore_patterns("*.safetensors"))
    AutoModelForCausalLM.from_pretrained(src, dtype=torch.bfloat16).save_pretrained(bf16)
    llm = LLM(str(bf16), backend=backend, dtype="float32", num_kv_blocks=32)
    ours = llm.generate([PROMPT], PARAMS)[0].outputs[0].token_ids
    # transformers on the same bf16 values, upcast to float32 as ours are
    hf = AutoModelForCausalLM.from_pretrained(bf16, dtype=torch.float32).eval()
    hf.generation_config.eos_token_id = None
    with torch.no_grad():
        ref = hf.generate(torch.tensor([PROMPT]), max_new_tokens=12, do_sample=False, pad_token_id=0)
    assert ours == ref[0, len(PROMPT) :].tolist()


def test_hub_id_resolves_from_the_local_cache_offline(tiny_model_dir, tmp_path, monkeypatch):
    # Lay the model out exactly as huggingface_hub caches a download.
    repo = tmp_path / "hub" / "models--lantern-test--tiny"
    snap = repo / "snapshots" / ("0" * 40)
    shutil.copytree(tiny_model_dir("llama2"), snap)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0" * 40)
    import huggingface_hub.constants

    # huggingface_hub reads HF_HUB_CACHE once at import; point its constant at our cache.
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    loaded = resolve_model("lantern-test/tiny")
    assert loaded.spec.config.architecture == "llama"
    assert loaded.spec.weight_files[0].parent == snap
    with pytest.raises(ModelNotFoundError, match="not in the local Hugging Face cache"):
        resolve_model("lantern-test/missing")


def test_unsupported_architecture_lists_supported(tiny_model_dir, tmp_path):
    folder = tmp_path / "persimmonish"
    shutil.copytree(tiny_model_dir("llama2"), folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(model_type="persimmon", architectures=["PersimmonForCausalLM"])
    (folder / "config.json").write_text(json.dumps(cfg))
    from lantern.app.models.spec import ARCHITECTURES

    assert {"llama", "gemma3_text", "gpt_oss", "deepseek_v3", "qwen3_moe"} <= set(ARCHITECTURES)
    supported = ", ".join(sorted(ARCHITECTURES))
    want = f"'persimmon' (PersimmonForCausalLM); supported: {supported}"
    with pytest.raises(UnsupportedModelError, match=re.escape(want)):
        resolve_model(str(folder))


def test_cli_reports_missing_model_in_one_line(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "lantern", "generate", "--w", str(tmp_path / "nope"), "hi"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert "not a model folder" in proc.stderr

"""Remote-code folders Lantern reads as another family (MiniCPM as Granite, InternLM2 as Llama) checked against a
second reference nobody here wrote: mlx_lm's own minicpm and internlm2 models, on a 4-bit folder mlx_lm's code
quantized and saved from the tests' folder (MiniCPM's plain rope and its LongRoPE past the original length, where its
remote code takes the long factors at every position)."""

from __future__ import annotations

import pytest

from tests.fixtures.teacher_forcing import assert_close_to_mlx_lm, quantized_by_mlx_lm
from tests.fixtures.tiny_models import build_model
from tests.models.test_minicpm_internlm2_folders import GRANITE, _longrope, internlm2_folder, minicpm_folder


def _folder(case: str, root):
    if case == "internlm2":
        return internlm2_folder(build_model("llama2", root / "llama"), root / case)
    if case == "minicpm":
        return minicpm_folder(build_model("granite", root / "granite", **GRANITE), root / case)
    rope = {"rope_type": "longrope", "rope_theta": 10000.0, **_longrope(8)}
    src = build_model("granite", root / "granite", rope_parameters=rope, **GRANITE)
    return minicpm_folder(src, root / case, rope_scaling={"rope_type": "longrope", **_longrope(8)})


@pytest.mark.parametrize("case", ["minicpm", "minicpm_long_rope", "internlm2"])
def test_mlx_lm_made_folder_matches_mlx_lm(case, tmp_path, backend, by_file_tokenizer):
    assert_close_to_mlx_lm(quantized_by_mlx_lm(_folder(case, tmp_path), tmp_path / "q4"), backend, case)

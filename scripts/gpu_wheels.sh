#!/usr/bin/env bash
# The Python 3.12 wheels the GPU device lacks (its image: ../shared/GPU-CHECKLIST.md and the device
# tool's KINDS.md), fetched here into .whl/ (ignored by git) for scripts/gpu_check.sh to install there.
# Versions are the ones this checkout's tests pass with; --no-deps, so every missing need is named.
# transformers too: the parity references differ by version (the device's 5.17 computes the tiny gemma2
# and gpt_oss models differently from 5.24, which Lantern on CPU and on CUDA both match). MLX on the CPU
# (mlx, mlx-cpu) and mlx_lm: the reference of the model tests whose families transformers lacks; rwkv (the
# World tokenizer's vocabulary file) and compressed-tensors (its test folders). bitsandbytes (43 MB) does not
# fit beside them in a call's 64 MiB: its folders' tests fail there for want of it.
#
#   bash scripts/gpu_wheels.sh        # then: device run with carry [".whl"], command `bash scripts/gpu_check.sh`
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || { mkdir -p .git/info && echo '/.whl/' >>.git/info/exclude; }
mkdir -p .whl
platforms=(--platform any --platform manylinux2014_x86_64)
for n in 17 24 27 28 31 34 35 39; do platforms+=(--platform "manylinux_2_${n}_x86_64"); done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${platforms[@]}" -d .whl \
    gguf==0.19.0 fastapi==0.165.0 starlette==1.10.0 uvicorn==0.54.0 annotated-doc==0.0.7 \
    opentelemetry-api==1.45.2 pydantic==2.13.4 pydantic-core==2.46.4 annotated-types==0.7.0 \
    typing-inspection==0.4.2 typing_extensions==4.16.0 openai==3.54.0 distro==1.9.0 jiter==0.19.0 \
    sniffio==1.3.1 httpx2==2.16.2 httpcore2==2.16.2 truststore==0.10.5 idna==3.20 anyio==4.16.0 \
    h11==0.16.0 llguidance==1.9.1 jsonschema==4.26.0 jsonschema-specifications==2025.9.1 referencing==0.37.0 \
    rpds-py==0.30.0 transformers==5.24.0 pyrwkv-tokenizer==0.9.1 mlx==0.32.4 mlx-cpu==0.32.4 mlx-lm==0.32.2 \
    rwkv==0.8.32 compressed-tensors==0.20.1 loguru==0.7.3
du -sh .whl

#!/usr/bin/env bash
# ../shared/GPU-CHECKLIST.md on the GPU device, in as few runs as its 10-minute limit allows.
#
# Here, once: bash scripts/gpu_wheels.sh   (the Python 3.12 wheels the device lacks, into .whl/)
# Device runs (the tool's `run`, carry [".whl"]), e.g.
#   bash scripts/gpu_check.sh env tests      # nvidia-smi + versions, then every `gpu` test (~7 min)
#   bash scripts/gpu_check.sh families       # every family on CUDA: the parity tests' torch-cuda variant and the
#                                            # model tests' torch cases (references: transformers, mlx_lm on the CPU)
#   PYTEST_ARGS="tests/models -n 15" PYTEST_K="torch and not mlx" bash scripts/gpu_check.sh pytest
#                                            # any selection (PYTEST_K: the -k expression); $OUT/failures.txt as it goes
#   bash scripts/gpu_check.sh quant          # the quantized matmul kernels' and --isq's `gpu` tests only
#   bash scripts/gpu_check.sh profile        # 8B int4 bs=1: wall vs GPU time per token, GPU time per kernel
#   bash scripts/gpu_check.sh bench-q4       # 8B shape, int4 (--isq q4): bs=1 vs the HBM roofline
#   bash scripts/gpu_check.sh bench          # 1B and 8B shapes in bf16, against HF generate
#   bash scripts/gpu_check.sh http           # 256 streaming HTTP clients vs the Python API (1B shape)
#   bash scripts/gpu_check.sh sampler        # one sampling step at 1, 32, 256 rows, greedy and T=1.0
#   bash scripts/gpu_check.sh qgemv          # the int4 GEMV's block sizes swept on the 8B matrices (vs roofline);
#                                            # LANTERN_GEMV_CONFIGS=$OUT/qgemv.json then runs its winners
#   bash scripts/gpu_check.sh qgemv-fp4      # the same for e2m1 (MXFP4, groups of 32)
#   bash scripts/gpu_check.sh dp4a           # the int8-activation GEMV (and the fused decode kernels: gated
#                                            # epilogue, rope + KV write, folded attention, the sampling draw,
#                                            # decode graphs): their gpu tests, then the GEMV timed on the 8B
#                                            # matrices beside the float GEMV's built-in configs (~3 min)
# LIMIT_<step>=seconds shortens a step to fit the device time left (LIMIT_qgemv_fp4 for qgemv-fp4).
# Each step writes $OUT/<step>.txt (the tool brings back at most 8 files) and the benches a JSON.
# A step that fails does not stop the next one; the exit status line closes each log.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/lantern-gpu}
export OUT  # (scripts/gpu_failures.py writes there)
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(env tests)

site=/tmp/lantern-site
pip_in() { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" "$@"; }
if [ -d .whl ]; then pip_in .whl/*.whl || exit 1; fi
# Lantern itself, not editable: its folders install as the lantern.* namespace (pyproject's package-dir).
pip_in --no-build-isolation . || exit 1
cp scripts/gpu_failures.py "$site"/  # pytest -p gpu_failures: each failure logged as it happens
export PYTHONPATH=$site
# Run from a copy of the tests: in the checkout's root, its folder lantern/ (only the package's top) would
# shadow the installed lantern.* namespace for `python -m` and for pytest's rootdir on sys.path.
work=/tmp/lantern-run
rm -rf "$work" && mkdir -p "$work" && cp -r tests scripts pyproject.toml "$work"/ && cd "$work" || exit 1

run() { # step seconds command...; LIMIT_<step> (e.g. LIMIT_models=120) overrides the seconds
    local name=$1 secs=$2 limit="LIMIT_${1//-/_}"
    secs=${!limit:-$secs}
    shift 2
    echo "== $name: $*" | tee -a "$OUT/$name.txt"
    timeout "$secs" "$@" >>"$OUT/$name.txt" 2>&1
    echo "== $name: exit $?" | tee -a "$OUT/$name.txt"
    tail -n 5 "$OUT/$name.txt"
}

for step in "${steps[@]}"; do
    case $step in
    env) run env 60 bash -c 'nvidia-smi; python3 -c "import torch, triton, lantern.backends.torch as t; \
print(torch.__version__, triton.__version__, torch.cuda.get_device_name(), t.__file__)"' ;;
    families) export PIP_NO_INDEX=1 PIP_RETRIES=0 HF_HUB_OFFLINE=1  # no network: the PyPI-fetched GGUF skips
        run families 100 python3 -m pytest -m gpu tests/conformance/test_parity.py -k logits_match -n 12 -q -rfE \
            --tb=short -p no:cacheprovider -p gpu_failures
        run models 170 python3 -m pytest tests/models -k torch -n 14 -q -rfE --tb=short -p no:cacheprovider -p gpu_failures \
            --timeout 120 ;;
    quant) run quant 300 python3 -m pytest -m gpu tests/kernels/test_triton_quant.py tests/kernels/test_triton_gemv_dp4a.py \
        tests/models/test_isq.py -n 8 -q -rfE \
        --tb=short -p no:cacheprovider -p gpu_failures ;;
    pytest) export PIP_NO_INDEX=1 PIP_RETRIES=0 HF_HUB_OFFLINE=1
        # shellcheck disable=SC2086  # PYTEST_ARGS: the selection, split as the shell splits it
        run pytest 540 python3 -m pytest -p no:cacheprovider -p gpu_failures -rfE --tb=short -k "${PYTEST_K:-}" ${PYTEST_ARGS:-} ;;
    profile) run profile 300 python3 scripts/profile_decode.py --shape 8b --isq q4 --json "$OUT/profile-q4.json" ;;
    tests) run tests 450 python3 -m pytest -m gpu tests/kernels tests/conformance tests/models/test_isq.py -q -rfE -p no:cacheprovider ;;
    bench) run bench 540 python3 -m lantern bench --backend torch --shape 1b --shape 8b --json "$OUT/bench.json" ;;
    bench-q4) run bench-q4 540 python3 -m lantern bench --backend torch --shape 8b --isq q4 --no-hf \
        --json "$OUT/bench-q4.json" ;;
    http) run http 400 bash -c 'm=$(python3 -c "import torch; from lantern.app.bench import prepare_model; \
print(prepare_model(\"1b\", torch.bfloat16, torch.device(\"cuda\")))" | tail -n 1) && \
python3 scripts/bench_http.py --backend torch --model "$m" --requests 256 --rounds 1' ;;
    sampler) run sampler 300 bash -c 'for r in 1 32 256; do for t in 0 1; do
python3 scripts/bench_sampler.py --rows $r --temperature $t --steps 50; done; done' ;;
    qgemv) run qgemv 540 python3 scripts/bench_qgemv.py --stages 1 --json "$OUT/qgemv.json" ;;
    dp4a) run dp4a 300 bash -c 'python3 -m pytest -m gpu tests/kernels/test_triton_gemv_dp4a.py tests/kernels/test_gated_gemv.py \
tests/kernels/test_triton_sampling.py tests/kernels/test_triton_kernels.py tests/kernels/test_triton_fused.py \
tests/conformance/test_decode_graphs.py tests/kernels/test_pdl.py tests/conformance/test_step_ahead.py -q -rfE --tb=short \
-p no:cacheprovider -p gpu_failures; \
python3 scripts/bench_qgemv.py --max-configs 0 --json "$OUT/dp4a.json"' ;;
    qgemv-fp4) run qgemv-fp4 540 python3 scripts/bench_qgemv.py --e2m1 --group 32 --json "$OUT/qgemv-fp4.json" ;;
    *) echo "unknown step $step (env, tests, pytest, quant, families, profile, bench, bench-q4, http, sampler, qgemv, dp4a, qgemv-fp4)" && exit 2 ;;
    esac
done

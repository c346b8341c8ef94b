"""The quantized CPU layers on CPUs without AVX-512, run here by capping the ISA in a fresh process.

- kernels/cpu_vnni_gemm_avx2.c (AVX2, with or without AVX-VNNI's dot products) must give what the
  AVX-512 build gives, bit for bit: the same quantization of x and the same integer sums and float
  steps, on every tile shape, 4- and 8-bit codes, codebooks, both I/O dtypes and the prefill decoder.
- The sampler's native pass (kernels/cpu_sampling.c) draws the same tokens on either build.
- aten lays int4pack weights out by its own CPU capability; where that is not the AVX-512 layout the
  decoders read (and no native kernel serves), 4-bit weights must still load (as int8 per channel).
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lantern.backends.torch import native_build

ROOT = Path(__file__).resolve().parents[2]
OUTPUTS = """
import sys, torch
from lantern.backends.torch import cpu_vnni_gemm, native_build, vnni_linear
from tests.unit.test_torch_vnni_gemm import affine
from tests.unit.test_torch_vnni_codebook import codebook_weight
assert cpu_vnni_gemm.available(), "the kernels did not build"
cpu = torch.device("cpu")
weights = {"q4g32": affine(200, 576, 4, 32, seed=1), "q4g128": affine(33, 256, 4, 128, seed=2),
           "q8g64": affine(100, 512, 8, 64, seed=3), "q8pc": affine(50, 256, 8, 256, seed=4),
           "codebook": codebook_weight(70, 256, seed=5)}
out = {"isa": native_build.isa()}
for name, w in weights.items():
    layer = vnni_linear.VnniLinear(w, cpu)
    for dtype in (torch.float32, torch.bfloat16):
        for m in (1, 2, 3, 4, 5, 13, 33):
            x = torch.randn(m, w.shape[1], generator=torch.Generator().manual_seed(m)).to(dtype)
            out[f"{name} {dtype} {m} rows"] = layer(x)
        out[f"{name} {dtype} decoded"] = layer._decoded_rows(16, w.shape[0], dtype)
from lantern.backends.torch import sampler
assert sampler.use_native_cpu_ops()
for rows, cols in ((1, 5003), (3, 49152), (32, 300)):
    g = torch.Generator().manual_seed(rows * cols)
    scores = torch.randn(rows, cols, generator=g) * 3
    keys = torch.randint(0, 2**32, (rows, 1), generator=g)
    temps = torch.rand(rows, 1, generator=g) + 0.2
    hashes = sampler.column_hashes(cols, cpu)
    out[f"draw {rows}x{cols}"] = sampler._argmax_with_noise(scores, keys, hashes, temps)
    out[f"draw {rows}x{cols} T=1"] = sampler._argmax_with_noise(scores, keys, hashes)
    out[f"argmax {rows}x{cols}"] = sampler.row_argmax(scores)
u = ((torch.arange(0, 1 << 23, 7, dtype=torch.float64) + 0.5) / 2**23).float()  # the draw's fast-pass log
out["fast noise"] = torch.ops.lantern.fast_neg_gumbel(u)
from lantern.backends.torch import cpu_elementwise  # the bf16 norms, rope and SiLU (a ctypes library)
g = torch.Generator().manual_seed(7)
for n in (7, 576, 1000):
    x, r = (torch.randn(300, n, generator=g) * 3).bfloat16(), torch.randn(300, n, generator=g).bfloat16()
    x[0, 0], x[1, -1] = float("nan"), float("inf")
    assert cpu_elementwise.serves(x)
    w = (torch.rand(n, generator=g) + 0.5).bfloat16()
    normed, h = cpu_elementwise.rms_norm(x, w, 1e-5, r)  # (bits compared: rows 0 and 1 are NaN)
    out[f"rms {n}"], out[f"rms h {n}"] = normed.view(torch.int16), h.view(torch.int16)
    out[f"silu {n}"] = cpu_elementwise.silu_mul((torch.randn(5, 2 * n, generator=g) * 4).bfloat16())
x = torch.randn(4, 3, 64, generator=g).bfloat16()
out["rope"] = cpu_elementwise.rope(x, torch.randn(4, 64, generator=g), torch.randn(4, 64, generator=g))
torch.save(out, sys.argv[1])
"""


def run(code: str, *args: str, **env: str) -> subprocess.CompletedProcess:
    full = dict(os.environ, PYTHONPATH=str(ROOT), **env)
    return subprocess.run([sys.executable, "-c", code, *args], env=full, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def avx512_outputs(tmp_path_factory):
    if native_build.isa() != "avx512" or "avx512_vnni" not in native_build.cpu_flags():
        pytest.skip("the reference is the AVX-512 build: this CPU has no AVX512-VNNI")
    path = tmp_path_factory.mktemp("isa") / "avx512.pt"
    proc = run(OUTPUTS, str(path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return torch.load(path)


@pytest.mark.parametrize("level", ["avx2-vnni", "avx2"])
def test_the_avx2_builds_compute_what_the_avx512_build_does_bit_for_bit(avx512_outputs, level, tmp_path):
    if not native_build._ISA_NEEDS[level] <= native_build.cpu_flags():
        pytest.skip(f"this CPU has no {level}")
    proc = run(OUTPUTS, str(tmp_path / "out.pt"), LANTERN_CPU_ISA=level)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = torch.load(tmp_path / "out.pt")
    assert got.pop("isa") == level and avx512_outputs["isa"] == "avx512"
    assert got.keys() == {k for k in avx512_outputs if k != "isa"}
    differ = [k for k, v in got.items() if not torch.equal(v, avx512_outputs[k])]
    assert not differ, differ


def test_the_avx2_build_has_no_avx512_instructions():
    """The AVX2 build runs on CPUs that would fault on an AVX-512 instruction: none in its code."""
    import shutil

    if shutil.which("objdump") is None or not native_build._ISA_NEEDS["avx2"] <= native_build.cpu_flags():
        pytest.skip("needs objdump and an AVX2 CPU")
    code = "from lantern.backends.torch import cpu_vnni_gemm; assert cpu_vnni_gemm.available()"
    proc = run(code, LANTERN_CPU_ISA="avx2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    flags = " ".join(native_build.AVX2_FLAGS["avx2"])
    builds = [d for d in native_build.cache_dir().glob("lantern_cpu_ops_*") if (d / "build.ninja").is_file()]
    mine = [d for d in builds if flags.split(" -D")[0] in (d / "build.ninja").read_text()]
    assert mine, builds
    for d in mine:
        so = next(d.glob("*.so"))
        text = subprocess.run(["objdump", "-d", str(so)], capture_output=True, text=True).stdout
        assert "zmm" not in text and "vpmaddubsw" in text, so
    # the ctypes library built for AVX2 as native_build.load builds it there
    so = native_build.build(
        native_build.KERNELS / "cpu_elementwise.c", (), (*native_build.AVX2_FLAGS["avx2"], "-shared", "-fPIC")
    )
    text = subprocess.run(["objdump", "-d", str(so)], capture_output=True, text=True).stdout
    assert "zmm" not in text and "ymm" in text, so


def test_4_bit_weights_load_where_aten_packs_int4_differently(tmp_path):
    """aten with its AVX2 capability and no native kernels: a Q4_K GGUF still loads and greedy
    decodes as the same file does with the AVX-512 layout, to int8 per channel's error."""
    code = """
import sys, json, logging
from lantern.app.engine import LLM, SamplingParams
from lantern.backends.torch import quant_linear
logging.basicConfig(level=logging.WARNING)
llm = LLM(sys.argv[1], backend="torch", dtype="float32", num_kv_blocks=16, block_size=4)
kinds = sorted({type(m).__name__ for m in llm.engine.backend.model.modules() if isinstance(m, quant_linear.QuantLayer)})
print(json.dumps(kinds))
"""
    from tests.fixtures.gguf_writer import write_gguf_model

    path, _ = write_gguf_model(tmp_path, arch="llama", qtype="Q4_K")
    proc = run(code, str(path), ATEN_CPU_CAPABILITY="avx2", LANTERN_CPU_KERNELS="0", LANTERN_CACHE=str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == '["Int8PackLinear"]'
    assert "aten packs int4 weights differently" in proc.stderr


def test_a_build_lock_left_by_a_killed_process_does_not_hang_the_next_load(tmp_path):
    """cpp_extension's lock is a file its holder deletes when done: a process killed while building or
    loading (a tensor-parallel worker killed at start-up) left it behind, and every later start waited
    for it forever. native_build holds an flock around cpp_extension (released when its holder dies)
    and removes a leftover file under it."""
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(tmp_path)], env=dict(os.environ, PYTHONPATH=str(ROOT)),
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "holding"
        assert (tmp_path / "lock").exists()
        probe = [sys.executable, "-c", PROBE_LOCK, str(tmp_path / "lantern.lock")]
        assert subprocess.run(probe, timeout=60).returncode == 1  # held: another process cannot enter
    finally:
        holder.kill()  # dies inside, as a killed worker does: cpp_extension's file stays
        holder.wait()
    assert (tmp_path / "lock").exists()
    with native_build._build_lock(tmp_path):  # would block if the dead holder's flock outlived it
        assert not (tmp_path / "lock").exists()
        assert subprocess.run(probe, timeout=60).returncode == 1
    assert subprocess.run(probe, timeout=60).returncode == 0


HOLD_LOCK = """
import sys, time
from pathlib import Path
from lantern.backends.torch import native_build
d = Path(sys.argv[1])
with native_build._build_lock(d):
    (d / "lock").touch()  # what cpp_extension's FileBaton holds while it builds
    print("holding", flush=True)
    time.sleep(600)
"""
PROBE_LOCK = """
import fcntl, sys
with open(sys.argv[1], "a") as f:
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        sys.exit(1)
"""

// torch.ops.lantern.paged_decode as a C++ torch op over cpu_paged_attention.c (see cpu_ops.cpp for
// why: a call from the dispatcher costs ~1-2 us, the ctypes op ~10 us more, and a decode step makes
// one per layer). Built by native_build.load_ops; cpu_attention.py keeps the ctypes op where the
// build fails, with the same checks and messages as here.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include "cpu_paged_attention.c"

namespace {

// q [B, H, D] -> [B, H, Dv] over pools [slots, KVH, D] / [slots, KVH, Dv] (V may be a view into K),
// q, the pools and the output all float32 or all bfloat16; window 0 and softcap 0: none.
at::Tensor paged_decode(const at::Tensor &q, const at::Tensor &k_pool, const at::Tensor &v_pool,
                        const at::Tensor &block_tables, const at::Tensor &seq_lens, int64_t block_size, double scale,
                        int64_t window, double softcap, const c10::optional<at::Tensor> &sinks) {
    bool fits = q.dim() == 3 && k_pool.dim() == 3 && v_pool.dim() == 3 && block_tables.dim() == 2 &&
                seq_lens.dim() == 1 && block_size > 0;
    if (fits) {
        const auto dt = q.scalar_type();
        const int64_t b = q.size(0), h = q.size(1), d = q.size(2), slots = k_pool.size(0), kvh = k_pool.size(1);
        fits = (dt == at::kFloat || dt == at::kBFloat16) && k_pool.scalar_type() == dt &&
               v_pool.scalar_type() == dt && k_pool.size(2) == d && v_pool.size(0) == slots &&
               v_pool.size(1) == kvh && kvh > 0 && h % kvh == 0 && k_pool.stride(2) == 1 && v_pool.stride(2) == 1 &&
               block_tables.size(0) == b && seq_lens.size(0) == b && slots % block_size == 0 && q.is_cpu() &&
               k_pool.is_cpu() && v_pool.is_cpu();
    }
    TORCH_CHECK_VALUE(fits, "paged_decode: q ", q.sizes(), " ", q.scalar_type(), ", pools ", k_pool.sizes(), " ",
                      k_pool.scalar_type(), " / ", v_pool.sizes(), " ", v_pool.scalar_type(), ", tables ",
                      block_tables.sizes(), ", lens ", seq_lens.sizes(), " do not fit");
    const int64_t b = q.size(0), h = q.size(1), d = q.size(2), slots = k_pool.size(0), kvh = k_pool.size(1);
    const int64_t dv = v_pool.size(2);
    at::Tensor qc = q.contiguous();
    at::Tensor tables = block_tables.to(at::kInt).contiguous();
    at::Tensor lens = seq_lens.to(at::kInt).contiguous();
    at::Tensor sink;
    if (sinks.has_value()) sink = sinks->detach().to(at::kFloat).contiguous();
    at::Tensor out = at::empty({b, h, dv}, q.options());
    int status = lantern_paged_decode(
        qc.data_ptr(), b, h, d, k_pool.data_ptr(), k_pool.stride(0), k_pool.stride(1), v_pool.data_ptr(),
        v_pool.stride(0), v_pool.stride(1), dv, kvh, tables.data_ptr<int32_t>(), tables.stride(0), tables.size(1),
        lens.data_ptr<int32_t>(), block_size, slots / block_size, (float)scale, window, (float)softcap,
        sink.defined() ? sink.data_ptr<float>() : nullptr, q.scalar_type() == at::kBFloat16, out.data_ptr(),
        at::get_num_threads());
    TORCH_CHECK_VALUE(status != -1, "paged_decode: a block table entry lies outside the KV pool");
    TORCH_CHECK_VALUE(status != -3, "paged_decode: a length needs more than the table's ", tables.size(1), " blocks");
    TORCH_CHECK(status == 0, "paged_decode: the kernel could not allocate its scratch memory");
    return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(lantern, m) {
    m.def(
        "paged_decode(Tensor q, Tensor k_pool, Tensor v_pool, Tensor block_tables, Tensor seq_lens, "
        "int block_size, float scale, int window, float softcap, Tensor? sinks) -> Tensor");
}

TORCH_LIBRARY_IMPL(lantern, CPU, m) { m.impl("paged_decode", paged_decode); }

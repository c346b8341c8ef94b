// Lantern's native CPU ops as a torch library: torch.ops.lantern.vnni_mm (and vnni_decode), and the
// sampler's noisy_argmax and row_argmax. Built by
// native_build.load_ops (torch.utils.cpp_extension) and loaded into the process, so a call goes
// from the dispatcher straight to the kernel: ~1-2 us, where a Python op that reaches a C kernel
// through ctypes costs ~10-15 us (a one-row SmolLM2 step makes ~120 such calls).
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#ifdef LANTERN_AVX2
#include "cpu_vnni_gemm_avx2.c"  // CPUs without AVX-512: the same kernels on 256-bit vectors
#else
#include "cpu_vnni_gemm.c"
#endif
#include "cpu_sampling.c"

namespace {

// A codebook weight's 16-byte table (4-bit indices only).
const uint8_t *codebook(const at::Tensor &t, int64_t bits, const char *op) {
    TORCH_CHECK_VALUE(bits == 4 && t.scalar_type() == at::kByte && t.numel() == 16 && t.is_contiguous() &&
                          t.device().is_cpu(),
                      op, ": a codebook table is 16 uint8 CPU values for 4-bit indices, not ", t.sizes(), " at ",
                      bits, " bits");
    return t.data_ptr<uint8_t>();
}

// x [M, K] float32 or bfloat16 @ W.T -> [M, n] in x's dtype; W as cpu_vnni_gemm.pack_codes /
// pack_scales hold it. Every size is checked against the others: a mismatch raises, never reads
// out of bounds.
at::Tensor vnni_mm(const at::Tensor &x, const at::Tensor &codes, const at::Tensor &scales, const at::Tensor &out_scale,
                   int64_t group_size, int64_t n, int64_t bits, const uint8_t *lut = nullptr) {
    TORCH_CHECK_TYPE(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16,
                     "vnni_mm: x must be float32 or bfloat16, not ", x.scalar_type());
    TORCH_CHECK_VALUE(x.dim() == 2 && x.device().is_cpu(), "vnni_mm: x must be a 2-D CPU tensor");
    const int64_t m = x.size(0), k = x.size(1), blocks = (n + 15) / 16, per_vector = bits == 4 ? 8 : 4;
    bool fits = (bits == 4 || bits == 8) && n > 0 && group_size > 0 && k % XG == 0 && group_size % XG == 0 &&
                k % group_size == 0 && codes.scalar_type() == at::kByte && codes.is_contiguous() &&
                codes.dim() == 3 && codes.size(0) == blocks && codes.size(1) == k / per_vector &&
                codes.size(2) == 64 && scales.scalar_type() == at::kHalf && scales.is_contiguous() &&
                scales.dim() == 4 && scales.size(0) == blocks && scales.size(1) == k / group_size &&
                scales.size(2) == 2 && scales.size(3) == 16 && out_scale.scalar_type() == at::kFloat &&
                out_scale.numel() == 1 && codes.device().is_cpu() && scales.device().is_cpu() &&
                out_scale.device().is_cpu();
    TORCH_CHECK_VALUE(fits, "vnni_mm: x ", x.sizes(), " does not fit the ", bits, "-bit weight ", codes.sizes());
    at::Tensor xc = x.contiguous();
    at::Tensor y = at::empty({m, n}, x.options());
    if (m == 0) return y;
    int bf16 = x.scalar_type() == at::kBFloat16;
    int rc = lantern_vnni_mm(xc.data_ptr(), m, k, codes.data_ptr<uint8_t>(), (const uint16_t *)scales.data_ptr(),
                             group_size, out_scale.data_ptr<float>(), n, y.data_ptr(), bf16, (int)bits, lut,
                             at::get_num_threads());
    TORCH_CHECK(rc == 0, "vnni_mm: the kernel could not allocate x's quantized copy");
    return y;
}

// Blocks first_block .. first_block + num_blocks of the same weight decoded as W^T: [K, 16 * num_blocks]
// float32 or bfloat16 (the dense prefill GEMM reads its [rows, K] transpose in place).
at::Tensor vnni_decode(const at::Tensor &codes, const at::Tensor &scales, const at::Tensor &out_scale, int64_t k,
                       int64_t group_size, int64_t bits, int64_t first_block, int64_t num_blocks,
                       at::ScalarType dtype, const uint8_t *lut = nullptr) {
    TORCH_CHECK_TYPE(dtype == at::kFloat || dtype == at::kBFloat16, "vnni_decode: float32 or bfloat16, not ", dtype);
    const int64_t per_vector = bits == 4 ? 8 : 4;
    bool fits = (bits == 4 || bits == 8) && group_size > 0 && k > 0 && k % XG == 0 && group_size % XG == 0 &&
                k % group_size == 0 && codes.scalar_type() == at::kByte && codes.is_contiguous() &&
                codes.dim() == 3 && codes.size(1) == k / per_vector && codes.size(2) == 64 &&
                scales.scalar_type() == at::kHalf && scales.is_contiguous() && scales.dim() == 4 &&
                scales.size(0) == codes.size(0) && scales.size(1) == k / group_size && scales.size(2) == 2 &&
                scales.size(3) == 16 && out_scale.scalar_type() == at::kFloat && out_scale.numel() == 1 &&
                first_block >= 0 && num_blocks >= 0 && first_block + num_blocks <= codes.size(0) &&
                codes.device().is_cpu() && scales.device().is_cpu() && out_scale.device().is_cpu();
    TORCH_CHECK_VALUE(fits, "vnni_decode: blocks ", first_block, "+", num_blocks, " of K=", k, " do not fit the ",
                      bits, "-bit weight ", codes.sizes());
    at::Tensor out = at::empty({k, 16 * num_blocks}, codes.options().dtype(dtype));
    if (num_blocks == 0) return out;
    lantern_vnni_decode(codes.data_ptr<uint8_t>(), (const uint16_t *)scales.data_ptr(), k, group_size, (int)bits, lut,
                        *out_scale.data_ptr<float>(), first_block, num_blocks, out.data_ptr(), 16 * num_blocks,
                        dtype == at::kBFloat16, at::get_num_threads());
    return out;
}

// The same with a codebook: 4-bit indices into `table`'s 16 codes (separate ops rather than an optional
// argument: inductor's C++ wrapper drops an argument left at its default, and the op then reads past
// the arguments it was given).
at::Tensor vnni_mm_codebook(const at::Tensor &x, const at::Tensor &codes, const at::Tensor &scales,
                            const at::Tensor &out_scale, int64_t group_size, int64_t n, int64_t bits,
                            const at::Tensor &table) {
    return vnni_mm(x, codes, scales, out_scale, group_size, n, bits, codebook(table, bits, "vnni_mm"));
}

at::Tensor vnni_decode_codebook(const at::Tensor &codes, const at::Tensor &scales, const at::Tensor &out_scale,
                                int64_t k, int64_t group_size, int64_t bits, int64_t first_block, int64_t num_blocks,
                                at::ScalarType dtype, const at::Tensor &table) {
    return vnni_decode(codes, scales, out_scale, k, group_size, bits, first_block, num_blocks, dtype,
                       codebook(table, bits, "vnni_decode"));
}

at::Tensor vnni_mm_plain(const at::Tensor &x, const at::Tensor &codes, const at::Tensor &scales,
                         const at::Tensor &out_scale, int64_t group_size, int64_t n, int64_t bits) {
    return vnni_mm(x, codes, scales, out_scale, group_size, n, bits);
}

at::Tensor vnni_decode_plain(const at::Tensor &codes, const at::Tensor &scales, const at::Tensor &out_scale, int64_t k,
                             int64_t group_size, int64_t bits, int64_t first_block, int64_t num_blocks,
                             at::ScalarType dtype) {
    return vnni_decode(codes, scales, out_scale, k, group_size, bits, first_block, num_blocks, dtype);
}

// Each row's first maximum of scores - T * log(-log(u)) (cpu_sampling.c): scores float32 [R, C] with
// unit column stride, hashes int32 [C] or [R, C], keys16 int32 [R] (or [R, 1]), temps float32 [R]
// (or [R, 1]), or empty for T = 1; mix1, mix2 the hash's multipliers as int32 values. With
// `values`, the noisy scores [R, C] instead of the argmax (noisy_scores, for the tests).
at::Tensor noisy_pass(const at::Tensor &scores, const at::Tensor &hashes, const at::Tensor &keys16,
                      const at::Tensor &temps, int64_t mix1, int64_t mix2, bool values) {
    TORCH_CHECK_VALUE(scores.scalar_type() == at::kFloat && scores.dim() == 2 && scores.stride(1) == 1 &&
                          scores.device().is_cpu(),
                      "noisy_argmax: scores must be a float32 CPU [rows, cols] tensor with unit column stride");
    const int64_t rows = scores.size(0), cols = scores.size(1);
    bool shared = hashes.dim() == 1 && hashes.size(0) == cols;
    bool per_row = hashes.dim() == 2 && hashes.size(0) == rows && hashes.size(1) == cols;
    TORCH_CHECK_VALUE(hashes.scalar_type() == at::kInt && hashes.is_contiguous() && hashes.device().is_cpu() &&
                          (shared || per_row),
                      "noisy_argmax: hashes must be int32 [", cols, "] or [", rows, ", ", cols, "], not ",
                      hashes.sizes());
    TORCH_CHECK_VALUE(keys16.scalar_type() == at::kInt && keys16.is_contiguous() && keys16.numel() == rows &&
                          keys16.device().is_cpu(),
                      "noisy_argmax: keys16 must be ", rows, " int32 values");
    TORCH_CHECK_VALUE(temps.numel() == 0 || (temps.scalar_type() == at::kFloat && temps.is_contiguous() &&
                                             temps.numel() == rows && temps.device().is_cpu()),
                      "noisy_argmax: temps must be ", rows, " float32 values or empty");
    at::Tensor out = at::empty({rows}, scores.options().dtype(at::kLong));
    at::Tensor dump = values ? at::empty({rows, cols}, scores.options()) : at::Tensor();
    if (rows == 0) return values ? dump : out;
    TORCH_CHECK_VALUE(cols > 0, "noisy_argmax: a row needs a column");
    lantern_noisy_argmax(scores.data_ptr<float>(), rows, cols, scores.stride(0), hashes.data_ptr<int32_t>(),
                         shared ? 0 : cols, keys16.data_ptr<int32_t>(),
                         temps.numel() ? temps.data_ptr<float>() : nullptr, 1, (int32_t)mix1, (int32_t)mix2,
                         out.data_ptr<int64_t>(), at::get_num_threads(), values ? dump.data_ptr<float>() : nullptr);
    return values ? dump : out;
}

at::Tensor noisy_argmax(const at::Tensor &scores, const at::Tensor &hashes, const at::Tensor &keys16,
                        const at::Tensor &temps, int64_t mix1, int64_t mix2) {
    return noisy_pass(scores, hashes, keys16, temps, mix1, mix2, false);
}

at::Tensor noisy_scores(const at::Tensor &scores, const at::Tensor &hashes, const at::Tensor &keys16,
                        const at::Tensor &temps, int64_t mix1, int64_t mix2) {
    return noisy_pass(scores, hashes, keys16, temps, mix1, mix2, true);
}

// torch.argmax(scores, -1) of a float32 CPU [rows, cols] tensor with unit column stride, in one pass.
at::Tensor row_argmax(const at::Tensor &scores) {
    TORCH_CHECK_VALUE(scores.scalar_type() == at::kFloat && scores.dim() == 2 && scores.stride(1) == 1 &&
                          scores.device().is_cpu() && scores.size(1) > 0,
                      "row_argmax: scores must be a float32 CPU [rows, cols > 0] tensor with unit column stride");
    at::Tensor out = at::empty({scores.size(0)}, scores.options().dtype(at::kLong));
    if (scores.size(0) == 0) return out;
    lantern_noisy_argmax(scores.data_ptr<float>(), scores.size(0), scores.size(1), scores.stride(0), nullptr, 0,
                         nullptr, nullptr, 0, 0, 0, out.data_ptr<int64_t>(), at::get_num_threads(), nullptr);
    return out;
}

// The sampler's fast-pass noise of float32 u values in (0, 1) (cpu_sampling.c), for the test of its
// bound against torch's u.log().neg().log().
at::Tensor fast_neg_gumbel(const at::Tensor &u) {
    TORCH_CHECK_VALUE(u.scalar_type() == at::kFloat && u.dim() == 1 && u.is_contiguous() && u.device().is_cpu(),
                      "fast_neg_gumbel: u must be a contiguous float32 CPU vector");
    const int64_t n = u.numel(), padded = (n + 15) / 16 * 16;
    at::Tensor whole = at::empty({padded}, u.options());
    at::Tensor noise = at::empty({padded}, u.options());
    float *w = whole.data_ptr<float>();
    const float *src = u.data_ptr<float>();
    for (int64_t i = 0; i < padded; i++) w[i] = i < n ? src[i] : 0.5f;  // the tail: any u in (0, 1)
    lantern_fast_neg_gumbel(whole.data_ptr<float>(), noise.data_ptr<float>(), padded);
    return noise.narrow(0, 0, n);
}

// The draw's exact noise computed as its candidates get it (a few values per call), for the test that
// it is torch's u.log().neg().log() bit for bit.
at::Tensor small_batch_neg_gumbel(const at::Tensor &u) {
    TORCH_CHECK_VALUE(u.scalar_type() == at::kFloat && u.dim() == 1 && u.is_contiguous() && u.device().is_cpu(),
                      "small_batch_neg_gumbel: u must be a contiguous float32 CPU vector");
    at::Tensor noise = at::empty({u.numel()}, u.options());
    lantern_small_batch_neg_gumbel(u.data_ptr<float>(), noise.data_ptr<float>(), u.numel());
    return noise;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(lantern, m) {
    m.def("vnni_mm(Tensor x, Tensor codes, Tensor scales, Tensor out_scale, int group_size, int n, int bits) -> Tensor");
    m.def(
        "vnni_mm_codebook(Tensor x, Tensor codes, Tensor scales, Tensor out_scale, int group_size, int n, int bits, "
        "Tensor table) -> Tensor");
    m.def("noisy_argmax(Tensor scores, Tensor hashes, Tensor keys16, Tensor temps, int mix1, int mix2) -> Tensor");
    m.def("noisy_scores(Tensor scores, Tensor hashes, Tensor keys16, Tensor temps, int mix1, int mix2) -> Tensor");
    m.def("row_argmax(Tensor scores) -> Tensor");
    m.def("fast_neg_gumbel(Tensor u) -> Tensor");
    m.def("small_batch_neg_gumbel(Tensor u) -> Tensor");
    m.def(
        "vnni_decode(Tensor codes, Tensor scales, Tensor out_scale, int k, int group_size, int bits, int first_block, "
        "int num_blocks, ScalarType dtype) -> Tensor");
    m.def(
        "vnni_decode_codebook(Tensor codes, Tensor scales, Tensor out_scale, int k, int group_size, int bits, "
        "int first_block, int num_blocks, ScalarType dtype, Tensor table) -> Tensor");
}

TORCH_LIBRARY_IMPL(lantern, CPU, m) {
    m.impl("vnni_mm", vnni_mm_plain);
    m.impl("vnni_mm_codebook", vnni_mm_codebook);
    m.impl("vnni_decode", vnni_decode_plain);
    m.impl("noisy_argmax", noisy_argmax);
    m.impl("noisy_scores", noisy_scores);
    m.impl("row_argmax", row_argmax);
    m.impl("fast_neg_gumbel", fast_neg_gumbel);
    m.impl("small_batch_neg_gumbel", small_batch_neg_gumbel);
    m.impl("vnni_decode_codebook", vnni_decode_codebook);
}

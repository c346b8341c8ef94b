// AVX-512 helpers the CPU attention kernels share (cpu_paged_attention.c, cpu_prefill_attention.c).
#pragma once
#include <immintrin.h>
#include <stdint.h>

static inline __mmask16 tail_mask(long left) { return left >= 16 ? 0xFFFF : (__mmask16)((1u << left) - 1); }
static inline __mmask32 tail_mask32(long left) {
    return left >= 32 ? 0xFFFFFFFFu : left <= 0 ? 0 : (__mmask32)((1u << left) - 1);
}

// e^x for x <= 0 (a score less the running max): x = n ln2 + r, |r| <= ln2 / 2, e^r by its Taylor
// polynomial to r^6 (relative error ~1e-7), times 2^n. Below -87 the result underflows to ~0; a NaN
// stays NaN (maxps returns its second operand when either is NaN), as it does in torch's softmax.
static inline __m512 exp_nonpositive(__m512 x) {
    x = _mm512_max_ps(_mm512_set1_ps(-87.0f), x);
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);  // ln2 in two parts
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187e-06f), r);
    __m512 p = _mm512_set1_ps(1.0f / 720);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

// y[:n] *= a
static inline void scale_row(float *y, float a, long n) {
    __m512 va = _mm512_set1_ps(a);
    for (long i = 0; i < n; i += 16) {
        __mmask16 m = tail_mask(n - i);
        _mm512_mask_storeu_ps(y + i, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, y + i), va));
    }
}

// Loads of 16 elements (masked) widened to float32: a bf16 value is a float32's upper half.
#define LOAD_F32(m, p) _mm512_maskz_loadu_ps(m, p)
#define LOAD_BF16(m, p) \
    _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p)), 16))

// x rounded to bf16, to nearest even as torch rounds (NaN: a quiet NaN), lanes m stored at dst.
static inline void store_bf16(uint16_t *dst, __m512 x, __mmask16 m) {
    const __m512i one = _mm512_set1_epi32(1), half = _mm512_set1_epi32(0x7FFF);
    __m512i u = _mm512_castps_si512(x);
    __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(half, _mm512_and_si512(_mm512_srli_epi32(u, 16), one)));
    r = _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), _mm512_set1_epi32(0x7FC00000));
    _mm256_mask_storeu_epi16(dst, m, _mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16)));
}


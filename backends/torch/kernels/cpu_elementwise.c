// The elementwise steps of a bfloat16 layer on x86 (AVX-512, or AVX2 built with -DLANTERN_AVX2), each
// one pass over its rows: RMSNorm with its residual add, rotary embedding, and SiLU(gate) * up. Built and
// loaded by backends/torch/cpu_elementwise.py.
//
// torch runs each as several bf16 ops, every one a pass over memory that widens, computes and rounds
// (RMSNorm: add, widen, square, mean, rsqrt, multiply, round, multiply by the weight): over a
// 2048-token SmolLM2 prefill step they took ~5.5 ms a layer, ~10% of the step. The roundings are
// torch's (reference.rms_norm / rotary / MLP): each intermediate that torch keeps in bf16 is rounded
// to bf16 here too, everything else is float32; only the order of the float32 sums differs (and the
// exp of SiLU, a polynomial good to ~1e-7), so a result may differ from torch's by one bf16 unit.
// The AVX2 build gives the AVX-512 build's results bit for bit: the same operations lane by lane, its
// RMSNorm sums kept as the two halves of the 16-lane accumulator and reduced in the same order.
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

#define PAR_ELEMENTS 65536  // below this many elements a call stays on one thread

#ifndef LANTERN_AVX2
#include "attention_simd.h"

static inline __m512 bf16_round(__m512 x) {  // x rounded to bf16 (nearest even), kept as float32
    const __m512i one = _mm512_set1_epi32(1), half = _mm512_set1_epi32(0x7FFF);
    __m512i u = _mm512_castps_si512(x);
    __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(half, _mm512_and_si512(_mm512_srli_epi32(u, 16), one)));
    r = _mm512_and_si512(r, _mm512_set1_epi32((int)0xFFFF0000u));
    return _mm512_mask_mov_ps(_mm512_castsi512_ps(r), _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), x);
}

// rows x [rows / inner][inner][n] (strides xs, xis: heads inside tokens), residual NULL or likewise
// (rs, ris): h = x + residual rounded to bf16 (written to h_out when there is a residual), out = weight
// * bf16(h * rsqrt(mean(h^2) + eps)), each product rounded to bf16. out and h_out are contiguous [rows][n].
void lantern_rms_norm_bf16(const uint16_t *x, long inner, long xs, long xis, const uint16_t *residual, long rs,
                           long ris, const uint16_t *weight, float eps, long rows, long n, uint16_t *out,
                           uint16_t *h_out) {
#pragma omp parallel for schedule(static) if (rows * n >= PAR_ELEMENTS)
    for (long r = 0; r < rows; r++) {
        long i = r / inner, j = r % inner;
        const uint16_t *xr = x + i * xs + j * xis, *rr = residual ? residual + i * rs + j * ris : 0;
        uint16_t *o = out + r * n, *hr = h_out ? h_out + r * n : 0;
        __m512 sum = _mm512_setzero_ps();
        for (long c = 0; c < n; c += 16) {
            __mmask16 m = tail_mask(n - c);
            __m512 h = LOAD_BF16(m, xr + c);
            if (rr) {
                h = bf16_round(_mm512_add_ps(h, LOAD_BF16(m, rr + c)));
                store_bf16(hr + c, h, m);
            }
            sum = _mm512_fmadd_ps(h, h, sum);
        }
        float inv = 1.0f / sqrtf(_mm512_reduce_add_ps(sum) / (float)n + eps);
        __m512 vinv = _mm512_set1_ps(inv);
        for (long c = 0; c < n; c += 16) {
            __mmask16 m = tail_mask(n - c);
            __m512 h = rr ? LOAD_BF16(m, hr + c) : LOAD_BF16(m, xr + c);
            __m512 normed = bf16_round(_mm512_mul_ps(h, vinv));
            store_bf16(o + c, _mm512_mul_ps(LOAD_BF16(m, weight + c), normed), m);
        }
    }
}

// Rotary embedding, rotate_half layout: x [rows][heads][d] (strides xs, xhs), cos/sin float32
// [rows][d] (contiguous) -> out [rows][heads][d] contiguous, out = bf16(x * cos + rotate_half(x) * sin)
// where rotate_half(x) = (-x[d/2:], x[:d/2]).
void lantern_rope_bf16(const uint16_t *x, long xs, long xhs, const float *cos, const float *sin, long rows, long heads,
                       long d, uint16_t *out) {
    long half = d / 2;
#pragma omp parallel for schedule(static) if (rows * heads * d >= PAR_ELEMENTS)
    for (long r = 0; r < rows; r++) {
        const float *cr = cos + r * d, *sr = sin + r * d;
        for (long h = 0; h < heads; h++) {
            const uint16_t *xh = x + r * xs + h * xhs;
            uint16_t *o = out + (r * heads + h) * d;
            for (long c = 0; c < half; c += 16) {
                __mmask16 m = tail_mask(half - c);
                __m512 a = LOAD_BF16(m, xh + c), b = LOAD_BF16(m, xh + half + c);
                __m512 first = _mm512_fnmadd_ps(b, _mm512_maskz_loadu_ps(m, sr + c), _mm512_mul_ps(a, _mm512_maskz_loadu_ps(m, cr + c)));
                __m512 second = _mm512_fmadd_ps(a, _mm512_maskz_loadu_ps(m, sr + half + c),
                                                _mm512_mul_ps(b, _mm512_maskz_loadu_ps(m, cr + half + c)));
                store_bf16(o + c, first, m);
                store_bf16(o + half + c, second, m);
            }
        }
    }
}

// gate_up [rows][2n] (row stride gs: gate the first n columns, up the next n) -> out [rows][n]
// contiguous, out = bf16(bf16(silu(gate)) * up), silu(g) = g / (1 + e^-g).
void lantern_silu_mul_bf16(const uint16_t *gate_up, long gs, long rows, long n, uint16_t *out) {
#pragma omp parallel for schedule(static) if (rows * n >= PAR_ELEMENTS)
    for (long r = 0; r < rows; r++) {
        const uint16_t *g = gate_up + r * gs, *u = g + n;
        uint16_t *o = out + r * n;
        for (long c = 0; c < n; c += 16) {
            __mmask16 m = tail_mask(n - c);
            __m512 x = LOAD_BF16(m, g + c);
            // e^-|x| never overflows; sigmoid(x) = 1 / (1 + e^-x) for x >= 0, e^x / (1 + e^x) below
            __m512 e = exp_nonpositive(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_abs_ps(x)));
            __m512 den = _mm512_add_ps(_mm512_set1_ps(1.0f), e);
            __mmask16 neg = _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_LT_OQ);
            __m512 silu = _mm512_div_ps(_mm512_mul_ps(x, _mm512_mask_mov_ps(_mm512_set1_ps(1.0f), neg, e)), den);
            store_bf16(o + c, _mm512_mul_ps(bf16_round(silu), LOAD_BF16(m, u + c)), m);
        }
    }
}

#else  // LANTERN_AVX2: the same steps on 8-lane vectors

// n <= 8 bf16 values at p widened to float32 (the lanes past n are 0), and their store rounded to
// nearest even (NaN: a quiet NaN), as attention_simd.h's LOAD_BF16 / store_bf16.
static inline __m256 load_bf16(const uint16_t *p, long n) {
    uint16_t tmp[8] = {0};
    if (n < 8) memcpy(tmp, p, n * sizeof(uint16_t)), p = tmp;
    __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}
static inline __m256 load_f32(const float *p, long n) {
    float tmp[8] = {0};
    if (n < 8) memcpy(tmp, p, n * sizeof(float)), p = tmp;
    return _mm256_loadu_ps(p);
}
static inline __m256i round_bits(__m256 x) {  // x's bits rounded to bf16 in the upper half (NaN quieted)
    const __m256i one = _mm256_set1_epi32(1), half = _mm256_set1_epi32(0x7FFF);
    __m256i u = _mm256_castps_si256(x);
    __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(half, _mm256_and_si256(_mm256_srli_epi32(u, 16), one)));
    __m256 nan = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FC00000));
    return _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(r), nan, _mm256_cmp_ps(x, x, _CMP_UNORD_Q)));
}
static inline void store_bf16(uint16_t *dst, __m256 x, long n) {
    __m256i r = _mm256_srli_epi32(round_bits(x), 16);
    __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
    if (n >= 8) {
        _mm_storeu_si128((__m128i *)dst, packed);
    } else {
        uint16_t tmp[8];
        _mm_storeu_si128((__m128i *)tmp, packed);
        memcpy(dst, tmp, n * sizeof(uint16_t));
    }
}
static inline __m256 bf16_round(__m256 x) {  // x rounded to bf16, kept as float32 (NaN kept as it is)
    __m256 r = _mm256_castsi256_ps(_mm256_and_si256(round_bits(x), _mm256_set1_epi32((int)0xFFFF0000u)));
    return _mm256_blendv_ps(r, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}
// attention_simd.h's exp_nonpositive: the same steps; 2^n (n >= -126 after the clamp) built as a float
static inline __m256 exp_nonpositive(__m256 x) {
    x = _mm256_max_ps(_mm256_set1_ps(-87.0f), x);
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.428606765330187e-06f), r);
    __m256 p = _mm256_set1_ps(1.0f / 720);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}
// _mm512_reduce_add_ps's order on the 16 lanes lo (0-7) and hi (8-15): halves, then quarters, pairs, one.
static inline float reduce16(__m256 lo, __m256 hi) {
    __m256 a = _mm256_add_ps(lo, hi);
    __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
    return _mm_cvtss_f32(_mm_add_ss(c, _mm_shuffle_ps(c, c, 1)));
}

void lantern_rms_norm_bf16(const uint16_t *x, long inner, long xs, long xis, const uint16_t *residual, long rs,
                           long ris, const uint16_t *weight, float eps, long rows, long n, uint16_t *out,
                           uint16_t *h_out) {
#pragma omp parallel for schedule(static) if (rows * n >= PAR_ELEMENTS)
    for (long r = 0; r < rows; r++) {
        long i = r / inner, j = r % inner;
        const uint16_t *xr = x + i * xs + j * xis, *rr = residual ? residual + i * rs + j * ris : 0;
        uint16_t *o = out + r * n, *hr = h_out ? h_out + r * n : 0;
        __m256 sum[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};  // the 16-lane accumulator's halves
        for (long c = 0; c < n; c += 8) {
            long m = n - c < 8 ? n - c : 8;
            __m256 h = load_bf16(xr + c, m);
            if (rr) {
                h = bf16_round(_mm256_add_ps(h, load_bf16(rr + c, m)));
                store_bf16(hr + c, h, m);
            }
            sum[(c / 8) & 1] = _mm256_fmadd_ps(h, h, sum[(c / 8) & 1]);
        }
        float inv = 1.0f / sqrtf(reduce16(sum[0], sum[1]) / (float)n + eps);
        __m256 vinv = _mm256_set1_ps(inv);
        for (long c = 0; c < n; c += 8) {
            long m = n - c < 8 ? n - c : 8;
            __m256 h = rr ? load_bf16(hr + c, m) : load_bf16(xr + c, m);
            __m256 normed = bf16_round(_mm256_mul_ps(h, vinv));
            store_bf16(o + c, _mm256_mul_ps(load_bf16(weight + c, m), normed), m);
        }
    }
}

void lantern_rope_bf16(const uint16_t *x, long xs, long xhs, const float *cos, const float *sin, long rows, long heads,
                       long d, uint16_t *out) {
    long half = d / 2;
#pragma omp parallel for schedule(static) if (rows * heads * d >= PAR_ELEMENTS)
    for (long r = 0; r < rows; r++) {
        const float *cr = cos + r * d, *sr = sin + r * d;
        for (long h = 0; h < heads; h++) {
            const uint16_t *xh = x + r * xs + h * xhs;
            uint16_t *o = out + (r * heads + h) * d;
            for (long c = 0; c < half; c += 8) {
                long m = half - c < 8 ? half - c : 8;
                __m256 a = load_bf16(xh + c, m), b = load_bf16(xh + half + c, m);
                __m256 first = _mm256_fnmadd_ps(b, load_f32(sr + c, m), _mm256_mul_ps(a, load_f32(cr + c, m)));
                __m256 second =
                    _mm256_fmadd_ps(a, load_f32(sr + half + c, m), _mm256_mul_ps(b, load_f32(cr + half + c, m)));
                store_bf16(o + c, first, m);
                store_bf16(o + half + c, second, m);
            }
        }
    }
}

void lantern_silu_mul_bf16(const uint16_t *gate_up, long gs, long rows, long n, uint16_t *out) {
    const __m256 zero = _mm256_setzero_ps(), ones = _mm256_set1_ps(1.0f);
    const __m256 sign = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
#pragma omp parallel for schedule(static) if (rows * n >= PAR_ELEMENTS)
    for (long r = 0; r < rows; r++) {
        const uint16_t *g = gate_up + r * gs, *u = g + n;
        uint16_t *o = out + r * n;
        for (long c = 0; c < n; c += 8) {
            long m = n - c < 8 ? n - c : 8;
            __m256 x = load_bf16(g + c, m);
            __m256 e = exp_nonpositive(_mm256_sub_ps(zero, _mm256_and_ps(x, sign)));
            __m256 den = _mm256_add_ps(ones, e);
            __m256 num = _mm256_blendv_ps(ones, e, _mm256_cmp_ps(x, zero, _CMP_LT_OQ));
            __m256 silu = _mm256_div_ps(_mm256_mul_ps(x, num), den);
            store_bf16(o + c, _mm256_mul_ps(bf16_round(silu), load_bf16(u + c, m)), m);
        }
    }
}
#endif

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

// The vector helpers per ISA; the kernels below are written once over W lanes. `left` is how many
// elements remain from p (the lanes past it read 0 and are not written).
#ifndef LANTERN_AVX2
#include "attention_simd.h"  // (its exp_nonpositive, tail_mask, LOAD_BF16, store_bf16)

#define W 16
typedef __m512 vf;
#define VSET(v) _mm512_set1_ps(v)
#define VADD(a, b) _mm512_add_ps(a, b)
#define VSUB(a, b) _mm512_sub_ps(a, b)
#define VMUL(a, b) _mm512_mul_ps(a, b)
#define VDIV(a, b) _mm512_div_ps(a, b)
#define VFMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define VFNMA(a, b, c) _mm512_fnmadd_ps(a, b, c)
#define VABS(a) _mm512_abs_ps(a)
static inline vf vload_bf16(const uint16_t *p, long left) { return LOAD_BF16(tail_mask(left), p); }
static inline vf vload_f32(const float *p, long left) { return _mm512_maskz_loadu_ps(tail_mask(left), p); }
static inline void vstore_bf16(uint16_t *p, vf x, long left) { store_bf16(p, x, tail_mask(left)); }
static inline vf vwhere_neg(vf x, vf if_neg, vf otherwise) {  // if_neg where x < 0, else otherwise
    return _mm512_mask_mov_ps(otherwise, _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_LT_OQ), if_neg);
}
static inline vf bf16_round(vf x) {  // x rounded to bf16 (nearest even), kept as float32 (NaN as it is)
    const __m512i one = _mm512_set1_epi32(1), half = _mm512_set1_epi32(0x7FFF);
    __m512i u = _mm512_castps_si512(x);
    __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(half, _mm512_and_si512(_mm512_srli_epi32(u, 16), one)));
    r = _mm512_and_si512(r, _mm512_set1_epi32((int)0xFFFF0000u));
    return _mm512_mask_mov_ps(_mm512_castsi512_ps(r), _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), x);
}
static inline float reduce16(const vf *acc) { return _mm512_reduce_add_ps(acc[0]); }

#else  // LANTERN_AVX2: 8 lanes; tails through a zeroed copy

#define W 8
typedef __m256 vf;
#define VSET(v) _mm256_set1_ps(v)
#define VADD(a, b) _mm256_add_ps(a, b)
#define VSUB(a, b) _mm256_sub_ps(a, b)
#define VMUL(a, b) _mm256_mul_ps(a, b)
#define VDIV(a, b) _mm256_div_ps(a, b)
#define VFMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define VFNMA(a, b, c) _mm256_fnmadd_ps(a, b, c)
#define VABS(a) _mm256_and_ps(a, _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF)))
static inline vf vload_bf16(const uint16_t *p, long left) {  // a bf16 value is a float32's upper half
    uint16_t tmp[8] = {0};
    if (left < 8) memcpy(tmp, p, left * sizeof(uint16_t)), p = tmp;
    __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}
static inline vf vload_f32(const float *p, long left) {
    float tmp[8] = {0};
    if (left < 8) memcpy(tmp, p, left * sizeof(float)), p = tmp;
    return _mm256_loadu_ps(p);
}
static inline __m256i round_bits(vf x) {  // x's bits rounded to bf16 in the upper half (NaN: a quiet NaN)
    const __m256i one = _mm256_set1_epi32(1), half = _mm256_set1_epi32(0x7FFF);
    __m256i u = _mm256_castps_si256(x);
    __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(half, _mm256_and_si256(_mm256_srli_epi32(u, 16), one)));
    __m256 nan = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FC00000));
    return _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(r), nan, _mm256_cmp_ps(x, x, _CMP_UNORD_Q)));
}
static inline void vstore_bf16(uint16_t *p, vf x, long left) {
    __m256i r = _mm256_srli_epi32(round_bits(x), 16);
    __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
    if (left >= 8) {
        _mm_storeu_si128((__m128i *)p, packed);
    } else {
        uint16_t tmp[8];
        _mm_storeu_si128((__m128i *)tmp, packed);
        memcpy(p, tmp, left * sizeof(uint16_t));
    }
}
static inline vf vwhere_neg(vf x, vf if_neg, vf otherwise) {
    return _mm256_blendv_ps(otherwise, if_neg, _mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_LT_OQ));
}
static inline vf bf16_round(vf x) {
    vf r = _mm256_castsi256_ps(_mm256_and_si256(round_bits(x), _mm256_set1_epi32((int)0xFFFF0000u)));
    return _mm256_blendv_ps(r, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}
// attention_simd.h's exp_nonpositive, step for step; 2^n (n >= -126 after the clamp) built as a float
static inline vf exp_nonpositive(vf x) {
    x = _mm256_max_ps(_mm256_set1_ps(-87.0f), x);
    vf n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504f)),
                           _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    vf r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.428606765330187e-06f), r);
    const float coef[6] = {1.0f / 120, 1.0f / 24, 1.0f / 6, 0.5f, 1.0f, 1.0f};
    vf p = _mm256_set1_ps(1.0f / 720);
    for (int i = 0; i < 6; i++) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(coef[i]));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}
// _mm512_reduce_add_ps's order over 16 lanes held as acc[0] (0-7) and acc[1] (8-15)
static inline float reduce16(const vf *acc) {
    __m256 a = _mm256_add_ps(acc[0], acc[1]);
    __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
    return _mm_cvtss_f32(_mm_add_ss(c, _mm_shuffle_ps(c, c, 1)));
}
#endif

#define ACC (16 / W)  // RMSNorm's sums as one 16-lane accumulator in W-lane pieces: the same order on both ISAs

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
        vf sum[ACC];
        for (int a = 0; a < ACC; a++) sum[a] = VSET(0.0f);
        for (long c = 0; c < n; c += W) {
            vf h = vload_bf16(xr + c, n - c);
            if (rr) {
                h = bf16_round(VADD(h, vload_bf16(rr + c, n - c)));
                vstore_bf16(hr + c, h, n - c);
            }
            sum[(c / W) % ACC] = VFMA(h, h, sum[(c / W) % ACC]);
        }
        vf vinv = VSET(1.0f / sqrtf(reduce16(sum) / (float)n + eps));
        for (long c = 0; c < n; c += W) {
            vf h = vload_bf16(rr ? hr + c : xr + c, n - c);
            vstore_bf16(o + c, VMUL(vload_bf16(weight + c, n - c), bf16_round(VMUL(h, vinv))), n - c);
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
            for (long c = 0; c < half; c += W) {
                long left = half - c;
                vf a = vload_bf16(xh + c, left), b = vload_bf16(xh + half + c, left);
                vf first = VFNMA(b, vload_f32(sr + c, left), VMUL(a, vload_f32(cr + c, left)));
                vf second = VFMA(a, vload_f32(sr + half + c, left), VMUL(b, vload_f32(cr + half + c, left)));
                vstore_bf16(o + c, first, left);
                vstore_bf16(o + half + c, second, left);
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
        for (long c = 0; c < n; c += W) {
            vf x = vload_bf16(g + c, n - c);
            // e^-|x| never overflows; sigmoid(x) = 1 / (1 + e^-x) for x >= 0, e^x / (1 + e^x) below
            vf e = exp_nonpositive(VSUB(VSET(0.0f), VABS(x)));
            vf silu = VDIV(VMUL(x, vwhere_neg(x, e, VSET(1.0f))), VADD(VSET(1.0f), e));
            vstore_bf16(o + c, VMUL(bf16_round(silu), vload_bf16(u + c, n - c)), n - c);
        }
    }
}

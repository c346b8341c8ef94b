// The elementwise steps of a bfloat16 layer on x86 AVX-512, each one pass over its rows: RMSNorm with
// its residual add, rotary embedding, and SiLU(gate) * up. Built and loaded by
// backends/torch/cpu_elementwise.py.
//
// torch runs each as several bf16 ops, every one a pass over memory that widens, computes and rounds
// (RMSNorm: add, widen, square, mean, rsqrt, multiply, round, multiply by the weight): over a
// 2048-token SmolLM2 prefill step they took ~5.5 ms a layer, ~10% of the step. The roundings are
// torch's (reference.rms_norm / rotary / MLP): each intermediate that torch keeps in bf16 is rounded
// to bf16 here too, everything else is float32; only the order of the float32 sums differs (and the
// exp of SiLU, a polynomial good to ~1e-7), so a result may differ from torch's by one bf16 unit.
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>

#include "attention_simd.h"

#define PAR_ELEMENTS 65536  // below this many elements a call stays on one thread

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

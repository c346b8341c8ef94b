// The sampler's CPU steps in one pass over the logits (backends/torch/cpu_sampling.py): the Gumbel-max
// draw argmax(scores - T * log(-log(u))) with u from the counter hash of backends/sampling_prep.py,
// and the plain argmax of greedy rows. torch's version of the draw makes ~15 passes over a [rows,
// vocab] scratch (the hash's integer steps, two logs, the scaling, the subtraction, the argmax); at
// SmolLM2's 49152 columns ~0.32 ms a row alone and ~5.5 ms for 32 rows on 2 cores, here ~0.10 and ~2.7
// (the two logs, MKL's, are most of it: Sleef's ran the draw in ~0.06 / ~1.7 but is not torch's log).
//
// The results are torch's, bit for bit: the same integer hash, u exact in float32, the logarithm
// torch's own (log_inplace), then one rounded multiply by T and one rounded subtraction (never fused:
// the pragma below; MLX rounds both too), and the first index of the maximum with NaN counting as the
// maximum (torch.argmax's rule).
// Compiled as C++ inside the torch op library (cpu_ops.cpp), so it is written in the common subset.
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")

#include <ATen/Config.h>
#if AT_MKL_ENABLED()
#define LANTERN_MKL_LOG 1
extern "C" void vmsLn(int n, const float *a, float *r, long long mode);  // MKL, LP64 (torch's build)
#else
#define LANTERN_MKL_LOG 0
#endif

#ifdef LANTERN_AVX2
#define SW 8
typedef __m256 sv_f;
typedef __m256i sv_i;
extern "C" __m256 Sleef_logf8_u10(__m256);
#define SV_LOG(v) Sleef_logf8_u10(v)
#define SV_LOAD_I(p) _mm256_loadu_si256((const __m256i *)(p))
#define SV_LOAD_F(p) _mm256_loadu_ps(p)
#define SV_STORE_F(p, v) _mm256_storeu_ps(p, v)
#define SV_SET_I(v) _mm256_set1_epi32(v)
#define SV_SET_F(v) _mm256_set1_ps(v)
#define SV_XOR(a, b) _mm256_xor_si256(a, b)
#define SV_MUL_I(a, b) _mm256_mullo_epi32(a, b)
#define SV_SRL(a, n) _mm256_srli_epi32(a, n)
#define SV_CVT(a) _mm256_cvtepi32_ps(a)
#define SV_MUL(a, b) _mm256_mul_ps(a, b)
#define SV_ADD(a, b) _mm256_add_ps(a, b)
#define SV_SUB(a, b) _mm256_sub_ps(a, b)
#define SV_MAX(a, b) _mm256_max_ps(a, b)
#define SV_HAS_NAN(v) (_mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)) != 0)
static inline float sv_hmax(sv_f v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
    return _mm_cvtss_f32(m);
}
#else
#define SW 16
typedef __m512 sv_f;
typedef __m512i sv_i;
extern "C" __m512 Sleef_logf16_u10(__m512);
#define SV_LOG(v) Sleef_logf16_u10(v)
#define SV_LOAD_I(p) _mm512_loadu_si512((const void *)(p))
#define SV_LOAD_F(p) _mm512_loadu_ps(p)
#define SV_STORE_F(p, v) _mm512_storeu_ps(p, v)
#define SV_SET_I(v) _mm512_set1_epi32(v)
#define SV_SET_F(v) _mm512_set1_ps(v)
#define SV_XOR(a, b) _mm512_xor_si512(a, b)
#define SV_MUL_I(a, b) _mm512_mullo_epi32(a, b)
#define SV_SRL(a, n) _mm512_srli_epi32(a, n)
#define SV_CVT(a) _mm512_cvtepi32_ps(a)
#define SV_MUL(a, b) _mm512_mul_ps(a, b)
#define SV_ADD(a, b) _mm512_add_ps(a, b)
#define SV_SUB(a, b) _mm512_sub_ps(a, b)
#define SV_MAX(a, b) _mm512_max_ps(a, b)
#define SV_HAS_NAN(v) (_mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q) != 0)
static inline float sv_hmax(sv_f v) { return _mm512_reduce_max_ps(v); }
#endif

// Columns per pass through the scratch: few for a plain argmax (the scratch stays in L1), many with
// noise (MKL's log pays per call: 256 -> 8192 took a 49152-column draw from ~260 to ~95 us).
#define SCHUNK 8192
#define SCHUNK_PLAIN 256

typedef struct {
    float best;   // the largest value seen (NaN: a NaN was seen, at idx)
    long idx;     // its first column
} argmax_part;

// buf[0:n) <- log(buf[0:n)), n a multiple of SW: torch's own float32 log. Where torch is built with
// MKL (the x86 wheels) its log_ is MKL's vmsLn in high-accuracy mode, which differs from Sleef's in
// ~14% of the 2^23 values u takes (by an ulp): so that one, same mode; elsewhere torch's vectorized
// log, Sleef's 1-ulp logf.
static inline void log_inplace(float *buf, long n) {
#if LANTERN_MKL_LOG
    vmsLn((int)n, buf, buf, 0x00000002 | 0x00000100 | 0x00140000);  // VML_HA | ERRMODE_IGNORE | FTZDAZ_OFF
#else
    for (long i = 0; i < n; i += SW) SV_STORE_F(buf + i, SV_LOG(SV_LOAD_F(buf + i)));
#endif
}

// Columns [c0, c1) of one row: scores (and, with noise, that row's hash inputs) -> its first maximum.
// mix1, mix2: sampling_prep's MIX_C1, MIX_C2 as int32; key16: the row's xorshift16(key); t: the
// row's temperature (NULL: T = 1, no multiply).
static argmax_part noisy_argmax_range(const float *scores, const int32_t *hashes, int noise, int32_t key16,
                                      const float *t, int32_t mix1, int32_t mix2, long c0, long c1, float *dump) {
    argmax_part out = {-INFINITY, c0};
    float buf[SCHUNK], pad_s[SCHUNK];
    int32_t pad_h[SCHUNK];
    const sv_i k = SV_SET_I(key16), m1 = SV_SET_I(mix1), m2 = SV_SET_I(mix2);
    const sv_f step = SV_SET_F(1.0f / 8388608.0f), half = SV_SET_F(1.0f / 16777216.0f), zero = SV_SET_F(0.0f);
    const sv_f temp = SV_SET_F(t ? *t : 1.0f);
    const long chunk = noise ? SCHUNK : SCHUNK_PLAIN;
    for (long c = c0; c < c1; c += chunk) {
        long n = c1 - c < chunk ? c1 - c : chunk, padded = (n + SW - 1) / SW * SW;
        const float *s = scores + c;
        const int32_t *h = noise ? hashes + c : NULL;
        if (padded != n) {  // the last part: read no column past the row (the padding is masked below)
            memset(pad_s + n, 0, (padded - n) * sizeof(float)), memcpy(pad_s, s, n * sizeof(float)), s = pad_s;
            if (noise) memset(pad_h + n, 0, (padded - n) * sizeof(int32_t)), memcpy(pad_h, h, n * sizeof(int32_t)), h = pad_h;
        }
        if (noise) {  // buf <- log(-log(u)) = -gumbel, as sampler._neg_gumbel_ makes it
            for (long i = 0; i < padded; i += SW) {
                sv_i a = SV_MUL_I(SV_XOR(SV_LOAD_I(h + i), k), m1);  // mix32(mix32(column) ^ key)
                a = SV_MUL_I(SV_XOR(a, SV_SRL(a, 15)), m2);
                a = SV_SRL(a, 9);  // its top 23 bits after the last xorshift: t ^ (t >> 15), t = y >>> 9
                a = SV_XOR(a, SV_SRL(a, 15));
                SV_STORE_F(buf + i, SV_ADD(half, SV_MUL(SV_CVT(a), step)));  // (t + 0.5) / 2^23, exact
            }
            log_inplace(buf, padded);
            for (long i = 0; i < padded; i += SW) SV_STORE_F(buf + i, SV_SUB(zero, SV_LOAD_F(buf + i)));
            log_inplace(buf, padded);
        }
        sv_f vmax = SV_SET_F(-INFINITY);
        int nan = 0;
        for (long i = 0; i < padded; i += SW) {
            sv_f v = SV_LOAD_F(s + i);
            if (noise) {
                sv_f ng = SV_LOAD_F(buf + i);
                if (t) ng = SV_MUL(ng, temp);
                v = SV_SUB(v, ng);
            }
            if (i + SW > n) {  // lanes past the row never win
                SV_STORE_F(buf + i, v);
                for (long j = n; j < i + SW; j++) buf[j] = -INFINITY;
                v = SV_LOAD_F(buf + i);
            }
            nan |= SV_HAS_NAN(v);
            vmax = SV_MAX(vmax, v);
            SV_STORE_F(buf + i, v);
        }
        if (dump) {  // the noisy scores themselves (lantern::noisy_scores: what the tests compare)
            memcpy(dump + c, buf, n * sizeof(float));
            continue;
        }
        if (nan) {  // the first NaN is the answer (torch.argmax counts NaN as the maximum)
            for (long j = 0; j < n; j++)
                if (buf[j] != buf[j]) {
                    out.best = NAN, out.idx = c + j;
                    return out;
                }
        }
        float m = sv_hmax(vmax);
        if (m > out.best) {
            for (long j = 0; j < n; j++)
                if (buf[j] == m) {
                    out.best = m, out.idx = c + j;
                    break;
                }
        }
    }
    return out;
}

// rows x cols scores (row stride ld) -> out[r], each row's first maximum of scores - T * log(-log(u))
// (noise: hashes [cols] shared, or [rows, cols] with hash_ld = cols; keys16 [rows]; temps [rows] or
// NULL) or of the scores themselves (noise 0). A row is split over the threads when there are
// fewer rows than threads; each row's answer is the same however it is split. dump (or NULL): rows x
// cols float32 receiving the noisy scores instead (out is then meaningless).
void lantern_noisy_argmax(const float *scores, long rows, long cols, long ld, const int32_t *hashes, long hash_ld,
                          const int32_t *keys16, const float *temps, int noise, int32_t mix1, int32_t mix2,
                          int64_t *out, int threads, float *dump) {
    long parts = rows >= threads ? 1 : (threads + rows - 1) / rows;
    if (cols < 4096) parts = 1;  // a small row is not worth a second thread
    long units = rows * parts;
    argmax_part *found = (argmax_part *)__builtin_alloca(units * sizeof(argmax_part));
#pragma omp parallel for num_threads(threads) schedule(static) if (units > 1)
    for (long u = 0; u < units; u++) {
        long r = u / parts, p = u % parts;
        long c0 = cols * p / parts, c1 = cols * (p + 1) / parts;
        found[u] = noisy_argmax_range(scores + r * ld, noise ? hashes + r * hash_ld : NULL, noise,
                                      noise ? keys16[r] : 0, temps ? temps + r : NULL, mix1, mix2, c0, c1,
                                      dump ? dump + r * cols : NULL);
    }
    for (long r = 0; r < rows; r++) {  // the parts in column order: a NaN first, else a strictly larger value
        argmax_part best = found[r * parts];
        for (long p = 1; p < parts && best.best == best.best; p++) {
            argmax_part o = found[r * parts + p];
            if (o.best != o.best || o.best > best.best) best = o;
        }
        out[r] = best.idx;
    }
}

#pragma GCC pop_options

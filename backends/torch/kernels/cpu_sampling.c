// The sampler's CPU steps in one pass over the logits (backends/torch/cpu_sampling.py): the Gumbel-max
// draw argmax(scores - T * log(-log(u))) with u from the counter hash of backends/sampling_prep.py,
// and the plain argmax of greedy rows. torch's version of the draw makes ~15 passes over a [rows,
// vocab] scratch (the hash's integer steps, two logs, the scaling, the subtraction, the argmax); at
// SmolLM2's 49152 columns ~0.32 ms a row alone and ~5.5 ms for 32 rows on 2 cores, here ~0.04 and
// ~0.66 (an exact pass with torch's log, MKL's, took ~0.09 and ~2.1: see noisy_argmax_range).
//
// The results are torch's, bit for bit: the same integer hash, u exact in float32, the logarithm
// torch's own (log_inplace) for every value that can win, then one rounded multiply by T and one
// rounded subtraction (never fused: the pragma below; MLX rounds both too), and the first index of
// the maximum with NaN counting as the maximum (torch.argmax's rule).
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
#define SV_GE_BITS(v, f) ((unsigned)_mm256_movemask_ps(_mm256_cmp_ps(v, f, _CMP_GE_OQ)))
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
#define SV_GE_BITS(v, f) ((unsigned)_mm512_cmp_ps_mask(v, f, _CMP_GE_OQ))
static inline float sv_hmax(sv_f v) { return _mm512_reduce_max_ps(v); }
#endif

#define NCAND 64  // candidates the fast pass keeps for the exact values (more: the row's exact pass)

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

// log_inplace for any n <= NCAND (a few candidates' values), called as the exact pass calls it: on an
// aligned buffer whose length is a multiple of SW (the rest 0.5), so that the values are the same
// whatever n (tested over every u at lengths 1..NCAND: lantern_small_batch_neg_gumbel).
static inline void log_inplace_n(float *buf, long n) {
    float pad[NCAND + SW] __attribute__((aligned(64)));
    long padded = (n + SW - 1) / SW * SW;
    for (long i = 0; i < padded; i++) pad[i] = i < n ? buf[i] : 0.5f;
    log_inplace(pad, padded);
    memcpy(buf, pad, n * sizeof(float));
}

// log(x) for the fast pass, x positive and normal (u and -log(u) are): x = 2^e * m with m in
// [sqrt(1/2), sqrt(2)), log(m) = f * Q(f) for f = m - 1 with Q of degree 5 fitted to log1p(f) / f
// (relative error <= ~8e-6, so log(-log(u)) is within ~2e-5 of torch's: the test measures it over
// every u). Inline and ~12 instructions, where a library log is a call and ~3x the work.
static const float LOGQ[6] = {-0.14338313f, 0.22070299f, -0.25397831f, 0.33256778f, -0.49990362f, 1.0000046f};
#ifdef LANTERN_AVX2
static inline sv_f log_fast(sv_f x) {
    __m256i xi = _mm256_castps_si256(x);
    __m256 e = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_srli_epi32(xi, 23), _mm256_set1_epi32(127)));
    __m256 m = _mm256_castsi256_ps(_mm256_or_si256(_mm256_and_si256(xi, _mm256_set1_epi32(0x7FFFFF)),
                                                   _mm256_set1_epi32(0x3F800000)));  // [1, 2)
    __m256 big = _mm256_cmp_ps(m, _mm256_set1_ps(1.41421356f), _CMP_GT_OQ);
    m = _mm256_blendv_ps(m, _mm256_mul_ps(m, _mm256_set1_ps(0.5f)), big);
    e = _mm256_add_ps(e, _mm256_and_ps(big, _mm256_set1_ps(1.0f)));
    __m256 f = _mm256_sub_ps(m, _mm256_set1_ps(1.0f)), q = _mm256_set1_ps(LOGQ[0]);
    for (int i = 1; i < 6; i++) q = _mm256_fmadd_ps(q, f, _mm256_set1_ps(LOGQ[i]));
    return _mm256_fmadd_ps(e, _mm256_set1_ps(0.69314718f), _mm256_mul_ps(f, q));
}
#else
static inline sv_f log_fast(sv_f x) {
    __m512 e = _mm512_getexp_ps(x), m = _mm512_getmant_ps(x, _MM_MANT_NORM_1_2, _MM_MANT_SIGN_src);  // [1, 2)
    __mmask16 big = _mm512_cmp_ps_mask(m, _mm512_set1_ps(1.41421356f), _CMP_GT_OQ);
    m = _mm512_mask_mul_ps(m, big, m, _mm512_set1_ps(0.5f));
    e = _mm512_mask_add_ps(e, big, e, _mm512_set1_ps(1.0f));
    __m512 f = _mm512_sub_ps(m, _mm512_set1_ps(1.0f)), q = _mm512_set1_ps(LOGQ[0]);
    for (int i = 1; i < 6; i++) q = _mm512_fmadd_ps(q, f, _mm512_set1_ps(LOGQ[i]));
    return _mm512_fmadd_ps(e, _mm512_set1_ps(0.69314718f), _mm512_mul_ps(f, q));
}
#endif

// u of column hash h for a row: mix32(mix32(column) ^ key)'s top 23 bits after the last xorshift,
// as (t + 0.5) / 2^23 (exact in float32).
static inline sv_f draw_u(sv_i h, sv_i k, sv_i m1, sv_i m2) {
    const sv_f step = SV_SET_F(1.0f / 8388608.0f), half = SV_SET_F(1.0f / 16777216.0f);
    sv_i a = SV_MUL_I(SV_XOR(h, k), m1);
    a = SV_MUL_I(SV_XOR(a, SV_SRL(a, 15)), m2);
    a = SV_SRL(a, 9);  // t = y >>> 9, then t ^ (t >> 15)
    a = SV_XOR(a, SV_SRL(a, 15));
    return SV_ADD(half, SV_MUL(SV_CVT(a), step));
}

// buf[0:n) <- log(-log(u)) = -gumbel for n hashes (n a multiple of SW), as sampler._neg_gumbel_ makes it.
static void neg_gumbel(const int32_t *h, long n, sv_i k, sv_i m1, sv_i m2, float *buf) {
    const sv_f zero = SV_SET_F(0.0f);
    for (long i = 0; i < n; i += SW) SV_STORE_F(buf + i, draw_u(SV_LOAD_I(h + i), k, m1, m2));
    log_inplace(buf, n);
    for (long i = 0; i < n; i += SW) SV_STORE_F(buf + i, SV_SUB(zero, SV_LOAD_F(buf + i)));
    log_inplace(buf, n);
}

typedef struct {
    int overflow;  // more candidates than fit, or an infinite maximum: the caller takes the exact pass
    int n;         // columns whose approximate value is within the margin of the maximum, in order
    long col[NCAND];
    float val[NCAND];
} candidates;

// Columns [c0, c1) of one row: scores (and, with noise, that row's hash inputs) -> its first maximum.
// mix1, mix2: sampling_prep's MIX_C1, MIX_C2 as int32; key16: the row's xorshift16(key); t: the
// row's temperature (NULL: T = 1, no multiply). exact 0 (with cand): the noise from the fast log; the
// result's best is then the approximate maximum and cand what the exact values must decide between.
static argmax_part argmax_pass(const float *scores, const int32_t *hashes, int noise, int32_t key16, const float *t,
                               int32_t mix1, int32_t mix2, long c0, long c1, float *dump, int exact, candidates *cand) {
    argmax_part out = {-INFINITY, c0};
    float buf[SCHUNK], pad_s[SCHUNK];
    int32_t pad_h[SCHUNK];
    const sv_i k = SV_SET_I(key16), m1 = SV_SET_I(mix1), m2 = SV_SET_I(mix2);
    const sv_f temp = SV_SET_F(t ? *t : 1.0f);
    const float tmargin = 1e-3f * (t && fabsf(*t) > 1.0f ? fabsf(*t) : 1.0f);  // see noisy_argmax_range
    const long chunk = noise ? SCHUNK : SCHUNK_PLAIN;
    for (long c = c0; c < c1; c += chunk) {
        long n = c1 - c < chunk ? c1 - c : chunk, padded = (n + SW - 1) / SW * SW;
        const float *s = scores + c;
        const int32_t *h = noise ? hashes + c : NULL;
        if (padded != n) {  // the last part: read no column past the row (the padding is masked below)
            memset(pad_s + n, 0, (padded - n) * sizeof(float)), memcpy(pad_s, s, n * sizeof(float)), s = pad_s;
            if (noise) memset(pad_h + n, 0, (padded - n) * sizeof(int32_t)), memcpy(pad_h, h, n * sizeof(int32_t)), h = pad_h;
        }
        if (noise && exact) neg_gumbel(h, padded, k, m1, m2, buf);
        sv_f vmax = SV_SET_F(-INFINITY);
        int nan = 0;
        const sv_f zero = SV_SET_F(0.0f);
        long i0 = 0;
        if (noise && !exact) {  // the fast pass: the noise in registers, two vectors at a time (their
            // dependency chains overlap), the row's last vector left to the loop below
            sv_f vmax1 = vmax;
            for (; i0 + 2 * SW < padded; i0 += 2 * SW) {
                sv_f ng0 = log_fast(SV_SUB(zero, log_fast(draw_u(SV_LOAD_I(h + i0), k, m1, m2))));
                sv_f ng1 = log_fast(SV_SUB(zero, log_fast(draw_u(SV_LOAD_I(h + i0 + SW), k, m1, m2))));
                if (t) ng0 = SV_MUL(ng0, temp), ng1 = SV_MUL(ng1, temp);
                sv_f v0 = SV_SUB(SV_LOAD_F(s + i0), ng0), v1 = SV_SUB(SV_LOAD_F(s + i0 + SW), ng1);
                nan |= SV_HAS_NAN(v0) | SV_HAS_NAN(v1);
                vmax = SV_MAX(vmax, v0), vmax1 = SV_MAX(vmax1, v1);
                SV_STORE_F(buf + i0, v0), SV_STORE_F(buf + i0 + SW, v1);
            }
            vmax = SV_MAX(vmax, vmax1);  // (a NaN is caught by the flag, whatever max made of it)
        }
        for (long i = i0; i < padded; i += SW) {
            sv_f v = SV_LOAD_F(s + i);
            if (noise) {
                sv_f ng = exact ? SV_LOAD_F(buf + i)
                                : log_fast(SV_SUB(zero, log_fast(draw_u(SV_LOAD_I(h + i), k, m1, m2))));
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
        if (!cand) {
            if (m > out.best) {
                for (long j = 0; j < n; j++)
                    if (buf[j] == m) {
                        out.best = m, out.idx = c + j;
                        break;
                    }
            }
            continue;
        }
        if (m == -INFINITY) continue;  // nothing here can win (a row of -inf keeps column c0, as exactly)
        if (m == INFINITY) {            // no margin around an infinity: the exact pass decides
            cand->overflow = 1;
            return out;
        }
        if (m > out.best) {  // a new maximum: drop the candidates it leaves behind (they stay in order)
            out.best = m;
            float floor = m - (tmargin + (fabsf(m) + 1.0f) * (1.0f / 1048576.0f));
            int kept = 0;
            for (int i = 0; i < cand->n; i++)
                if (cand->val[i] >= floor) cand->col[kept] = cand->col[i], cand->val[kept++] = cand->val[i];
            cand->n = kept;
        }
        float floor = out.best - (tmargin + (fabsf(out.best) + 1.0f) * (1.0f / 1048576.0f));
        if (floor == -INFINITY) {  // a maximum within the margin of -FLT_MAX: the exact pass decides
            cand->overflow = 1;
            return out;
        }
        if (m < floor) continue;
        const sv_f vfloor = SV_SET_F(floor);
        for (long i = 0; i < padded; i += SW)
            for (unsigned bits = SV_GE_BITS(SV_LOAD_F(buf + i), vfloor); bits; bits &= bits - 1) {
                long j = i + __builtin_ctz(bits);
                if (j >= n) break;  // (the lanes past the row hold -inf, below any finite floor)
                if (cand->n == NCAND) {
                    cand->overflow = 1;
                    return out;
                }
                cand->col[cand->n] = c + j, cand->val[cand->n++] = buf[j];
            }
    }
    return out;
}

// The first maximum of scores - T * log(-log(u)) over columns [c0, c1), or of the scores (noise 0).
// The two logs, MKL's, are most of an exact pass; so where torch's log is MKL's, a first pass takes
// log_fast instead and keeps the columns whose value comes within a margin of its maximum, and only
// those get the exact values: the answer is the exact pass's. log(-log(u)) is within ~2e-5 of
// torch's (measured over every u by the tests), so a value is within T times that plus the two
// roundings after it (each <= an ulp of its result) of its exact one; the margin, 1e-3 * max(T, 1)
// + (|max| + 1) * 2^-20, is > 20x that. The exact maximum's column has an approximate value >= max~
// - 2 * bound, so it is a candidate, and so is every column tied with it. Rows whose candidates
// overflow (values tied in bulk, an infinite maximum) take the exact pass. 32 rows of 49152 columns
// on 2 cores: ~2.1 -> ~0.66 ms, one row ~0.09 -> ~0.04 ms.
static argmax_part noisy_argmax_range(const float *scores, const int32_t *hashes, int noise, int32_t key16,
                                      const float *t, int32_t mix1, int32_t mix2, long c0, long c1, float *dump) {
    int fast = LANTERN_MKL_LOG && noise && !dump && (!t || (*t == *t && fabsf(*t) <= 1e30f));
    if (!fast) return argmax_pass(scores, hashes, noise, key16, t, mix1, mix2, c0, c1, dump, 1, NULL);
    candidates cand;
    cand.overflow = 0, cand.n = 0;
    argmax_part approx = argmax_pass(scores, hashes, noise, key16, t, mix1, mix2, c0, c1, NULL, 0, &cand);
    if (cand.overflow) return argmax_pass(scores, hashes, noise, key16, t, mix1, mix2, c0, c1, NULL, 1, NULL);
    if (approx.best != approx.best || cand.n == 0) return approx;  // a NaN (a score's: the same column), or all -inf
    // The candidates' exact values: the same integer hash, torch's log, the same two roundings.
    float u[NCAND], v[NCAND];
    for (int i = 0; i < cand.n; i++) {
        uint32_t a = ((uint32_t)hashes[cand.col[i]] ^ (uint32_t)key16) * (uint32_t)mix1;
        a = (a ^ (a >> 15)) * (uint32_t)mix2;
        a >>= 9;
        a ^= a >> 15;
        u[i] = 1.0f / 16777216.0f + (float)(int32_t)a * (1.0f / 8388608.0f);
    }
    log_inplace_n(u, cand.n);
    for (int i = 0; i < cand.n; i++) u[i] = 0.0f - u[i];
    log_inplace_n(u, cand.n);
    argmax_part out = {-INFINITY, cand.col[0]};
    for (int i = 0; i < cand.n; i++) {
        float ng = t ? u[i] * *t : u[i];
        v[i] = scores[cand.col[i]] - ng;
        if (i == 0 || v[i] > out.best) out.best = v[i], out.idx = cand.col[i];
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

// out[i] = log_fast(-log_fast(u[i])) for n values (n a multiple of SW): the fast pass's noise, for
// the test of its bound against torch's.
void lantern_fast_neg_gumbel(const float *u, float *out, long n) {
    const sv_f zero = SV_SET_F(0.0f);
    for (long i = 0; i < n; i += SW) SV_STORE_F(out + i, log_fast(SV_SUB(zero, log_fast(SV_LOAD_F(u + i)))));
}

// out[i] = log(-log(u[i])) through log_inplace_n in batches of 1, 2, ..., NCAND, 1, ... values (the
// candidates' exact values): what the tests compare with torch's over every u.
void lantern_small_batch_neg_gumbel(const float *u, float *out, long n) {
    for (long i = 0, len = 1; i < n; i += len, len = len % NCAND + 1) {
        long m = n - i < len ? n - i : len;
        memcpy(out + i, u + i, m * sizeof(float));
        log_inplace_n(out + i, m);
        for (long j = 0; j < m; j++) out[i + j] = 0.0f - out[i + j];
        log_inplace_n(out + i, m);
    }
}

#pragma GCC pop_options

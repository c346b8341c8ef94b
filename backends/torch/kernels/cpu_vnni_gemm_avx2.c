// cpu_vnni_gemm.c's kernels for x86 CPUs without AVX-512 (most desktop CPUs: Intel Core 12th-14th
// generation, AMD Zen 2 and 3): the same weight layouts, the same quantization of x and the same
// arithmetic in the same order, on 256-bit vectors, so the results equal the AVX-512 build's bit for
// bit (the tests check it). A tile is one block of 16 outputs by up to MR rows; each 64-byte vector of
// the layout is read as two halves of 8 outputs, one after the other within each group of 32 columns,
// so every cache line is used whole while it is in L1 (a tile per half read each line twice).
//
// Integer dot products: with AVX-VNNI (LANTERN_AVXVNNI: Alder Lake and later, Zen 5) vpdpbusd on 256
// bits, as the AVX-512 build; otherwise vpmaddubsw (u8 x s8 pairs into s16, saturating), summed in s16
// over a group of 32 columns, then vpmaddwd into s32. A pair of products of codes below 16 is at most
// 2 x 15 x 128 = 3840 and a group adds 8 of them (30720 < 2^15): nothing saturates. So 8-bit codes (and
// the codebook's looked-up codes) are split into their two nibbles, q = 16 * hi + lo, each summed apart.
//
// Compiled into the torch op library in place of cpu_vnni_gemm.c (cpu_ops.cpp, LANTERN_AVX2).
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define XG 32  // x's quantization group
#ifdef LANTERN_AVXVNNI
#define MR 3  // rows per tile: 6 int32 and 6 float accumulators fit the 16 registers
#else
#define MR 2  // the emulated dot product needs temporaries: two rows keep it out of memory
#endif

static inline __m256 load8(const void *x, long i, int x_bf16) {
    if (!x_bf16) return _mm256_loadu_ps((const float *)x + i);
    __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)x + i));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

static inline float hmax8(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
    return _mm_cvtss_f32(m);
}

static inline int hsum8i(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}

// int32 lanes (each within -128..127) -> their 8 low bytes, in order
static inline int64_t bytes8(__m256i v) {
    __m256i w = _mm256_packs_epi32(v, v);          // 16-bit: [0..3 0..3 | 4..7 4..7]
    w = _mm256_packs_epi16(w, w);                   // 8-bit
    __m128i lo = _mm256_castsi256_si128(w), hi = _mm256_extracti128_si256(w, 1);
    return (int64_t)(uint32_t)_mm_cvtsi128_si32(lo) | ((int64_t)_mm_cvtsi128_si32(hi) << 32);
}

// The AVX-512 build's quantize_rows on 8-wide vectors (documented there): x ~ d * (x1 + x2 / 256).
static void quantize_rows(const void *x, int x_bf16, long m0, long m1, long K, float out_scale, int8_t *xq, float *dx,
                          float *sx) {
    long groups = K / XG;
    const __m256i lo = _mm256_set1_epi32(-128), hi = _mm256_set1_epi32(127);
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (long m = m0; m < m1; m++)
        for (long gq = 0; gq < groups; gq++) {
            long at = m * K + gq * XG;
            __m256 v[4], amax = _mm256_setzero_ps();
            for (int j = 0; j < 4; j++) {
                v[j] = load8(x, at + 8 * j, x_bf16);
                amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v[j]));
            }
            float d = hmax8(amax) / 127.0f, inv = d > 0 ? 1.0f / d : 0.0f;
            __m256 vinv = _mm256_set1_ps(inv), vd = _mm256_set1_ps(d), v256 = _mm256_set1_ps(256.0f);
            int64_t b1[4], b2[4];
            __m256i isum = _mm256_setzero_si256(), rsum = _mm256_setzero_si256();
            for (int j = 0; j < 4; j++) {
                __m256 q = _mm256_round_ps(_mm256_mul_ps(v[j], vinv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
                __m256i r = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_mul_ps(_mm256_fnmadd_ps(q, vd, v[j]), vinv), v256));
                r = _mm256_min_epi32(_mm256_max_epi32(r, lo), hi);
                __m256i iq = _mm256_cvtps_epi32(q);
                isum = _mm256_add_epi32(isum, iq);
                rsum = _mm256_add_epi32(rsum, r);
                b1[j] = bytes8(iq), b2[j] = bytes8(r);
            }
            // per 4 columns: their x1 bytes, then their x2 bytes (the AVX-512 build's layout)
            int32_t *o = (int32_t *)(xq + 2 * at);
            for (int j = 0; j < 4; j++) {
                o[4 * j + 0] = (int32_t)b1[j], o[4 * j + 1] = (int32_t)b2[j];
                o[4 * j + 2] = (int32_t)(b1[j] >> 32), o[4 * j + 3] = (int32_t)(b2[j] >> 32);
            }
            long sum = 256L * hsum8i(isum) + hsum8i(rsum);
            dx[m * groups + gq] = d / 256.0f * out_scale;
            sx[m * groups + gq] = d / 256.0f * out_scale * (float)sum;
        }
}

static inline __m128i to_bf16_8(__m256 v) {  // round to nearest even (finite values)
    __m256i u = _mm256_castps_si256(v);
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    u = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7FFF), lsb)), 16);
    __m256i p = _mm256_packus_epi32(u, u);  // [0..3 0..3 | 4..7 4..7] as u16
    return _mm_unpacklo_epi64(_mm256_castsi256_si128(p), _mm256_extracti128_si256(p, 1));
}

static inline void store8(void *y, long i, __m256 v, int n, int y_bf16) {
    if (y_bf16) {
        __m128i h = to_bf16_8(v);
        if (n == 8)
            _mm_storeu_si128((__m128i *)((uint16_t *)y + i), h);
        else {
            uint16_t tmp[8];
            _mm_storeu_si128((__m128i *)tmp, h);
            memcpy((uint16_t *)y + i, tmp, (size_t)n * 2);
        }
    } else if (n == 8) {
        _mm256_storeu_ps((float *)y + i, v);
    } else {
        float tmp[8];
        _mm256_storeu_ps(tmp, v);
        memcpy((float *)y + i, tmp, (size_t)n * 4);
    }
}

// A group's integer sums per 32-bit lane (output): acc4 adds w . x for codes below 16, acc8 for any
// u8 codes (4 u8 x s8 byte products a lane); acc_sum gives the int32 sums.
#ifdef LANTERN_AVXVNNI
typedef struct {
    __m256i s;
} acc_t;
static inline acc_t acc_zero(void) { return (acc_t){_mm256_setzero_si256()}; }
static inline void acc4(acc_t *a, __m256i w, __m256i x) { a->s = _mm256_dpbusd_avx_epi32(a->s, w, x); }
static inline void acc8(acc_t *a, __m256i w, __m256i x) { a->s = _mm256_dpbusd_avx_epi32(a->s, w, x); }
static inline __m256i acc_sum(acc_t a, int wide) { return (void)wide, a.s; }
#else
typedef struct {
    __m256i lo, hi;  // s16 pair sums of the low nibbles' products and of the high nibbles'
} acc_t;
static inline acc_t acc_zero(void) { return (acc_t){_mm256_setzero_si256(), _mm256_setzero_si256()}; }
static inline void acc4(acc_t *a, __m256i w, __m256i x) { a->lo = _mm256_add_epi16(a->lo, _mm256_maddubs_epi16(w, x)); }
static inline void acc8(acc_t *a, __m256i w, __m256i x) {
    const __m256i low = _mm256_set1_epi8(0x0F);
    acc4(a, _mm256_and_si256(w, low), x);
    a->hi = _mm256_add_epi16(a->hi, _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(w, 4), low), x));
}
static inline __m256i acc_sum(acc_t a, int wide) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i s = _mm256_madd_epi16(a.lo, ones);
    return wide ? _mm256_add_epi32(s, _mm256_slli_epi32(_mm256_madd_epi16(a.hi, ones), 4)) : s;
}
#endif

typedef struct {
    const int8_t *xq;
    const float *dx, *sx;
    long K;
    const uint8_t *w;  // the tile's block
    const uint16_t *sz;  // the block's scales
    long g;
    const uint8_t *lut;
    const char *pf[2];  // cache lines of the next block's codes and scales, requested along the way
    long pf_lines[2], pf_per_group[2];
} tile_args;

// R rows x 16 outputs. NIB: 1 4-bit codes, 2 4-bit codebook indices, 0 8-bit codes (as cpu_vnni_gemm.c).
#define DEF_TILE(NIB, R)                                                                              \
    static void tile##NIB##_##R(const tile_args *a, void *y, long ldy, long n0, int n, int y_bf16) {  \
        const long K = a->K, groups = K / XG;                                                         \
        const __m256i low = _mm256_set1_epi8(0x0F);                                                   \
        const __m256i table =                                                                         \
            NIB == 2 ? _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)a->lut)) : low;   \
        __m256 facc[2][R];                                                                            \
        for (int h = 0; h < 2; h++)                                                                   \
            for (int i = 0; i < R; i++) facc[h][i] = _mm256_setzero_ps();                             \
        for (long gq = 0; gq < groups; gq++) {                                                        \
            for (int q = 0; q < 2; q++)                                                               \
                for (long l = gq * a->pf_per_group[q], e = l + a->pf_per_group[q]; l < e && l < a->pf_lines[q]; l++) \
                    _mm_prefetch(a->pf[q] + 64 * l, _MM_HINT_T2);                                     \
            const uint16_t *p = a->sz + (gq * XG / a->g) * 32;                                        \
            for (int h = 0; h < 2; h++) {                                                             \
                acc_t s1[R], s2[R];                                                                   \
                for (int i = 0; i < R; i++) s1[i] = s2[i] = acc_zero();                               \
                for (int kk = 0; kk < (NIB ? XG / 8 : XG / 4); kk++) {                                \
                    long kv = gq * (NIB ? XG / 8 : XG / 4) + kk;                                      \
                    __m256i v = _mm256_loadu_si256((const __m256i *)(a->w + kv * 64 + 32 * h));       \
                    if (NIB) {                                                                        \
                        __m256i lo = _mm256_and_si256(v, low);                                        \
                        __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);                  \
                        if (NIB == 2) lo = _mm256_shuffle_epi8(table, lo), hi = _mm256_shuffle_epi8(table, hi); \
                        for (int i = 0; i < R; i++) {                                                 \
                            const int32_t *xr = (const int32_t *)(a->xq + i * 2 * K + kv * 16);       \
                            if (NIB == 1) {                                                           \
                                acc4(&s1[i], lo, _mm256_set1_epi32(xr[0]));                           \
                                acc4(&s2[i], lo, _mm256_set1_epi32(xr[1]));                           \
                                acc4(&s1[i], hi, _mm256_set1_epi32(xr[2]));                           \
                                acc4(&s2[i], hi, _mm256_set1_epi32(xr[3]));                           \
                            } else {                                                                  \
                                acc8(&s1[i], lo, _mm256_set1_epi32(xr[0]));                           \
                                acc8(&s2[i], lo, _mm256_set1_epi32(xr[1]));                           \
                                acc8(&s1[i], hi, _mm256_set1_epi32(xr[2]));                           \
                                acc8(&s2[i], hi, _mm256_set1_epi32(xr[3]));                           \
                            }                                                                         \
                        }                                                                             \
                    } else {                                                                          \
                        for (int i = 0; i < R; i++) {                                                 \
                            const int32_t *xr = (const int32_t *)(a->xq + i * 2 * K + kv * 8);        \
                            acc8(&s1[i], v, _mm256_set1_epi32(xr[0]));                                \
                            acc8(&s2[i], v, _mm256_set1_epi32(xr[1]));                                \
                        }                                                                             \
                    }                                                                                 \
                }                                                                                     \
                __m256 s = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 8 * h)));            \
                __m256 b = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 16 + 8 * h)));       \
                for (int i = 0; i < R; i++) {                                                         \
                    __m256i sum = _mm256_add_epi32(_mm256_slli_epi32(acc_sum(s1[i], NIB != 1), 8),    \
                                                   acc_sum(s2[i], NIB != 1));                         \
                    __m256 prod = _mm256_mul_ps(_mm256_cvtepi32_ps(sum), _mm256_set1_ps(a->dx[i * groups + gq])); \
                    facc[h][i] = _mm256_fmadd_ps(prod, s, facc[h][i]);                                \
                    facc[h][i] = _mm256_fmadd_ps(b, _mm256_set1_ps(a->sx[i * groups + gq]), facc[h][i]); \
                }                                                                                     \
            }                                                                                         \
        }                                                                                             \
        for (int h = 0; h < 2 && 8 * h < n; h++)                                                      \
            for (int i = 0; i < R; i++)                                                               \
                store8(y, i * ldy + n0 + 8 * h, facc[h][i], n - 8 * h < 8 ? n - 8 * h : 8, y_bf16);   \
    }
DEF_TILE(1, 1) DEF_TILE(1, 2) DEF_TILE(0, 1) DEF_TILE(0, 2) DEF_TILE(2, 1) DEF_TILE(2, 2)
#if MR > 2
DEF_TILE(1, 3) DEF_TILE(0, 3) DEF_TILE(2, 3)
#endif

typedef void (*tile_t)(const tile_args *, void *, long, long, int, int);
#if MR > 2
static const tile_t TILES[3][MR + 1] = {
    {0, tile0_1, tile0_2, tile0_3}, {0, tile1_1, tile1_2, tile1_3}, {0, tile2_1, tile2_2, tile2_3}};
#else
static const tile_t TILES[3][MR + 1] = {{0, tile0_1, tile0_2}, {0, tile1_1, tile1_2}, {0, tile2_1, tile2_2}};
#endif

// The AVX-512 build's entry point and contract (cpu_vnni_gemm.c).
int lantern_vnni_mm(const void *x, long M, long K, const uint8_t *w, const uint16_t *sz, long g,
                    const float *out_scale_p, long N, void *y, int io_bf16, int bits, const uint8_t *lut, int threads) {
    const float out_scale = *out_scale_p;
    long groups = K / XG, blocks = (N + 15) / 16;
    int8_t *xq = (int8_t *)malloc(2 * M * K);
    float *dx = (float *)malloc(M * groups * sizeof(float)), *sx = (float *)malloc(M * groups * sizeof(float));
    if (!xq || !dx || !sx) {
        free(xq), free(dx), free(sx);
        return -1;
    }
    const tile_t *table = TILES[bits == 4 ? (lut ? 2 : 1) : 0];
    long wblock = bits == 4 ? 16 * K / 2 : 16 * K, sblock = (K / g) * 32;
    if (M * K < 16384) quantize_rows(x, io_bf16, 0, M, K, out_scale, xq, dx, sx);
#pragma omp parallel num_threads(threads)
    {
        if (M * K >= 16384) {
#pragma omp for schedule(static)
            for (long m = 0; m < M; m++) quantize_rows(x, io_bf16, m, m + 1, K, out_scale, xq, dx, sx);
        }
        // As in cpu_vnni_gemm.c: a contiguous run of blocks per thread, each requesting the next one's lines
        // (this build on the same EPYC, one-row SmolLM2 matmuls: ~8.3 -> ~7.6 ms per token; 8 and 32 rows: the same).
        long nt = omp_get_num_threads(), tid = omp_get_thread_num();
        long b0 = blocks * tid / nt, b1 = blocks * (tid + 1) / nt;
        for (long b = b0; b < b1; b++) {
            long n0 = 16 * b;
            int n = N - n0 < 16 ? (int)(N - n0) : 16;
            tile_args a = {xq, dx, sx, K, w + b * wblock, sz + b * sblock, g, lut, {0, 0}, {0, 0}, {0, 0}};
            if (b + 1 < b1) {
                const char *from[2] = {(const char *)(w + (b + 1) * wblock), (const char *)(sz + (b + 1) * sblock)};
                long bytes[2] = {wblock, 2 * sblock};
                for (int q = 0; q < 2; q++) {
                    long first = (long)((uintptr_t)from[q] & 63), lines = (first + bytes[q] + 63) / 64;
                    a.pf[q] = from[q] - first, a.pf_lines[q] = lines, a.pf_per_group[q] = groups ? (lines + groups - 1) / groups : 0;
                }
            }
            for (long m0 = 0; m0 < M; m0 += MR) {
                long rows = M - m0 < MR ? M - m0 : MR;
                a.xq = xq + 2 * m0 * K, a.dx = dx + m0 * groups, a.sx = sx + m0 * groups;
                char *yr = (char *)y + m0 * N * (io_bf16 ? 2 : 4);
                table[rows](&a, yr, N, n0, n, io_bf16);
                a.pf_lines[0] = a.pf_lines[1] = 0;  // requested once, with the block's first rows
            }
        }
    }
    free(xq), free(dx), free(sx);
    return 0;
}

// The AVX-512 build's prefill decoder (cpu_vnni_gemm.c), 8 outputs at a time: the codebook's 16
// codes are looked up as two 8-entry permutes.
void lantern_vnni_decode(const uint8_t *w, const uint16_t *sz, long K, long g, int bits, const uint8_t *lut,
                         float out_scale, long b0, long nb, void *out, long ld, int out_bf16, int threads) {
    const long per_vector = bits == 4 ? 8 : 4, vectors = K / per_vector, wblock = 16 * K * bits / 8,
               sblock = (K / g) * 32;
    const __m256 os = _mm256_set1_ps(out_scale);
    const __m256i mask = _mm256_set1_epi32(bits == 4 ? 15 : 255), seven = _mm256_set1_epi32(7);
    __m256i lut_lo = mask, lut_hi = mask;
    if (lut) {
        lut_lo = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)lut));
        lut_hi = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(lut + 8)));
    }
#pragma omp parallel for num_threads(threads) schedule(static)
    for (long hi = 0; hi < 2 * nb; hi++) {
        long bi = hi / 2, half = hi % 2;
        const uint8_t *wb = w + (b0 + bi) * wblock + 32 * half;
        const uint16_t *sb = sz + (b0 + bi) * sblock + 8 * half;
        __m256 s = _mm256_setzero_ps(), b = s;
        long group = -1;
        for (long kv = 0; kv < vectors; kv++) {
            long col0 = kv * per_vector;
            if (col0 / g != group) {
                group = col0 / g;
                const uint16_t *p = sb + group * 32;
                s = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)), os);
                b = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 16))), os);
            }
            __m256i v = _mm256_loadu_si256((const __m256i *)(wb + kv * 64));
            for (int c = 0; c < per_vector; c++) {
                int shift = bits == 4 ? 8 * (c & 3) + 4 * (c >> 2) : 8 * c;
                __m256i q = _mm256_and_si256(_mm256_srl_epi32(v, _mm_cvtsi32_si128(shift)), mask);
                if (lut) {
                    __m256i low8 = _mm256_permutevar8x32_epi32(lut_lo, q);
                    __m256i high8 = _mm256_permutevar8x32_epi32(lut_hi, q);  // index & 7
                    q = _mm256_blendv_epi8(low8, high8, _mm256_cmpgt_epi32(q, seven));
                }
                __m256 val = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q), s, b);
                long at = (col0 + c) * ld + bi * 16 + 8 * half;
                if (out_bf16)
                    _mm_storeu_si128((__m128i *)((uint16_t *)out + at), to_bf16_8(val));
                else
                    _mm256_storeu_ps((float *)out + at, val);
            }
        }
    }
}

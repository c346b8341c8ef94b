// Weight-only quantized GEMMs for CPU decode steps on x86 AVX512-VNNI: y[M, N] = x[M, K] @ W^T.
//
// W is group-affine: w = (s * q + b) * out_scale for each group of g columns (g a multiple of 32),
// with unsigned codes q (4-bit: 0..15, 8-bit: 0..255), float16 s and b, and out_scale a power of two
// that brings the weight's scales into float16's range (exact: it is folded into x's scales). x is
// quantized per row and per 32 columns in two int8 levels (quantize_rows), so that the products are
// integer dot products (vpdpbusd: 64 u8 x s8 multiply-adds per instruction, exact int32 sums), and
// each 32 columns add, with isum = 256 * sum(x1 q) + sum(x2 q) and dx = d / 256,
//     y += (isum * dx) * s + b * (dx * sum(256 x1 + x2))        (float32, two fused multiply-adds)
// The quantized sum of x scales the b term: its error then follows w = s*q + b, not s*q (smaller).
//
// Layouts, in blocks of 16 outputs (one vector of int32 lanes; N padded to a multiple of 16):
//   4-bit codes  [N/16][K/8][16][4] bytes: byte t of lane i holds q[i][8k + t] in its low nibble and
//                q[i][8k + 4 + t] in its high one (a 64-byte load is 16 outputs x 8 columns)
//   codebook     the 4-bit layout holding indices into a 16-byte table of 8-bit codes (lut): weights
//                whose 8-bit codes take at most 16 values (GGUF's IQ4 and other codebook types) at
//                4 bits each; each index becomes its code in registers (vpshufb), which then
//                multiplies as an 8-bit code does (same scales and biases)
//   8-bit codes  [N/16][K/4][16][4] bytes: byte t of lane i is q[i][4k + t]
//   s, b         [N/16][K/g][2][16] float16: the block's 16 scales, then its 16 biases
//
// Every row is computed alone (its own quantization, its own sums in a fixed order), and the
// threads split the outputs, never K: a row's result does not depend on how many rows share its
// step or which kernel shape served it (the tests check it bit for bit). x and y are float32 or
// bfloat16 (io_bf16: x widened exactly, y rounded to nearest even once).
// Compiled as C++ inside the torch op library (cpu_ops.cpp), so it is written in the common subset.
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

// acc += w (u8) . the 4 bytes at p (s8) broadcast, the broadcast inside the instruction ({1to16})
// where `inside`: written as _mm512_set1_epi32, the compiler hoists the broadcasts out of the
// tile's column loop into registers and spills accumulators for them. Only the 4-row tiles of
// 4-bit codes gain (32-row SmolLM2 matmuls ~3-5%); fewer rows leave registers to spare, and the
// 8-bit tiles (no unpacking) measured ~2% slower with it.
#define DPBUSD_BCST(inside, acc, w, p)                                                                \
    do {                                                                                              \
        if (inside)                                                                                   \
            __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*(const int32_t *)(p))); \
        else                                                                                          \
            acc = _mm512_dpbusd_epi32(acc, w, _mm512_set1_epi32(*(const int32_t *)(p)));             \
    } while (0)
#define XG 32  // x's quantization group
#define MR 4   // rows of x per tile
#define NC 2   // 16-output vectors per tile (4 x 2 x 2 int32 accumulators, 8 float ones)

static inline __m512 load16(const void *x, long i, int x_bf16) {
    if (!x_bf16) return _mm512_loadu_ps((const float *)x + i);
    __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)x + i));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// Rows m0 .. m1 of x quantized in two int8 levels: x ~ d * (x1 + x2 / 256), d = max|x| / 127 per row
// and group of 32, x1 = round(x / d), x2 = round(256 * (x - d * x1) / d) (saturated: |.| <= 128).
// One level (llama.cpp's q8) leaves ~1% error per product on real activations with outlier channels,
// enough to change a small model's greedy answers; two leave ~1/256 of that. xq holds, per 4
// columns, 4 bytes of x1 then 4 of x2; dx = d / 256 and sx = dx * sum(256 * x1 + x2), times out_scale.
static void quantize_rows(const void *x, int x_bf16, long m0, long m1, long K, float out_scale, int8_t *xq, float *dx,
                          float *sx) {
    long groups = K / XG;
    const __m512i lo = _mm512_set1_epi32(-128), hi = _mm512_set1_epi32(127);
    for (long m = m0; m < m1; m++)
        for (long gq = 0; gq < groups; gq++) {
            long at = m * K + gq * XG;
            __m512 a = load16(x, at, x_bf16), b = load16(x, at + 16, x_bf16);
            float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));
            float d = amax / 127.0f, inv = d > 0 ? 1.0f / d : 0.0f;
            __m512 vinv = _mm512_set1_ps(inv), vd = _mm512_set1_ps(d), v256 = _mm512_set1_ps(256.0f);
            __m512 qa = _mm512_roundscale_ps(_mm512_mul_ps(a, vinv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            __m512 qb = _mm512_roundscale_ps(_mm512_mul_ps(b, vinv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            // the remainder x - d * x1 (one rounding), in units of d / 256
            __m512i ra = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_mul_ps(_mm512_fnmadd_ps(qa, vd, a), vinv), v256));
            __m512i rb = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_mul_ps(_mm512_fnmadd_ps(qb, vd, b), vinv), v256));
            ra = _mm512_min_epi32(_mm512_max_epi32(ra, lo), hi);
            rb = _mm512_min_epi32(_mm512_max_epi32(rb, lo), hi);
            __m512i ia = _mm512_cvtps_epi32(qa), ib = _mm512_cvtps_epi32(qb);
            __m128i a1 = _mm512_cvtepi32_epi8(ia), b1 = _mm512_cvtepi32_epi8(ib);
            __m128i a2 = _mm512_cvtepi32_epi8(ra), b2 = _mm512_cvtepi32_epi8(rb);
            __m128i *o = (__m128i *)(xq + 2 * at);  // per 4 columns: their x1 bytes, then their x2 bytes
            _mm_storeu_si128(o, _mm_unpacklo_epi32(a1, a2));
            _mm_storeu_si128(o + 1, _mm_unpackhi_epi32(a1, a2));
            _mm_storeu_si128(o + 2, _mm_unpacklo_epi32(b1, b2));
            _mm_storeu_si128(o + 3, _mm_unpackhi_epi32(b1, b2));
            long sum = 256L * _mm512_reduce_add_epi32(_mm512_add_epi32(ia, ib)) +
                       _mm512_reduce_add_epi32(_mm512_add_epi32(ra, rb));
            dx[m * groups + gq] = d / 256.0f * out_scale;
            sx[m * groups + gq] = d / 256.0f * out_scale * (float)sum;
        }
}

// Round to the nearest bf16, ties to even (finite values): the top 16 bits of the result.
static inline __m256i to_bf16(__m512 v) {
    __m512i u = _mm512_castps_si512(v);
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    u = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7FFF), lsb));
    return _mm512_cvtepi32_epi16(_mm512_srli_epi32(u, 16));
}

static inline void store16(void *y, long i, __m512 v, __mmask16 mask, int y_bf16) {
    if (y_bf16)
        _mm256_mask_storeu_epi16((uint16_t *)y + i, mask, to_bf16(v));
    else
        _mm512_mask_storeu_ps((float *)y + i, mask, v);
}

typedef struct {
    const int8_t *xq;
    const float *dx, *sx;
    long K;
    const uint8_t *w;  // the tile's first block
    const uint16_t *sz;
    long g;
    const uint8_t *lut;  // the codebook's 16 codes (NIB 2 only)
    const char *pf[2];  // cache lines of the next tile's codes and scales, requested along the way
    long pf_lines[2], pf_per_group[2];
} tile_args;

// R rows x C vectors of outputs. NIB: 1 4-bit codes (two columns per byte), 2 4-bit codebook
// indices (the same layout, each looked up in the 16-byte table), 0 8-bit codes. Each
// group of 32 columns sums x1 and x2 products apart (exact int32), then joins them as 256 * s1 + s2.
#define DEF_TILE(NIB, R, C)                                                                           \
    static void tile##NIB##_##R##x##C(const tile_args *a, void *y, long ldy, long n0, long N, int y_bf16) { \
        const long K = a->K, groups = K / XG, wstride = NIB ? 8 * K : 16 * K, sstride = (K / a->g) * 32; \
        const __m512i low = _mm512_set1_epi8(0x0F);                                                   \
        const __m512i table = NIB == 2 ? _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)a->lut)) : low; \
        __m512 facc[R][C];                                                                            \
        for (int i = 0; i < R; i++)                                                                   \
            for (int j = 0; j < C; j++) facc[i][j] = _mm512_setzero_ps();                             \
        for (long gq = 0; gq < groups; gq++) {                                                        \
            for (int p = 0; p < 2; p++)                                                               \
                for (long l = gq * a->pf_per_group[p], e = l + a->pf_per_group[p]; l < e && l < a->pf_lines[p]; l++) \
                    _mm_prefetch(a->pf[p] + 64 * l, _MM_HINT_T2);                                     \
            __m512i s1[R][C], s2[R][C];                                                               \
            for (int i = 0; i < R; i++)                                                               \
                for (int j = 0; j < C; j++) s1[i][j] = s2[i][j] = _mm512_setzero_si512();             \
            for (int kk = 0; kk < (NIB ? XG / 8 : XG / 4); kk++) {                                    \
                long kv = gq * (NIB ? XG / 8 : XG / 4) + kk; /* the 64-byte vector along K */         \
                for (int j = 0; j < C; j++) {                                                         \
                    __m512i v = _mm512_loadu_si512(a->w + j * wstride + kv * 64);                     \
                    __m512i lo = NIB ? _mm512_and_si512(v, low) : v;                                  \
                    if (NIB == 2) lo = _mm512_shuffle_epi8(table, lo);                                \
                    for (int i = 0; i < R; i++) {                                                     \
                        const int32_t *xr = (const int32_t *)(a->xq + i * 2 * K + kv * (NIB ? 16 : 8)); \
                        DPBUSD_BCST(R == MR && NIB, s1[i][j], lo, xr + 0);                             \
                        DPBUSD_BCST(R == MR && NIB, s2[i][j], lo, xr + 1);                             \
                    }                                                                                 \
                    if (NIB) {                                                                        \
                        __m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);                  \
                        if (NIB == 2) hi = _mm512_shuffle_epi8(table, hi);                            \
                        for (int i = 0; i < R; i++) {                                                 \
                            const int32_t *xr = (const int32_t *)(a->xq + i * 2 * K + kv * 16);       \
                            DPBUSD_BCST(R == MR && NIB, s1[i][j], hi, xr + 2);                         \
                            DPBUSD_BCST(R == MR && NIB, s2[i][j], hi, xr + 3);                         \
                        }                                                                             \
                    }                                                                                 \
                }                                                                                     \
            }                                                                                         \
            long gw = gq * XG / a->g;                                                                 \
            for (int j = 0; j < C; j++) {                                                             \
                const uint16_t *p = a->sz + j * sstride + gw * 32;                                    \
                __m512 s = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));                   \
                __m512 b = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p + 16)));            \
                for (int i = 0; i < R; i++) {                                                         \
                    __m512i sum = _mm512_add_epi32(_mm512_slli_epi32(s1[i][j], 8), s2[i][j]);          \
                    __m512 prod = _mm512_mul_ps(_mm512_cvtepi32_ps(sum), _mm512_set1_ps(a->dx[i * groups + gq])); \
                    facc[i][j] = _mm512_fmadd_ps(prod, s, facc[i][j]);                                \
                    facc[i][j] = _mm512_fmadd_ps(b, _mm512_set1_ps(a->sx[i * groups + gq]), facc[i][j]); \
                }                                                                                     \
            }                                                                                         \
        }                                                                                             \
        for (int j = 0; j < C; j++) {                                                                 \
            long n = n0 + 16 * j, left = N - n;                                                       \
            __mmask16 mask = left >= 16 ? 0xFFFF : (__mmask16)((1u << left) - 1);                    \
            for (int i = 0; i < R; i++) store16(y, i * ldy + n, facc[i][j], mask, y_bf16);           \
        }                                                                                             \
    }
#define DEF_TILES(NIB, R) DEF_TILE(NIB, R, 1) DEF_TILE(NIB, R, 2)
DEF_TILES(1, 1) DEF_TILES(1, 2) DEF_TILES(1, 3) DEF_TILES(1, 4)
DEF_TILES(0, 1) DEF_TILES(0, 2) DEF_TILES(0, 3) DEF_TILES(0, 4)
DEF_TILES(2, 1) DEF_TILES(2, 2) DEF_TILES(2, 3) DEF_TILES(2, 4)

typedef void (*tile_t)(const tile_args *, void *, long, long, long, int);
static const tile_t TILES4[MR + 1][NC + 1] = {
    {0}, {0, tile1_1x1, tile1_1x2}, {0, tile1_2x1, tile1_2x2}, {0, tile1_3x1, tile1_3x2}, {0, tile1_4x1, tile1_4x2}};
static const tile_t TILES8[MR + 1][NC + 1] = {
    {0}, {0, tile0_1x1, tile0_1x2}, {0, tile0_2x1, tile0_2x2}, {0, tile0_3x1, tile0_3x2}, {0, tile0_4x1, tile0_4x2}};
static const tile_t TILESLUT[MR + 1][NC + 1] = {
    {0}, {0, tile2_1x1, tile2_1x2}, {0, tile2_2x1, tile2_2x2}, {0, tile2_3x1, tile2_3x2}, {0, tile2_4x1, tile2_4x2}};

// The tile requests these bytes of codes and of scales (the lines that hold them), a few per group of K.
static void prefetch_plan(tile_args *a, const uint8_t *w, long w_bytes, const uint16_t *s, long s_bytes, long groups) {
    const char *from[2] = {(const char *)w, (const char *)s};
    long bytes[2] = {w_bytes, s_bytes};
    for (int p = 0; p < 2; p++) {
        if (bytes[p] <= 0 || groups <= 0) continue;
        long first = (long)((uintptr_t)from[p] & 63), lines = (first + bytes[p] + 63) / 64;
        a->pf[p] = from[p] - first, a->pf_lines[p] = lines, a->pf_per_group[p] = (lines + groups - 1) / groups;
    }
}

// bits 4 or 8 (lut: 4-bit codebook indices, else NULL); K a multiple of 32 and of g, g a multiple of 32.
// Returns 0, or -1 when out of memory.
int lantern_vnni_mm(const void *x, long M, long K, const uint8_t *w, const uint16_t *sz, long g,
                    const float *out_scale_p, long N, void *y, int io_bf16, int bits, const uint8_t *lut, int threads) {
    const float out_scale = *out_scale_p;
    long groups = K / XG, blocks = (N + 15) / 16, tiles = (blocks + NC - 1) / NC;
    int8_t *xq = (int8_t *)malloc(2 * M * K);
    float *dx = (float *)malloc(M * groups * sizeof(float)), *sx = (float *)malloc(M * groups * sizeof(float));
    if (!xq || !dx || !sx) {
        free(xq), free(dx), free(sx);
        return -1;
    }
    const tile_t(*table)[NC + 1] = bits == 4 ? (lut ? TILESLUT : TILES4) : TILES8;
    long wblock = bits == 4 ? 16 * K / 2 : 16 * K, sblock = (K / g) * 32;
    if (M * K < 16384) quantize_rows(x, io_bf16, 0, M, K, out_scale, xq, dx, sx);  // a few rows: not worth a barrier
#pragma omp parallel num_threads(threads)
    {
        if (M * K >= 16384) {
#pragma omp for schedule(static)
            for (long m = 0; m < M; m++) quantize_rows(x, io_bf16, m, m + 1, K, out_scale, xq, dx, sx);
        }
        // Each thread takes a contiguous run of tiles and requests the lines of its next tile while it
        // computes one: a core alone keeps too few misses in flight to stream at the memory's rate.
        // One-row SmolLM2 Q4_1 matmuls on 2 EPYC cores: ~6.6 -> ~5.3 ms per token, 4 rows ~10.0 ->
        // ~8.1 ms; 32 rows (compute-bound) within noise. The start of the next weight was tried
        // too (requested during the last tile): no gain.
        long nt = omp_get_num_threads(), tid = omp_get_thread_num();
        long t0 = tiles * tid / nt, t1 = tiles * (tid + 1) / nt;
        for (long t = t0; t < t1; t++) {
            long b0 = t * NC, cols = blocks - b0 < NC ? blocks - b0 : NC;
            tile_args a = {xq, dx, sx, K, w + b0 * wblock, sz + b0 * sblock, g, lut, {0, 0}, {0, 0}, {0, 0}};
            if (t + 1 < t1) {
                long bn = b0 + NC, nb = blocks - bn < NC ? blocks - bn : NC;
                prefetch_plan(&a, w + bn * wblock, nb * wblock, sz + bn * sblock, nb * sblock * 2, groups);
            }
            for (long m0 = 0; m0 < M; m0 += MR) {
                long rows = M - m0 < MR ? M - m0 : MR;
                a.xq = xq + 2 * m0 * K, a.dx = dx + m0 * groups, a.sx = sx + m0 * groups;
                char *yr = (char *)y + m0 * N * (io_bf16 ? 2 : 4);
                table[rows][cols](&a, yr, N, b0 * 16, N, io_bf16);
                a.pf_lines[0] = a.pf_lines[1] = 0;  // requested once, with the tile's first rows
            }
        }
    }
    free(xq), free(dx), free(sx);
    return 0;
}

// Blocks b0 .. b0 + nb of a packed weight decoded as W^T for the dense prefill GEMM (which reads W.T
// in place): out[k * ld + 16 * (b - b0) + i] = w of output row 16 * b + i at column k, computed as
// fma(q, s, b) in float32 with out_scale folded into s and b (exact: a power of two), stored as
// float32 or rounded once to bfloat16. One pass: each 64-byte vector of codes becomes 8 (4-bit) or 4
// (8-bit) columns of 16 outputs; codebook indices (lut) are looked up first. The threads split the blocks.
void lantern_vnni_decode(const uint8_t *w, const uint16_t *sz, long K, long g, int bits, const uint8_t *lut,
                         float out_scale, long b0, long nb, void *out, long ld, int out_bf16, int threads) {
    const long per_vector = bits == 4 ? 8 : 4, vectors = K / per_vector, wblock = 16 * K * bits / 8,
               sblock = (K / g) * 32;
    const __m512 os = _mm512_set1_ps(out_scale);
    const __m512i mask = _mm512_set1_epi32(bits == 4 ? 15 : 255);
    const __m512i codebook = lut ? _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)lut)) : mask;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (long bi = 0; bi < nb; bi++) {
        const uint8_t *wb = w + (b0 + bi) * wblock;
        const uint16_t *sb = sz + (b0 + bi) * sblock;
        __m512 s = _mm512_setzero_ps(), b = s;
        long group = -1;
        for (long kv = 0; kv < vectors; kv++) {
            long col0 = kv * per_vector;
            if (col0 / g != group) {
                group = col0 / g;
                const uint16_t *p = sb + group * 32;
                s = _mm512_mul_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)), os);
                b = _mm512_mul_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p + 16))), os);
            }
            __m512i v = _mm512_loadu_si512(wb + kv * 64);
            for (int c = 0; c < per_vector; c++) {
                // 4-bit: column c < 4 is byte c's low nibble, c >= 4 byte c - 4's high one; 8-bit: byte c
                unsigned shift = bits == 4 ? 8 * (c & 3) + 4 * (c >> 2) : 8 * c;
                __m512i q = _mm512_and_si512(_mm512_srli_epi32(v, shift), mask);
                if (lut) q = _mm512_permutexvar_epi32(q, codebook);
                __m512 val = _mm512_fmadd_ps(_mm512_cvtepi32_ps(q), s, b);
                long at = (col0 + c) * ld + bi * 16;
                if (out_bf16)
                    _mm256_storeu_si256((__m256i *)((uint16_t *)out + at), to_bf16(val));
                else
                    _mm512_storeu_ps((float *)out + at, val);
            }
        }
    }
}

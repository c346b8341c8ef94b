// Weight-only quantized GEMMs for batched decode rows on x86 AVX-512; x and y float32 or bf16 (io_bf16).
//
// ---- int4: y[M, N] = x[M, K] @ W^T for an int4pack weight (aten's _convert_weight_to_int4pack_for_cpu
// layout, [N/64][K][32] bytes: byte j of a 64-row block holds row j in its low nibble and row j + 32
// in its high one; W = (q - 8) * scale + zero with bf16 [K/g][N_pad][2] (scale, zero)). Built and
// loaded by backends/torch/cpu_gemm.py.
//
// aten's kernel re-decodes the weights for every few rows of x; here each 64-row block is decoded
// once into two float32 panels [K][32] that stay in cache, and every 12 rows of x run a 12 x 32
// register-blocked multiply-add over a panel (24 accumulators, x broadcast from memory).
// Numerics follow aten's kernel, so that a row's result does not depend on how many rows share its
// step (which picks the kernel): x rounded to bf16, each weight (q - 8) * scale + zero in one
// rounding, float32 sums in K order, the output rounded to bf16 (tests check it bit for bit). With
// bf16 x and y (a bfloat16 model) the values are the same: x is already bf16, and y is stored as
// the bf16 it was rounded to.
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define NR 32
#define MR 12

// Round to the nearest bf16, ties to even (finite values), kept in float32.
static inline __m512 round_bf16(__m512 v) {
    __m512i u = _mm512_castps_si512(v);
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    u = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7FFF), lsb));
    return _mm512_castsi512_ps(_mm512_and_si512(u, _mm512_set1_epi32((int)0xFFFF0000u)));
}

#define DEF_KERNEL(R)                                                                                 \
    static void kernel_##R(const float *x, long ldx, const float *panel, long K, float *y, long ldy) { \
        __m512 a0[R], a1[R];                                                                          \
        for (int i = 0; i < R; i++) a0[i] = a1[i] = _mm512_setzero_ps();                              \
        for (long k = 0; k < K; k++) {                                                                \
            __m512 w0 = _mm512_load_ps(panel + k * NR), w1 = _mm512_load_ps(panel + k * NR + 16);     \
            _Pragma("GCC unroll 16") for (int i = 0; i < R; i++) {                                    \
                __m512 xb = _mm512_set1_ps(x[i * ldx + k]);                                           \
                a0[i] = _mm512_fmadd_ps(xb, w0, a0[i]);                                               \
                a1[i] = _mm512_fmadd_ps(xb, w1, a1[i]);                                               \
            }                                                                                         \
        }                                                                                             \
        for (int i = 0; i < R; i++) {                                                                 \
            _mm512_storeu_ps(y + i * ldy, round_bf16(a0[i]));                                         \
            _mm512_storeu_ps(y + i * ldy + 16, round_bf16(a1[i]));                                    \
        }                                                                                             \
    }
DEF_KERNEL(1) DEF_KERNEL(2) DEF_KERNEL(3) DEF_KERNEL(4) DEF_KERNEL(5) DEF_KERNEL(6)
DEF_KERNEL(7) DEF_KERNEL(8) DEF_KERNEL(9) DEF_KERNEL(10) DEF_KERNEL(11) DEF_KERNEL(12)

typedef void (*kernel_t)(const float *, long, const float *, long, float *, long);
static const kernel_t KERNELS[MR + 1] = {0, kernel_1, kernel_2, kernel_3, kernel_4, kernel_5, kernel_6,
                                         kernel_7, kernel_8, kernel_9, kernel_10, kernel_11, kernel_12};

static inline float bf16_to_float(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

// x as float32 rounded to bf16: rounded if float32, widened (exactly) if already bf16.
static float *rounded_copy(const void *x, long count, int x_bf16) {
    float *xr = aligned_alloc(64, (count * sizeof(float) + 63) / 64 * 64);
    if (!xr) return 0;
    for (long i = 0; i < count; i += 16) {
        __mmask16 m = count - i >= 16 ? 0xFFFF : (__mmask16)((1u << (count - i)) - 1);
        __m512 v = x_bf16 ? _mm512_castsi512_ps(_mm512_slli_epi32(
                                _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, (const uint16_t *)x + i)), 16))
                          : round_bf16(_mm512_maskz_loadu_ps(m, (const float *)x + i));
        _mm512_mask_storeu_ps(xr + i, m, v);
    }
    return xr;
}

// Columns n0 .. n1 of a float32 [M][N] result whose values are bf16 already, stored as bf16 (the
// top half of each float: exact).
static void store_bf16_cols(const float *yf, long M, long N, long n0, long n1, uint16_t *y) {
    for (long i = 0; i < M; i++)
        for (long n = n0; n < n1; n += 16) {
            __mmask16 m = n1 - n >= 16 ? 0xFFFF : (__mmask16)((1u << (n1 - n)) - 1);
            __m512i u = _mm512_srli_epi32(_mm512_castps_si512(_mm512_maskz_loadu_ps(m, yf + i * N + n)), 16);
            _mm256_mask_storeu_epi16(y + i * N + n, m, _mm512_cvtepi32_epi16(u));
        }
}

// x's rounded float32 copy, and where the kernels write y: y itself, or (bf16 output) a float32
// buffer whose columns are then stored as bf16. Returns 0, or -1 (nothing allocated) when out of memory.
static int io_buffers(const void *x, long M, long K, void *y, long N, int io_bf16, float **xr, float **yf) {
    *xr = rounded_copy(x, M * K, io_bf16);
    *yf = io_bf16 ? aligned_alloc(64, ((size_t)M * N * sizeof(float) + 63) / 64 * 64) : y;
    if (*xr && *yf) return 0;
    free(*xr);
    if (io_bf16) free(*yf);
    return -1;
}

// Block t's 64 rows as two panels [K][32] (rows 0-31 from the low nibbles, 32-63 from the high ones).
static void decode_block(const uint8_t *block, const uint16_t *sz, long n_pad, long n0, long K, long g,
                         float *scale, float *zero, float *lo_panel, float *hi_panel) {
    for (long gi = 0; gi < K / g; gi++)
        for (int j = 0; j < 64; j++) {
            const uint16_t *p = sz + (gi * n_pad + n0 + j) * 2;
            scale[gi * 64 + j] = bf16_to_float(p[0]);
            zero[gi * 64 + j] = bf16_to_float(p[1]);
        }
    const __m512i mask = _mm512_set1_epi32(0xF), eight = _mm512_set1_epi32(8);
    for (long k = 0; k < K; k++) {
        const float *s = scale + (k / g) * 64, *z = zero + (k / g) * 64;
        for (int h = 0; h < 2; h++) {
            __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(block + k * 32 + h * 16)));
            __m512 lo = _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_and_si512(b, mask), eight));
            __m512 hi = _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_srli_epi32(b, 4), eight));
            _mm512_store_ps(lo_panel + k * NR + h * 16,
                            _mm512_fmadd_ps(lo, _mm512_loadu_ps(s + h * 16), _mm512_loadu_ps(z + h * 16)));
            _mm512_store_ps(hi_panel + k * NR + h * 16,
                            _mm512_fmadd_ps(hi, _mm512_loadu_ps(s + 32 + h * 16), _mm512_loadu_ps(z + 32 + h * 16)));
        }
    }
}

// Columns n0 .. n0 + 31 (fewer at the matrix's edge) of y from one panel.
static void panel_product(const float *x, long M, long K, const float *panel, float *y, long N, long n0, float *tmp) {
    long cols = N - n0 < NR ? N - n0 : NR;
    if (cols <= 0) return;
    for (long m = 0; m < M; m += MR) {
        long rows = M - m < MR ? M - m : MR;
        if (cols == NR) {
            KERNELS[rows](x + m * K, K, panel, K, y + m * N + n0, N);
            continue;
        }
        KERNELS[rows](x + m * K, K, panel, K, tmp, NR);
        for (long i = 0; i < rows; i++) memcpy(y + (m + i) * N + n0, tmp + i * NR, cols * sizeof(float));
    }
}

// Returns 0, or -1 when a buffer could not be allocated (y is then incomplete).
int lantern_int4pack_mm(const void *x, long M, long K, const uint8_t *packed, const uint16_t *sz, long g, long n_pad,
                        void *y, long N, int io_bf16, int threads) {
    long blocks = (N + 63) / 64;
    int failed = 0;
    float *xr, *yf;
    if (io_buffers(x, M, K, y, N, io_bf16, &xr, &yf) != 0) return -1;
#pragma omp parallel num_threads(threads) reduction(| : failed)
    {
        size_t panel_bytes = (size_t)K * NR * sizeof(float);
        float *lo = aligned_alloc(64, panel_bytes), *hi = aligned_alloc(64, panel_bytes);
        float *sc = malloc((K / g) * 64 * 2 * sizeof(float)), *tmp = malloc(MR * NR * sizeof(float));
        int ok = lo && hi && sc && tmp;
        // Every thread takes part in the loop (a worksharing construct); one without buffers skips its blocks.
#pragma omp for schedule(static)
        for (long t = 0; t < blocks; t++) {
            if (!ok) {
                failed = 1;
                continue;
            }
            decode_block(packed + t * K * 32, sz, n_pad, t * 64, K, g, sc, sc + (K / g) * 64, lo, hi);
            panel_product(xr, M, K, lo, yf, N, t * 64, tmp);
            panel_product(xr, M, K, hi, yf, N, t * 64 + 32, tmp);
            if (io_bf16) store_bf16_cols(yf, M, N, t * 64, (t + 1) * 64 < N ? (t + 1) * 64 : N, y);
        }
        free(lo), free(hi), free(sc), free(tmp);
    }
    free(xr);
    if (io_bf16) free(yf);
    return failed ? -1 : 0;
}

// ---- int8: y[M, N] = x[M, K] @ W^T for a row-major int8 weight [N][K] (the layout aten's
// _weight_int8pack_mm reads), K a multiple of 16, unit scales (the caller scales the output).
// Numerics follow aten's AVX-512 kernel bit for bit: x rounded to bf16, one 16-lane float32
// accumulator per output fed by fused multiply-adds in K order, reduced by _mm512_reduce_add_ps,
// rounded to bf16. aten blocks 4 x 4 outputs and converts each weight again for every 4 rows of x;
// here 6 rows of x share each converted weight vector (4 x 6 accumulators).
#define DEF_DOT(R, C)                                                                                \
    static void dot_##R##x##C(const float *x, long K, const int8_t *w, float *y, long ldy) {        \
        __m512 acc[R][C];                                                                            \
        for (int i = 0; i < R; i++)                                                                  \
            for (int j = 0; j < C; j++) acc[i][j] = _mm512_setzero_ps();                             \
        for (long k = 0; k < K; k += 16) {                                                           \
            __m512 wv[C];                                                                            \
            for (int j = 0; j < C; j++)                                                              \
                wv[j] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(w + j * K + k)))); \
            _Pragma("GCC unroll 8") for (int i = 0; i < R; i++) {                                    \
                __m512 xv = _mm512_loadu_ps(x + i * K + k);                                          \
                for (int j = 0; j < C; j++) acc[i][j] = _mm512_fmadd_ps(xv, wv[j], acc[i][j]);       \
            }                                                                                        \
        }                                                                                            \
        for (int i = 0; i < R; i++)                                                                  \
            for (int j = 0; j < C; j++) {                                                            \
                __m512 s = _mm512_set1_ps(_mm512_reduce_add_ps(acc[i][j]));                          \
                y[i * ldy + j] = _mm512_cvtss_f32(round_bf16(s));                                    \
            }                                                                                        \
    }
#define DEF_DOT_ROWS(C) DEF_DOT(1, C) DEF_DOT(2, C) DEF_DOT(3, C) DEF_DOT(4, C) DEF_DOT(5, C) DEF_DOT(6, C)
DEF_DOT_ROWS(1) DEF_DOT_ROWS(4)

typedef void (*dot_t)(const float *, long, const int8_t *, float *, long);
static const dot_t DOT4[7] = {0, dot_1x4, dot_2x4, dot_3x4, dot_4x4, dot_5x4, dot_6x4};
static const dot_t DOT1[7] = {0, dot_1x1, dot_2x1, dot_3x1, dot_4x1, dot_5x1, dot_6x1};

// Returns 0, or -1 when a buffer could not be allocated.
int lantern_int8pack_mm(const void *x, long M, long K, const int8_t *w, void *y, long N, int io_bf16, int threads) {
    float *xr, *yf;
    if (io_buffers(x, M, K, y, N, io_bf16, &xr, &yf) != 0) return -1;
    long tiles = (N + 63) / 64;  // 64 weight rows per task: 4 at a time stay in L1 across x's rows
#pragma omp parallel for num_threads(threads) schedule(static)
    for (long t = 0; t < tiles; t++) {
        long n_end = (t + 1) * 64 < N ? (t + 1) * 64 : N;
        for (long n = t * 64; n < n_end;) {
            int cols = n_end - n >= 4 ? 4 : 1;
            for (long m = 0; m < M; m += 6) {
                int rows = M - m < 6 ? M - m : 6;
                (cols == 4 ? DOT4 : DOT1)[rows](xr + m * K, K, w + n * K, yf + m * N + n, N);
            }
            n += cols;
        }
        if (io_bf16) store_bf16_cols(yf, M, N, t * 64, n_end, y);
    }
    free(xr);
    if (io_bf16) free(yf);
    return 0;
}

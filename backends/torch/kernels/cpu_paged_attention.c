// Paged decode attention on x86 AVX-512: one query token per sequence against the keys and values it
// holds in the paged KV pool, read in place through its block table. Built and loaded by
// backends/torch/cpu_attention.py. q, K, V and the output are all float32 or all bfloat16; every
// sum, score and softmax term is float32 either way, the output rounded to bf16 once at the end.
// bf16 operands are never converted up front: q.k runs on VDPBF16PS where the CPU has it (32
// exact bf16 products summed in float32 per instruction), and each value row is widened once, in
// registers, for all the query heads that share it (in cache: 151 -> 104 us a 32-row SmolLM2 call
// at 192 tokens). Out of cache the call waited on memory: each thread now has the lines of its next
// part requested a few at a time while it computes the current one (prefetch_ahead): 446 -> 177 us,
// ~30 GB/s of keys and values on 2 cores.
//
// The plain-torch path gathers every row's K and V into new tensors and then runs SDPA over them:
// three passes over the context per layer (read, write, read). Here each key and value is read once.
// A row's keys are cut at fixed absolute positions (parts of PART, chunks of CHUNK): each part keeps
// an online softmax (running max, sum and weighted values), the parts are then merged in order. The
// cuts depend on the positions only, so a row's output does not depend on the other rows of its step.
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>

#include "attention_simd.h"

#define PART 64
#define CHUNK 32

// Lane i of the result: the sum of v[i]'s 16 lanes (sixteen dot products finished at once).
static inline __m512 hsum16(const __m512 *v) {
    __m512 a[8], b[4], c[2];
    for (int i = 0; i < 8; i++)  // per 128-bit lane: [x0+x2, y0+y2, x1+x3, y1+y3]
        a[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
    for (int i = 0; i < 4; i++)  // per 128-bit lane L, element e: lane L's sum of v[4i + e]
        b[i] = _mm512_add_ps(_mm512_shuffle_ps(a[2 * i], a[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_ps(a[2 * i], a[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    for (int i = 0; i < 2; i++)  // then the four 128-bit lanes of each b summed into one
        c[i] = _mm512_add_ps(_mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                             _mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], _MM_SHUFFLE(3, 1, 3, 1)));
    return _mm512_add_ps(_mm512_shuffle_f32x4(c[0], c[1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(c[0], c[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

// y[:n] += x * b
static inline void axpy(float *y, const float *x, float b, long n) {
    __m512 vb = _mm512_set1_ps(b);
    for (long i = 0; i < n; i += 16) {
        __mmask16 m = tail_mask(n - i);
        _mm512_mask_storeu_ps(y + i, m, _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, x + i), vb, _mm512_maskz_loadu_ps(m, y + i)));
    }
}

// s[0..cnt) = q . rows[j][off:off + D] for up to 16 rows, once per element type of the rows
// (SUFFIX, T, LOAD) so that the inner loop never branches on it; q float32.
#define DOTS16(SUFFIX, T, LOAD)                                                                                      \
    static inline __m512 dots16_##SUFFIX(const float *q, const void *const *rows, long off, long cnt, long D) {     \
        __m512 acc[16];                                                                                             \
        for (int i = 0; i < 16; i++) acc[i] = _mm512_setzero_ps();                                                  \
        for (long d = 0; d < D; d += 16) {                                                                          \
            __mmask16 m = tail_mask(D - d);                                                                         \
            __m512 qv = _mm512_maskz_loadu_ps(m, q + d);                                                            \
            for (long i = 0; i < 16; i++) /* rows past cnt repeat row 0: a fixed count keeps acc in registers */    \
                acc[i] = _mm512_fmadd_ps(qv, LOAD(m, (const T *)rows[i < cnt ? i : 0] + off + d), acc[i]);          \
        }                                                                                                           \
        return hsum16(acc);                                                                                         \
    }

// float32 values: acc[:Dv] += sum_j p[j] * rows[j][off:off + Dv], 64 columns at a time in registers,
// even and odd rows in separate accumulators (independent chains of multiply-adds).
static inline void weighted_rows_f32(float *acc, const float *p, const void *const *rows, long off, long n, long Dv) {
    for (long c = off; c < off + Dv; c += 64) {
        __mmask16 mk[4];
        __m512 e[4], o[4];
        for (int u = 0; u < 4; u++) {
            long left = off + Dv - c - 16 * u;
            mk[u] = left <= 0 ? 0 : tail_mask(left);
            e[u] = _mm512_maskz_loadu_ps(mk[u], acc + c - off + 16 * u), o[u] = _mm512_setzero_ps();
        }
        long j = 0;
        for (; j + 1 < n; j += 2) {
            __m512 pe = _mm512_set1_ps(p[j]), po = _mm512_set1_ps(p[j + 1]);
            for (int u = 0; u < 4; u++) {
                e[u] = _mm512_fmadd_ps(pe, LOAD_F32(mk[u], (const float *)rows[j] + c + 16 * u), e[u]);
                o[u] = _mm512_fmadd_ps(po, LOAD_F32(mk[u], (const float *)rows[j + 1] + c + 16 * u), o[u]);
            }
        }
        if (j < n) {
            __m512 pe = _mm512_set1_ps(p[j]);
            for (int u = 0; u < 4; u++)
                e[u] = _mm512_fmadd_ps(pe, LOAD_F32(mk[u], (const float *)rows[j] + c + 16 * u), e[u]);
        }
        for (int u = 0; u < 4; u++)
            _mm512_mask_storeu_ps(acc + c - off + 16 * u, mk[u], _mm512_add_ps(e[u], o[u]));
    }
}

DOTS16(f32, float, LOAD_F32)
#ifdef __AVX512BF16__
#define BF16_DOTS 1
// s[0..cnt) = q . rows[j][off:off + D] for up to 16 rows, q and the rows bf16: 32 products per
// VDPBF16PS, each exact in float32 and summed in float32 (denormal inputs count as zero).
static inline __m512 dots16_dp(const uint16_t *q, const void *const *rows, long off, long cnt, long D) {
    __m512 acc[16];
    for (int i = 0; i < 16; i++) acc[i] = _mm512_setzero_ps();
    for (long d = 0; d < D; d += 32) {
        __mmask32 m = tail_mask32(D - d);
        __m512bh qv = (__m512bh)_mm512_maskz_loadu_epi16(m, q + d);
        for (long i = 0; i < 16; i++) {  // rows past cnt repeat row 0: a fixed count keeps acc in registers
            const uint16_t *r = (const uint16_t *)rows[i < cnt ? i : 0] + off + d;
            acc[i] = _mm512_dpbf16_ps(acc[i], qv, (__m512bh)_mm512_maskz_loadu_epi16(m, r));
        }
    }
    return hsum16(acc);
}
#else
#define BF16_DOTS 0
DOTS16(bf16, uint16_t, LOAD_BF16)  // bf16 keys widened on load, q widened up front
#endif

// bf16 values, for N (1..4) query heads at once: acc[g][:] += sum_j p[g * CHUNK + j] * rows[j][off:off + Dv].
// Each value row is loaded once for the N heads and widened in registers without a shuffle: of 32
// bf16 (one load), a shift gives the even columns as float32 and a mask the odd ones. So acc keeps
// each 32 columns as [16 even | 16 odd] (unpermuted at the end, in lantern_paged_decode); its heads
// lie Dvp (Dv rounded up to 32) apart.
static inline __attribute__((always_inline)) void weighted_heads_bf16_n(float *acc, const float *p,
                                                                        const void *const *rows, long off, long n,
                                                                        long Dv, long Dvp, const int N) {
    const __m512i odd = _mm512_set1_epi32((int)0xFFFF0000u);
    for (long c = 0; c < Dv; c += 32) {
        __mmask32 m = tail_mask32(Dv - c);
        __m512 even_sum[4], odd_sum[4];
        for (int g = 0; g < N; g++)
            even_sum[g] = _mm512_loadu_ps(acc + g * Dvp + c), odd_sum[g] = _mm512_loadu_ps(acc + g * Dvp + c + 16);
        for (long j = 0; j < n; j++) {
            __m512i x = _mm512_maskz_loadu_epi16(m, (const uint16_t *)rows[j] + off + c);
            __m512 we = _mm512_castsi512_ps(_mm512_slli_epi32(x, 16)), wo = _mm512_castsi512_ps(_mm512_and_si512(x, odd));
            for (int g = 0; g < N; g++) {
                __m512 pb = _mm512_set1_ps(p[g * CHUNK + j]);
                even_sum[g] = _mm512_fmadd_ps(pb, we, even_sum[g]), odd_sum[g] = _mm512_fmadd_ps(pb, wo, odd_sum[g]);
            }
        }
        for (int g = 0; g < N; g++)
            _mm512_storeu_ps(acc + g * Dvp + c, even_sum[g]), _mm512_storeu_ps(acc + g * Dvp + c + 16, odd_sum[g]);
    }
}

// The G heads of one KV head, four at a time (8 accumulators + 2 widened vectors in registers).
static void weighted_heads_bf16(float *acc, const float *p, const void *const *rows, long off, long n, long Dv,
                                long Dvp, long G) {
    for (long g = 0; g < G; g += 4) {
        float *a = acc + g * Dvp;
        const float *pg = p + g * CHUNK;
        switch (G - g < 4 ? G - g : 4) {
            case 1: weighted_heads_bf16_n(a, pg, rows, off, n, Dv, Dvp, 1); break;
            case 2: weighted_heads_bf16_n(a, pg, rows, off, n, Dv, Dvp, 2); break;
            case 3: weighted_heads_bf16_n(a, pg, rows, off, n, Dv, Dvp, 3); break;
            default: weighted_heads_bf16_n(a, pg, rows, off, n, Dv, Dvp, 4); break;
        }
    }
}

#if !BF16_DOTS
// dst[:n] = src[:n] widened to float32 (bf16 q, for the widening dot products).
static void widen_bf16(float *dst, const uint16_t *src, long n) {
    for (long i = 0; i < n; i += 16) {
        __mmask16 m = tail_mask(n - i);
        _mm512_mask_storeu_ps(dst + i, m, LOAD_BF16(m, src + i));
    }
}
#endif

// dst[:n] = src rounded to bf16, src holding each 32 columns as [16 even | 16 odd] (weighted_heads_bf16).
static void round_bf16_unpermuted(uint16_t *dst, const float *src, long n) {
    const __m512i lo = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    const __m512i hi = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
    for (long c = 0; c < n; c += 32) {
        __m512 even = _mm512_loadu_ps(src + c), odd = _mm512_loadu_ps(src + c + 16);
        store_bf16(dst + c, _mm512_permutex2var_ps(even, lo, odd), tail_mask(n - c));
        if (n - c > 16) store_bf16(dst + c + 16, _mm512_permutex2var_ps(even, hi, odd), tail_mask(n - c - 16));
    }
}

typedef struct {
    const char *k, *v;  // the pool's first slot
    long ks, khs, vs, vhs;  // elements from one slot / KV head to the next
    int bf16;  // K and V hold bf16 (2 bytes an element), else float32 (4)
    long D, Dv, Dvp, H, KVH;  // Dvp: a head's span in acc (bf16: Dv rounded up to 32, else Dv)
    const int32_t *table;  // this row's, table_width entries
    long table_width;
    long block_size, num_blocks;
    float scale, softcap;
} row_view;

// The K and V rows of positions [c0, c0 + n): pointers to each position's slot, the table walked
// from (*block_i, *offset). Returns 0, -1 when an entry lies outside the pool, -3 when the table
// runs out.
static int chunk_rows(const row_view *h, long n, long *block_i, long *offset, const void **krow, const void **vrow) {
    long esize = h->bf16 ? 2 : 4;
    for (long j = 0; j < n; j++) {
        if (*block_i >= h->table_width) return -3;
        long block = h->table[*block_i];
        if (block < 0 || block >= h->num_blocks) return -1;
        long slot = block * h->block_size + *offset;
        krow[j] = h->k + slot * h->ks * esize, vrow[j] = h->v + slot * h->vs * esize;
        if (++*offset == h->block_size) *offset = 0, ++*block_i;
    }
    return 0;
}

// Asks for n rows of `bytes` each to be brought into cache. The blocks a row's positions live in
// are scattered over the pool, so the hardware prefetchers see a new stream every block_size
// positions; without this a 32-row step waited on memory for most of its time.
static inline void prefetch_rows(const void *const *rows, long n, long bytes) {
    for (long j = 0; j < n; j++)
        for (long b = 0; b < bytes; b += 64) _mm_prefetch((const char *)rows[j] + b, _MM_HINT_T0);
}

// The cache lines of the part a thread takes next, requested a few at a time while it computes the
// current one (the next part is otherwise fetched only when it starts: a stall per part). Spread out
// rather than asked for at once: a burst of prefetches fills the core's miss buffers and stalls it.
#define AHEAD_SPANS (2 * (PART + 1))
typedef struct {
    const char *addr[AHEAD_SPANS];  // contiguous spans: a block's slots of K, then of V
    long bytes[AHEAD_SPANS];
    long spans, span, offset;  // the next line: span `span`, byte `offset`
    long per_call;  // lines per prefetch_ahead call
} ahead;

// Queue positions [p0, p1) of the row h (block by block: a block's slots are contiguous), to be
// requested over about `calls` calls of prefetch_ahead.
static void ahead_init(ahead *a, const row_view *h, long p0, long p1, long calls) {
    long esize = h->bf16 ? 2 : 4, lines = 0;
    long kbytes = ((h->KVH - 1) * h->khs + h->D) * esize, vbytes = ((h->KVH - 1) * h->vhs + h->Dv) * esize;
    a->spans = a->span = a->offset = 0;
    for (long pos = p0; pos < p1 && a->spans + 2 <= AHEAD_SPANS;) {
        long block_i = pos / h->block_size, offset = pos % h->block_size;
        long n = h->block_size - offset < p1 - pos ? h->block_size - offset : p1 - pos;
        if (block_i >= h->table_width) break;
        long block = h->table[block_i];
        if (block < 0 || block >= h->num_blocks) break;  // attend_part reports it
        long slot = block * h->block_size + offset;
        a->addr[a->spans] = h->k + slot * h->ks * esize, a->bytes[a->spans++] = (n - 1) * h->ks * esize + kbytes;
        a->addr[a->spans] = h->v + slot * h->vs * esize, a->bytes[a->spans++] = (n - 1) * h->vs * esize + vbytes;
        lines += (a->bytes[a->spans - 2] + a->bytes[a->spans - 1]) / 64 + 2;
        pos += n;
    }
    a->per_call = lines / (calls > 0 ? calls : 1) + 1;
}

// Requests the next per_call lines of the queue into L2.
static inline void prefetch_ahead(ahead *a) {
    for (long i = 0; i < a->per_call && a->span < a->spans; i++) {
        _mm_prefetch(a->addr[a->span] + a->offset, _MM_HINT_T1);
        a->offset += 64;
        if (a->offset >= a->bytes[a->span]) a->span++, a->offset = 0;
    }
}

// Online softmax over positions [p0, p1) for the row's H query heads q [H][D] (each KV head's
// G = H / KVH heads in turn, so that a chunk's keys and values are read from memory once and then
// from cache): m [H] running max, l [H] sum of e^(s - m), acc [H][Dvp] sum of e^(s - m) v.
// q: float32, or bf16 where the dot products take it as it is (BF16_DOTS). sc: H * CHUNK floats of
// scratch. Returns -1 when a block table entry lies outside the pool, -3 when the row's length needs
// more blocks than its table has.
static int attend_part(const row_view *h, const void *q, long p0, long p1, float *m, float *l, float *acc, float *sc,
                       ahead *next) {
    long H = h->H, G = H / h->KVH, Dvp = h->Dvp;
    for (long i = 0; i < H; i++) {
        m[i] = -INFINITY, l[i] = 0.0f;
        for (long d = 0; d < Dvp; d++) acc[i * Dvp + d] = 0.0f;
    }
    // Row pointers for this chunk and the next (double-buffered): the next chunk's rows are
    // requested while this one computes. kbytes / vbytes: a position's span over the KV heads.
    const void *rows[2][2][CHUNK];
    long esize = h->bf16 ? 2 : 4, block_i = p0 / h->block_size, offset = p0 % h->block_size;
    long kbytes = ((h->KVH - 1) * h->khs + h->D) * esize, vbytes = ((h->KVH - 1) * h->vhs + h->Dv) * esize;
    long c1 = (p0 / CHUNK + 1) * CHUNK < p1 ? (p0 / CHUNK + 1) * CHUNK : p1;
    int rc = chunk_rows(h, c1 - p0, &block_i, &offset, rows[0][0], rows[0][1]), cur = 0;
    if (rc != 0) return rc;
    prefetch_rows(rows[0][0], c1 - p0, kbytes);
    prefetch_rows(rows[0][1], c1 - p0, vbytes);
    for (long c0 = p0; c0 < p1; cur ^= 1) {
        c1 = (c0 / CHUNK + 1) * CHUNK < p1 ? (c0 / CHUNK + 1) * CHUNK : p1;
        long n = c1 - c0, c2 = c1 + CHUNK < p1 ? c1 + CHUNK : p1;
        const void **krow = rows[cur][0], **vrow = rows[cur][1];
        if (c2 > c1) {
            rc = chunk_rows(h, c2 - c1, &block_i, &offset, rows[cur ^ 1][0], rows[cur ^ 1][1]);
            if (rc != 0) return rc;
            prefetch_rows(rows[cur ^ 1][0], c2 - c1, kbytes);
            prefetch_rows(rows[cur ^ 1][1], c2 - c1, vbytes);
        }
        for (long head = 0; head < H; head++) {
            long kv_off = (head / G) * h->khs;
            for (long j = 0; j < n; j += 16) {
                long cnt = n - j < 16 ? n - j : 16;
                // the element type is picked per 16 keys, not per element
#if BF16_DOTS
                __m512 s = h->bf16 ? dots16_dp((const uint16_t *)q + head * h->D, krow + j, kv_off, cnt, h->D)
                                   : dots16_f32((const float *)q + head * h->D, krow + j, kv_off, cnt, h->D);
#else
                const float *qh = (const float *)q + head * h->D;
                __m512 s = h->bf16 ? dots16_bf16(qh, krow + j, kv_off, cnt, h->D)
                                   : dots16_f32(qh, krow + j, kv_off, cnt, h->D);
#endif
                s = _mm512_mul_ps(s, _mm512_set1_ps(h->scale));
                _mm512_mask_storeu_ps(sc + head * CHUNK + j, tail_mask(cnt), s);
                prefetch_ahead(next);
            }
        }
        if (h->softcap > 0.0f)
            for (long head = 0; head < H; head++)
                for (long j = 0; j < n; j++) sc[head * CHUNK + j] = h->softcap * tanhf(sc[head * CHUNK + j] / h->softcap);
        for (long head = 0; head < H; head++) {
            float *s = sc + head * CHUNK;
            __m512 vmax = _mm512_set1_ps(-INFINITY);  // (a scalar loop here was a chain of n dependent compares)
            for (long j = 0; j < n; j += 16)
                vmax = _mm512_max_ps(vmax, _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), tail_mask(n - j), s + j));
            float cmax = _mm512_reduce_max_ps(vmax);
            if (cmax > m[head]) {
                if (m[head] != -INFINITY) {  // rescale what the earlier chunks summed to the new max
                    float corr = expf(m[head] - cmax);
                    l[head] *= corr;
                    scale_row(acc + head * Dvp, corr, Dvp);
                }
                m[head] = cmax;
            }
            __m512 sum = _mm512_setzero_ps(), vm = _mm512_set1_ps(m[head]);
            for (long j = 0; j < n; j += 16) {
                __mmask16 mk = tail_mask(n - j);
                __m512 e = _mm512_maskz_mov_ps(mk, exp_nonpositive(_mm512_sub_ps(_mm512_maskz_loadu_ps(mk, s + j), vm)));
                _mm512_mask_storeu_ps(s + j, mk, e);
                sum = _mm512_add_ps(sum, e);
            }
            l[head] += _mm512_reduce_add_ps(sum);
            if (!h->bf16) weighted_rows_f32(acc + head * Dvp, s, vrow, (head / G) * h->vhs, n, h->Dv);
        }
        if (h->bf16)  // after every head's weights: each KV head's value rows read once for its G heads
            for (long kvh = 0; kvh < h->KVH; kvh++)
                weighted_heads_bf16(acc + kvh * G * Dvp, sc + kvh * G * CHUNK, vrow, kvh * h->vhs, n, h->Dv, Dvp, G);
        c0 = c1;
    }
    return 0;
}

// Part t's positions [*p0, *p1): row_of[t]'s keys cut at multiples of PART, from lo to its length.
static inline void part_range(long t, const long *row_of, const long *first_part, const long *lo, const int32_t *lens,
                              long *p0, long *p1) {
    long b = row_of[t], a = (lo[b] / PART + t - first_part[b]) * PART, e = a + PART;
    *p0 = a > lo[b] ? a : lo[b], *p1 = e < lens[b] ? e : lens[b];
}

// out [B][H][Dv] = softmax(q k^T * scale) v for each row's keys at positions
// [max(0, len - window), len) (window 0: all), GQA with H / KVH query heads per KV head.
// bf16: q, k, v and out hold bf16 (uint16), else float32. k/v: element (slot, head, d) at
// slot * ks + head * khs + d (strides in elements). softcap 0: none. sinks: NULL or [H] float32, one
// extra logit per head in the denominator. Returns 0; -1 when a block table entry lies outside the
// pool; -2 when scratch memory could not be allocated; -3 when a length needs more blocks than the
// table's width (out is then incomplete).
int lantern_paged_decode(const void *q, long B, long H, long D, const void *k, long ks, long khs, const void *v,
                         long vs, long vhs, long Dv, long KVH, const int32_t *tables, long table_stride, long table_width,
                         const int32_t *lens, long block_size, long num_blocks, float scale, long window, float softcap,
                         const float *sinks, int bf16, void *out, int threads) {
    // bf16: the output kept in float32 until each row is done (here, not in the caller: two torch
    // conversions per layer cost ~3 us, ~15% of a one-row call); q widened once up front unless the
    // dot products take bf16.
    long Dvp = bf16 ? (Dv + 31) / 32 * 32 : Dv, qsize = bf16 ? 2 : 4;
    const char *qp = (const char *)q;
    float *of = (float *)out, *wide = 0;
    if (bf16) {
        wide = (float *)malloc((size_t)(B * H * (D + Dvp) + 1) * sizeof(float));
        if (!wide) return -2;
        of = wide + B * H * D;
#if !BF16_DOTS
        widen_bf16(wide, (const uint16_t *)q, B * H * D);
        qp = (const char *)wide, qsize = 4;
#endif
    }
    long *first_part = (long *)malloc((B + 1) * sizeof(long)), *lo = (long *)malloc(B * sizeof(long)), *row_of = 0;
    if (!first_part || !lo) return free(first_part), free(lo), free(wide), -2;
    first_part[0] = 0;
    for (long b = 0; b < B; b++) {
        long len = lens[b] > 0 ? lens[b] : 0;
        lo[b] = window > 0 && len > window ? len - window : 0;
        first_part[b + 1] = first_part[b] + (len > lo[b] ? (len - 1) / PART - lo[b] / PART + 1 : 0);
    }
    long parts = first_part[B], per_part = H * (Dvp + 2);
    float *partial = (float *)malloc((size_t)(parts * per_part + 1) * sizeof(float));
    row_of = (long *)malloc((parts + 1) * sizeof(long));
    if (!partial || !row_of) return free(partial), free(row_of), free(first_part), free(lo), free(wide), -2;
    for (long b = 0; b < B; b++)
        for (long t = first_part[b]; t < first_part[b + 1]; t++) row_of[t] = b;
    int status = 0;
    const row_view base = {(const char *)k, (const char *)v, ks, khs, vs, vhs, bf16, D, Dv, Dvp, H, KVH, tables,
                           table_width, block_size, num_blocks, scale, softcap};
#pragma omp parallel num_threads(threads) reduction(min : status)
    {
        float *sc = (float *)malloc(H * CHUNK * sizeof(float));
        if (!sc) status = -2;
        // Each thread takes a contiguous run of parts (not dynamic scheduling) so that it knows its
        // next part and can have it fetched ahead.
        long nt = omp_get_num_threads(), id = omp_get_thread_num();
        long t0 = parts * id / nt, t1 = parts * (id + 1) / nt;
        for (long t = t0; t < t1 && sc; t++) {
            row_view h = base, next = base;
            long p0, p1, n0, n1;
            part_range(t, row_of, first_part, lo, lens, &p0, &p1);
            h.table = tables + row_of[t] * table_stride;
            ahead queue = {.spans = 0};
            if (t == t0) {  // the first part: nothing to overlap its fetch with
                ahead_init(&queue, &h, p0, p1, 1);
                prefetch_ahead(&queue);
            }
            if (t + 1 < t1) {  // the next part: its lines spread over this part's score loops
                part_range(t + 1, row_of, first_part, lo, lens, &n0, &n1);
                next.table = tables + row_of[t + 1] * table_stride;
                ahead_init(&queue, &next, n0, n1, H * ((p1 - p0 + 15) / 16));
            }
            float *m = partial + t * per_part, *l = m + H, *acc = l + H;
            int rc = attend_part(&h, qp + row_of[t] * H * D * qsize, p0, p1, m, l, acc, sc, &queue);
            if (rc != 0) status = rc;
        }
        free(sc);
    }
    if (status == 0) {
#pragma omp parallel for num_threads(threads) schedule(static)
        for (long r = 0; r < B * H; r++) {
            long b = r / H, head = r % H, n = first_part[b + 1] - first_part[b];
            float *o = of + r * Dvp, mx = -INFINITY, den = 0.0f;
            for (long i = 0; i < n; i++) {
                float mi = partial[(first_part[b] + i) * per_part + head];
                mx = mi > mx ? mi : mx;
            }
            if (sinks) mx = sinks[head] > mx ? sinks[head] : mx;
            for (long d = 0; d < Dvp; d++) o[d] = 0.0f;
            for (long i = 0; i < n; i++) {
                const float *m = partial + (first_part[b] + i) * per_part;
                float w = expf(m[head] - mx);
                den += m[H + head] * w;
                axpy(o, m + 2 * H + head * Dvp, w, Dvp);
            }
            if (sinks) den += expf(sinks[head] - mx);
            scale_row(o, den > 0.0f ? 1.0f / den : 0.0f, Dvp);
            if (bf16) round_bf16_unpermuted((uint16_t *)out + r * Dv, o, Dv);
        }
    }
    free(partial), free(row_of), free(first_part), free(lo), free(wide);
    return status;
}

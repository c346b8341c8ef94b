// Paged decode attention on x86 AVX-512: one query token per sequence against the keys and values it
// holds in the paged KV pool, read in place through its block table. Built and loaded by
// backends/torch/cpu_attention.py. q, K, V and the output are all float32 or all bfloat16; bf16 is
// widened to float32 on load (exact) and every sum, score and softmax term is float32 either way,
// the output rounded to bf16 once at the end.
//
// The plain-torch path gathers every row's K and V into new tensors and then runs SDPA over them:
// three passes over the context per layer (read, write, read). Here each key and value is read once.
// A row's keys are cut at fixed absolute positions (parts of PART, chunks of CHUNK): each part keeps
// an online softmax (running max, sum and weighted values), the parts are then merged in order. The
// cuts depend on the positions only, so a row's output does not depend on the other rows of its step.
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#define PART 64
#define CHUNK 32

static inline __mmask16 tail_mask(long left) { return left >= 16 ? 0xFFFF : (__mmask16)((1u << left) - 1); }

// e^x for x <= 0 (a score less the running max): x = n ln2 + r, |r| <= ln2 / 2, e^r by its Taylor
// polynomial to r^6 (relative error ~1e-7), times 2^n. Below -87 the result underflows to ~0.
static inline __m512 exp_nonpositive(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
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

// y[:n] *= a
static inline void scale_row(float *y, float a, long n) {
    __m512 va = _mm512_set1_ps(a);
    for (long i = 0; i < n; i += 16) {
        __mmask16 m = tail_mask(n - i);
        _mm512_mask_storeu_ps(y + i, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, y + i), va));
    }
}

// y[:n] += x * b
static inline void axpy(float *y, const float *x, float b, long n) {
    __m512 vb = _mm512_set1_ps(b);
    for (long i = 0; i < n; i += 16) {
        __mmask16 m = tail_mask(n - i);
        _mm512_mask_storeu_ps(y + i, m, _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, x + i), vb, _mm512_maskz_loadu_ps(m, y + i)));
    }
}

// Loads of 16 elements (masked) widened to float32: a bf16 value is a float32's upper half.
#define LOAD_F32(m, p) _mm512_maskz_loadu_ps(m, p)
#define LOAD_BF16(m, p) \
    _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p)), 16))

// The helpers that read K and V, once per element type (SUFFIX, T, LOAD), so that the inner loops
// never branch on it. rows: pointers to each row's slot (T elements), off: the head's offset in it.
//   dots16: s[0..cnt) = q . rows[j][off:off + D] for up to 16 rows.
//   weighted_rows: acc[:Dv] += sum_j p[j] * rows[j][off:off + Dv], 64 columns at a time in
//   registers, even and odd rows in separate accumulators (independent chains of multiply-adds).
#define KV_READERS(SUFFIX, T, LOAD)                                                                                   \
    static inline __m512 dots16_##SUFFIX(const float *q, const void *const *rows, long off, long cnt, long D) {     \
        __m512 acc[16];                                                                                             \
        for (int i = 0; i < 16; i++) acc[i] = _mm512_setzero_ps();                                                  \
        for (long d = 0; d < D; d += 16) {                                                                          \
            __mmask16 m = tail_mask(D - d);                                                                         \
            __m512 qv = _mm512_maskz_loadu_ps(m, q + d);                                                            \
            for (long i = 0; i < cnt; i++)                                                                          \
                acc[i] = _mm512_fmadd_ps(qv, LOAD(m, (const T *)rows[i] + off + d), acc[i]);                        \
        }                                                                                                           \
        return hsum16(acc);                                                                                         \
    }                                                                                                               \
    static inline void weighted_rows_##SUFFIX(float *acc, const float *p, const void *const *rows, long off, long n, \
                                              long Dv) {                                                            \
        for (long c = off; c < off + Dv; c += 64) {                                                                 \
            __mmask16 mk[4];                                                                                        \
            __m512 e[4], o[4];                                                                                      \
            for (int u = 0; u < 4; u++) {                                                                           \
                long left = off + Dv - c - 16 * u;                                                                  \
                mk[u] = left <= 0 ? 0 : tail_mask(left);                                                            \
                e[u] = _mm512_maskz_loadu_ps(mk[u], acc + c - off + 16 * u), o[u] = _mm512_setzero_ps();            \
            }                                                                                                       \
            long j = 0;                                                                                             \
            for (; j + 1 < n; j += 2) {                                                                             \
                __m512 pe = _mm512_set1_ps(p[j]), po = _mm512_set1_ps(p[j + 1]);                                    \
                for (int u = 0; u < 4; u++) {                                                                       \
                    e[u] = _mm512_fmadd_ps(pe, LOAD(mk[u], (const T *)rows[j] + c + 16 * u), e[u]);                 \
                    o[u] = _mm512_fmadd_ps(po, LOAD(mk[u], (const T *)rows[j + 1] + c + 16 * u), o[u]);             \
                }                                                                                                   \
            }                                                                                                       \
            if (j < n) {                                                                                            \
                __m512 pe = _mm512_set1_ps(p[j]);                                                                   \
                for (int u = 0; u < 4; u++)                                                                         \
                    e[u] = _mm512_fmadd_ps(pe, LOAD(mk[u], (const T *)rows[j] + c + 16 * u), e[u]);                 \
            }                                                                                                       \
            for (int u = 0; u < 4; u++)                                                                             \
                _mm512_mask_storeu_ps(acc + c - off + 16 * u, mk[u], _mm512_add_ps(e[u], o[u]));                    \
        }                                                                                                           \
    }

KV_READERS(f32, float, LOAD_F32)
KV_READERS(bf16, uint16_t, LOAD_BF16)

// dst[:n] = src[:n] widened to float32 (bf16 q).
static void widen_bf16(float *dst, const uint16_t *src, long n) {
    for (long i = 0; i < n; i += 16) {
        __mmask16 m = tail_mask(n - i);
        _mm512_mask_storeu_ps(dst + i, m, LOAD_BF16(m, src + i));
    }
}

// dst[:n] = src[:n] rounded to bf16, to nearest even as torch rounds (NaN: a quiet NaN).
static void round_bf16(uint16_t *dst, const float *src, long n) {
    const __m512i one = _mm512_set1_epi32(1), half = _mm512_set1_epi32(0x7FFF);
    for (long i = 0; i < n; i += 16) {
        __mmask16 m = tail_mask(n - i);
        __m512 x = _mm512_maskz_loadu_ps(m, src + i);
        __m512i u = _mm512_castps_si512(x);
        __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(half, _mm512_and_si512(_mm512_srli_epi32(u, 16), one)));
        r = _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), _mm512_set1_epi32(0x7FC00000));
        _mm256_mask_storeu_epi16(dst + i, m, _mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16)));
    }
}

typedef struct {
    const char *k, *v;  // the pool's first slot
    long ks, khs, vs, vhs;  // elements from one slot / KV head to the next
    int bf16;  // K and V hold bf16 (2 bytes an element), else float32 (4)
    long D, Dv, H, KVH;
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

// Online softmax over positions [p0, p1) for the row's H query heads q [H][D] (each KV head's
// G = H / KVH heads in turn, so that a chunk's keys and values are read from memory once and then
// from cache): m [H] running max, l [H] sum of e^(s - m), acc [H][Dv] sum of e^(s - m) v.
// sc: H * CHUNK floats of scratch. Returns -1 when a block table entry lies outside the pool, -3
// when the row's length needs more blocks than its table has.
static int attend_part(const row_view *h, const float *q, long p0, long p1, float *m, float *l, float *acc, float *sc) {
    long H = h->H, G = H / h->KVH;
    for (long i = 0; i < H; i++) {
        m[i] = -INFINITY, l[i] = 0.0f;
        for (long d = 0; d < h->Dv; d++) acc[i * h->Dv + d] = 0.0f;
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
                const float *qh = q + head * h->D;  // the element type is picked per 16 keys, not per element
                __m512 s = h->bf16 ? dots16_bf16(qh, krow + j, kv_off, cnt, h->D)
                                   : dots16_f32(qh, krow + j, kv_off, cnt, h->D);
                s = _mm512_mul_ps(s, _mm512_set1_ps(h->scale));
                _mm512_mask_storeu_ps(sc + head * CHUNK + j, tail_mask(cnt), s);
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
                    scale_row(acc + head * h->Dv, corr, h->Dv);
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
            if (h->bf16)
                weighted_rows_bf16(acc + head * h->Dv, s, vrow, (head / G) * h->vhs, n, h->Dv);
            else
                weighted_rows_f32(acc + head * h->Dv, s, vrow, (head / G) * h->vhs, n, h->Dv);
        }
        c0 = c1;
    }
    return 0;
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
    // bf16: q widened once up front, and the output kept in float32 until each row is done (here,
    // not in the caller: two torch conversions per layer cost ~3 us, ~15% of a one-row call).
    const float *qf = (const float *)q;
    float *of = (float *)out, *wide = 0;
    if (bf16) {
        wide = (float *)malloc((size_t)(B * H * (D + Dv) + 1) * sizeof(float));
        if (!wide) return -2;
        widen_bf16(wide, (const uint16_t *)q, B * H * D);
        qf = wide, of = wide + B * H * D;
    }
    long *first_part = (long *)malloc((B + 1) * sizeof(long)), *lo = (long *)malloc(B * sizeof(long)), *row_of = 0;
    if (!first_part || !lo) return free(first_part), free(lo), free(wide), -2;
    first_part[0] = 0;
    for (long b = 0; b < B; b++) {
        long len = lens[b] > 0 ? lens[b] : 0;
        lo[b] = window > 0 && len > window ? len - window : 0;
        first_part[b + 1] = first_part[b] + (len > lo[b] ? (len - 1) / PART - lo[b] / PART + 1 : 0);
    }
    long parts = first_part[B], per_part = H * (Dv + 2);
    float *partial = (float *)malloc((size_t)(parts * per_part + 1) * sizeof(float));
    row_of = (long *)malloc((parts + 1) * sizeof(long));
    if (!partial || !row_of) return free(partial), free(row_of), free(first_part), free(lo), free(wide), -2;
    for (long b = 0; b < B; b++)
        for (long t = first_part[b]; t < first_part[b + 1]; t++) row_of[t] = b;
    int status = 0;
    const row_view base = {(const char *)k, (const char *)v, ks, khs, vs, vhs, bf16, D, Dv, H, KVH, tables, table_width,
                           block_size, num_blocks, scale, softcap};
#pragma omp parallel num_threads(threads) reduction(min : status)
    {
        float *sc = (float *)malloc(H * CHUNK * sizeof(float));
        if (!sc) status = -2;
#pragma omp for schedule(dynamic, 1)
        for (long t = 0; t < parts; t++) {
            long b = row_of[t];
            if (!sc) continue;
            long p0 = (lo[b] / PART + t - first_part[b]) * PART, p1 = p0 + PART;
            p0 = p0 > lo[b] ? p0 : lo[b], p1 = p1 < lens[b] ? p1 : lens[b];
            row_view h = base;
            h.table = tables + b * table_stride;
            float *m = partial + t * per_part, *l = m + H, *acc = l + H;
            int rc = attend_part(&h, qf + b * H * D, p0, p1, m, l, acc, sc);
            if (rc != 0) status = rc;
        }
        free(sc);
    }
    if (status == 0) {
#pragma omp parallel for num_threads(threads) schedule(static)
        for (long r = 0; r < B * H; r++) {
            long b = r / H, head = r % H, n = first_part[b + 1] - first_part[b];
            float *o = of + r * Dv, mx = -INFINITY, den = 0.0f;
            for (long i = 0; i < n; i++) {
                float mi = partial[(first_part[b] + i) * per_part + head];
                mx = mi > mx ? mi : mx;
            }
            if (sinks) mx = sinks[head] > mx ? sinks[head] : mx;
            for (long d = 0; d < Dv; d++) o[d] = 0.0f;
            for (long i = 0; i < n; i++) {
                const float *m = partial + (first_part[b] + i) * per_part;
                float w = expf(m[head] - mx);
                den += m[H + head] * w;
                axpy(o, m + 2 * H + head * Dv, w, Dv);
            }
            if (sinks) den += expf(sinks[head] - mx);
            scale_row(o, den > 0.0f ? 1.0f / den : 0.0f, Dv);
            if (bf16) round_bf16((uint16_t *)out + r * Dv, o, Dv);
        }
    }
    free(partial), free(row_of), free(first_part), free(lo), free(wide);
    return status;
}

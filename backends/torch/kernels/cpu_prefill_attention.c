// Causal prefill attention on x86 AVX-512: every prefill chunk of a step against the keys and values
// its sequence holds in the paged KV pool (the chunk's own written there first), read in place
// through the block table, in one call per layer. Built and loaded by backends/torch/cpu_attention.py.
//
// torch's CPU flash kernel (the plain-torch path, one call per chunk) spends most of a 128-token
// chunk's call on overhead: 16 chunks x 9 heads of SmolLM2 took ~8.8 ms a layer, ~15% of a
// 2048-token step. Here a thread takes a tile of QT query positions of one KV head's G query heads
// (G * QT rows sharing every key and value it loads) and walks the keys in chunks of KC, keeping an
// online softmax per row. Each chunk's keys are transposed once (keys along the vector lanes), so a
// row's KC scores are D / 2 VDPBF16PS (bf16 where the CPU has AVX512-BF16: exact products summed in
// float32) or D float32 multiply-adds, with no horizontal sums; the values are widened to float32
// once per chunk. Every sum, score and softmax term is float32; the output is rounded to bf16 once.
// Chunks start at multiples of KC in absolute position, so a row's result does not depend on how
// the step cut its sequence into chunks or which rows share its tile.
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "attention_simd.h"

#define QT 16  // query positions per tile
#define KC 16  // keys per chunk: one vector of scores per row
#define RB 8   // rows whose scores are computed together (independent chains of dot products)

#ifdef __AVX512BF16__
#define BF16_DOTS 1
#else
#define BF16_DOTS 0
#endif

typedef struct {
    const char *q, *k, *v;
    long qs, qhs, ks, khs, vs, vhs;  // strides in elements: (token or slot, head)
    long H, D, Dv, Dvp, KVH, G;  // Dvp: Dv rounded up to 16
    int bf16;  // q, K, V and out hold bf16, else float32
    int dots;  // scores by VDPBF16PS on bf16 pairs (bf16 and BF16_DOTS), else float32 multiply-adds
    long words;  // 32-bit words a key row takes in the transposed tile: D / 2 with dots, else D
    const int32_t *tables;
    long table_stride, table_width, block_size, num_blocks;
    float scale, softcap;
    long window;
    const float *sinks;
} pf_args;

typedef struct {
    uint32_t *qw;  // [rows][words]: each row's query (bf16 pairs, or float32)
    uint32_t *kt;  // [words rounded up to 16][KC]: the chunk's keys, transposed
    float *vw;  // [KC][Dvp]: the chunk's values in float32
    float *sc;  // [rows][KC]: scores, then softmax terms
    float *m, *l, *acc;  // [rows], [rows], [rows][Dvp]
    long *qpos;  // [rows]
} scratch;

// The 16 x 16 32-bit words of r transposed in place (r[i] lane j <-> r[j] lane i).
static inline void transpose16(__m512i *r) {
    __m512i t[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
        r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
        r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
        r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    // r[4b + c] now holds, in 128-bit lane L, word 4L + c of rows 4b..4b+3; lanes regroup by word:
    for (int i = 0; i < 4; i++) {
        t[i] = _mm512_shuffle_i32x4(r[i], r[i + 4], _MM_SHUFFLE(2, 0, 2, 0));
        t[i + 4] = _mm512_shuffle_i32x4(r[i], r[i + 4], _MM_SHUFFLE(3, 1, 3, 1));
        t[i + 8] = _mm512_shuffle_i32x4(r[i + 8], r[i + 12], _MM_SHUFFLE(2, 0, 2, 0));
        t[i + 12] = _mm512_shuffle_i32x4(r[i + 8], r[i + 12], _MM_SHUFFLE(3, 1, 3, 1));
    }
    for (int i = 0; i < 4; i++) {
        r[i] = _mm512_shuffle_i32x4(t[i], t[i + 8], _MM_SHUFFLE(2, 0, 2, 0));
        r[i + 8] = _mm512_shuffle_i32x4(t[i], t[i + 8], _MM_SHUFFLE(3, 1, 3, 1));
        r[i + 4] = _mm512_shuffle_i32x4(t[i + 4], t[i + 12], _MM_SHUFFLE(2, 0, 2, 0));
        r[i + 12] = _mm512_shuffle_i32x4(t[i + 4], t[i + 12], _MM_SHUFFLE(3, 1, 3, 1));
    }
}

// Words [w, w + 16) of an element row in the tile's format (bf16 pairs, or float32 widened from
// bf16 or read as is); zeros for a missing row (NULL) and past the row's end.
static inline __m512i row_words(const pf_args *a, const char *row, long w) {
    if (!row) return _mm512_setzero_si512();
    __mmask16 m = tail_mask(a->words - w);
    if (a->dots || !a->bf16) return _mm512_maskz_loadu_epi32(m, (const uint32_t *)row + w);
    return _mm512_castps_si512(LOAD_BF16(m, (const uint16_t *)row + w));
}

// The chunk's key rows (NULL: a position outside the rows' range) transposed into kt, values
// widened into vw.
static void load_chunk(const pf_args *a, scratch *s, const char *const *krow, const char *const *vrow) {
    __m512i r[16];
    for (long w = 0; w < a->words; w += 16) {
        for (int j = 0; j < KC; j++) r[j] = row_words(a, krow[j], w);
        transpose16(r);
        for (int i = 0; i < 16; i++) _mm512_storeu_si512(s->kt + (w + i) * KC, r[i]);
    }
    for (int j = 0; j < KC; j++)
        for (long c = 0; c < a->Dvp; c += 16) {
            __mmask16 m = vrow[j] ? tail_mask(a->Dv - c) : 0;
            __m512 x = a->bf16 ? LOAD_BF16(m, (const uint16_t *)vrow[j] + c) : LOAD_F32(m, (const float *)vrow[j] + c);
            _mm512_storeu_ps(s->vw + j * a->Dvp + c, x);
        }
}

// sc[r][:] = scale * (q_r . key j) for the tile's rows.
static void chunk_scores(const pf_args *a, scratch *s, long rows) {
    const __m512 vscale = _mm512_set1_ps(a->scale);
    for (long r0 = 0; r0 < rows; r0 += RB) {
        __m512 acc[RB];
        const uint32_t *q[RB];
        for (int u = 0; u < RB; u++)  // rows past the tile's repeat its first: a fixed count keeps acc in registers
            acc[u] = _mm512_setzero_ps(), q[u] = s->qw + (r0 + u < rows ? r0 + u : r0) * a->words;
        if (a->dots) {
#if BF16_DOTS
            for (long w = 0; w < a->words; w++) {
                __m512bh kv = (__m512bh)_mm512_loadu_si512(s->kt + w * KC);
                for (int u = 0; u < RB; u++) acc[u] = _mm512_dpbf16_ps(acc[u], (__m512bh)_mm512_set1_epi32((int)q[u][w]), kv);
            }
#endif
        } else {
            for (long w = 0; w < a->words; w++) {
                __m512 kv = _mm512_loadu_ps((const float *)(s->kt + w * KC));
                for (int u = 0; u < RB; u++) acc[u] = _mm512_fmadd_ps(_mm512_set1_ps(((const float *)q[u])[w]), kv, acc[u]);
            }
        }
        for (int u = 0; u < RB && r0 + u < rows; u++) _mm512_storeu_ps(s->sc + (r0 + u) * KC, _mm512_mul_ps(acc[u], vscale));
    }
}

// acc[r] += sum_j sc[r][j] * vw[j] for rows r0, r0 + 1 (N of them), NV vectors of 16 columns from c.
static inline __attribute__((always_inline)) void weigh_values(const pf_args *a, scratch *s, long r0, long c,
                                                               const int N, const int NV) {
    __m512 acc[2][4];
    for (int n = 0; n < N; n++)
        for (int u = 0; u < NV; u++) acc[n][u] = _mm512_loadu_ps(s->acc + (r0 + n) * a->Dvp + c + 16 * u);
    for (int j = 0; j < KC; j++) {
        const float *vj = s->vw + j * a->Dvp + c;
        for (int n = 0; n < N; n++) {
            __m512 p = _mm512_set1_ps(s->sc[(r0 + n) * KC + j]);
            for (int u = 0; u < NV; u++) acc[n][u] = _mm512_fmadd_ps(p, _mm512_loadu_ps(vj + 16 * u), acc[n][u]);
        }
    }
    for (int n = 0; n < N; n++)
        for (int u = 0; u < NV; u++) _mm512_storeu_ps(s->acc + (r0 + n) * a->Dvp + c + 16 * u, acc[n][u]);
}

static void chunk_values(const pf_args *a, scratch *s, long rows) {
    for (long c = 0; c < a->Dvp; c += 64) {
        long nv = (a->Dvp - c) / 16 < 4 ? (a->Dvp - c) / 16 : 4;
        for (long r = 0; r < rows; r += 2) {
            int two = r + 1 < rows;
            switch (nv * 2 + two) {
                case 2: weigh_values(a, s, r, c, 1, 1); break;
                case 3: weigh_values(a, s, r, c, 2, 1); break;
                case 4: weigh_values(a, s, r, c, 1, 2); break;
                case 5: weigh_values(a, s, r, c, 2, 2); break;
                case 6: weigh_values(a, s, r, c, 1, 3); break;
                case 7: weigh_values(a, s, r, c, 2, 3); break;
                case 8: weigh_values(a, s, r, c, 1, 4); break;
                default: weigh_values(a, s, r, c, 2, 4); break;
            }
        }
    }
}

// The online softmax's step for each row: its scores at the keys it sees (causal, window) become
// e^(score - running max) in sc, zero elsewhere; the running max, sum and acc are rescaled as the max grows.
static void chunk_softmax(const pf_args *a, scratch *s, long rows, long c0, __mmask16 have) {
    const __m512i pos = _mm512_add_epi32(_mm512_set1_epi32((int)c0),
                                         _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
    for (long r = 0; r < rows; r++) {
        float *sr = s->sc + r * KC;
        __mmask16 ok = have & _mm512_cmple_epi32_mask(pos, _mm512_set1_epi32((int)s->qpos[r]));
        if (a->window > 0) ok &= _mm512_cmpgt_epi32_mask(pos, _mm512_set1_epi32((int)(s->qpos[r] - a->window)));
        if (!ok) {
            memset(sr, 0, KC * sizeof(float));
            continue;
        }
        __m512 x = _mm512_loadu_ps(sr);
        if (a->softcap > 0.0f) {
            float t[KC];
            _mm512_storeu_ps(t, x);
            for (int j = 0; j < KC; j++) t[j] = a->softcap * tanhf(t[j] / a->softcap);
            x = _mm512_loadu_ps(t);
        }
        float cmax = _mm512_mask_reduce_max_ps(ok, x);
        if (cmax > s->m[r]) {
            if (s->m[r] != -INFINITY) {  // rescale what the earlier chunks summed to the new max
                float corr = expf(s->m[r] - cmax);
                s->l[r] *= corr;
                scale_row(s->acc + r * a->Dvp, corr, a->Dvp);
            }
            s->m[r] = cmax;
        }
        __m512 e = _mm512_maskz_mov_ps(ok, exp_nonpositive(_mm512_sub_ps(x, _mm512_set1_ps(s->m[r]))));
        s->l[r] += _mm512_reduce_add_ps(e);
        _mm512_storeu_ps(sr, e);
    }
}

// Pointers to the K and V rows (KV head kvh) of positions [c0, c0 + KC), NULL outside [lo, hi); *have:
// the lanes with a row. Returns 0, -1 when a table entry lies outside the pool, -3 when the table runs out.
static int chunk_rows(const pf_args *a, const int32_t *table, long kvh, long c0, long lo, long hi, const char **krow,
                      const char **vrow, __mmask16 *have) {
    long esize = a->bf16 ? 2 : 4;
    *have = 0;
    for (int j = 0; j < KC; j++) {
        long p = c0 + j;
        krow[j] = vrow[j] = 0;
        if (p < lo || p >= hi) continue;
        long bi = p / a->block_size;
        if (bi >= a->table_width) return -3;
        long block = table[bi];
        if (block < 0 || block >= a->num_blocks) return -1;
        long slot = block * a->block_size + p % a->block_size;
        krow[j] = a->k + (slot * a->ks + kvh * a->khs) * esize;
        vrow[j] = a->v + (slot * a->vs + kvh * a->vhs) * esize;
        *have |= (__mmask16)(1u << j);
    }
    return 0;
}

// One tile: query positions [qpos0, qpos0 + nq) of KV head kvh of the sequence with block table
// `table`, its rows' query tokens from q_token; out_token: the output row of its first position.
static int attend_tile(const pf_args *a, scratch *s, const int32_t *table, long kvh, long qpos0, long nq,
                       long q_token, long out_token, void *out) {
    long G = a->G, rows = G * nq, esize = a->bf16 ? 2 : 4;
    for (long i = 0; i < nq; i++)
        for (long g = 0; g < G; g++) {  // row i * G + g: position qpos0 + i, head kvh * G + g
            long r = i * G + g;
            const char *src = a->q + ((q_token + i) * a->qs + (kvh * G + g) * a->qhs) * esize;
            for (long w = 0; w < a->words; w += 16)
                _mm512_mask_storeu_epi32(s->qw + r * a->words + w, tail_mask(a->words - w), row_words(a, src, w));
            s->qpos[r] = qpos0 + i, s->m[r] = -INFINITY, s->l[r] = 0.0f;
            memset(s->acc + r * a->Dvp, 0, a->Dvp * sizeof(float));
        }
    long hi = qpos0 + nq, lo = a->window > 0 && qpos0 - a->window + 1 > 0 ? qpos0 - a->window + 1 : 0;
    // Row pointers of this chunk and the next (double-buffered): the next chunk's lines are requested
    // while this one computes (its keys and values come from L2 or further: the pool is shared by all).
    const char *rows_of[2][2][KC];
    __mmask16 have[2];
    int cur = 0, rc = chunk_rows(a, table, kvh, lo / KC * KC, lo, hi, rows_of[0][0], rows_of[0][1], &have[0]);
    for (long c0 = lo / KC * KC; c0 < hi && rc == 0; c0 += KC, cur ^= 1) {
        if (c0 + KC < hi) {
            rc = chunk_rows(a, table, kvh, c0 + KC, lo, hi, rows_of[cur ^ 1][0], rows_of[cur ^ 1][1], &have[cur ^ 1]);
            for (int j = 0; j < KC; j++)
                if (rows_of[cur ^ 1][0][j]) {
                    for (long b = 0; b < a->D * esize; b += 64) _mm_prefetch(rows_of[cur ^ 1][0][j] + b, _MM_HINT_T0);
                    for (long b = 0; b < a->Dv * esize; b += 64) _mm_prefetch(rows_of[cur ^ 1][1][j] + b, _MM_HINT_T0);
                }
        }
        load_chunk(a, s, rows_of[cur][0], rows_of[cur][1]);
        chunk_scores(a, s, rows);
        chunk_softmax(a, s, rows, c0, have[cur]);
        chunk_values(a, s, rows);
    }
    if (rc != 0) return rc;
    for (long r = 0; r < rows; r++) {
        long head = kvh * G + r % G, token = out_token + r / G;
        float m = s->m[r], l = s->l[r], *acc = s->acc + r * a->Dvp;
        if (a->sinks) {  // one more logit in the denominator, with no value
            float sink = a->sinks[head], mx = sink > m ? sink : m;
            l = l * (m == -INFINITY ? 0.0f : expf(m - mx)) + expf(sink - mx);
            if (m != -INFINITY) scale_row(acc, expf(m - mx), a->Dvp);
        }
        __m512 inv = _mm512_set1_ps(l > 0.0f ? 1.0f / l : 0.0f);
        for (long c = 0; c < a->Dv; c += 16) {
            __m512 o = _mm512_mul_ps(_mm512_loadu_ps(acc + c), inv);
            long at = (token * a->H + head) * a->Dv + c;
            if (a->bf16)
                store_bf16((uint16_t *)out + at, o, tail_mask(a->Dv - c));
            else
                _mm512_mask_storeu_ps((float *)out + at, tail_mask(a->Dv - c), o);
        }
    }
    return 0;
}

// out [sum of q_len][H][Dv] = attention of each group's queries, in group order. Group g's q_len[g]
// queries are the tokens q_start[g].. of q (element (t, h, d) at t * qs + h * qhs + d), at positions
// ctx_len[g] - q_len[g] .. ctx_len[g] - 1 of its sequence, whose keys and values (all of them written
// to the pool already) lie in the pool through its block table (row g of tables). A query at
// position p sees keys max(0, p - window + 1) .. p (window 0: from 0). k/v: element (slot, head, d)
// at slot * ks + head * khs + d. softcap 0: none; sinks: NULL or [H] float32. Returns 0; -1 when a
// block table entry lies outside the pool; -2 when scratch memory could not be allocated; -3 when a
// length needs more blocks than the table's width.
int lantern_prefill_attention(const void *q, long qs, long qhs, long H, long D, const void *k, long ks, long khs,
                              const void *v, long vs, long vhs, long Dv, long KVH, long groups, const int64_t *q_start,
                              const int64_t *q_len, const int64_t *ctx_len, const int32_t *tables, long table_stride,
                              long table_width, long block_size, long num_blocks, float scale, long window,
                              float softcap, const float *sinks, int bf16, void *out, int threads) {
    pf_args a = {(const char *)q, (const char *)k, (const char *)v, qs, qhs, ks, khs, vs, vhs, H, D, Dv,
                 (Dv + 15) / 16 * 16, KVH, H / KVH, bf16, bf16 && BF16_DOTS && D % 2 == 0, 0, tables, table_stride, table_width,
                 block_size, num_blocks, scale, softcap, window, sinks};
    a.words = a.dots ? D / 2 : D;
    long items = 0;
    for (long g = 0; g < groups; g++) items += KVH * ((q_len[g] + QT - 1) / QT);
    long *item_group = (long *)malloc((items + 1) * sizeof(long)), *item_tile = (long *)malloc((items + 1) * sizeof(long));
    long *out_row = (long *)malloc((groups + 1) * sizeof(long));
    if (!item_group || !item_tile || !out_row) return free(item_group), free(item_tile), free(out_row), -2;
    // Items by tile, last tiles first: they see the most keys, and dynamic scheduling then ends evenly.
    long n = 0, max_tiles = 0;
    out_row[0] = 0;
    for (long g = 0; g < groups; g++) {
        long tiles = (q_len[g] + QT - 1) / QT;
        max_tiles = tiles > max_tiles ? tiles : max_tiles;
        out_row[g + 1] = out_row[g] + q_len[g];
    }
    for (long t = max_tiles - 1; t >= 0; t--)
        for (long g = 0; g < groups; g++)
            if (t * QT < q_len[g])
                for (long h = 0; h < KVH; h++) item_group[n] = g, item_tile[n++] = t * KVH + h;
    int status = 0;
    long rows = a.G * QT, kw = (a.words + 15) / 16 * 16;
#pragma omp parallel num_threads(threads) reduction(min : status)
    {
        scratch s;
        size_t floats = rows * a.words + kw * KC + KC * a.Dvp + rows * KC + 2 * rows + rows * a.Dvp;
        float *mem = (float *)malloc(floats * sizeof(float));
        s.qpos = (long *)malloc(rows * sizeof(long));
        if (!mem || !s.qpos) status = -2;
        if (mem) {
            s.qw = (uint32_t *)mem, s.kt = s.qw + rows * a.words, s.vw = (float *)(s.kt + kw * KC);
            s.sc = s.vw + KC * a.Dvp, s.m = s.sc + rows * KC, s.l = s.m + rows, s.acc = s.l + rows;
        }
#pragma omp for schedule(dynamic, 1)
        for (long i = 0; i < items; i++) {
            if (!mem || !s.qpos) continue;
            long g = item_group[i], tile = item_tile[i] / KVH, kvh = item_tile[i] % KVH;
            long nq = q_len[g] - tile * QT < QT ? q_len[g] - tile * QT : QT;
            long qpos0 = ctx_len[g] - q_len[g] + tile * QT;
            int rc = attend_tile(&a, &s, tables + g * table_stride, kvh, qpos0, nq, q_start[g] + tile * QT,
                                 out_row[g] + tile * QT, out);
            if (rc != 0) status = rc;
        }
        free(mem), free(s.qpos);
    }
    free(item_group), free(item_tile), free(out_row);
    return status;
}

/* Paged attention (vLLM's PagedAttention): the causal attention of query rows over the K/V of a
 * sequence held in fixed-size blocks of a pool (nanolm/paged_attention.h). */
#include <math.h>
#include <string.h>
#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "nanolm/paged_attention.h"
#include "nanolm/safetensors.h"
#include "numerics/vexp_simd.h"

/* 16 floats as one value (GCC/Clang vector extension): the compiler emits AVX-512, two AVX2 or
 * four SSE operations. Element-wise + and * are the scalar operations lane by lane. GCC in ISO C
 * mode does not contract a multiply and an add into one fused operation, in these or in the
 * scalar loops whose bits they must equal; Clang contracts both alike. Values of this type go
 * through pointers between functions (no 64-byte vector arguments or results, which change ABI
 * with the target). */
typedef float v16 __attribute__((vector_size(64)));

typedef int8_t c16 __attribute__((vector_size(16)));
/* 8 floats (one AVX2 register, two SSE): kernels whose accumulators must stay in registers hold
 * eight of these, where sixteen 64-byte values would spill on AVX2. Like v16, they go through
 * pointers between functions. */
typedef float v8 __attribute__((vector_size(32)));
static inline __attribute__((always_inline)) void load8(v8 *v, const float *p) { memcpy(v, p, sizeof *v); }
/* 8 int8 codes widened to floats (exact). GCC turns the generic conversion into one byte at a
 * time, so AVX2 builds use the sign-extending instruction. */
typedef int8_t c8 __attribute__((vector_size(8)));
static inline __attribute__((always_inline)) void widen8(v8 *v, const int8_t *p) {
#if defined(__AVX2__)
    long long b;
    memcpy(&b, p, sizeof b);
    const __m256 f = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_cvtsi64_si128(b)));
    memcpy(v, &f, sizeof *v);
#else
    c8 b;
    memcpy(&b, p, sizeof b);
    *v = __builtin_convertvector(b, v8);
#endif
}
/* 8 floats of an fp32 row, or 8 int8 codes widened (I8). */
static inline __attribute__((always_inline)) void row8(v8 *v, const void *p, int I8) {
    if (I8)
        widen8(v, p);
    else
        load8(v, p);
}
static inline void load16(v16 *v, const float *p) { memcpy(v, p, sizeof *v); }

/* Walks the positions of one kv head of a sequence in order without a division or a
 * multiplication per position: the row of position t is block table[t / bs], slot t % bs, and the
 * slots of one head in a block are consecutive rows (hd apart), so the walk steps a pointer and
 * looks the table up once per block. */
typedef struct kv_walk {
    const nl_paged_kv *c;
    const int32_t *table;
    int64_t l, kv, kh, blk, slot, end; /* end: one past the last position walked */
    const float *f;                    /* fp32 pool: the head's row at the current position */
    const int8_t *q;                   /* int8 pool: its codes */
    const uint16_t *s;                 /* and its scale */
} kv_walk;

static inline void walk_block(kv_walk *w) {
    const int32_t id = w->table[w->blk];
    if (w->c->dtype == NL_PAGED_INT8) {
        w->q = nl_paged_codes_at(w->c, id, w->l, (int)w->kv, w->kh, w->slot);
        w->s = nl_paged_scale_at(w->c, id, w->l, (int)w->kv, w->kh, w->slot);
    } else
        w->f = nl_paged_f32_at(w->c, id, w->l, (int)w->kv, w->kh, w->slot);
}
static inline void walk_start(kv_walk *w, const nl_paged_kv *c, const int32_t *table, int64_t l, int kv, int64_t kh,
                              int64_t t, int64_t end) {
    w->c = c, w->table = table, w->l = l, w->kv = kv, w->kh = kh, w->end = end;
    w->blk = t / c->block_size, w->slot = t % c->block_size;
    w->f = NULL, w->q = NULL, w->s = NULL;
    walk_block(w);
}
/* The table entry of the next block is read only if positions before `end` remain in it. */
static inline void walk_next(kv_walk *w) {
    if (++w->slot == w->c->block_size) {
        w->slot = 0, w->blk++;
        if (w->blk * w->c->block_size < w->end) walk_block(w);
        return;
    }
    if (w->c->dtype == NL_PAGED_INT8) {
        w->q += w->c->hd;
        w->s++;
    } else
        w->f += w->c->hd;
}
static inline const float *walk_f32(const kv_walk *w) { return w->f; }
static inline const int8_t *walk_codes(const kv_walk *w) { return w->q; }
static inline float walk_scale(const kv_walk *w) { return nl_st_f16_to_f32(*w->s); }
/* Asks for the cache lines of the head's row at the walk's position. A block's rows of one head
 * are sequential, but each block lies elsewhere in the pool and a prefix written steps ago is out
 * of cache: a read that waits on each block runs at a fraction of the memory bandwidth. */
static inline void walk_prefetch(const kv_walk *w) {
    const int64_t hd = w->c->hd;
    const char *p;
    int64_t bytes;
    if (w->c->dtype == NL_PAGED_INT8) {
        p = (const char *)w->q, bytes = hd;
        __builtin_prefetch(w->s);
    } else
        p = (const char *)w->f, bytes = hd * (int64_t)sizeof(float);
    for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(p + b);
    __builtin_prefetch(p + bytes - 1);
}
/* A second walk KV_AHEAD positions ahead of one at t (inactive when none remain): its rows are
 * prefetched while the first walk's are read. */
enum { KV_AHEAD = 8 };
static inline int walk_ahead(kv_walk *a, const kv_walk *w, int64_t t) {
    if (t + KV_AHEAD >= w->end) return 0;
    walk_start(a, w->c, w->table, w->l, (int)w->kv, w->kh, t + KV_AHEAD, w->end);
    return 1;
}

/* Dimensions i0 .. i0 + lanes - 1 (lanes <= 16) of a K or V row as 16 floats, zero past lanes
 * (int8 codes widened). */
static inline void row16_f32(v16 *out, const float *r, int64_t lanes) {
    if (lanes == 16) {
        load16(out, r);
        return;
    }
    float f[16] = {0};
    memcpy(f, r, (size_t)lanes * sizeof(float));
    load16(out, f);
}
static inline void row16_i8(v16 *out, const int8_t *r, int64_t lanes) {
    c16 b = {0};
    memcpy(&b, r, (size_t)lanes);
    *out = __builtin_convertvector(b, v16);
}

/* The keys of one 16-position tile, positions t0 .. t0 + n - 1 (n <= 16), as 16 float lanes per
 * dimension: dimension i at the returned pointer + i * *stride; for an int8 pool the keys' fp16
 * scales in ks[j] (0 past n), for fp32 ks is all 0. Keys are stored transposed in their blocks
 * (nanolm/paged_attention.h). When the 16 slots from t0's lie in t0's block (always with the
 * default block of 16, whose keys are one tile), fp32 keys are read in place and int8 codes are
 * widened from it into buf; lanes past n are then slots not written for this sequence, whose
 * scores nothing reads (int8: times a scale of 0). Otherwise (a block size that is not a multiple
 * of 16) they are gathered into buf, zero past n. buf: hd x 16 floats; NULL for int8 tiles in place,
 * whose codes are then returned as they are (int8_t, stride block_size). */
static inline const void *key_lanes(const nl_paged_kv *c, const int32_t *table, int64_t l, int64_t kh, int64_t t0,
                                    int64_t n, float *buf, int64_t *stride, float *ks) {
    const int64_t bs = c->block_size, hd = c->hd, s0 = t0 % bs;
    const int in_place = s0 + NL_KV_KTILE <= bs;
    if (c->dtype != NL_PAGED_INT8) {
        for (int j = 0; j < NL_KV_KTILE; j++) ks[j] = 0.0f;
        if (in_place) {
            *stride = bs;
            return nl_paged_key_f32(c, table[t0 / bs], l, kh) + s0;
        }
        for (int64_t j = 0; j < NL_KV_KTILE; j++) {
            const float *col = j < n ? nl_paged_key_f32(c, table[(t0 + j) / bs], l, kh) + (t0 + j) % bs : NULL;
            for (int64_t i = 0; i < hd; i++) buf[i * NL_KV_KTILE + j] = col ? col[i * bs] : 0.0f;
        }
    } else {
        if (in_place) { /* the tile's scales are consecutive slots of one block */
            const uint16_t *sp = nl_paged_scale_at(c, table[t0 / bs], l, 0, kh, s0);
            for (int64_t j = 0; j < NL_KV_KTILE; j++) ks[j] = j < n ? nl_st_f16_to_f32(sp[j]) : 0.0f;
        } else
            for (int64_t j = 0; j < NL_KV_KTILE; j++)
                ks[j] = j < n ? nl_st_f16_to_f32(*nl_paged_scale_at(c, table[(t0 + j) / bs], l, 0, kh, (t0 + j) % bs))
                              : 0.0f;
        if (in_place) {
            const int8_t *codes = nl_paged_key_codes(c, table[t0 / bs], l, kh) + s0;
            if (!buf) { /* the caller widens them as it reads */
                *stride = bs;
                return codes;
            }
            for (int64_t i = 0; i < hd; i++) {
                v8 lo, hi;
                widen8(&lo, codes + i * bs);
                widen8(&hi, codes + i * bs + 8);
                memcpy(buf + i * NL_KV_KTILE, &lo, sizeof lo);
                memcpy(buf + i * NL_KV_KTILE + 8, &hi, sizeof hi);
            }
        } else
            for (int64_t j = 0; j < NL_KV_KTILE; j++) {
                const int8_t *col = j < n ? nl_paged_key_codes(c, table[(t0 + j) / bs], l, kh) + (t0 + j) % bs : NULL;
                for (int64_t i = 0; i < hd; i++) buf[i * NL_KV_KTILE + j] = col ? (float)col[i * bs] : 0.0f;
            }
    }
    *stride = NL_KV_KTILE;
    return buf;
}
/* Asks for the cache lines of a key tile stored in place (fp32: a line per dimension with the
 * default block; int8: the block's codes and scales). */
static inline void key_prefetch(const nl_paged_kv *c, const int32_t *table, int64_t l, int64_t kh, int64_t t0) {
    const int64_t bs = c->block_size, s0 = t0 % bs;
    if (s0 + NL_KV_KTILE > bs) return;
    if (c->dtype == NL_PAGED_INT8) {
        const int8_t *p = nl_paged_key_codes(c, table[t0 / bs], l, kh) + s0;
        for (int64_t i = 0; i < c->hd; i += 64 / NL_KV_KTILE) __builtin_prefetch(p + i * bs);
        __builtin_prefetch(nl_paged_scale_at(c, table[t0 / bs], l, 0, kh, s0));
        return;
    }
    const float *p = nl_paged_key_f32(c, table[t0 / bs], l, kh) + s0;
    for (int64_t i = 0; i < c->hd; i++) __builtin_prefetch(p + i * bs);
}

/* The keys of one 16-position tile as key_lanes gives them, with this tile's values (wanted by
 * the weighted sum after the softmax) and the next tile's keys (wanted after this tile's scores)
 * asked for: by then they are in cache, where a walk that waited on each block would run at a
 * fraction of the memory's speed. */
static const float *key_tile(const nl_paged_kv *c, const int32_t *table, int64_t l, int64_t kh, int64_t t0,
                             int64_t last, float *kt, float *ks, int64_t *stride) {
    const int64_t n_here = last - t0 + 1 < NL_KV_KTILE ? last - t0 + 1 : NL_KV_KTILE;
    kv_walk v;
    walk_start(&v, c, table, l, 1, kh, t0, last + 1);
    for (int64_t j = 0; j < n_here; j++, walk_next(&v)) walk_prefetch(&v);
    if (t0 + NL_KV_KTILE <= last) key_prefetch(c, table, l, kh, t0 + NL_KV_KTILE);
    return (const float *)key_lanes(c, table, l, kh, t0, n_here, kt, stride, ks); /* kt given: floats */
}

/* Scores of query q (hd) against a transposed key tile: a[j] = (sum over i, in order, of
 * q[i] * k[j][i]) * scale, times the key's fp16 scale first for an int8 pool. Each sum is the
 * scalar loop's, 16 of them side by side (no fused multiply-add: the build is ISO C, so the
 * compiler does not contract), so the bits equal a one-position-at-a-time loop. */
static inline void score_out(const v16 *sc, const float *ks, float scale, int int8, float *a) {
    float out[NL_KV_KTILE];
    memcpy(out, sc, sizeof out);
    for (int j = 0; j < NL_KV_KTILE; j++) a[j] = int8 ? out[j] * ks[j] * scale : out[j] * scale;
}
static void tile_scores(const float *q, const float *kt, int64_t kst, const float *ks, int64_t hd, float scale,
                        int int8, float *a) {
    v16 sc = {0}, k;
    for (int64_t i = 0; i < hd; i++) {
        load16(&k, kt + i * kst);
        sc += q[i] * k;
    }
    score_out(&sc, ks, scale, int8, a);
}

/* The scores of NT (1 .. NL_KV_DTILES) key tiles for one query: tile g's 16 lanes of dimension
 * i at p[g] + i * st[g] (floats, or with I8 int8 codes widened as they are read); out + 16 g its
 * 16 sums over i in order, each the scalar loop's. The tiles' sums are independent chains side
 * by side (one tile alone waits on each add); pn[g] (or NULL): the next group's fp32 tiles,
 * prefetched a dimension at a time. */
#define DT_X(g, o) (row8(&x, (const char *)p##g + (o)*esz, I8), x)
#define DT_ACC(g)                                                                                                      \
    do {                                                                                                               \
        lo##g += qi * DT_X(g, 0), hi##g += qi * DT_X(g, 8);                                                            \
        if (pn##g) __builtin_prefetch(pn##g), pn##g += sn##g;                                                          \
        p##g += s##g;                                                                                                  \
    } while (0)
static inline __attribute__((always_inline)) void
dtiles(const void *const p[NL_KV_DTILES], const int64_t st[NL_KV_DTILES], const float *const pn[NL_KV_DTILES],
       const int64_t stn[NL_KV_DTILES], const float *q, int64_t hd, const int NT, const int I8, float *out) {
    const int64_t esz = I8 ? 1 : (int64_t)sizeof(float);
    const char *p0 = p[0], *p1 = p[1], *p2 = p[2], *p3 = p[3];
    const float *pn0 = pn[0], *pn1 = pn[1], *pn2 = pn[2], *pn3 = pn[3];
    const int64_t s0 = st[0] * esz, s1 = st[1] * esz, s2 = st[2] * esz, s3 = st[3] * esz;
    const int64_t sn0 = stn[0], sn1 = stn[1], sn2 = stn[2], sn3 = stn[3];
    v8 lo0 = {0}, hi0 = {0}, lo1 = {0}, hi1 = {0}, lo2 = {0}, hi2 = {0}, lo3 = {0}, hi3 = {0}, x;
    for (int64_t i = 0; i < hd; i++) {
        const float qi = q[i];
        DT_ACC(0);
        if (NT > 1) DT_ACC(1);
        if (NT > 2) DT_ACC(2);
        if (NT > 3) DT_ACC(3);
    }
    const v8 acc[2 * NL_KV_DTILES] = {lo0, hi0, lo1, hi1, lo2, hi2, lo3, hi3};
    memcpy(out, acc, sizeof(float) * 16 * (size_t)NT);
}

/* One query's scores against positions 0 .. last: a[t] = (sum over i, in order, of q[i] *
 * k[t][i]) * scale (times the key's fp16 scale first for an int8 pool), NL_KV_DTILES tiles of 16
 * positions at a time from the transposed keys (fp32 in place, int8 widened: no transpose, no
 * dependent chain of one tile). The next group's keys and this group's values (read by the
 * weighted sum after the softmax) are prefetched as it goes. buf: NL_KV_DTILES x hd x 16 floats. */
static void decode_scores(const nl_paged_kv *c, const int32_t *table, int64_t l, int64_t kh, int64_t last,
                          const float *q, float scale, float *a, float *buf) {
    const int64_t hd = c->hd, n_pos = last + 1, group = NL_KV_DTILES * NL_KV_KTILE, bs = c->block_size;
    const int int8 = c->dtype == NL_PAGED_INT8;
    const void *p[NL_KV_DTILES];
    const float *pn[NL_KV_DTILES] = {NULL, NULL, NULL, NULL};
    int64_t st[NL_KV_DTILES], stn[NL_KV_DTILES] = {0, 0, 0, 0};
    float ks[NL_KV_DTILES][NL_KV_KTILE];
    for (int64_t t0 = 0; t0 < n_pos; t0 += group) {
        int nt = 0;
        int codes = int8; /* int8 tiles all in place: their codes widened as dtiles reads them */
        for (; nt < NL_KV_DTILES && t0 + nt * NL_KV_KTILE < n_pos; nt++) {
            const int64_t tt = t0 + nt * NL_KV_KTILE, n = n_pos - tt < NL_KV_KTILE ? n_pos - tt : NL_KV_KTILE;
            codes &= tt % bs + NL_KV_KTILE <= bs;
            p[nt] = key_lanes(c, table, l, kh, tt, n, codes ? NULL : buf + nt * hd * NL_KV_KTILE, &st[nt], ks[nt]);
        }
        if (int8 && !codes) /* a tile across blocks: every tile of the group widened into buf */
            for (int g = 0; g < nt; g++) {
                const int64_t tt = t0 + g * NL_KV_KTILE, n = n_pos - tt < NL_KV_KTILE ? n_pos - tt : NL_KV_KTILE;
                p[g] = key_lanes(c, table, l, kh, tt, n, buf + g * hd * NL_KV_KTILE, &st[g], ks[g]);
            }
        for (int g = nt; g < NL_KV_DTILES; g++) p[g] = p[0], st[g] = st[0];
        for (int g = 0; g < NL_KV_DTILES; g++) { /* the next group's tiles: fp32 read in place as it goes */
            const int64_t tt = t0 + group + g * NL_KV_KTILE;
            pn[g] = NULL;
            if (tt >= n_pos) continue;
            if (int8)
                key_prefetch(c, table, l, kh, tt);
            else if (tt % bs + NL_KV_KTILE <= bs) {
                pn[g] = nl_paged_key_f32(c, table[tt / bs], l, kh) + tt % bs;
                stn[g] = bs;
            }
        }
        kv_walk v;
        walk_start(&v, c, table, l, 1, kh, t0, n_pos);
        for (int64_t j = 0; j < group && t0 + j < n_pos; j++, walk_next(&v)) walk_prefetch(&v);
        float sc[NL_KV_DTILES * NL_KV_KTILE];
        const void *const *pv = p;
        if (codes && nt == 4)
            dtiles(pv, st, pn, stn, q, hd, 4, 1, sc);
        else if (codes)
            for (int g = 0; g < nt; g++) { /* a last group of fewer tiles: one at a time */
                const void *one[NL_KV_DTILES] = {pv[g], pv[g], pv[g], pv[g]};
                const int64_t so[NL_KV_DTILES] = {st[g], st[g], st[g], st[g]};
                dtiles(one, so, pn, stn, q, hd, 1, 1, sc + g * NL_KV_KTILE);
            }
        else if (nt == 4)
            dtiles(pv, st, pn, stn, q, hd, 4, 0, sc);
        else if (nt == 3)
            dtiles(pv, st, pn, stn, q, hd, 3, 0, sc);
        else if (nt == 2)
            dtiles(pv, st, pn, stn, q, hd, 2, 0, sc);
        else
            dtiles(pv, st, pn, stn, q, hd, 1, 0, sc);
        for (int g = 0; g < nt; g++)
            for (int j = 0; j < NL_KV_KTILE; j++) {
                const float o = sc[g * NL_KV_KTILE + j];
                a[t0 + g * NL_KV_KTILE + j] = int8 ? o * ks[g][j] * scale : o * scale;
            }
    }
}

/* tile_scores for up to 8 queries of one sequence against the same key tile: query r's q at
 * q + r * q_stride, its scores at a + r * a_stride. The eight sums are independent chains in
 * registers (one chain alone waits on each add), each the same sum as tile_scores'; the tile's
 * 16 lanes run as two halves of 8 so that the accumulators fit AVX2's registers. */
enum { SCORE_Q = 8 };
#define SQ_ACC(r) s##r += qr[r][i] * k
static void tile_scores_rows(const float *q, int64_t q_stride, int nr, const float *kt, int64_t kst, const float *ks,
                             int64_t hd, float scale, int int8, float *a, int64_t a_stride) {
    const float *qr[SCORE_Q];
    for (int r = 0; r < SCORE_Q; r++) qr[r] = q + (r < nr ? r : 0) * q_stride; /* rows past nr: dropped */
    float out[SCORE_Q][NL_KV_KTILE];
    for (int half = 0; half < 2; half++) {
        v8 s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0}, s4 = {0}, s5 = {0}, s6 = {0}, s7 = {0};
        const float *kp = kt + 8 * half;
        for (int64_t i = 0; i < hd; i++, kp += kst) {
            v8 k;
            load8(&k, kp);
            SQ_ACC(0);
            SQ_ACC(1);
            SQ_ACC(2);
            SQ_ACC(3);
            SQ_ACC(4);
            SQ_ACC(5);
            SQ_ACC(6);
            SQ_ACC(7);
        }
        const v8 acc[SCORE_Q] = {s0, s1, s2, s3, s4, s5, s6, s7};
        for (int r = 0; r < SCORE_Q; r++) memcpy(out[r] + 8 * half, &acc[r], sizeof acc[r]);
    }
    for (int r = 0; r < nr; r++) {
        v16 sc;
        load16(&sc, out[r]);
        score_out(&sc, ks, scale, int8, a + r * a_stride);
    }
}

/* The largest of a[0..n) that is not NaN (-inf if none), the scalar loop's `if (a[t] > mx) mx =
 * a[t]` run on 16 lanes and then across them: the same value whatever the order (a zero of
 * either sign may come out for zeros of both signs; a[t] - mx and its exp are then the same). */
typedef int32_t i16v __attribute__((vector_size(64)));
static float row_max(const float *a, int64_t n) {
    float mx = -INFINITY;
    int64_t t = 0;
    if (n >= 16) {
        v16 m = {0}, x;
        m -= INFINITY;
        for (; t + 16 <= n; t += 16) {
            load16(&x, a + t);
            i16v gt = x > m, xi, mi;
            memcpy(&xi, &x, sizeof xi);
            memcpy(&mi, &m, sizeof mi);
            mi = (xi & gt) | (mi & ~gt);
            memcpy(&m, &mi, sizeof m);
        }
        float lane[16];
        memcpy(lane, &m, sizeof lane);
        for (int j = 0; j < 16; j++)
            if (lane[j] > mx) mx = lane[j];
    }
    for (; t < n; t++)
        if (a[t] > mx) mx = a[t];
    return mx;
}

/* Softmax of the nq score rows of a tile in place: row r (at s + r * row) holds positions
 * 0 .. pos0 + r; a[t] = exp(a[t] - max) / sum, the sum in position order. The exps are
 * nl_vexpf's (vectorized; the same function as nl_model_step's attention). One row's sum is a
 * chain of dependent adds; the rows of a tile are summed side by side instead, 8 chains at a
 * time, each in position order (each row is padded with +0 up to the tile's longest row: adding
 * +0 to a positive sum changes no bit). */
static void softmax_rows(float *s, int64_t nq, int64_t row, int64_t pos0) {
    const int64_t n_max = pos0 + nq, padded = (n_max + NL_KV_KTILE - 1) / NL_KV_KTILE * NL_KV_KTILE;
    for (int64_t r = 0; r < nq; r++) {
        float *a = s + r * row;
        const int64_t n = pos0 + r + 1;
        const float mx = row_max(a, n);
        nl_vexp_shift(a, a, mx, n); /* nl_vexpf(a[t] - mx), 8 lanes at a time on AVX2 */
        if (nq > 1) memset(a + n, 0, (size_t)(padded - n) * sizeof(float));
    }
    float sum[NL_KV_KTILE];
    for (int64_t r0 = 0; r0 < nq; r0 += NL_KV_KTILE) {
        const int64_t nr = nq - r0 < NL_KV_KTILE ? nq - r0 : NL_KV_KTILE;
        if (nr == 1) {
            const float *a = s + r0 * row;
            sum[0] = 0.0f;
            for (int64_t t = 0; t < pos0 + r0 + 1; t++) sum[0] += a[t];
        } else /* 8 rows side by side: 8 independent chains of scalar adds in position order */
            for (int64_t j0 = 0; j0 < nr; j0 += 8) {
                const int64_t nj = nr - j0 < 8 ? nr - j0 : 8;
                const float *a[8];
                for (int64_t j = 0; j < 8; j++) a[j] = s + (r0 + j0 + (j < nj ? j : 0)) * row; /* past nj: dropped */
                float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f, s4 = 0.0f, s5 = 0.0f, s6 = 0.0f, s7 = 0.0f;
                for (int64_t t = 0; t < padded; t++) {
                    s0 += a[0][t], s1 += a[1][t], s2 += a[2][t], s3 += a[3][t];
                    s4 += a[4][t], s5 += a[5][t], s6 += a[6][t], s7 += a[7][t];
                }
                const float got[8] = {s0, s1, s2, s3, s4, s5, s6, s7};
                for (int64_t j = 0; j < nj; j++) sum[j0 + j] = got[j];
            }
        for (int64_t j = 0; j < nr; j++) {
            float *a = s + (r0 + j) * row;
            for (int64_t t = 0; t < pos0 + r0 + j + 1; t++) a[t] = a[t] / sum[j];
        }
    }
}

#define PV_ROWS  4
#define PV_LANES 16

/* How many of dimensions g + 16k .. g + 16k + 15 exist (k = 0..3) in a head of hd dimensions. */
static inline void lanes64(int64_t hd, int64_t g, int64_t lanes[4]) {
    for (int k = 0; k < 4; k++) {
        int64_t left = hd - g - k * PV_LANES;
        lanes[k] = left < 0 ? 0 : left < PV_LANES ? left : PV_LANES;
    }
}

/* Dimensions g .. g + 63 (lanes[k] of the k-th 16, zero past hd) of the value row of the walk's
 * position as four vectors, and for an int8 pool its fp16 scale in *scale. */
static inline void value64(v16 x[4], const kv_walk *w, int64_t g, const int64_t lanes[4], int full, float *scale) {
    if (full) { /* fp32, all 64 dimensions present */
        const float *v = walk_f32(w) + g;
        for (int k = 0; k < 4; k++) load16(&x[k], v + k * PV_LANES);
    } else if (w->c->dtype == NL_PAGED_INT8) {
        const int8_t *r = walk_codes(w) + g;
        for (int k = 0; k < 4; k++) row16_i8(&x[k], r + k * PV_LANES, lanes[k]);
        *scale = walk_scale(w);
    } else
        for (int k = 0; k < 4; k++) row16_f32(&x[k], walk_f32(w) + g + k * PV_LANES, lanes[k]);
}

/* Moves a walk KV_AHEAD positions ahead of position t one position on, having prefetched its row
 * (*pf: 0 once it has passed the end). */
static inline void ahead_next(kv_walk *a, int *pf, int64_t t) {
    if (!*pf) return;
    walk_prefetch(a);
    if ((*pf = t + 1 + KV_AHEAD < a->end)) walk_next(a);
}

/* A value row's 8 floats at dimension offset d: fp32 in place, or int8 codes widened. */
#define PV_X(d) (row8(&x, I8 ? (const void *)(vc + (d)) : (const void *)(vf + (d)), I8), x)

/* pv_decode's sums, dimensions g .. g + 8 NV - 1 (all present): NV (4 or 8) register
 * accumulators of 8 floats, the table walked a block at a time (the rows of one head in a block
 * are consecutive), the next block's row of the same slot prefetched as each is read. I8: an
 * int8 pool (p times the value's fp16 scale, as pv_decode). */
#define PV_ACC(j) a##j += pt * PV_X(8 * (j))
static inline __attribute__((always_inline)) void pv_block(const nl_paged_kv *c, const int32_t *table, int64_t l,
                                                           int64_t kh, int64_t pos, const float *p, int64_t g,
                                                           const int NV, const int I8, float *out) {
    const int64_t hd = c->hd, bs = c->block_size;
    const int64_t esz = I8 ? 1 : (int64_t)sizeof(float);
    v8 a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, a4 = {0}, a5 = {0}, a6 = {0}, a7 = {0};
    for (int64_t b = 0, t = 0; t <= pos; b++) {
        const char *row = I8 ? (const char *)nl_paged_codes_at(c, table[b], l, 1, kh, 0)
                             : (const char *)nl_paged_f32_at(c, table[b], l, 1, kh, 0);
        const uint16_t *sc = I8 ? nl_paged_scale_at(c, table[b], l, 1, kh, 0) : NULL;
        const char *rn = NULL;
        if ((b + 1) * bs <= pos)
            rn = I8 ? (const char *)nl_paged_codes_at(c, table[b + 1], l, 1, kh, 0)
                    : (const char *)nl_paged_f32_at(c, table[b + 1], l, 1, kh, 0);
        const int64_t n = pos + 1 - t < bs ? pos + 1 - t : bs;
        for (int64_t sl = 0; sl < n; sl++, t++) {
            const char *r = row + (sl * hd + g) * esz;
            const float *vf = (const float *)(const void *)r;
            const int8_t *vc = (const int8_t *)r;
            if (rn) {
                __builtin_prefetch(rn + (sl * hd + g) * esz);
                __builtin_prefetch(rn + (sl * hd + g) * esz + 8 * NV * esz - 1);
            }
            const float pt = I8 ? p[t] * nl_st_f16_to_f32(sc[sl]) : p[t];
            v8 x;
            PV_ACC(0);
            PV_ACC(1);
            PV_ACC(2);
            PV_ACC(3);
            if (NV > 4) {
                PV_ACC(4);
                PV_ACC(5);
                PV_ACC(6);
                PV_ACC(7);
            }
        }
    }
    const v8 acc[8] = {a0, a1, a2, a3, a4, a5, a6, a7};
    memcpy(out, acc, sizeof(float) * 8 * (size_t)NV);
}

/* One token's output (hd) at position pos: out[i] = sum over positions 0 .. pos, in order, of
 * p[t] * v[t][i] (p times the value's fp16 scale for an int8 pool), started from 0. 64
 * dimensions at a time in four register accumulators, so each value row is read once per 64
 * dimensions and the four chains overlap; an fp32 head of 32 dimensions (or 16, 48) loads only
 * the vectors it has. The rows KV_AHEAD positions on are prefetched as the walk goes. */
static void pv_decode(const nl_paged_kv *c, const int32_t *table, int64_t l, int64_t kh, int64_t pos, const float *p,
                      float *out) {
    const int64_t hd = c->hd;
    const int int8 = c->dtype == NL_PAGED_INT8;
    for (int64_t g = 0; g < hd; g += 4 * PV_LANES) {
        if (hd - g >= 64 || hd - g == 32) { /* whole groups of 64 or a last 32 */
            if (int8 && hd - g >= 64)
                pv_block(c, table, l, kh, pos, p, g, 8, 1, out + g);
            else if (int8)
                pv_block(c, table, l, kh, pos, p, g, 4, 1, out + g);
            else if (hd - g >= 64)
                pv_block(c, table, l, kh, pos, p, g, 8, 0, out + g);
            else
                pv_block(c, table, l, kh, pos, p, g, 4, 0, out + g);
            continue;
        }
        int64_t lanes[4];
        lanes64(hd, g, lanes);
        int whole = 0; /* fp32 with every present group of 16 complete: how many groups */
        if (!int8) {
            while (whole < 4 && lanes[whole] == PV_LANES) whole++;
            if (whole < 4 && lanes[whole] != 0) whole = 0;
        }
        v16 a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
        kv_walk w, ahead = {0};
        walk_start(&w, c, table, l, 1, kh, 0, pos + 1);
        int pf = walk_ahead(&ahead, &w, 0);
        if (whole == 4) {
            for (int64_t t = 0; t <= pos; t++, walk_next(&w)) {
                ahead_next(&ahead, &pf, t);
                const float *v = walk_f32(&w) + g, pt = p[t];
                v16 x0, x1, x2, x3;
                load16(&x0, v);
                load16(&x1, v + PV_LANES);
                load16(&x2, v + 2 * PV_LANES);
                load16(&x3, v + 3 * PV_LANES);
                a0 += pt * x0;
                a1 += pt * x1;
                a2 += pt * x2;
                a3 += pt * x3;
            }
        } else if (whole == 2) {
            for (int64_t t = 0; t <= pos; t++, walk_next(&w)) {
                ahead_next(&ahead, &pf, t);
                const float *v = walk_f32(&w) + g, pt = p[t];
                v16 x0, x1;
                load16(&x0, v);
                load16(&x1, v + PV_LANES);
                a0 += pt * x0;
                a1 += pt * x1;
            }
        } else {
            float scale = 1.0f;
            for (int64_t t = 0; t <= pos; t++, walk_next(&w)) {
                ahead_next(&ahead, &pf, t);
                v16 x[4];
                value64(x, &w, g, lanes, 0, &scale);
                const float pt = int8 ? p[t] * scale : p[t];
                a0 += pt * x[0];
                a1 += pt * x[1];
                a2 += pt * x[2];
                a3 += pt * x[3];
            }
        }
        float o[4 * PV_LANES];
        memcpy(o, &a0, sizeof a0);
        memcpy(o + PV_LANES, &a1, sizeof a1);
        memcpy(o + 2 * PV_LANES, &a2, sizeof a2);
        memcpy(o + 3 * PV_LANES, &a3, sizeof a3);
        for (int k = 0; k < 4; k++) memcpy(out + g + k * PV_LANES, o + k * PV_LANES, (size_t)lanes[k] * sizeof(float));
    }
}

/* pv_rows' sums over positions 0 .. pos with all 64 dimensions present: acc[k][d] += pr[k][t] *
 * v[t][off + 16 d ..] (pr times the value's fp16 scale for an int8 pool, I8). Sixteen dimensions
 * at a time for the 4 tokens (8 register accumulators of 8 floats; 64-byte ones would spill on
 * AVX2), the table walked a block at a time; the first pass prefetches the next block's rows, the
 * later ones find them in cache. */
#define PVR_ACC(k)                                                                                                     \
    do {                                                                                                               \
        const float pt = I8 ? pr[k][t] * s : pr[k][t];                                                                 \
        lo##k += pt * x0, hi##k += pt * x1;                                                                            \
    } while (0)
static inline __attribute__((always_inline)) void pv_rows_block(const nl_paged_kv *c, const int32_t *table, int64_t l,
                                                                int64_t kh, int64_t off, int64_t pos,
                                                                const float *const pr[PV_ROWS], v16 acc[PV_ROWS][4],
                                                                const int I8) {
    const int64_t hd = c->hd, bs = c->block_size, esz = I8 ? 1 : (int64_t)sizeof(float);
    for (int d = 0; d < 4; d++) {
        v8 lo0 = {0}, hi0 = {0}, lo1 = {0}, hi1 = {0}, lo2 = {0}, hi2 = {0}, lo3 = {0}, hi3 = {0};
        for (int64_t b = 0, t = 0; t <= pos; b++) {
            const char *row = I8 ? (const char *)nl_paged_codes_at(c, table[b], l, 1, kh, 0)
                                 : (const char *)nl_paged_f32_at(c, table[b], l, 1, kh, 0);
            const uint16_t *sc = I8 ? nl_paged_scale_at(c, table[b], l, 1, kh, 0) : NULL;
            const char *rn = NULL;
            if (d == 0 && (b + 1) * bs <= pos)
                rn = I8 ? (const char *)nl_paged_codes_at(c, table[b + 1], l, 1, kh, 0)
                        : (const char *)nl_paged_f32_at(c, table[b + 1], l, 1, kh, 0);
            const int64_t n = pos + 1 - t < bs ? pos + 1 - t : bs;
            for (int64_t sl = 0; sl < n; sl++, t++) {
                const char *r = row + (sl * hd + off + d * PV_LANES) * esz;
                const float *vf = (const float *)(const void *)r;
                const int8_t *vc = (const int8_t *)r;
                if (rn) {
                    __builtin_prefetch(rn + (sl * hd + off) * esz);
                    __builtin_prefetch(rn + (sl * hd + off) * esz + 64 * esz - 1);
                }
                const float s = I8 ? nl_st_f16_to_f32(sc[sl]) : 1.0f;
                v8 x, x0, x1;
                x0 = PV_X(0);
                x1 = PV_X(8);
                PVR_ACC(0);
                PVR_ACC(1);
                PVR_ACC(2);
                PVR_ACC(3);
            }
        }
        const v8 h[2 * PV_ROWS] = {lo0, hi0, lo1, hi1, lo2, hi2, lo3, hi3};
        for (int k = 0; k < PV_ROWS; k++) memcpy(&acc[k][d], &h[2 * k], sizeof acc[k][d]);
    }
}

/* Dimensions g .. g + 63 (lanes[k] of each 16 valid) of the outputs of 2 <= nr <= PV_ROWS tokens
 * at positions pos, pos + 1, ...: token k's output is the sum over positions 0 .. pos + k, in
 * order, of p[k * row + t] * v[t] (p times the value's fp16 scale for an int8 pool), started
 * from 0: the same sums as pv_decode's. Sixteen accumulators (4 tokens x 64 dimensions) in
 * registers, so each value row is read once for the 4 tokens and 64 dimensions and the table is
 * walked once per group of 64 dimensions. */
static void pv_rows(const nl_paged_kv *c, const int32_t *table, int64_t l, int64_t kh, int64_t pos, int nr, int64_t g,
                    const int64_t lanes[4], const float *p, int64_t row, float *out, int64_t out_stride) {
    const int int8 = c->dtype == NL_PAGED_INT8, full = !int8 && lanes[3] == PV_LANES, whole = lanes[3] == PV_LANES;
    /* rows past nr read row 0's weights and are dropped */
    const float *pr[PV_ROWS];
    for (int k = 0; k < PV_ROWS; k++) pr[k] = p + (k < nr ? k : 0) * row;
    v16 acc[PV_ROWS][4];
    memset(acc, 0, sizeof acc);
    float scale = 1.0f;
    kv_walk w;
    walk_start(&w, c, table, l, 1, kh, 0, pos + nr);
    /* positions 0 .. pos, which all nr tokens see */
    if (whole) { /* accumulators in registers, then the walk goes on from pos + 1 */
        if (int8)
            pv_rows_block(c, table, l, kh, g, pos, pr, acc, 1);
        else
            pv_rows_block(c, table, l, kh, g, pos, pr, acc, 0);
        walk_start(&w, c, table, l, 1, kh, pos + 1, pos + nr);
    } else
        for (int64_t t = 0; t <= pos; t++, walk_next(&w)) {
            v16 x[4];
            value64(x, &w, g, lanes, full, &scale);
            for (int k = 0; k < PV_ROWS; k++) {
                const float pt = int8 ? pr[k][t] * scale : pr[k][t];
                for (int d = 0; d < 4; d++) acc[k][d] += pt * x[d];
            }
        }
    for (int64_t t = pos + 1; t < pos + nr; t++, walk_next(&w)) { /* the chunk's own positions: token k sees pos + k */
        v16 x[4];
        value64(x, &w, g, lanes, full, &scale);
        for (int k = (int)(t - pos); k < nr; k++) {
            const float pt = int8 ? p[k * row + t] * scale : p[k * row + t];
            for (int d = 0; d < 4; d++) acc[k][d] += pt * x[d];
        }
    }
    for (int k = 0; k < nr; k++) {
        float o[4 * PV_LANES];
        memcpy(o, acc[k], sizeof o);
        for (int d = 0; d < 4; d++)
            memcpy(out + k * out_stride + g + d * PV_LANES, o + d * PV_LANES, (size_t)lanes[d] * sizeof(float));
    }
}

/* The same arithmetic as the contiguous cache of src/model/infer.c (attend_fp32 / attend_int8),
 * walking the block table: every score a sum over the head dimension in order, max-shifted exp,
 * weighted sum over positions in order. The nq queries of a tile share each transposed key tile
 * and each value row they read, which is what makes a prompt chunk's attention cheap; the
 * arithmetic of each query is the same whatever tile it is in. */
void nl_paged_attend_rows(const nl_paged_kv *c, const int32_t *table, int64_t l, int64_t pos0, int64_t nq,
                          const float *q, int64_t q_stride, int64_t NH, int64_t h, float *out, int64_t out_stride,
                          float *scratch) {
    const int64_t KVH = c->KVH, hd = c->hd, kh = h / (NH / KVH);
    const int64_t last = pos0 + nq - 1, n_pos = last + 1, row = n_pos + NL_KV_KTILE;
    const float scale = 1.0f / sqrtf((float)hd);
    const int int8 = c->dtype == NL_PAGED_INT8;
    float *kt = scratch + nq * row, ks[NL_KV_KTILE];
    if (nq == 1) { /* a decode: fp32 keys read in place, int8 blocks multiplied in registers */
        decode_scores(c, table, l, kh, last, q + h * hd, scale, scratch, kt);
        softmax_rows(scratch, 1, row, pos0);
        pv_decode(c, table, l, kh, pos0, scratch, out);
        return;
    }
    /* scores: row r of the tile (position pos0 + r) needs positions 0..pos0 + r */
    for (int64_t t0 = 0; t0 < n_pos; t0 += NL_KV_KTILE) {
        int64_t kst;
        const float *kp = key_tile(c, table, l, kh, t0, last, kt, ks, &kst);
        for (int64_t r = t0 > pos0 ? t0 - pos0 : 0; r < nq; r += SCORE_Q) {
            const int nr = nq - r < SCORE_Q ? (int)(nq - r) : SCORE_Q;
            if (nr == 1) /* a chunk's last row: one chain, no dropped rows */
                tile_scores(q + r * q_stride + h * hd, kp, kst, ks, hd, scale, int8, scratch + r * row + t0);
            else
                tile_scores_rows(q + r * q_stride + h * hd, q_stride, nr, kp, kst, ks, hd, scale, int8,
                                 scratch + r * row + t0, row);
        }
    }
    softmax_rows(scratch, nq, row, pos0);
    if (nq == 1) {
        pv_decode(c, table, l, kh, pos0, scratch, out);
        return;
    }
    /* weighted sum: 4 tokens and 64 dimensions at a time, in registers, each value row read once
     * for the 4 tokens (a last group of one token runs pv_decode's sums) */
    for (int64_t r0 = 0; r0 < nq; r0 += PV_ROWS) {
        const int nr = nq - r0 < PV_ROWS ? (int)(nq - r0) : PV_ROWS;
        if (nr == 1) {
            pv_decode(c, table, l, kh, pos0 + r0, scratch + r0 * row, out + r0 * out_stride);
            continue;
        }
        for (int64_t g = 0; g < hd; g += 4 * PV_LANES) {
            int64_t lanes[4];
            lanes64(hd, g, lanes);
            pv_rows(c, table, l, kh, pos0 + r0, nr, g, lanes, scratch + r0 * row, row, out + r0 * out_stride,
                    out_stride);
        }
    }
}

void nl_paged_attend_head(const nl_paged_kv *c, const int32_t *table, int64_t l, int64_t pos, const float *q,
                          int64_t NH, int64_t h, float *out, float *scratch) {
    nl_paged_attend_rows(c, table, l, pos, 1, q, 0, NH, h, out, 0, scratch);
}

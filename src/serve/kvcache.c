/* The paged KV cache: block pool, free list, per-token store and paged attention (kvcache.h). */
#include <math.h>
#include <string.h>

#include "nanolm/formats.h"
#include "nanolm/kvcache.h"

size_t nl_kvcache_block_bytes(int64_t L, int64_t KVH, int64_t hd, nl_kv_dtype dt, int64_t block_size) {
    size_t rows = (size_t)(L * 2 * block_size);
    if (dt == NL_KV_INT8) return rows * (size_t)(KVH * hd) + rows * (size_t)KVH * sizeof(uint16_t);
    return rows * (size_t)(KVH * hd) * sizeof(float);
}

nl_status nl_kvcache_init(nl_kvcache *c, int64_t L, int64_t KVH, int64_t hd, nl_kv_dtype dt, int64_t block_size,
                          int64_t n_blocks) {
    memset(c, 0, sizeof *c);
    if (L < 1 || KVH < 1 || hd < 1 || block_size < 1 || n_blocks < 1)
        return nl_fail(NL_ERR_INVALID,
                       "KV cache: layers %lld, kv heads %lld, head dim %lld, block size %lld, blocks %lld "
                       "must all be positive",
                       (long long)L, (long long)KVH, (long long)hd, (long long)block_size, (long long)n_blocks);
    if (n_blocks > INT32_MAX) return nl_fail(NL_ERR_RANGE, "KV cache: %lld blocks is too many", (long long)n_blocks);
    if (dt != NL_KV_FP32 && dt != NL_KV_INT8) return nl_fail(NL_ERR_INVALID, "KV cache: unknown type %d", (int)dt);
    c->L = L;
    c->KVH = KVH;
    c->hd = hd;
    c->block_size = block_size;
    c->n_blocks = n_blocks;
    c->dtype = dt;
    c->block_bytes = nl_kvcache_block_bytes(L, KVH, hd, dt, block_size);
    size_t rows = (size_t)(n_blocks * L * 2 * block_size);
    if (dt == NL_KV_INT8) {
        c->codes = nl_malloc(rows * (size_t)(KVH * hd), "int8 KV cache pool codes");
        c->scales = nl_malloc(rows * (size_t)KVH * sizeof(uint16_t), "int8 KV cache pool scales");
        if (!c->codes || !c->scales) {
            nl_kvcache_free(c);
            return NL_ERR_NOMEM;
        }
    } else {
        c->f32 = nl_malloc(rows * (size_t)(KVH * hd) * sizeof(float), "fp32 KV cache pool");
        if (!c->f32) {
            nl_kvcache_free(c);
            return NL_ERR_NOMEM;
        }
    }
    c->free_ids = nl_malloc((size_t)n_blocks * sizeof(int32_t), "KV cache free list");
    if (!c->free_ids) {
        nl_kvcache_free(c);
        return NL_ERR_NOMEM;
    }
    /* the stack pops block 0 first */
    for (int64_t i = 0; i < n_blocks; i++) c->free_ids[i] = (int32_t)(n_blocks - 1 - i);
    c->n_free = n_blocks;
    return NL_OK;
}

void nl_kvcache_free(nl_kvcache *c) {
    if (!c) return;
    nl_free(c->f32);
    nl_free(c->codes);
    nl_free(c->scales);
    nl_free(c->free_ids);
    memset(c, 0, sizeof *c);
}

int32_t nl_kvcache_alloc(nl_kvcache *c) {
    if (c->n_free == 0) return -1;
    return c->free_ids[--c->n_free];
}

void nl_kvcache_release(nl_kvcache *c, int32_t id) {
    if (id < 0 || id >= c->n_blocks || c->n_free >= c->n_blocks) return;
    c->free_ids[c->n_free++] = id;
}

void nl_kvcache_store(nl_kvcache *c, const int32_t *table, int64_t l, int64_t pos, const float *k, const float *v) {
    int32_t id = table[pos / c->block_size];
    int64_t slot = pos % c->block_size, kvd = c->KVH * c->hd;
    if (c->dtype == NL_KV_INT8) {
        nl_kv_quantize_token(nl_kvcache_codes_row(c, id, l, 0, slot), nl_kvcache_scales_row(c, id, l, 0, slot), k,
                             c->KVH, c->hd);
        nl_kv_quantize_token(nl_kvcache_codes_row(c, id, l, 1, slot), nl_kvcache_scales_row(c, id, l, 1, slot), v,
                             c->KVH, c->hd);
    } else {
        memcpy(nl_kvcache_f32_row(c, id, l, 0, slot), k, (size_t)kvd * sizeof(float));
        memcpy(nl_kvcache_f32_row(c, id, l, 1, slot), v, (size_t)kvd * sizeof(float));
    }
}

/* The same arithmetic as the contiguous cache of src/model/infer.c (attend_fp32 / attend_int8),
 * walking the block table: scores in position order, max-shifted exp, weighted sum in order. */
void nl_kvcache_attend_head(const nl_kvcache *c, const int32_t *table, int64_t l, int64_t pos, const float *q,
                            int64_t NH, int64_t h, float *out, float *a) {
    const int64_t KVH = c->KVH, hd = c->hd, bs = c->block_size, group = NH / KVH;
    const float scale = 1.0f / sqrtf((float)hd);
    const int int8 = c->dtype == NL_KV_INT8;
    {
        const int64_t kh = h / group;
        const float *qh = q + h * hd;
        float mx = -INFINITY;
        int64_t t = 0;
        if (!int8) /* 8 positions at a time: 8 independent sums, each still over i in order */
            for (; t + 8 <= pos + 1; t += 8) {
                const float *k[8];
                float sc[8] = {0};
                for (int j = 0; j < 8; j++)
                    k[j] = nl_kvcache_f32_row(c, table[(t + j) / bs], l, 0, (t + j) % bs) + kh * hd;
                for (int64_t i = 0; i < hd; i++)
                    for (int j = 0; j < 8; j++) sc[j] += qh[i] * k[j][i];
                for (int j = 0; j < 8; j++) {
                    a[t + j] = sc[j] * scale;
                    if (a[t + j] > mx) mx = a[t + j];
                }
            }
        for (; t <= pos; t++) {
            int32_t id = table[t / bs];
            int64_t slot = t % bs;
            float sc = 0.0f;
            if (int8) {
                const int8_t *k = nl_kvcache_codes_row(c, id, l, 0, slot) + kh * hd;
                for (int64_t i = 0; i < hd; i++) sc += qh[i] * (float)k[i];
                a[t] = sc * nl_fmt_decode(NL_FMT_FP16, nl_kvcache_scales_row(c, id, l, 0, slot)[kh]) * scale;
            } else {
                const float *k = nl_kvcache_f32_row(c, id, l, 0, slot) + kh * hd;
                for (int64_t i = 0; i < hd; i++) sc += qh[i] * k[i];
                a[t] = sc * scale;
            }
            if (a[t] > mx) mx = a[t];
        }
        float sum = 0.0f;
        for (int64_t t = 0; t <= pos; t++) {
            a[t] = expf(a[t] - mx);
            sum += a[t];
        }
        float *o = out;
        for (int64_t i = 0; i < hd; i++) o[i] = 0.0f;
        for (int64_t t = 0; t <= pos; t++) {
            int32_t id = table[t / bs];
            int64_t slot = t % bs;
            if (int8) {
                const int8_t *v = nl_kvcache_codes_row(c, id, l, 1, slot) + kh * hd;
                float p = a[t] / sum * nl_fmt_decode(NL_FMT_FP16, nl_kvcache_scales_row(c, id, l, 1, slot)[kh]);
                for (int64_t i = 0; i < hd; i++) o[i] += p * (float)v[i];
            } else {
                const float *v = nl_kvcache_f32_row(c, id, l, 1, slot) + kh * hd;
                float p = a[t] / sum;
                for (int64_t i = 0; i < hd; i++) o[i] += p * v[i];
            }
        }
    }
}

size_t nl_kvcache_seq_bytes(int64_t L, int64_t KVH, int64_t hd, nl_kv_dtype dt, int64_t n_tokens) {
    size_t rows = (size_t)L * 2 * (size_t)n_tokens;
    if (dt == NL_KV_INT8) return rows * (size_t)(KVH * hd) + rows * (size_t)KVH * sizeof(uint16_t);
    return rows * (size_t)(KVH * hd) * sizeof(float);
}

/* One walk for both directions: to_pool 0 copies pool -> buf, 1 copies buf -> pool. */
static void seq_copy(const nl_kvcache *c, const int32_t *table, int64_t n, uint8_t *buf, int to_pool) {
    const int64_t kvd = c->KVH * c->hd;
    const size_t row_bytes = c->dtype == NL_KV_INT8 ? (size_t)kvd : (size_t)kvd * sizeof(float);
    const size_t scale_bytes = (size_t)c->KVH * sizeof(uint16_t);
    uint8_t *scales = buf + (size_t)(c->L * 2 * n) * row_bytes; /* int8 only */
    for (int64_t l = 0; l < c->L; l++)
        for (int kv = 0; kv < 2; kv++)
            for (int64_t t = 0; t < n; t++) {
                int32_t id = table[t / c->block_size];
                int64_t slot = t % c->block_size, r = (l * 2 + kv) * n + t;
                uint8_t *b = buf + (size_t)r * row_bytes;
                uint8_t *p = c->dtype == NL_KV_INT8 ? (uint8_t *)nl_kvcache_codes_row(c, id, l, kv, slot)
                                                    : (uint8_t *)nl_kvcache_f32_row(c, id, l, kv, slot);
                if (to_pool)
                    memcpy(p, b, row_bytes);
                else
                    memcpy(b, p, row_bytes);
                if (c->dtype != NL_KV_INT8) continue;
                uint8_t *sb = scales + (size_t)r * scale_bytes,
                        *sp = (uint8_t *)nl_kvcache_scales_row(c, id, l, kv, slot);
                if (to_pool)
                    memcpy(sp, sb, scale_bytes);
                else
                    memcpy(sb, sp, scale_bytes);
            }
}

void nl_kvcache_gather(const nl_kvcache *c, const int32_t *table, int64_t n_tokens, uint8_t *dst) {
    seq_copy(c, table, n_tokens, dst, 0);
}

void nl_kvcache_scatter(nl_kvcache *c, const int32_t *table, int64_t n_tokens, const uint8_t *src) {
    seq_copy(c, table, n_tokens, (uint8_t *)src, 1);
}

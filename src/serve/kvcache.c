/* The paged KV cache's storage: the pool's memory, the per-token store and the copies of a
 * sequence out and in (kvcache.h). Its bookkeeping is block_pool.c's, its attention
 * numerics/paged_attention.c's. */
#include <math.h>
#include <string.h>

#include "nanolm/formats.h"
#include "nanolm/kvcache.h"
#include "nanolm/safetensors.h"

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
    if (dt == NL_KV_INT8 && hd > NL_KVCACHE_INT8_MAX_HD)
        return nl_fail(NL_ERR_INVALID, "KV cache: an int8 cache takes heads of at most %d dimensions, got %lld",
                       NL_KVCACHE_INT8_MAX_HD, (long long)hd);
    c->L = L;
    c->KVH = KVH;
    c->hd = hd;
    c->block_size = block_size;
    c->n_blocks = n_blocks;
    c->dtype = dt;
    c->block_bytes = nl_kvcache_block_bytes(L, KVH, hd, dt, block_size);
    size_t rows = (size_t)(n_blocks * L * 2 * block_size);
    if (dt == NL_KV_INT8) {
        c->codes = nl_malloc_huge(rows * (size_t)(KVH * hd), "int8 KV cache pool codes");
        c->scales = nl_malloc(rows * (size_t)KVH * sizeof(uint16_t), "int8 KV cache pool scales");
        if (!c->codes || !c->scales) {
            nl_kvcache_free(c);
            return NL_ERR_NOMEM;
        }
    } else {
        c->f32 = nl_malloc_huge(rows * (size_t)(KVH * hd) * sizeof(float), "fp32 KV cache pool");
        if (!c->f32) {
            nl_kvcache_free(c);
            return NL_ERR_NOMEM;
        }
    }
    return NL_OK;
}

void nl_kvcache_free(nl_kvcache *c) {
    if (!c) return;
    nl_free(c->f32);
    nl_free(c->codes);
    nl_free(c->scales);
    memset(c, 0, sizeof *c);
}

void nl_kvcache_store(nl_kvcache *c, const int32_t *table, int64_t l, int64_t pos, const float *k, const float *v) {
    const int32_t id = table[pos / c->block_size];
    const int64_t slot = pos % c->block_size, hd = c->hd;
    for (int64_t kh = 0; kh < c->KVH; kh++) {
        if (c->dtype == NL_KV_INT8) { /* key codes transposed: quantized into a row, then a column */
            int8_t row[NL_KVCACHE_INT8_MAX_HD], *kc = nl_paged_key_codes(c, id, l, kh) + slot;
            nl_kv_quantize_token(row, nl_kvcache_scale_at(c, id, l, 0, kh, slot), k + kh * hd, 1, hd);
            for (int64_t i = 0; i < hd; i++) kc[i * c->block_size] = row[i];
            nl_kv_quantize_token(nl_kvcache_codes_at(c, id, l, 1, kh, slot), nl_kvcache_scale_at(c, id, l, 1, kh, slot),
                                 v + kh * hd, 1, hd);
        } else {
            float *kc = nl_paged_key_f32(c, id, l, kh) + slot; /* keys transposed: a column */
            for (int64_t i = 0; i < hd; i++) kc[i * c->block_size] = k[kh * hd + i];
            memcpy(nl_kvcache_f32_at(c, id, l, 1, kh, slot), v + kh * hd, (size_t)hd * sizeof(float));
        }
    }
}

size_t nl_kvcache_seq_bytes(int64_t L, int64_t KVH, int64_t hd, nl_kv_dtype dt, int64_t n_tokens) {
    size_t rows = (size_t)L * 2 * (size_t)n_tokens;
    if (dt == NL_KV_INT8) return rows * (size_t)(KVH * hd) + rows * (size_t)KVH * sizeof(uint16_t);
    return rows * (size_t)(KVH * hd) * sizeof(float);
}

/* One walk for both directions: to_pool 0 copies pool -> buf, 1 copies buf -> pool. The buffer
 * holds row r = (l * 2 + kv) * n + t of all KVH heads (KVH * hd values), then for int8 the
 * scales in the same row order (KVH each): independent of the block size, of the pool's
 * head-major order and of its transposed keys. */
static void seq_copy(const nl_kvcache *c, const int32_t *table, int64_t n, uint8_t *buf, int to_pool) {
    const int64_t hd = c->hd, KVH = c->KVH;
    const int int8 = c->dtype == NL_KV_INT8;
    const size_t head_bytes = int8 ? (size_t)hd : (size_t)hd * sizeof(float), row_bytes = (size_t)KVH * head_bytes;
    uint8_t *scales = buf + (size_t)(c->L * 2 * n) * row_bytes; /* int8 only */
    for (int64_t l = 0; l < c->L; l++)
        for (int kv = 0; kv < 2; kv++)
            for (int64_t t = 0; t < n; t++) {
                const int32_t id = table[t / c->block_size];
                const int64_t slot = t % c->block_size, r = (l * 2 + kv) * n + t;
                for (int64_t kh = 0; kh < KVH; kh++) {
                    uint8_t *b = buf + (size_t)r * row_bytes + (size_t)kh * head_bytes;
                    if (kv == 0) { /* keys: a column of the transposed block */
                        const size_t esz = int8 ? 1 : sizeof(float);
                        uint8_t *col = int8 ? (uint8_t *)nl_paged_key_codes(c, id, l, kh) + slot
                                            : (uint8_t *)(nl_paged_key_f32(c, id, l, kh) + slot);
                        for (int64_t i = 0; i < hd; i++) {
                            uint8_t *e = col + (size_t)(i * c->block_size) * esz, *f = b + (size_t)i * esz;
                            memcpy(to_pool ? e : f, to_pool ? f : e, esz);
                        }
                        if (!int8) continue;
                        uint8_t *sb = scales + ((size_t)r * (size_t)KVH + (size_t)kh) * sizeof(uint16_t);
                        uint8_t *sp = (uint8_t *)nl_kvcache_scale_at(c, id, l, kv, kh, slot);
                        memcpy(to_pool ? sp : sb, to_pool ? sb : sp, sizeof(uint16_t));
                        continue;
                    }
                    uint8_t *p = int8 ? (uint8_t *)nl_kvcache_codes_at(c, id, l, kv, kh, slot)
                                      : (uint8_t *)nl_kvcache_f32_at(c, id, l, kv, kh, slot);
                    memcpy(to_pool ? p : b, to_pool ? b : p, head_bytes);
                    if (!int8) continue;
                    uint8_t *sb = scales + ((size_t)r * (size_t)KVH + (size_t)kh) * sizeof(uint16_t);
                    uint8_t *sp = (uint8_t *)nl_kvcache_scale_at(c, id, l, kv, kh, slot);
                    memcpy(to_pool ? sp : sb, to_pool ? sb : sp, sizeof(uint16_t));
                }
            }
}

void nl_kvcache_gather(const nl_kvcache *c, const int32_t *table, int64_t n_tokens, uint8_t *dst) {
    seq_copy(c, table, n_tokens, dst, 0);
}

void nl_kvcache_scatter(nl_kvcache *c, const int32_t *table, int64_t n_tokens, const uint8_t *src) {
    seq_copy(c, table, n_tokens, (uint8_t *)src, 1);
}

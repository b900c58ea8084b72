/*
 * nanolm kvcache: the storage of the serving engine's paged KV cache (the layout is
 * nanolm/paged_attention.h's, vLLM's PagedAttention layout): the pool's memory, the store of one
 * token's K/V, and the copies of a sequence's K/V out of the pool and into it (prefill/decode
 * disaggregation). Which sequence holds which block (free list, block tables, reference counts,
 * prefix hashes) is nanolm/block_pool.h's; the attention kernels are nanolm/paged_attention.h's.
 */
#ifndef NANOLM_KVCACHE_H
#define NANOLM_KVCACHE_H

#include <stddef.h>
#include <stdint.h>

#include "nanolm/base.h"
#include "nanolm/infer.h"
#include "nanolm/paged_attention.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The pool (dtype holds an nl_kv_dtype). */
typedef nl_paged_kv nl_kvcache;

/* Bytes of one block for this shape and type. */
size_t nl_kvcache_block_bytes(int64_t L, int64_t KVH, int64_t hd, nl_kv_dtype dt, int64_t block_size);
/* Allocates a pool of n_blocks blocks. Errors: NL_ERR_INVALID for sizes < 1 or an
 * unknown type, NL_ERR_NOMEM naming the bytes asked for. */
nl_status nl_kvcache_init(nl_kvcache *c, int64_t L, int64_t KVH, int64_t hd, nl_kv_dtype dt, int64_t block_size,
                          int64_t n_blocks);
/* The widest head an int8 pool takes (a key is quantized on the stack before it is stored
 * transposed); real models' heads are 64-256. */
#define NL_KVCACHE_INT8_MAX_HD 1024
/* Frees the pool; safe on a zeroed struct. */
void nl_kvcache_free(nl_kvcache *c);
/* The pool's rows (nanolm/paged_attention.h). */
static inline float *nl_kvcache_f32_at(const nl_kvcache *c, int32_t id, int64_t l, int kv, int64_t kh, int64_t slot) {
    return nl_paged_f32_at(c, id, l, kv, kh, slot);
}
static inline int8_t *nl_kvcache_codes_at(const nl_kvcache *c, int32_t id, int64_t l, int kv, int64_t kh,
                                          int64_t slot) {
    return nl_paged_codes_at(c, id, l, kv, kh, slot);
}
static inline uint16_t *nl_kvcache_scale_at(const nl_kvcache *c, int32_t id, int64_t l, int kv, int64_t kh,
                                            int64_t slot) {
    return nl_paged_scale_at(c, id, l, kv, kh, slot);
}

/* Stores one token's k and v (KVH*hd each) at position pos of a sequence with block table
 * `table`, layer l (quantized for an int8 pool). */
void nl_kvcache_store(nl_kvcache *c, const int32_t *table, int64_t l, int64_t pos, const float *k, const float *v);

/* Bytes of the K/V of n_tokens positions of one sequence in the block-size-independent layout
 * of nl_kvcache_gather: fp32 (L, 2, n_tokens, KVH*hd) floats; int8 codes (L, 2, n_tokens, KVH*hd)
 * then fp16 scales (L, 2, n_tokens, KVH). That is 2 x L x KVH x hd x bytes x n_tokens, plus for
 * int8 the 2 x L x KVH x 2 x n_tokens bytes of scales. */
size_t nl_kvcache_seq_bytes(int64_t L, int64_t KVH, int64_t hd, nl_kv_dtype dt, int64_t n_tokens);
/* Copies positions [0, n_tokens) of a sequence (block table `table`) into dst
 * (nl_kvcache_seq_bytes bytes), exactly as stored (int8 codes and scales are not re-quantized). */
void nl_kvcache_gather(const nl_kvcache *c, const int32_t *table, int64_t n_tokens, uint8_t *dst);
/* The reverse: writes positions [0, n_tokens) of a sequence whose blocks are allocated from src. */
void nl_kvcache_scatter(nl_kvcache *c, const int32_t *table, int64_t n_tokens, const uint8_t *src);

#ifdef __cplusplus
}
#endif
#endif

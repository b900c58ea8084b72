/*
 * nanolm kvcache: the paged KV cache of the serving engine (vLLM's PagedAttention layout).
 *
 * One pool of n_blocks fixed-size blocks; a block holds the keys and values of block_size
 * consecutive positions of one sequence for every layer:
 *   fp32  data  (n_blocks, L, 2, KVH, block_size, hd)         K at [.., 0, ..], V at [.., 1, ..]
 *   int8  codes (n_blocks, L, 2, KVH, block_size, hd) and scales (n_blocks, L, 2, KVH, block_size)
 *         in the int8 KV format of nanolm/model.h (absmax per head and token, fp16 scale:
 *         nl_kv_quantize_token).
 * Head-major within a block, as vLLM's: the block_size positions of one kv head are one
 * contiguous run (4 KiB for 16 fp32 positions of 64 dimensions), so the attention of one head,
 * which walks its positions in order, reads memory sequentially.
 * A sequence owns a block table (its blocks in position order): position p lives in block
 * table[p / block_size], slot p % block_size. Blocks come from a free list and go back to it
 * when the sequence finishes, is cancelled or is preempted. Not thread-safe: the engine's step
 * thread owns the pool.
 */
#ifndef NANOLM_KVCACHE_H
#define NANOLM_KVCACHE_H

#include <stddef.h>
#include <stdint.h>

#include "nanolm/base.h"
#include "nanolm/model.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct nl_kvcache {
    int64_t L, KVH, hd, block_size, n_blocks;
    nl_kv_dtype dtype;
    float *f32;        /* fp32 pool (NULL for int8) */
    int8_t *codes;     /* int8 pool codes (NULL for fp32) */
    uint16_t *scales;  /* int8 pool fp16 scales */
    int32_t *free_ids; /* (n_blocks) stack of free block ids */
    int64_t n_free;
    size_t block_bytes; /* bytes of one block (codes + scales for int8) */
} nl_kvcache;

/* Bytes of one block for this shape and type. */
size_t nl_kvcache_block_bytes(int64_t L, int64_t KVH, int64_t hd, nl_kv_dtype dt, int64_t block_size);
/* Allocates a pool of n_blocks blocks (all free). Errors: NL_ERR_INVALID for sizes < 1 or an
 * unknown type, NL_ERR_NOMEM naming the bytes asked for. */
nl_status nl_kvcache_init(nl_kvcache *c, int64_t L, int64_t KVH, int64_t hd, nl_kv_dtype dt, int64_t block_size,
                          int64_t n_blocks);
/* Frees the pool; safe on a zeroed struct. */
void nl_kvcache_free(nl_kvcache *c);
/* Takes a free block: its id, or -1 when the pool is empty. */
int32_t nl_kvcache_alloc(nl_kvcache *c);
/* Returns block id to the pool. */
void nl_kvcache_release(nl_kvcache *c, int32_t id);
/* Blocks in use. */
static inline int64_t nl_kvcache_used(const nl_kvcache *c) { return c->n_blocks - c->n_free; }

/* fp32 K (kv = 0) or V (kv = 1) of kv head kh at `slot` in block id, layer l (hd floats; the
 * next slot's follow). */
static inline float *nl_kvcache_f32_at(const nl_kvcache *c, int32_t id, int64_t l, int kv, int64_t kh, int64_t slot) {
    return c->f32 + (((((int64_t)id * c->L + l) * 2 + kv) * c->KVH + kh) * c->block_size + slot) * c->hd;
}
/* int8 codes (hd) and fp16 scale of the same. */
static inline int8_t *nl_kvcache_codes_at(const nl_kvcache *c, int32_t id, int64_t l, int kv, int64_t kh,
                                          int64_t slot) {
    return c->codes + (((((int64_t)id * c->L + l) * 2 + kv) * c->KVH + kh) * c->block_size + slot) * c->hd;
}
static inline uint16_t *nl_kvcache_scale_at(const nl_kvcache *c, int32_t id, int64_t l, int kv, int64_t kh,
                                            int64_t slot) {
    return c->scales + ((((int64_t)id * c->L + l) * 2 + kv) * c->KVH + kh) * c->block_size + slot;
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

/* Positions per key tile, and the most queries of one sequence the engine attends as one tile. */
#define NL_KV_KTILE 16
#define NL_KV_QTILE 16

/* Floats of scratch nl_kvcache_attend_rows needs for nq queries of a sequence of at most
 * seq_len positions (nl_kvcache_attend_head: nq = 1). */
static inline int64_t nl_kvcache_attend_scratch(int64_t nq, int64_t seq_len, int64_t hd) {
    return nq * (seq_len + NL_KV_KTILE) + hd * NL_KV_KTILE;
}

/* Causal attention of query head h for nq consecutive tokens of one sequence, at positions
 * pos0 .. pos0 + nq - 1, each over positions 0 .. its own (block table `table`, layer l): token
 * r's q (NH*hd, RoPE applied) at q + r * q_stride, its head-h output (hd) at out + r * out_stride.
 * Their keys must be stored already. The tokens share each key and value they read (a prompt
 * chunk's attention reads the prefix once per tile, not once per token). Each output's
 * arithmetic is that of nl_kvcache_attend_head for its position: it does not depend on nq.
 * scratch: nl_kvcache_attend_scratch(nq, seq_len, hd) floats. */
void nl_kvcache_attend_rows(const nl_kvcache *c, const int32_t *table, int64_t l, int64_t pos0, int64_t nq,
                            const float *q, int64_t q_stride, int64_t NH, int64_t h, float *out, int64_t out_stride,
                            float *scratch);

/* Causal attention of query head h of one token at position pos over positions 0..pos of a
 * sequence (block table `table`), layer l: out (hd) of head h from q (NH*hd, RoPE applied);
 * grouped-query heads share kv head h / (NH/KVH). scratch: nl_kvcache_attend_scratch(1, pos + 1,
 * hd) floats. The scores,
 * softmax and weighted sum run in position order, so the result does not depend on what else
 * shares the step. */
void nl_kvcache_attend_head(const nl_kvcache *c, const int32_t *table, int64_t l, int64_t pos, const float *q,
                            int64_t NH, int64_t h, float *out, float *scratch);

#ifdef __cplusplus
}
#endif
#endif

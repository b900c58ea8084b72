/*
 * nanolm paged_attention: causal attention over a paged K/V pool (vLLM's PagedAttention layout).
 *
 * The pool holds n_blocks fixed-size blocks; a block holds the keys and values of block_size
 * consecutive positions of one sequence for every layer:
 *   fp32  f32   (n_blocks, L, 2, KVH, block_size, hd)         K at [.., 0, ..], V at [.., 1, ..]
 *         except that the keys of one kv head in a block are stored transposed, (hd, block_size):
 *         dimension i of the block's positions is one run (nl_paged_key_f32)
 *   int8  codes (n_blocks, L, 2, KVH, block_size, hd) and scales (n_blocks, L, 2, KVH, block_size)
 *         (absmax per head and token, fp16 scale: the int8 KV format of nanolm/model.h), the key
 *         codes transposed in the same way (nl_paged_key_codes).
 * Head-major within a block: the block_size positions of one kv head are one contiguous run, so
 * the attention of one head, which walks its positions in order, reads memory sequentially.
 * Keys are dimension-major within that run because a score is a sum over dimensions in
 * order: with 16 positions of a dimension side by side, 16 scores advance with one vector load
 * and no transpose (vLLM stores its key cache in the same spirit, head_size / x, block_size, x).
 * A sequence is a block table (its blocks in position order): position p lives in block
 * table[p / block_size], slot p % block_size. Who owns which block is the serving engine's
 * business (src/serve/block_pool.c); these kernels only read.
 */
#ifndef NANOLM_PAGED_ATTENTION_H
#define NANOLM_PAGED_ATTENTION_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The element types of a pool: the values of nl_kv_dtype (nanolm/model.h). */
#define NL_PAGED_FP32 0
#define NL_PAGED_INT8 1

typedef struct nl_paged_kv {
    int64_t L, KVH, hd, block_size, n_blocks;
    int dtype;          /* NL_PAGED_FP32 or NL_PAGED_INT8 */
    float *f32;         /* fp32 pool (NULL for int8) */
    int8_t *codes;      /* int8 pool codes (NULL for fp32) */
    uint16_t *scales;   /* int8 pool fp16 scales */
    size_t block_bytes; /* bytes of one block (codes + scales for int8) */
} nl_paged_kv;

/* fp32 V (kv = 1) of kv head kh at `slot` in block id, layer l (hd floats; the next slot's
 * follow). With kv = 0 and slot 0: where that head's transposed keys start (nl_paged_key_f32). */
static inline float *nl_paged_f32_at(const nl_paged_kv *c, int32_t id, int64_t l, int kv, int64_t kh, int64_t slot) {
    return c->f32 + (((((int64_t)id * c->L + l) * 2 + kv) * c->KVH + kh) * c->block_size + slot) * c->hd;
}
/* fp32 keys of kv head kh in block id, layer l: dimension i of the position at `slot` is
 * nl_paged_key_f32(..)[i * block_size + slot]. */
static inline float *nl_paged_key_f32(const nl_paged_kv *c, int32_t id, int64_t l, int64_t kh) {
    return nl_paged_f32_at(c, id, l, 0, kh, 0);
}
/* int8 codes of V (kv = 1) at a slot (hd, the next slot's follow), and the fp16 scale of K (kv =
 * 0) or V at a slot. With kv = 0 and slot 0: where that head's transposed key codes start
 * (nl_paged_key_codes). */
static inline int8_t *nl_paged_codes_at(const nl_paged_kv *c, int32_t id, int64_t l, int kv, int64_t kh, int64_t slot) {
    return c->codes + (((((int64_t)id * c->L + l) * 2 + kv) * c->KVH + kh) * c->block_size + slot) * c->hd;
}
/* int8 keys of kv head kh in block id, layer l, transposed as fp32 keys are: dimension i of the
 * position at `slot` is nl_paged_key_codes(..)[i * block_size + slot]. */
static inline int8_t *nl_paged_key_codes(const nl_paged_kv *c, int32_t id, int64_t l, int64_t kh) {
    return nl_paged_codes_at(c, id, l, 0, kh, 0);
}
static inline uint16_t *nl_paged_scale_at(const nl_paged_kv *c, int32_t id, int64_t l, int kv, int64_t kh,
                                          int64_t slot) {
    return c->scales + ((((int64_t)id * c->L + l) * 2 + kv) * c->KVH + kh) * c->block_size + slot;
}

/* Positions per key tile, and the most queries of one sequence attended as one tile. */
#define NL_KV_KTILE 16
#define NL_KV_QTILE 16
/* Key tiles whose scores a decode query sums side by side (independent chains). */
#define NL_KV_DTILES 4

/* Floats of scratch nl_paged_attend_rows needs for nq queries of a sequence of at most
 * seq_len positions (nl_paged_attend_head: nq = 1). */
static inline int64_t nl_paged_attend_scratch(int64_t nq, int64_t seq_len, int64_t hd) {
    return nq * (seq_len + NL_KV_KTILE) + NL_KV_DTILES * hd * NL_KV_KTILE;
}

/* Causal attention of query head h for nq consecutive tokens of one sequence, at positions
 * pos0 .. pos0 + nq - 1, each over positions 0 .. its own (block table `table`, layer l): token
 * r's q (NH*hd, RoPE applied) at q + r * q_stride, its head-h output (hd) at out + r * out_stride.
 * Their keys must be stored already. The tokens share each key and value they read (a prompt
 * chunk's attention reads the prefix once per tile, not once per token). Each output's
 * arithmetic is that of nl_paged_attend_head for its position: it does not depend on nq.
 * scratch: nl_paged_attend_scratch(nq, seq_len, hd) floats. */
void nl_paged_attend_rows(const nl_paged_kv *c, const int32_t *table, int64_t l, int64_t pos0, int64_t nq,
                          const float *q, int64_t q_stride, int64_t NH, int64_t h, float *out, int64_t out_stride,
                          float *scratch);

/* Causal attention of query head h of one token at position pos over positions 0..pos of a
 * sequence (block table `table`), layer l: out (hd) of head h from q (NH*hd, RoPE applied);
 * grouped-query heads share kv head h / (NH/KVH). scratch: nl_paged_attend_scratch(1, pos + 1,
 * hd) floats. The scores, softmax and weighted sum run in position order, so the result does not
 * depend on what else shares the step. */
void nl_paged_attend_head(const nl_paged_kv *c, const int32_t *table, int64_t l, int64_t pos, const float *q,
                          int64_t NH, int64_t h, float *out, float *scratch);

#ifdef __cplusplus
}
#endif
#endif

/*
 * Context parallelism: causal attention over a sequence split across the P ranks of a group
 * (ring attention with online softmax, Liu et al. 2023; load-balanced causal split as in
 * Megatron-LM's context parallelism).
 *
 * The sequence of T tokens is cut into 2P chunks of c = T/(2P); rank r holds chunks r and
 * 2P-1-r (one early, one late, so every rank does the same causal work). Local rows (B, 2c):
 * rows [0, c) are positions r*c + t, rows [c, 2c) are positions (2P-1-r)*c + t.
 *
 * Forward: each rank keeps its queries and passes its K/V block around the ring (P-1 hops);
 * every visiting block updates the running max, sum and weighted V of each query row (online
 * softmax), masked causally by global position. Backward recomputes the probabilities from the
 * saved log-sum-exp, passes K/V together with their gradient accumulators around the full ring
 * (P hops, so each block's dK/dV arrive home). No (T, T) matrix is ever held: activation memory
 * per rank is O(B * T/P * width).
 */
#ifndef NANOLM_CP_H
#define NANOLM_CP_H

#include <stddef.h>
#include <stdint.h>

#include "nanolm/comm.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct nl_cp_attn {
    nl_comm *cp; /* borrowed */
    int P, r;
    int64_t B, T, Tl, c, NH, KVH, hd;
    float *out;     /* (B, Tl, NH*hd) attention output (before o_proj) */
    float *lse;     /* (B, NH, Tl) log-sum-exp of each query row */
    float *m, *l;   /* (B, NH, Tl) running max / sum (forward) */
    float *ring[2]; /* (B, Tl, 2*KVH*hd) K/V block | its gradient, two buffers */
    size_t bytes;   /* everything above, as allocated */
} nl_cp_attn;

/* Global position of local row t (0 <= t < 2c) on rank r of P for a sequence of T. */
int64_t nl_cp_position(int P, int r, int64_t T, int64_t t);
/* Sizes the buffers for B sequences of T tokens over the group `cp`. T must be a multiple of
 * 2 * size(cp). Errors: NL_ERR_INVALID naming T, NL_ERR_NOMEM. */
nl_status nl_cp_attn_init(nl_cp_attn *a, nl_comm *cp, int64_t B, int64_t T, int64_t NH, int64_t KVH, int64_t hd);
void nl_cp_attn_free(nl_cp_attn *a);
/* a->out (B, Tl, NH*hd) = causal attention of this rank's rows of qkv (B, Tl, (NH+2KVH)*hd), with
 * q and k already rotated for their global positions. Collective over the group. */
nl_status nl_cp_attn_forward(nl_cp_attn *a, const float *qkv);
/* dqkv (B, Tl, (NH+2KVH)*hd) (overwritten) from dout (B, Tl, NH*hd) after nl_cp_attn_forward on
 * the same qkv. Collective over the group. */
nl_status nl_cp_attn_backward(nl_cp_attn *a, float *dqkv, const float *dout, const float *qkv);

#ifdef __cplusplus
}
#endif
#endif

/*
 * NanoLM-MoE: mixture-of-experts MLPs (DeepSeek-MoE / Switch / GShard style) in NanoLM.
 *
 * Layers l >= arch.first_moe_layer (when arch.n_experts > 0) replace the dense SwiGLU MLP by
 *
 *   p   = softmax(Wr . x)                      router, Wr (E, C), per token      (BT, E)
 *   sel = top-k of p (ties: lower index)       g_j = p_j / sum_{k in sel} p_k  (renormalised)
 *   out = shared(x) + sum_{j in sel, kept} g_j . expert_j(x)
 *
 * with every expert a SwiGLU of inner size F = expert_hidden_dim; the S shared experts are
 * fused into one SwiGLU of inner size S*F (as in DeepSeek's shared_experts).
 *
 * Groups: the capacity and the auxiliary loss are computed per sequence (GShard's "groups" are
 * the sequences here), so splitting the batch across data-parallel ranks changes nothing.
 *   capacity   with capacity_factor c > 0 each expert takes at most ceil(c*T*k/E) slots of a
 *              sequence, in token order; later slots are dropped (their token keeps only the
 *              residual and the other experts). c = 0: no dropping.
 *   aux loss   Switch/GShard: aux = alpha * E * sum_e f_e * P_e per sequence and MoE layer,
 *              f_e = (slots routed to e before dropping) / (T*k), P_e = mean router prob of e;
 *              averaged over sequences, summed over layers, added to the training objective
 *              (the reported loss stays the cross-entropy; aux is reported separately).
 *
 * Parameter layout of an MoE layer inside the flat buffer (after the attention tensors):
 *   post_attention_layernorm (C), mlp.gate.weight (E, C),
 *   mlp.shared_experts.{gate,up}_proj (S*F, C) each, mlp.shared_experts.down_proj (C, S*F),
 *   then this rank's routed experts e0 .. e0+E_local-1, each gate (F, C), up (F, C), down (C, F).
 * Under expert parallelism with ep ranks, rank r holds experts [r*E/ep, (r+1)*E/ep) only.
 *
 * Dispatch: the slots are sorted by expert (stably in token order) and sent with the exchange
 * hooks (counts first, then rows); the expert side computes on rows ordered expert-major,
 * source-rank-minor, which is the one-process order, and sends the outputs back.
 * Only fp32; the MoE matmuls bypass nl_linear_ops.
 */
#ifndef NANOLM_MOE_H
#define NANOLM_MOE_H

#include <stddef.h>
#include <stdint.h>

#include "nanolm/model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The exchange between the ep ranks (installed by the expert-parallel trainer; not needed when
 * ep = 1). Both are collective over the expert-parallel group. */
typedef struct nl_moe_ops {
    /* send (ep * n) -> recv (ep * n): block r of send goes to rank r, block r of recv came from r. */
    nl_status (*counts)(void *user, const int64_t *send, int64_t *recv, int64_t n);
    /* all-to-all of rows of `width` floats: send_rows[r] rows to rank r (consecutive blocks of
     * send), recv_rows[r] rows from rank r (consecutive blocks of recv). */
    nl_status (*rows)(void *user, const float *send, const int64_t *send_rows, float *recv, const int64_t *recv_rows,
                      int64_t width);
    void *user;
} nl_moe_ops;

/* Saved activations of one MoE layer (sized for the worst case at nl_model_alloc_acts). */
typedef struct nl_moe_layer {
    float *probs;        /* (BT, E) router softmax */
    float *gates;        /* (BT, K) renormalised gates */
    int32_t *sel;        /* (BT, K) chosen experts (global index) */
    int32_t *slot;       /* (BT, K) row of the slot in send order, -1 when dropped */
    float *ysend;        /* (BT*K, C) expert outputs, send order */
    float *xrecv;        /* (R, C) rows this rank's experts got, expert-major */
    float *h13, *hact;   /* (R, 2F), (R, F) */
    float *h13s, *hacts; /* (BT, 2SF), (BT, SF) shared experts */
    int64_t *send_cnt;   /* (E) slots sent to each expert */
    int64_t *recv_cnt;   /* (ep, E_local) rows received from each source for each local expert */
    int64_t n_send, n_recv;
} nl_moe_layer;

typedef struct nl_moe {
    int64_t E, K, S, F, first, n_moe_layers;
    int ep, ep_rank;
    int64_t E_local, e0;   /* this rank's experts [e0, e0 + E_local) */
    float capacity_factor; /* 0: no dropping */
    float aux_coef;        /* alpha (0: no auxiliary loss) */
    nl_moe_ops *ops;
    /* activations */
    int64_t rmax;         /* rows an expert side can receive: BT*K*ep */
    nl_moe_layer *layers; /* [n_moe_layers] */
    float *mem;
    size_t mem_floats;
    float *s_send, *s_recv, *s_a, *s_b; /* scratch (rmax, max(C, 2F)) x 4 */
    float *s_dg;                        /* (BT, K) */
    int64_t *s_cnt;                     /* scratch counts */
    /* statistics of the last forward (this rank's tokens) */
    int64_t *tokens;              /* (n_moe_layers, E) slots routed per expert before dropping */
    int64_t slots, dropped;       /* slots over all MoE layers, and how many were dropped */
    double aux_loss;              /* alpha-weighted, summed over layers, mean over sequences */
    int64_t rows_sent, rows_self; /* rows of all exchanges of the last forward+backward that left
                                   * the rank / stayed on it (payload only) */
    int64_t rows_dispatched;      /* rows this rank's slots sent to the experts (incl. itself) */
    int64_t rows_returned;        /* rows that came back to its slots (incl. from itself) */
} nl_moe;

/* Like nl_model_init, for rank ep_rank of an expert-parallel group of ep ranks: only experts
 * [ep_rank*E/ep, (ep_rank+1)*E/ep) of each MoE layer are allocated. ep must divide n_experts.
 * Errors: NL_ERR_INVALID naming the field, NL_ERR_NOMEM. */
nl_status nl_model_init_ep(nl_model *m, const nl_arch *arch, int ep, int ep_rank);
/* Is layer l an MoE layer of this model? */
int nl_moe_is_layer(const nl_model *m, int64_t l);
/* Offset range (floats) of layer l's routed experts held by this rank: [*begin, *end). */
void nl_moe_expert_range(const nl_model *m, int64_t l, size_t *begin, size_t *end);

/* (The MoE forward, backward and buffers that nl_model_forward/backward, nl_model_alloc_acts
 * and nl_model_free call are internal to the model: src/model/model_internal.h.) */

/* Built-in MoE presets: "moe-course-tiny" (the course's 64 routed + 2 shared experts, top-6,
 * scaled down to D = 64, 2 layers). Returns NL_ERR_INVALID for another name. */
nl_status nl_moe_preset(const char *name, nl_arch *out);

#ifdef __cplusplus
}
#endif
#endif

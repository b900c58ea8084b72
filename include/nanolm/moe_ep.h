/*
 * Expert-parallel training of NanoLM-MoE over MPI (with data parallelism around it).
 *
 * World of N ranks, expert-parallel groups of `ep` consecutive ranks (ep divides N and the
 * expert count). Every rank is a data-parallel rank with its own slice of the global batch
 * (nl_data_batch with its world rank), holds the attention, norms, embeddings, routers and
 * shared experts in full (replicated, gradients all-reduced over the world) and the routed
 * experts [r*E/ep, (r+1)*E/ep) of each MoE layer, r = rank % ep (gradients all-reduced over the
 * N/ep ranks holding the same experts). In each MoE layer the routed slots travel to the
 * expert's owner with an all-to-all of counts and an all-to-allv of rows (dispatch), the
 * outputs come back the same way (combine), and backward repeats both for the gradients.
 * Initialisation is deterministic per tensor (nl_model_init_random), so every rank builds its
 * part of the same model as one process; the run equals one process with batch N*B.
 */
#ifndef NANOLM_MOE_EP_H
#define NANOLM_MOE_EP_H

#include "nanolm/comm.h"
#include "nanolm/cp.h"
#include "nanolm/data.h"
#include "nanolm/moe.h"
#include "nanolm/train.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct nl_ep_opts {
    nl_train_opts train; /* the training options (nanolm/train.h): batch = sequences per
                                * data-parallel rank, seq, AdamW, clipping, seed */
    int ep;
    int cp; /* context parallel: groups of cp consecutive ranks share sequences,
                                * each rank holds 2 of the 2*cp chunks (needs ep 1, no aux loss
                                * and no capacity, whose groups are whole sequences) */
    nl_comm_impl impl;
    int64_t batch, seq; /* sequences per data-parallel rank, tokens per sequence */
    float lr, weight_decay, beta1, beta2, eps, grad_clip;
    float capacity_factor, aux_coef;
    uint64_t seed;
} nl_ep_opts;

/* ep 1, ours, batch 4, seq 32, lr 1e-3, wd 0.1, betas (0.9, 0.95), eps 1e-8, clip 1, no
 * capacity limit, aux 0.01, seed 1337. */
void nl_ep_opts_default(nl_ep_opts *o);

/* What one step did (this rank, and summed over the world where said). */
typedef struct nl_ep_step_stats {
    float loss;      /* mean cross-entropy over the global batch */
    double aux_loss; /* mean over the global batch (already alpha-weighted) */
    double grad_norm;
    int64_t *tokens;                                 /* (n_moe_layers, E) slots per expert, summed over the world */
    int64_t slots, dropped;                          /* summed over the world */
    uint64_t a2a_sent_bytes;                         /* this rank, from the comm counters (counts + payload) */
    uint64_t a2a_count_bytes;                        /* of which the per-expert counts */
    uint64_t payload_sent_bytes, payload_self_bytes; /* rows that left this rank / stayed */
    uint64_t dispatched_bytes, returned_bytes;       /* this rank's slots out to the experts / back */
} nl_ep_step_stats;

typedef struct nl_ep_trainer {
    nl_model model;
    nl_adamw opt;
    nl_ep_opts o;
    nl_comm *world, *ep_comm, *edp_comm;
    int n, rank;
    nl_moe_ops ops;
    int32_t *x, *y;
    nl_ep_step_stats st;
    float *fbuf; /* (n_moe_layers * E + 3) stats reduction */
    /* context parallelism */
    nl_comm *cp_comm;
    nl_cp_attn *cpa;    /* [L] one ring-attention context per layer */
    int64_t *positions; /* (seq / cp) global positions of this rank's columns */
    int32_t *gx, *gy;   /* (B, seq) the full windows */
    nl_attn_ops attn;
} nl_ep_trainer;

/* Builds the model part of this rank. Errors: NL_ERR_INVALID (ep does not divide the world or
 * the experts, dense arch), NL_ERR_NOMEM, NL_ERR_COMM. */
nl_status nl_ep_init(nl_ep_trainer *t, const nl_arch *arch, const nl_ep_opts *o, nl_comm *world);
void nl_ep_free(nl_ep_trainer *t);
/* Activation bytes of this rank (the model's and the ring-attention contexts'). */
size_t nl_ep_act_bytes(const nl_ep_trainer *t);
/* The hooks of the one training loop (nanolm/train.h): grads (this rank's slice of the global
 * batch, forward and backward with the experts' all-to-alls, replicated gradients averaged over
 * the world and expert gradients over the expert replicas; fills t->st), sumsq, scale, update
 * (AdamW), eval (every rank the same validation windows; none with context parallelism), save and
 * load (rank 0 writes the whole model: ep 1 only; NULL otherwise) and agree_stop. */
void nl_ep_layout(nl_ep_trainer *t, nl_train_layout *L);

#ifdef __cplusplus
}
#endif
#endif

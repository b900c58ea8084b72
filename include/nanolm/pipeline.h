/*
 * Pipeline (GPipe, 1F1B) and tensor (Megatron) parallelism of NanoLM over MPI, with data
 * parallelism on top (DP x TP x PP).
 *
 * Tensor parallelism over T ranks: each rank holds T-th of the heads and KV heads (rows of wq,
 * wk, wv: column-parallel) and the matching columns of wo (row-parallel), T-th of the SwiGLU
 * width (rows of w1, w3; columns of w2). Norms, embedding and classifier are replicated. Per
 * block, forward all-reduces the (b, T, C) outputs of o and of w2, backward the (b, T, C)
 * input gradients of the q/k/v and the w1/w3 matmuls: 2 all-reduces forward and 2 backward.
 *
 * The layers are split into P contiguous stages (stage s gets layers [s*L/P, (s+1)*L/P)); stage 0
 * also does the embedding lookup, the last stage the final norm, the classifier and the loss.
 * A data-parallel rank's batch of B windows is cut into M micro-batches of B/M windows; the
 * residual stream (b, T, C) of each micro-batch travels forward from stage to stage and its
 * gradient travels back (point-to-point). Gradients are accumulated over the micro-batches,
 * averaged, all-reduced over the data-parallel group (per owned unit), clipped by the global
 * norm and each stage updates the parameters it owns.
 *
 *   GPipe: all M forwards, then all M backwards.
 *   1F1B:  stage s runs min(P-s-1, M) forwards, then alternates one forward and one backward,
 *          then the remaining backwards: at most P-s micro-batches of activations are alive.
 *
 * Each rank records the seconds it computes (busy) and waits for a message (idle), so the
 * measured bubble idle/(busy+idle) can be compared with (P-1)/(M+P-1).
 *
 * Memory: a rank allocates only its part (nl_model_init_part): its stage's layers with T-th of
 * the heads, KV heads and SwiGLU width, plus the embedding (first stage) and the final norm and
 * classifier (last stage), replicated over the tensor-parallel group; gradients and AdamW state
 * of the same size; activations of its layers for the micro-batches in flight: all M under GPipe,
 * min(M, P - s) on stage s under 1F1B. The whole model is built once at init to cut the part from (then freed).
 *
 * Limits of this implementation: no ZeRO with PP/TP, untied embeddings only, no MoE layers.
 */
#ifndef NANOLM_PIPELINE_H
#define NANOLM_PIPELINE_H

#include <stdint.h>

#include "nanolm/dtrain.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum nl_pipe_schedule { NL_PIPE_GPIPE = 0, NL_PIPE_1F1B = 1 } nl_pipe_schedule;

typedef struct nl_pipe_mb nl_pipe_mb; /* activations of one micro-batch on this stage */

typedef struct nl_pipe {
    nl_model model; /* this rank's part only: local layers, heads, width */
    nl_dist_opts o;
    int M; /* micro-batches per step */
    nl_pipe_schedule schedule;
    nl_comm *pp, *dp, *tp; /* borrowed */
    int P, s, D, d;        /* pipeline size and stage, data-parallel size and rank */
    int TP, tr;            /* tensor-parallel size and rank */
    int nh, kvh, h;        /* this rank's heads, KV heads and SwiGLU width */
    uint8_t *own;          /* (model.n_params) 1 replicated over the TP group, 2 a TP slice */
    int l0, l1;            /* this stage's layers [l0, l1) of the whole model */
    size_t n_params_full;  /* parameters of the whole model */
    size_t act_floats;     /* micro-batch activations + backward scratch, floats */
    int64_t b;             /* windows per micro-batch */
    int n_slots;           /* micro-batch activation slots: M (GPipe), min(M, P - s) (1F1B) */
    nl_pipe_mb *mbs;       /* [n_slots]; micro-batch k uses slot k % n_slots */
    double loss_sum;       /* last stage: sum of the step's micro-batch losses */
    float *scratch;        /* backward scratch of one micro-batch */
    float *dresid, *dln, *dqkv, *datty, *datt, *dh13, *dhact;
    float *gat;             /* SP: (b*T, C) all-gathered norm output, transient (NULL without SP) */
    float *adam_m, *adam_v; /* (n_params); only the owned ranges are used */
    nl_adamw opt;           /* hyper-parameters and steps taken (t); m, v stay NULL */
    int32_t *x, *y;         /* (B, T) this data-parallel rank's batch */
    double busy_s, idle_s;  /* last step: computing, waiting for a pipeline message */
    double tp_s;            /* last step: in tensor-parallel collectives */
    /* sequence parallelism (o.sp with TP > 1, one stage): the residual stream, RMSNorms and
     * residual adds work on this rank's rows [sp_r0, sp_r0 + sp_n) of the (b*T) rows; each
     * all-reduce of the TP block becomes a reduce-scatter (after o_proj / down_proj) and an
     * all-gather (before q/k/v and gate/up), and the same in backward. The norm weights' and
     * the embedding's gradients are partial per rank and summed over the group. The buffers of
     * those sequence-sharded tensors (residual stream, norm outputs and rstd, residual after
     * attention) hold sp_n rows; an all-gathered norm output lives only in `gat` and is gathered
     * again in backward. */
    int64_t sp_r0, sp_n;
    /* last step's timeline: event i is a forward (kind 0) or backward (1) of micro-batch ev_mb[i]
     * computing from ev_t0[i] to ev_t1[i] seconds after the step began (after a barrier) */
    int n_ev;
    int *ev_kind, *ev_mb;
    double *ev_t0, *ev_t1;
    double t_step0;
    double step_s;
} nl_pipe;

/* Builds this rank's stage and tensor-parallel slice. Every rank initialises the whole model from
 * o->seed (deterministic) and dp rank 0 broadcasts it over the data-parallel group. Errors: NL_ERR_INVALID (batch not
 * divisible by M, more stages than layers), NL_ERR_UNSUPPORTED (tied embeddings, zero > 0),
 * NL_ERR_NOMEM. */
nl_status nl_pipe_init(nl_pipe *pp, const nl_arch *arch, const nl_dist_opts *o, int M, nl_pipe_schedule sched,
                       nl_comm *pp_comm, nl_comm *dp_comm, nl_comm *tp_comm);
void nl_pipe_free(nl_pipe *pp);
/* Fills L with the hooks of the one training loop (nanolm/train.h): grads runs the stage schedule
 * (forward and backward of the micro-batches), sums tensor-parallel partial gradients, averages
 * over micro-batches and all-reduces over the data-parallel group; the loss is the mean of the
 * global batch (every rank). sumsq: the global gradient's sum of squares (split slices once,
 * replicated tensors once per tensor-parallel group). update: AdamW on the owned ranges.
 * No evaluation and no checkpoints (the layout's eval / save / load are NULL). */
void nl_pipe_layout(nl_pipe *p, nl_train_layout *L);
/* One step (nl_train_layout_step over the hooks); *loss = mean loss of the global batch (on every
 * rank), *grad_norm before clipping. */
nl_status nl_pipe_step(nl_pipe *pp, const nl_data *d, int64_t step, float lr, float *loss, double *grad_norm);
/* Bytes this rank holds: parameters, gradients, AdamW state (all of its part) and, as workspace,
 * the activations of its micro-batches and the backward scratch. */
void nl_pipe_memory_report(const nl_pipe *p, nl_dist_memory *out);
/* (P-1)/(M+P-1). */
double nl_pipe_bubble_formula(int P, int M);

#ifdef __cplusplus
}
#endif
#endif

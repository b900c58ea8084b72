/*
 * nanolm par_probe: what a data, tensor or pipeline parallel training run reports per rank
 * (`nanolm parallel train`): a probe wrapped around the layout's training hooks (nanolm/train.h)
 * that records the bytes every collective sent in the last step, backward and waiting time
 * (DDP/ZeRO) or busy and idle time (pipeline), and the per-rank rows shared with every rank.
 */
#ifndef NANOLM_PAR_PROBE_H
#define NANOLM_PAR_PROBE_H

#include "nanolm/dtrain.h"
#include "nanolm/pipeline.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct nl_par_probe {
    nl_train_layout inner; /* the engine's hooks */
    nl_train_layout hooks; /* the probe's hooks, for nl_trainer_init_layout (kept by pointer) */
    nl_dist_trainer *dt;   /* the engine: one of the two */
    nl_pipe *pl;
    nl_comm_stats st;                               /* the last step's bytes */
    double bw_s, wait_s, busy_s, idle_s;            /* summed over the steps */
    void (*before_grads)(void *user, int64_t step); /* at the start of every step (NULL: nothing) */
    void *user;
} nl_par_probe;

/* Wraps the hooks of dt (DDP/ZeRO) or pl (pipeline/tensor; dt NULL) into p->hooks. */
void nl_par_probe_init(nl_par_probe *p, nl_dist_trainer *dt, nl_pipe *pl);

/* The per-rank row: bytes sent and received per step, sent per collective, memory held,
 * pipeline busy and idle seconds, the pipeline stage. */
enum {
    NL_PAR_SENT = 0,
    NL_PAR_RECV,
    NL_PAR_COLL, /* NL_COMM_OP_COUNT values, one per collective */
    NL_PAR_PARAMS = NL_PAR_COLL + NL_COMM_OP_COUNT,
    NL_PAR_GRADS,
    NL_PAR_OPTIMIZER,
    NL_PAR_WORKSPACE,
    NL_PAR_BUSY,
    NL_PAR_IDLE,
    NL_PAR_STAGE,
    NL_PAR_ROW /* doubles per row */
};

/* Fills this rank's row of rows (P, NL_PAR_ROW), zero elsewhere, and sums over w so that every
 * rank holds the whole table. Collective over w. */
nl_status nl_par_share_rows(nl_comm *w, const nl_par_probe *p, int pp_rank, double *rows);

/* The last step's pipeline events of every rank, (P, 2 micro, 4): kind (0 forward, 1 backward),
 * micro-batch, start and end seconds; shared with every rank. Collective over w. */
nl_status nl_par_share_timeline(nl_comm *w, const nl_pipe *pl, int micro, double *ev);

#ifdef __cplusplus
}
#endif

#endif

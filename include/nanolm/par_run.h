/* One rank's part of a parallel training run (`nanolm parallel train`): the layout of the ranks,
 * the byte-level training data, the engine (DDP/ZeRO, or the pipeline/tensor engine when tp or pp
 * > 1) wrapped by the probe (par_probe.h), and the one trainer over the probe's hooks. */
#ifndef NANOLM_PAR_RUN_H
#define NANOLM_PAR_RUN_H

#include "nanolm/data.h"
#include "nanolm/par_probe.h"
#include "nanolm/tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct nl_par_run {
    nl_layout L;
    nl_tokenizer tok;
    nl_data d;
    int mp;              /* the pipeline/tensor engine (pl) rather than DDP/ZeRO (t) */
    nl_dist_trainer t;
    nl_pipe pl;
    nl_par_probe pr;     /* at a fixed address: the trainer keeps its hooks */
    nl_trainer tn;
} nl_par_run;

/* The parts nl_par_run_open makes, in order: which one failed. */
typedef enum nl_par_run_part { NL_PAR_RUN_LAYOUT, NL_PAR_RUN_DATA, NL_PAR_RUN_ENGINE, NL_PAR_RUN_TRAINER } nl_par_run_part;

/* Makes *x on the ranks of w: the layout dp x tp x pp, the data of the text file `data` in windows
 * of o->train.seq, the engine of arch with o (micro microbatches and schedule sched when pp > 1),
 * the probe calling before_grads(user, step) at the start of each step (NULL: nothing), and the
 * trainer (resumed when o->train.resume). *failed names the part that failed. Free with
 * nl_par_run_free, also after an error. */
nl_status nl_par_run_open(nl_par_run *x, nl_comm *w, const nl_arch *arch, const nl_dist_opts *o, int dp, int tp,
                          int pp, int micro, nl_pipe_schedule sched, const char *data,
                          void (*before_grads)(void *user, int64_t step), void *user, nl_par_run_part *failed);
void nl_par_run_free(nl_par_run *x);

#ifdef __cplusplus
}
#endif

#endif

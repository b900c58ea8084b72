/* One rank's part of a parallel training run (nanolm/par_run.h). */
#include "nanolm/par_run.h"

#include <string.h>

nl_status nl_par_run_open(nl_par_run *x, nl_comm *w, const nl_arch *arch, const nl_dist_opts *o, int dp, int tp,
                          int pp, int micro, nl_pipe_schedule sched, const char *data,
                          void (*before_grads)(void *user, int64_t step), void *user, nl_par_run_part *failed) {
    memset(x, 0, sizeof *x);
    x->mp = tp > 1 || pp > 1;
    *failed = NL_PAR_RUN_LAYOUT;
    NL_TRY(nl_layout_init(w, dp, tp, pp, &x->L));
    *failed = NL_PAR_RUN_DATA;
    NL_TRY(nl_tokenizer_init_byte(&x->tok));
    NL_TRY(nl_data_open(&x->d, data, &x->tok));
    NL_TRY(nl_data_check_window(&x->d, (int)o->train.seq));
    *failed = NL_PAR_RUN_ENGINE;
    if (x->mp)
        NL_TRY(nl_pipe_init(&x->pl, arch, o, micro, sched, x->L.pp_comm, x->L.dp_comm, x->L.tp_comm));
    else
        NL_TRY(nl_dist_init(&x->t, arch, o, x->L.dp_comm));
    nl_par_probe_init(&x->pr, x->mp ? NULL : &x->t, &x->pl);
    x->pr.before_grads = before_grads, x->pr.user = user;
    *failed = NL_PAR_RUN_TRAINER;
    return nl_trainer_init_layout(&x->tn, &o->train, &x->pr.hooks);
}

void nl_par_run_free(nl_par_run *x) {
    nl_trainer_free(&x->tn);
    nl_dist_free(&x->t);
    nl_pipe_free(&x->pl);
    nl_data_free(&x->d);
    nl_tokenizer_free(&x->tok);
    nl_layout_free(&x->L);
}

/* What a parallel training run reports per rank (nanolm/par_probe.h): the probe around the
 * layout's hooks and the per-rank rows every rank ends up holding. */
#include <string.h>

#include "nanolm/par_probe.h"

static nl_status probe_grads(void *u, const nl_data *d, int64_t step, float *loss) {
    nl_par_probe *p = u;
    if (p->before_grads) p->before_grads(p->user, step);
    nl_comm_reset_total_stats();
    return p->inner.grads(p->inner.user, d, step, loss);
}
static nl_status probe_sumsq(void *u, double *ss) {
    nl_par_probe *p = u;
    return p->inner.sumsq(p->inner.user, ss);
}
static void probe_scale(void *u, float f) {
    nl_par_probe *p = u;
    p->inner.scale(p->inner.user, f);
}
static nl_status probe_update(void *u, float lr) {
    nl_par_probe *p = u;
    NL_TRY(p->inner.update(p->inner.user, lr));
    nl_comm_get_total_stats(&p->st); /* bytes of this step (the last step's are reported) */
    if (p->pl) p->busy_s += p->pl->busy_s, p->idle_s += p->pl->idle_s;
    if (p->dt) p->bw_s += p->dt->backward_s, p->wait_s += p->dt->comm_wait_s;
    return NL_OK;
}
static nl_status probe_eval(void *u, const nl_data *d, int64_t w, double *loss) {
    nl_par_probe *p = u;
    return p->inner.eval(p->inner.user, d, w, loss);
}
static nl_status probe_save(void *u, const char *path, const struct nl_ckpt_state *st) {
    nl_par_probe *p = u;
    return p->inner.save(p->inner.user, path, st);
}
static nl_status probe_load(void *u, const char *path, struct nl_ckpt_state *st) {
    nl_par_probe *p = u;
    return p->inner.load(p->inner.user, path, st);
}
static nl_status probe_agree_stop(void *u, int *stop) {
    nl_par_probe *p = u;
    return p->inner.agree_stop(p->inner.user, stop);
}

void nl_par_probe_init(nl_par_probe *p, nl_dist_trainer *dt, nl_pipe *pl) {
    memset(p, 0, sizeof *p);
    p->dt = dt;
    p->pl = dt ? NULL : pl;
    if (dt)
        nl_dist_layout(dt, &p->inner);
    else
        nl_pipe_layout(pl, &p->inner);
    nl_train_layout *h = &p->hooks;
    *h = p->inner;
    h->user = p;
    h->grads = probe_grads, h->sumsq = probe_sumsq, h->scale = probe_scale, h->update = probe_update;
    h->eval = p->inner.eval ? probe_eval : NULL;
    h->save = p->inner.save ? probe_save : NULL;
    h->load = p->inner.load ? probe_load : NULL;
    h->agree_stop = p->inner.agree_stop ? probe_agree_stop : NULL;
}

/* Each rank fills its row of (p, k) doubles; afterwards every rank holds the whole table. */
static nl_status share(nl_comm *w, double *rows, int k) {
    int p = nl_comm_size(w);
    for (int i = 0; i < p * k; i++) NL_TRY(nl_comm_sum_double(w, &rows[i]));
    return NL_OK;
}

nl_status nl_par_share_rows(nl_comm *w, const nl_par_probe *p, int pp_rank, double *rows) {
    nl_dist_memory dm;
    if (p->pl) /* this rank's part only (see nanolm/pipeline.h) */
        nl_pipe_memory_report(p->pl, &dm);
    else
        nl_dist_memory_report(p->dt, &dm);
    double *me = rows + (size_t)nl_comm_rank(w) * NL_PAR_ROW;
    me[NL_PAR_SENT] = (double)nl_comm_stats_sent_bytes(&p->st);
    me[NL_PAR_RECV] = (double)nl_comm_stats_recv_bytes(&p->st);
    for (int k = 0; k < NL_COMM_OP_COUNT; k++) me[NL_PAR_COLL + k] = (double)p->st.coll[k].sent_bytes;
    me[NL_PAR_PARAMS] = (double)dm.params;
    me[NL_PAR_GRADS] = (double)dm.grads;
    me[NL_PAR_OPTIMIZER] = (double)dm.optimizer;
    me[NL_PAR_WORKSPACE] = (double)dm.workspace;
    me[NL_PAR_BUSY] = p->busy_s;
    me[NL_PAR_IDLE] = p->idle_s;
    me[NL_PAR_STAGE] = pp_rank;
    return share(w, rows, NL_PAR_ROW);
}

nl_status nl_par_share_timeline(nl_comm *w, const nl_pipe *pl, int micro, double *ev) {
    int R = nl_comm_rank(w);
    for (int i = 0; i < pl->n_ev; i++) {
        double *e = ev + ((size_t)R * 2 * (size_t)micro + (size_t)i) * 4;
        e[0] = pl->ev_kind[i], e[1] = pl->ev_mb[i], e[2] = pl->ev_t0[i], e[3] = pl->ev_t1[i];
    }
    return share(w, ev, 2 * micro * 4);
}

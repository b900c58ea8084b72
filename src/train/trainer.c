/* The NanoLM training loop and evaluation (see nanolm/train.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nanolm/checkpoint.h"
#include "nanolm/mup.h"
#include "nanolm/step_prof.h"
#include "nanolm/train.h"

void nl_train_opts_default(nl_train_opts *o) {
    memset(o, 0, sizeof *o);
    o->steps = 2000;
    o->batch = 12;
    o->seq = 64;
    o->grad_accum = 1;
    o->lr = 1e-3f;
    o->lr_min = 1e-4f;
    o->warmup = 100;
    o->weight_decay = 0.1f;
    o->beta1 = 0.9f;
    o->beta2 = 0.95f;
    o->adam_eps = 1e-8f;
    o->grad_clip = 1.0f;
    o->precision = NL_PREC_FP32;
    o->seed = 1337;
    o->eval_every = 250;
    o->eval_windows = 200;
    o->tokenizer = "byte";
}

nl_status nl_eval_window_count(const nl_data *d, nl_data_split split, int64_t T, int64_t max_windows,
                               int64_t *windows) {
    int64_t w = nl_data_eval_windows(d, split, (int)T);
    if (max_windows > 0 && w > max_windows) w = max_windows;
    *windows = w;
    if (w < 1)
        return nl_fail(NL_ERR_INVALID, "%s: the %s split has %lld tokens, fewer than one window of %lld + 1", d->path,
                       nl_data_split_name(split), (long long)nl_data_split_tokens(d, split), (long long)T);
    return NL_OK;
}

nl_status nl_eval_windows(nl_model *m, const nl_data *d, nl_data_split split, int64_t B, int64_t T, int64_t max_windows,
                          nl_eval_visit visit, void *user) {
    int64_t windows;
    NL_TRY(nl_eval_window_count(d, split, T, max_windows, &windows));
    int32_t *x = nl_malloc((size_t)(B * T) * sizeof(int32_t), "eval batch");
    int32_t *y = nl_malloc((size_t)(B * T) * sizeof(int32_t), "eval batch");
    nl_status rc = (x && y) ? NL_OK : NL_ERR_NOMEM;
    for (int64_t w = 0; !rc && w < windows; w += B) {
        int nb = 0;
        int want = (int)(windows - w < B ? windows - w : B);
        rc = nl_data_eval_batch(d, split, w, want, (int)T, x, y, &nb);
        if (rc || nb == 0) break;
        float loss;
        rc = nl_model_forward(m, x, y, nb, T, &loss);
        if (!rc) rc = visit(user, m->train->a.losses, nb * T);
    }
    nl_free(x);
    nl_free(y);
    return rc;
}

/* nl_eval_loss's visitor: the sum of the per-token losses in text order, in double. */
typedef struct eval_sum {
    double total;
    int64_t scored;
} eval_sum;
static nl_status add_losses(void *user, const float *losses, int64_t n) {
    eval_sum *s = user;
    for (int64_t i = 0; i < n; i++) s->total += losses[i];
    s->scored += n;
    return NL_OK;
}

nl_status nl_eval_loss(nl_model *m, const nl_data *d, nl_data_split split, int64_t B, int64_t T, int64_t max_windows,
                       double *mean_loss, int64_t *n_scored) {
    eval_sum s = {0, 0};
    NL_TRY(nl_eval_windows(m, d, split, B, T, max_windows, add_losses, &s));
    *mean_loss = s.total / (double)s.scored;
    if (n_scored) *n_scored = s.scored;
    return NL_OK;
}

/* The first shape field where a and b differ, named with both values (0: equal). */
static nl_status arch_mismatch(const char *path, const nl_arch *want, const nl_arch *have) {
    if (strcmp(want->name, have->name))
        return nl_fail(NL_ERR_INVALID, "%s holds model \"%s\", the run asks for \"%s\"", path, have->name, want->name);
    struct {
        const char *n;
        int64_t a, b;
    } f[] = {{"vocab_size", want->vocab_size, have->vocab_size},
             {"dim", want->dim, have->dim},
             {"n_layers", want->n_layers, have->n_layers},
             {"n_heads", want->n_heads, have->n_heads},
             {"n_kv_heads", want->n_kv_heads, have->n_kv_heads},
             {"hidden_dim", want->hidden_dim, have->hidden_dim},
             {"seq_len", want->seq_len, have->seq_len},
             {"tied_embeddings", want->tied_embeddings, have->tied_embeddings},
             {"n_experts", want->n_experts, have->n_experts},
             {"n_shared_experts", want->n_shared_experts, have->n_shared_experts},
             {"top_k", want->top_k, have->top_k},
             {"expert_hidden_dim", want->expert_hidden_dim, have->expert_hidden_dim},
             {"first_moe_layer", want->first_moe_layer, have->first_moe_layer}};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        if (f[i].a != f[i].b)
            return nl_fail(NL_ERR_INVALID, "%s: the model's %s is %lld, the run asks for %lld", path, f[i].n,
                           (long long)f[i].b, (long long)f[i].a);
    return NL_OK;
}

/* The warmup of a run whose o->warmup is < 0 (not chosen): the one a resumed checkpoint recorded
 * (stored_warmup >= 0), else 100 steps, or steps/10 when that is not below steps. */
static int64_t derive_warmup(const nl_train_opts *o, int64_t stored_warmup) {
    if (o->warmup >= 0) return o->warmup;
    if (stored_warmup >= 0) return stored_warmup;
    return 100 < o->steps ? 100 : o->steps / 10;
}

/* What this run records in its checkpoints besides the shape and precision. */
static void run_of(const nl_train_opts *o, int64_t warmup, nl_ckpt_run *r) {
    memset(r, 0, sizeof *r);
    r->mup_base_dim = o->mup_base_dim;
    r->loss_scaling = !o->no_loss_scaling;
    snprintf(r->qat, sizeof r->qat, "%s", o->qat ? o->qat : "");
    snprintf(r->fp8, sizeof r->fp8, "%s", o->fp8 ? o->fp8 : "");
    snprintf(r->schedule, sizeof r->schedule, "cosine");
    r->warmup = warmup;
}

/* A resumed run must be the run the checkpoint continues: every field named with both values. */
static nl_status check_resume(const char *path, const nl_train_opts *o, int64_t warmup, const nl_ckpt_state *st) {
    nl_ckpt_run want;
    run_of(o, warmup, &want);
    const nl_ckpt_run *have = &st->run;
    /* A run restarted after it saved its last step (a job preempted between the final save and
     * its exit) has nothing to do: NL_DONE, which the CLI reports and exits 0 on, so a restart
     * loop does not mark a finished run as failed. Fewer steps than trained is a mistake. */
    if (st->step == o->steps)
        return nl_fail(NL_DONE,
                       "%s has already trained all %lld steps of this run: nothing to do (give more steps to "
                       "continue)",
                       path, (long long)st->step);
    if (st->step > o->steps)
        return nl_fail(NL_ERR_INVALID,
                       "%s has already trained %lld steps and the run asks for %lld in total: nothing to "
                       "do (give more steps to continue)",
                       path, (long long)st->step, (long long)o->steps);
    if (st->precision != o->precision)
        return nl_fail(NL_ERR_INVALID,
                       "%s was trained with precision %s, this run asks for %s; resume with the same one", path,
                       nl_precision_name(st->precision), nl_precision_name(o->precision));
    if (have->mup_base_dim != want.mup_base_dim)
        return nl_fail(NL_ERR_INVALID, "%s was trained with muP base width %lld, this run asks for %lld (0: no muP)",
                       path, (long long)have->mup_base_dim, (long long)want.mup_base_dim);
    if (o->precision == NL_PREC_FP16 && have->loss_scaling != want.loss_scaling)
        return nl_fail(NL_ERR_INVALID, "%s was trained %s loss scaling, this run asks %s it", path,
                       have->loss_scaling ? "with dynamic" : "without",
                       want.loss_scaling ? "for dynamic" : "to go without");
    if (strcmp(have->qat, want.qat))
        return nl_fail(NL_ERR_INVALID, "%s was trained with QAT scheme \"%s\", this run asks for \"%s\" (\"\": none)",
                       path, have->qat, want.qat);
    if (strcmp(have->fp8, want.fp8))
        return nl_fail(NL_ERR_INVALID, "%s was trained with FP8 recipe \"%s\", this run asks for \"%s\" (\"\": none)",
                       path, have->fp8, want.fp8);
    if (strcmp(have->schedule, want.schedule))
        return nl_fail(NL_ERR_INVALID, "%s was trained with the %s schedule, this run asks for %s", path,
                       have->schedule, want.schedule);
    if (have->warmup >= 0 && have->warmup != want.warmup)
        return nl_fail(NL_ERR_INVALID, "%s was trained with warmup %lld steps, this run asks for %lld", path,
                       (long long)have->warmup, (long long)want.warmup);
    return NL_OK;
}

/* One run writes o->out at a time: an advisory lock beside it, held until nl_trainer_free. */
static nl_status lock_out(nl_trainer *t, const nl_train_opts *o) {
    if (!o->out) return NL_OK;
    int fd;
    NL_TRY(nl_output_lock(o->out, "--out", &fd));
    if (!(t->out_lock_path = strdup(o->out))) {
        nl_output_unlock(o->out, fd);
        return nl_fail(NL_ERR_NOMEM, "out of memory locking %s", o->out);
    }
    t->out_lock_fd = fd;
    return NL_OK;
}

static void unlock_out(nl_trainer *t) {
    if (!t->out_lock_path) return;
    nl_output_unlock(t->out_lock_path, t->out_lock_fd);
    free(t->out_lock_path);
    t->out_lock_path = NULL;
}

/* A parallel run writes o->out from the rank that writes files: that rank takes the same lock as
 * a one-process run (lock_out), and every rank learns whether it did, so that all of them refuse
 * together rather than wait on each other. */
static nl_status lock_layout_out(nl_trainer *t, const nl_train_opts *o, const nl_train_layout *L) {
    if (!o->out) return NL_OK;
    nl_status mine = L->rank0 ? lock_out(t, o) : NL_OK;
    int refused = mine != NL_OK;
    nl_status rc = L->agree_stop ? L->agree_stop(L->user, &refused) : NL_OK; /* the max over the ranks */
    if (!rc && !refused) return NL_OK;
    unlock_out(t);
    if (mine) return mine; /* lock_out said why */
    return rc ? rc : nl_fail(NL_ERR_IO, "--out %s is locked by another run (see rank 0's message)", o->out);
}

nl_status nl_trainer_init(nl_trainer *t, const nl_arch *arch, const nl_train_opts *o) {
    memset(t, 0, sizeof *t);
    nl_status rc;
    nl_ckpt_state st;
    memset(&st, 0, sizeof st);
    if (o->resume && o->init_weights)
        return nl_fail(NL_ERR_INVALID, "resuming a run and starting from a checkpoint's weights exclude each other");
    if (o->steps < 1) return nl_fail(NL_ERR_INVALID, "steps must be >= 1, got %lld", (long long)o->steps);
    if (!arch && !o->resume && !o->init_weights) return nl_fail(NL_ERR_INVALID, "no model shape and no checkpoint");
    NL_TRY(lock_out(t, o));
    if (o->resume || o->init_weights) {
        char tok[64];
        const char *path = o->resume ? o->resume : o->init_weights;
        if ((rc = nl_ckpt_load_model(path, &t->model, tok))) goto fail;
        if (arch && o->resume && (rc = arch_mismatch(path, arch, &t->model.arch))) goto fail;
    } else {
        if ((rc = nl_model_init(&t->model, arch))) goto fail;
        nl_model_init_random(&t->model, o->seed);
    }
    nl_model *m = &t->model;
    t->seq = o->seq > 0 ? o->seq : m->arch.seq_len;
    if (o->batch <= 0 || t->seq > m->arch.seq_len) {
        rc = nl_fail(NL_ERR_INVALID,
                     "sequence length %lld must be in [1, %lld] (the model's seq_len) and the batch positive",
                     (long long)t->seq, (long long)m->arch.seq_len);
        goto fail;
    }
    if ((rc = nl_model_alloc_grads(m)) || (rc = nl_model_alloc_acts(m, o->batch, t->seq)) ||
        (rc = nl_model_set_precision(m, o->precision)) ||
        (rc = nl_adamw_init(&t->opt, m, o->beta1, o->beta2, o->adam_eps, o->weight_decay)))
        goto fail;
    if (o->mup_base_dim > 0) { /* muP hooks: output multiplier, per-tensor learning rates, init */
        t->mup = nl_calloc(1, sizeof *t->mup, "muP");
        if (!t->mup) {
            rc = NL_ERR_NOMEM;
            goto fail;
        }
        if ((rc = nl_mup_init(t->mup, m, &t->opt, o->mup_base_dim, !o->resume && !o->init_weights))) goto fail;
    }
    nl_scaler_init(&t->scaler);
    if (o->loss_scale_init > 0) t->scaler.scale = o->loss_scale_init;
    t->saved_step = o->resume ? -2 : -1; /* -2: the resumed file is a good checkpoint too */
    nl_rng_seed(&t->rng, o->seed ^ 0x9e3779b97f4a7c15ULL);
    t->warmup = derive_warmup(o, -1);
    if (o->resume) {
        st.opt = &t->opt;
        if ((rc = nl_ckpt_load_state(o->resume, m, &st))) goto fail;
        t->warmup = derive_warmup(o, st.run.warmup);
        if ((rc = check_resume(o->resume, o, t->warmup, &st))) goto fail;
        t->step = st.step;
        t->rng = st.rng;
        t->scaler = st.scaler;
    }
    if (o->no_loss_scaling) { /* the scaler stays at 1: overflow still skips a step, nothing rescales */
        t->scaler.scale = 1.0f;
        t->scaler.growth_factor = 1.0f;
        t->scaler.backoff_factor = 1.0f;
    }
    t->x = nl_malloc((size_t)(o->batch * t->seq) * sizeof(int32_t), "batch inputs");
    t->y = nl_malloc((size_t)(o->batch * t->seq) * sizeof(int32_t), "batch targets");
    /* one record per step this process will run (a resumed run runs steps - step of them) */
    t->log_cap = o->steps - t->step;
    t->log = nl_calloc((size_t)t->log_cap, sizeof(nl_train_log), "training log");
    if (nl_step_prof_wanted()) {
        t->prof = nl_calloc(1, sizeof *t->prof, "step profile");
        if (t->prof) nl_step_prof_init(t->prof, nl_threads());
    }
    if (!t->x || !t->y || !t->log || (nl_step_prof_wanted() && !t->prof)) {
        rc = NL_ERR_NOMEM;
        goto fail;
    }
    t->mem.params = nl_model_param_bytes(m);
    t->mem.grads = m->n_params * sizeof(float);
    t->mem.optimizer = nl_adamw_bytes(&t->opt);
    t->mem.activations = nl_model_act_bytes(m);
    t->mem.lp_weights = nl_model_lp_weight_bytes(m);
    t->mem.batch = 2 * (size_t)(o->batch * t->seq) * sizeof(int32_t);
    t->mem.total =
        t->mem.params + t->mem.grads + t->mem.optimizer + t->mem.activations + t->mem.lp_weights + t->mem.batch;
    return NL_OK;
fail:
    nl_trainer_free(t);
    return rc;
}

double nl_train_flops_per_token(const nl_model *m, int64_t T) {
    double n = (double)m->n_params;
    if (m->w.embed && m->w.embed != m->w.cls) n -= (double)(m->V * m->C); /* tied: it is the classifier too */
    return 6.0 * n + 12.0 * (double)m->L * (double)(m->NH * m->hd) * (double)T;
}

nl_status nl_train_layout_step(const nl_train_layout *L, const nl_data *d, int64_t step, float lr, float grad_clip,
                               float *loss_out, double *norm_out) {
    float loss = 0;
    NL_TRY(L->grads(L->user, d, step, &loss));
    if (!isfinite(loss))
        return nl_fail(NL_ERR_NUMERIC, "loss is %s at step %lld (lr %.3g)", isnan(loss) ? "nan" : "inf",
                       (long long)step + 1, (double)lr);
    double ss = 0;
    NL_TRY(L->sumsq(L->user, &ss));
    double norm = sqrt(ss);
    float f = nl_clip_factor(norm, grad_clip);
    if (f != 1.0f) L->scale(L->user, f);
    NL_TRY(L->update(L->user, lr));
    if (loss_out) *loss_out = loss;
    if (norm_out) *norm_out = norm;
    return NL_OK;
}

nl_status nl_trainer_init_layout(nl_trainer *t, const nl_train_opts *o, const nl_train_layout *L) {
    memset(t, 0, sizeof *t);
    const char *no = o->precision != NL_PREC_FP32 ? "a precision other than fp32"
                     : o->grad_accum > 1
                         ? "gradient accumulation (use a larger batch, or micro-batches with pipeline parallelism)"
                     : o->mup_base_dim > 0   ? "muP"
                     : o->qat                ? "QAT"
                     : o->fp8                ? "FP8 training"
                     : o->init_weights       ? "starting from a checkpoint's weights"
                     : o->out && !L->save    ? "checkpoints"
                     : o->resume && !L->load ? "resuming"
                                             : NULL;
    if (no) return nl_fail(NL_ERR_UNSUPPORTED, "the %s layout does not support %s", L->name, no);
    if (o->steps < 1) return nl_fail(NL_ERR_INVALID, "steps must be >= 1, got %lld", (long long)o->steps);
    NL_TRY(lock_layout_out(t, o, L));
    t->layout = L;
    t->seq = o->seq;
    t->warmup = derive_warmup(o, -1);
    t->saved_step = o->resume ? -2 : -1;
    nl_scaler_init(&t->scaler);
    nl_rng_seed(&t->rng, o->seed ^ 0x9e3779b97f4a7c15ULL);
    if (o->resume) {
        nl_ckpt_state st;
        memset(&st, 0, sizeof st);
        nl_status rc = L->load(L->user, o->resume, &st);
        t->warmup = derive_warmup(o, rc ? -1 : st.run.warmup);
        if (!rc) rc = check_resume(o->resume, o, t->warmup, &st);
        if (rc) {
            unlock_out(t);
            memset(t, 0, sizeof *t);
            return rc;
        }
        t->step = st.step;
        t->rng = st.rng;
        t->scaler = st.scaler;
    }
    t->log_cap = o->steps - t->step;
    t->log = nl_calloc((size_t)t->log_cap, sizeof(nl_train_log), "training log");
    if (!t->log) {
        unlock_out(t);
        return NL_ERR_NOMEM;
    }
    return NL_OK;
}

void nl_trainer_free(nl_trainer *t) {
    unlock_out(t);
    if (t->layout) { /* the model and optimizer live in the layout */
        nl_free(t->log);
        memset(t, 0, sizeof *t);
        return;
    }
    if (t->mup) nl_mup_free(t->mup, &t->model, &t->opt);
    nl_free(t->mup);
    nl_model_free(&t->model);
    nl_adamw_free(&t->opt);
    nl_free(t->x);
    nl_free(t->y);
    nl_free(t->log);
    nl_free(t->prof);
    memset(t, 0, sizeof *t);
}

static nl_status save(nl_trainer *t, const nl_train_opts *o) {
    if (!o->out) return NL_OK;
    nl_ckpt_state st = {t->step, t->rng, &t->opt, t->scaler, o->precision, {0}};
    run_of(o, t->warmup, &st.run);
    if (t->layout)
        NL_TRY(t->layout->save(t->layout->user, o->out, &st));
    else
        NL_TRY(nl_ckpt_save(o->out, &t->model, o->tokenizer, &st));
    t->saved_step = t->step;
    return NL_OK;
}

/* One step of this process alone: micro-batches, loss scaling, clipping, AdamW. */
static nl_status plain_step(nl_trainer *t, const nl_train_opts *o, const nl_data *d, float lr, nl_train_log *rec) {
    nl_model *m = &t->model;
    int64_t T = t->seq, B = o->batch, accum = o->grad_accum > 0 ? o->grad_accum : 1;
    if (t->prof) nl_step_prof_begin(t->prof);
    m->prof = t->prof; /* the forward and backward mark their phases */
    nl_model_zero_grad(m);
    nl_step_prof_mark(t->prof, NL_PROF_OPTIM);
    int fp16 = o->precision == NL_PREC_FP16;
    m->train->loss_scale = (fp16 ? t->scaler.scale : 1.0f) / (float)accum;
    double loss = 0.0;
    for (int64_t k = 0; k < accum; k++) {
        NL_TRY(nl_data_batch(d, NL_DATA_TRAIN, o->seed, t->step * accum + k, 0, 1, (int)B, (int)T, t->x, t->y));
        nl_step_prof_mark(t->prof, NL_PROF_DATA);
        float l;
        NL_TRY(nl_model_forward(m, t->x, t->y, B, T, &l));
        loss += l / (double)accum;
        if (!isfinite(l)) break;
        NL_TRY(nl_model_backward(m));
    }
    m->prof = NULL; /* evaluations are not part of the step */
    if (!isfinite(loss))
        return nl_fail(NL_ERR_NUMERIC, "loss is %s at step %lld (lr %.3g)", isnan(loss) ? "nan" : "inf",
                       (long long)t->step + 1, (double)lr);
    rec->loss = (float)loss;
    int found_inf = 0;
    if (fp16) {
        rec->loss_scale = t->scaler.scale;
        found_inf = nl_scaler_unscale(&t->scaler, m);
        nl_scaler_update(&t->scaler, found_inf);
    }
    if (found_inf) {
        rec->skipped = 1;
        rec->grad_norm = NAN;
    } else {
        rec->grad_norm = (float)nl_grad_clip(m, o->grad_clip);
        nl_adamw_step(&t->opt, m, lr);
    }
    if (t->prof) {
        nl_step_prof_mark(t->prof, NL_PROF_OPTIM);
        t->prof->steps++;
    }
    return NL_OK;
}

nl_status nl_trainer_run(nl_trainer *t, const nl_train_opts *o, const nl_data *d, nl_train_callback cb, void *user) {
    const nl_train_layout *L = t->layout;
    int64_t T = t->seq, B = o->batch, accum = o->grad_accum > 0 ? o->grad_accum : 1;
    NL_TRY(nl_data_check_window(d, (int)T));
    if (!L && d->vocab_size > t->model.V)
        return nl_fail(NL_ERR_INVALID, "%s: tokenizer vocab %d exceeds the model's vocab %lld", d->path, d->vocab_size,
                       (long long)t->model.V);
    double t_start = nl_time_s();
    int64_t last = o->stop_after > 0 && o->stop_after < o->steps ? o->stop_after : o->steps;
    const char *kept = o->out && t->saved_step != -1 ? o->out : NULL; /* the last good checkpoint */
    t->stopped = 0;
    while (t->step < last && t->n_log < t->log_cap) {
        double t0 = nl_time_s();
        float lr = nl_lr_cosine(t->step, t->warmup, o->steps, o->lr, o->lr_min);
        nl_train_log rec = {.step = t->step + 1, .lr = lr, .val_loss = NAN, .loss_scale = 1.0f};
        nl_status rc;
        if (L) {
            double norm = 0;
            rc = nl_train_layout_step(L, d, t->step, lr, o->grad_clip, &rec.loss, &norm);
            rec.grad_norm = (float)norm;
        } else {
            rc = plain_step(t, o, d, lr, &rec);
        }
        if (rc == NL_ERR_NUMERIC)
            return nl_fail(NL_ERR_NUMERIC, "%s; training stopped%s%s", nl_last_error(),
                           kept ? ", the last good checkpoint is " : "", kept ? kept : "");
        if (rc) return rc;
        t->step++;
        double dt = nl_time_s() - t0;
        int64_t tokens = accum * B * T;
        rec.tokens_per_s = (double)tokens / dt;
        t->tokens_done += tokens;
        int stop = o->stop ? *o->stop : 0;
        if (o->stop && L && L->agree_stop) NL_TRY(L->agree_stop(L->user, &stop)); /* the same step on every rank */
        if ((o->eval_every > 0 && t->step % o->eval_every == 0) || t->step == last || stop) {
            if (!L || L->eval) {
                double vl;
                NL_TRY(L ? L->eval(L->user, d, o->eval_windows, &vl)
                         : nl_eval_loss(&t->model, d, NL_DATA_VAL, B, T, o->eval_windows, &vl, NULL));
                rec.val_loss = (float)vl;
                if (!isfinite(vl))
                    return nl_fail(NL_ERR_NUMERIC, "validation loss is %s after step %lld; training stopped%s%s",
                                   isnan(vl) ? "nan" : "inf", (long long)t->step,
                                   kept ? ", the last good checkpoint is " : "", kept ? kept : "");
            }
            NL_TRY(save(t, o));
            kept = o->out;
        }
        t->wall_s = nl_time_s() - t_start;
        t->log[t->n_log++] = rec;
        if (cb) cb(user, &rec, o);
        if (stop) {
            t->stopped = stop;
            break;
        }
    }
    return NL_OK;
}

nl_status nl_train_log_write_csv(const nl_trainer *t, const char *path) {
    size_t cap = 128 + (size_t)t->n_log * 160, len = 0;
    char *buf = nl_malloc(cap, "CSV log");
    if (!buf) return NL_ERR_NOMEM;
    len += (size_t)snprintf(buf + len, cap - len,
                            "step,lr,train_loss,val_loss,grad_norm,loss_scale,skipped,tokens_per_s\n");
    for (int64_t i = 0; i < t->n_log; i++) {
        const nl_train_log *r = &t->log[i];
        char val[32] = "";
        if (!isnan(r->val_loss)) snprintf(val, sizeof val, "%.9g", r->val_loss);
        len += (size_t)snprintf(buf + len, cap - len, "%lld,%.9g,%.9g,%s,%.9g,%.9g,%d,%.1f\n", (long long)r->step,
                                r->lr, r->loss, val, r->grad_norm, r->loss_scale, r->skipped, r->tokens_per_s);
    }
    nl_status rc = nl_write_file_atomic(path, buf, len);
    nl_free(buf);
    return rc;
}

nl_status nl_eval_loss_tokens(nl_model *m, const int *tokens, int64_t n, int64_t B, int64_t T, double *mean_loss,
                              int64_t *n_scored) {
    nl_data d;
    NL_TRY(nl_data_from_tokens(&d, "evaluation tokens", tokens, n, (int)m->arch.vocab_size));
    nl_status rc = nl_eval_loss(m, &d, NL_DATA_ALL, B, T, 0, mean_loss, n_scored);
    nl_data_free(&d);
    return rc;
}

nl_status nl_eval_loss_kv(const nl_model *m, nl_decode_state *st, const nl_data *d, nl_data_split split, int64_t T,
                          int64_t max_windows, double *mean_loss, int64_t *n_scored) {
    if (!st->mem) return nl_fail(NL_ERR_INVALID, "nl_eval_loss_kv: make the decode state first (nl_decode_state_init)");
    if (T < 1 || T > m->arch.seq_len)
        return nl_fail(NL_ERR_INVALID, "KV-cache eval: sequence length %lld must be in [1, %lld]", (long long)T,
                       (long long)m->arch.seq_len);
    int64_t windows;
    NL_TRY(nl_eval_window_count(d, split, T, max_windows, &windows));
    int32_t *x = nl_malloc((size_t)T * sizeof(int32_t), "eval window");
    int32_t *y = nl_malloc((size_t)T * sizeof(int32_t), "eval window");
    nl_status rc = (x && y) ? NL_OK : NL_ERR_NOMEM;
    double total = 0.0;
    int64_t scored = 0;
    for (int64_t w = 0; !rc && w < windows; w++) {
        int nb = 0;
        rc = nl_data_eval_batch(d, split, w, 1, (int)T, x, y, &nb);
        if (rc || nb == 0) break;
        for (int64_t t = 0; t < T; t++) {
            if (x[t] < 0 || x[t] >= m->V || y[t] < 0 || y[t] >= m->V) {
                rc = nl_fail(NL_ERR_INVALID, "%s: token %d at window %lld position %lld is outside the vocabulary",
                             d->path, (int)(x[t] < 0 || x[t] >= m->V ? x[t] : y[t]), (long long)w, (long long)t);
                break;
            }
            const float *logits = nl_model_step(m, st, x[t], t);
            if (!logits) {
                rc = NL_ERR_INVALID;
                break;
            }
            float mx = logits[0];
            for (int64_t v = 1; v < m->V; v++) mx = logits[v] > mx ? logits[v] : mx;
            double se = 0.0;
            for (int64_t v = 0; v < m->V; v++) se += exp((double)(logits[v] - mx));
            total += log(se) + (double)mx - (double)logits[y[t]];
            scored++;
        }
    }
    nl_free(x);
    nl_free(y);
    if (rc) return rc;
    *mean_loss = total / (double)scored;
    if (n_scored) *n_scored = scored;
    return NL_OK;
}

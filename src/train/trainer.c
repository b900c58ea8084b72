/* The NanoLM training loop and evaluation (see nanolm/train.h). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "nanolm/checkpoint.h"
#include "nanolm/mup.h"
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

nl_status nl_eval_loss(nl_model *m, const nl_data *d, nl_data_split split, int64_t B, int64_t T,
                       int64_t max_windows, double *mean_loss, int64_t *n_scored) {
    int64_t windows = nl_data_eval_windows(d, split, (int)T);
    if (max_windows > 0 && windows > max_windows) windows = max_windows;
    if (windows < 1)
        return nl_fail(NL_ERR_INVALID, "%s: the %s split has %lld tokens, fewer than one window of %lld + 1", d->path,
                       nl_data_split_name(split), (long long)nl_data_split_tokens(d, split), (long long)T);
    int32_t *x = nl_malloc((size_t)(B * T) * sizeof(int32_t), "eval batch");
    int32_t *y = nl_malloc((size_t)(B * T) * sizeof(int32_t), "eval batch");
    nl_status rc = (x && y) ? NL_OK : NL_ERR_NOMEM;
    double total = 0.0;
    int64_t scored = 0;
    for (int64_t w = 0; !rc && w < windows; w += B) {
        int nb = 0;
        int want = (int)(windows - w < B ? windows - w : B);
        rc = nl_data_eval_batch(d, split, w, want, (int)T, x, y, &nb);
        if (rc || nb == 0) break;
        float loss;
        rc = nl_model_forward(m, x, y, nb, T, &loss);
        if (rc) break;
        for (int64_t i = 0; i < nb * T; i++) total += m->a.losses[i];
        scored += nb * T;
    }
    nl_free(x);
    nl_free(y);
    if (rc) return rc;
    *mean_loss = total / (double)scored;
    if (n_scored) *n_scored = scored;
    return NL_OK;
}

nl_status nl_trainer_init(nl_trainer *t, const nl_arch *arch, const nl_train_opts *o) {
    memset(t, 0, sizeof *t);
    nl_status rc;
    nl_ckpt_state st;
    memset(&st, 0, sizeof st);
    if (o->resume && o->init_weights)
        return nl_fail(NL_ERR_INVALID, "--resume and --resume-weights exclude each other");
    if (o->resume || o->init_weights) {
        char tok[64];
        NL_TRY(nl_ckpt_load_model(o->resume ? o->resume : o->init_weights, &t->model, tok));
    } else {
        NL_TRY(nl_model_init(&t->model, arch));
        nl_model_init_random(&t->model, o->seed);
    }
    nl_model *m = &t->model;
    if (o->batch <= 0 || o->seq <= 0 || o->seq > m->arch.seq_len) {
        rc = nl_fail(NL_ERR_INVALID, "--seq %lld must be in [1, %lld] (the model's seq_len) and --batch positive",
                     (long long)o->seq, (long long)m->arch.seq_len);
        goto fail;
    }
    if ((rc = nl_model_alloc_grads(m)) || (rc = nl_model_alloc_acts(m, o->batch, o->seq)) ||
        (rc = nl_model_set_precision(m, o->precision)) ||
        (rc = nl_adamw_init(&t->opt, m, o->beta1, o->beta2, o->adam_eps, o->weight_decay)))
        goto fail;
    if (o->mup_base_dim > 0) { /* muP hooks: output multiplier, per-tensor learning rates, init */
        t->mup = nl_calloc(1, sizeof *t->mup, "muP");
        if (!t->mup) { rc = NL_ERR_NOMEM; goto fail; }
        if ((rc = nl_mup_init(t->mup, m, &t->opt, o->mup_base_dim, !o->resume && !o->init_weights))) goto fail;
    }
    nl_scaler_init(&t->scaler);
    if (o->loss_scale_init > 0) t->scaler.scale = o->loss_scale_init;
    t->saved_step = o->resume ? -2 : -1; /* -2: the resumed file is a good checkpoint too */
    nl_rng_seed(&t->rng, o->seed ^ 0x9e3779b97f4a7c15ULL);
    if (o->resume) {
        st.opt = &t->opt;
        if ((rc = nl_ckpt_load_state(o->resume, m, &st))) goto fail;
        if (st.precision != o->precision) {
            rc = nl_fail(NL_ERR_INVALID, "%s was trained with a different --precision; resume with the same one", o->resume);
            goto fail;
        }
        t->step = st.step;
        t->rng = st.rng;
        t->scaler = st.scaler;
    }
    t->x = nl_malloc((size_t)(o->batch * o->seq) * sizeof(int32_t), "batch inputs");
    t->y = nl_malloc((size_t)(o->batch * o->seq) * sizeof(int32_t), "batch targets");
    t->log = nl_calloc((size_t)(o->steps > 0 ? o->steps : 1), sizeof(nl_train_log), "training log");
    if (!t->x || !t->y || !t->log) {
        rc = NL_ERR_NOMEM;
        goto fail;
    }
    t->mem.params = nl_model_param_bytes(m);
    t->mem.grads = m->n_params * sizeof(float);
    t->mem.optimizer = nl_adamw_bytes(&t->opt);
    t->mem.activations = nl_model_act_bytes(m);
    t->mem.lp_weights = nl_model_lp_weight_bytes(m);
    t->mem.batch = 2 * (size_t)(o->batch * o->seq) * sizeof(int32_t);
    t->mem.total = t->mem.params + t->mem.grads + t->mem.optimizer + t->mem.activations + t->mem.lp_weights + t->mem.batch;
    return NL_OK;
fail:
    nl_trainer_free(t);
    return rc;
}

void nl_trainer_free(nl_trainer *t) {
    if (t->mup) nl_mup_free(t->mup, &t->model, &t->opt);
    nl_free(t->mup);
    nl_model_free(&t->model);
    nl_adamw_free(&t->opt);
    nl_free(t->x);
    nl_free(t->y);
    nl_free(t->log);
    memset(t, 0, sizeof *t);
}

static nl_status save(nl_trainer *t, const nl_train_opts *o) {
    if (!o->out) return NL_OK;
    nl_ckpt_state st = {t->step, t->rng, &t->opt, t->scaler, o->precision};
    NL_TRY(nl_ckpt_save(o->out, &t->model, o->tokenizer, &st));
    t->saved_step = t->step;
    return NL_OK;
}

nl_status nl_trainer_run(nl_trainer *t, const nl_train_opts *o, const nl_data *d, nl_train_callback cb, void *user) {
    nl_model *m = &t->model;
    int64_t T = o->seq, B = o->batch, accum = o->grad_accum > 0 ? o->grad_accum : 1;
    NL_TRY(nl_data_check_window(d, (int)T));
    if (d->vocab_size > m->V)
        return nl_fail(NL_ERR_INVALID, "%s: tokenizer vocab %d exceeds the model's vocab %lld", d->path, d->vocab_size,
                       (long long)m->V);
    double t_start = nl_time_s();
    int64_t last = o->stop_after > 0 && o->stop_after < o->steps ? o->stop_after : o->steps;
    while (t->step < last) {
        double t0 = nl_time_s();
        float lr = nl_lr_cosine(t->step, o->warmup, o->steps, o->lr, o->lr_min);
        nl_model_zero_grad(m);
        int fp16 = o->precision == NL_PREC_FP16;
        m->loss_scale = (fp16 ? t->scaler.scale : 1.0f) / (float)accum;
        double loss = 0.0;
        for (int64_t k = 0; k < accum; k++) {
            NL_TRY(nl_data_batch(d, NL_DATA_TRAIN, o->seed, t->step * accum + k, 0, 1, (int)B, (int)T, t->x, t->y));
            float l;
            NL_TRY(nl_model_forward(m, t->x, t->y, B, T, &l));
            loss += l / (double)accum;
            if (!isfinite(l)) break;
            NL_TRY(nl_model_backward(m));
        }
        if (!isfinite(loss))
            return nl_fail(NL_ERR_NUMERIC, "loss is %s at step %lld (lr %.3g); training stopped%s%s", isnan(loss) ? "nan" : "inf",
                           (long long)t->step + 1, (double)lr, o->out && t->saved_step != -1 ? ", the last good checkpoint is " : "",
                           o->out && t->saved_step != -1 ? o->out : "");
        nl_train_log rec = {.step = t->step + 1, .lr = lr, .loss = (float)loss, .val_loss = NAN, .loss_scale = 1.0f};
        int found_inf = 0;
        if (fp16) {
            rec.loss_scale = t->scaler.scale;
            found_inf = nl_scaler_unscale(&t->scaler, m);
            nl_scaler_update(&t->scaler, found_inf);
        }
        if (found_inf) {
            rec.skipped = 1;
            rec.grad_norm = NAN;
        } else {
            rec.grad_norm = (float)nl_grad_clip(m, o->grad_clip);
            nl_adamw_step(&t->opt, m, lr);
        }
        t->step++;
        double dt = nl_time_s() - t0;
        rec.tokens_per_s = (double)(accum * B * T) / dt;
        t->tokens_done += accum * B * T;
        if ((o->eval_every > 0 && t->step % o->eval_every == 0) || t->step == last) {
            double vl;
            NL_TRY(nl_eval_loss(m, d, NL_DATA_VAL, B, T, o->eval_windows, &vl, NULL));
            rec.val_loss = (float)vl;
            if (!isfinite(vl))
                return nl_fail(NL_ERR_NUMERIC, "validation loss is %s after step %lld; training stopped%s%s",
                               isnan(vl) ? "nan" : "inf", (long long)t->step, o->out && t->saved_step != -1 ? ", the last good checkpoint is " : "",
                               o->out && t->saved_step != -1 ? o->out : "");
            NL_TRY(save(t, o));
        }
        t->wall_s = nl_time_s() - t_start;
        t->log[t->n_log++] = rec;
        if (cb) cb(user, &rec, o);
    }
    return NL_OK;
}

nl_status nl_eval_loss_tokens(nl_model *m, const int *tokens, int64_t n, int64_t B, int64_t T,
                              double *mean_loss, int64_t *n_scored) {
    nl_data d;
    NL_TRY(nl_data_from_tokens(&d, "evaluation tokens", tokens, n, (int)m->arch.vocab_size));
    nl_status rc = nl_eval_loss(m, &d, NL_DATA_ALL, B, T, 0, mean_loss, n_scored);
    nl_data_free(&d);
    return rc;
}

nl_status nl_eval_loss_kv(nl_model *m, const nl_data *d, nl_data_split split, int64_t T, int64_t max_windows,
                          double *mean_loss, int64_t *n_scored) {
    if (!m->kv_cache) return nl_fail(NL_ERR_INVALID, "nl_eval_loss_kv: allocate the KV cache first");
    if (T < 1 || T > m->arch.seq_len)
        return nl_fail(NL_ERR_INVALID, "KV-cache eval: --seq %lld must be in [1, %lld]", (long long)T,
                       (long long)m->arch.seq_len);
    int64_t windows = nl_data_eval_windows(d, split, (int)T);
    if (max_windows > 0 && windows > max_windows) windows = max_windows;
    if (windows < 1)
        return nl_fail(NL_ERR_INVALID, "%s: the %s split has %lld tokens, fewer than one window of %lld + 1", d->path,
                       nl_data_split_name(split), (long long)nl_data_split_tokens(d, split), (long long)T);
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
            const float *logits = nl_model_step(m, x[t], t);
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

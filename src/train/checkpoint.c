/* NanoLM checkpoints: safetensors with HF Llama names + training state (see nanolm/checkpoint.h). */
#include <cjson/cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nanolm/checkpoint.h"
#include "nanolm/model_load.h"
#include "nanolm/resources.h"
#include "nanolm/llama2c.h"
#include "nanolm/safetensors.h"

const char *nl_precision_name(nl_precision p) {
    return p == NL_PREC_BF16 ? "bf16" : p == NL_PREC_FP16 ? "fp16" : "fp32";
}


nl_status nl_ckpt_save(const char *path, const nl_model *m, const char *tokenizer, const nl_ckpt_state *st) {
    nl_st_writer w;
    nl_st_writer_init(&w);
    nl_status rc = NL_OK;
    char *aj = nl_arch_to_json(&m->arch), *tj = NULL;
    char(*names)[112] = NULL;
    rc = nl_st_writer_meta(&w, "format", "pt");
    if (!rc) rc = nl_st_writer_meta(&w, "nanolm.arch", aj);
    if (!rc) rc = nl_st_writer_meta(&w, "nanolm.tokenizer", tokenizer ? tokenizer : "byte");
    const nl_param_info *tab;
    int nt = nl_model_params_table(m, &tab);
    for (int i = 0; i < nt && !rc; i++)
        rc = nl_st_writer_add(&w, tab[i].name, NL_ST_F32, tab[i].ndim, tab[i].shape, m->params + tab[i].offset);
    if (!rc && st && st->opt) {
        cJSON *o = cJSON_CreateObject();
        char buf[32];
        cJSON_AddNumberToObject(o, "step", (double)st->step);
        cJSON_AddStringToObject(o, "precision", nl_precision_name(st->precision));
        cJSON *rng = cJSON_AddArrayToObject(o, "rng");
        for (int k = 0; k < 4; k++) {
            snprintf(buf, sizeof buf, "%" PRIu64, st->rng.s[k]);
            cJSON_AddItemToArray(rng, cJSON_CreateString(buf));
        }
        cJSON *ad = cJSON_AddObjectToObject(o, "adamw");
        cJSON_AddNumberToObject(ad, "t", (double)st->opt->t);
        cJSON_AddNumberToObject(ad, "beta1", st->opt->beta1);
        cJSON_AddNumberToObject(ad, "beta2", st->opt->beta2);
        cJSON_AddNumberToObject(ad, "eps", st->opt->eps);
        cJSON_AddNumberToObject(ad, "weight_decay", st->opt->weight_decay);
        cJSON *sc = cJSON_AddObjectToObject(o, "scaler");
        cJSON_AddNumberToObject(sc, "scale", st->scaler.scale);
        cJSON_AddNumberToObject(sc, "good_steps", (double)st->scaler.good_steps);
        cJSON_AddNumberToObject(sc, "skipped", (double)st->scaler.skipped);
        cJSON_AddNumberToObject(sc, "growth_interval", (double)st->scaler.growth_interval);
        cJSON *run = cJSON_AddObjectToObject(o, "run");
        cJSON_AddNumberToObject(run, "mup_base_dim", (double)st->run.mup_base_dim);
        cJSON_AddNumberToObject(run, "loss_scaling", st->run.loss_scaling);
        cJSON_AddStringToObject(run, "qat", st->run.qat);
        cJSON_AddStringToObject(run, "fp8", st->run.fp8);
        cJSON_AddStringToObject(run, "schedule", st->run.schedule[0] ? st->run.schedule : "cosine");
        cJSON_AddNumberToObject(run, "warmup", (double)st->run.warmup);
        tj = cJSON_PrintUnformatted(o);
        cJSON_Delete(o);
        rc = nl_st_writer_meta(&w, "nanolm.train", tj);
        names = calloc((size_t)nt * 2, sizeof *names);
        for (int i = 0; i < nt && !rc; i++) {
            snprintf(names[2 * i], sizeof names[0], "optimizer.exp_avg.%s", tab[i].name);
            snprintf(names[2 * i + 1], sizeof names[0], "optimizer.exp_avg_sq.%s", tab[i].name);
            rc = nl_st_writer_add(&w, names[2 * i], NL_ST_F32, tab[i].ndim, tab[i].shape, st->opt->m + tab[i].offset);
            if (!rc)
                rc = nl_st_writer_add(&w, names[2 * i + 1], NL_ST_F32, tab[i].ndim, tab[i].shape,
                                      st->opt->v + tab[i].offset);
        }
    }
    if (!rc) rc = nl_st_writer_write(&w, path);
    nl_st_writer_free(&w);
    free(names);
    cJSON_free(aj);
    if (tj) cJSON_free(tj);
    return rc;
}

nl_status nl_ckpt_load_model(const char *path, nl_model *m, char *tokenizer) {
    return nl_model_load_ckpt(path, m, tokenizer);
}

/* ---- training state: parse and validate ------------------------------------------------------ */

/* An integer field in [lo, hi] (a JSON number with no fraction). */
static nl_status get_int(const char *src, const cJSON *obj, const char *field, const char *name, int64_t lo, int64_t hi,
                         int64_t *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, field);
    if (!cJSON_IsNumber(v)) return nl_fail(NL_ERR_FORMAT, "%s: nanolm.train %s is missing or not a number", src, name);
    double d = v->valuedouble;
    if (!isfinite(d) || d != floor(d) || d < (double)lo || d > (double)hi)
        return nl_fail(NL_ERR_FORMAT, "%s: nanolm.train %s is %.17g, expected an integer in [%lld, %lld]", src, name, d,
                       (long long)lo, (long long)hi);
    *out = (int64_t)d;
    return NL_OK;
}

/* A finite float field in [lo, hi] (hi_open: < hi). */
static nl_status get_float(const char *src, const cJSON *obj, const char *field, const char *name, double lo, double hi,
                           int hi_open, float *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, field);
    if (!cJSON_IsNumber(v)) return nl_fail(NL_ERR_FORMAT, "%s: nanolm.train %s is missing or not a number", src, name);
    double d = v->valuedouble;
    if (!isfinite(d) || d < lo || d > hi || (hi_open && d >= hi) || !isfinite((float)d))
        return nl_fail(NL_ERR_FORMAT, "%s: nanolm.train %s is %.17g, expected a finite number in [%g, %g%s", src, name,
                       d, lo, hi, hi_open ? ")" : "]");
    *out = (float)d;
    return NL_OK;
}

/* A string field copied into out (cap bytes); missing -> def. */
static nl_status get_str(const char *src, const cJSON *obj, const char *field, const char *name, const char *def,
                         char *out, size_t cap) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, field);
    if (!v) {
        snprintf(out, cap, "%s", def);
        return NL_OK;
    }
    if (!cJSON_IsString(v) || strlen(v->valuestring) >= cap)
        return nl_fail(NL_ERR_FORMAT, "%s: nanolm.train %s is not a string of at most %zu characters", src, name,
                       cap - 1);
    snprintf(out, cap, "%s", v->valuestring);
    return NL_OK;
}

#define NL_MAX_EXACT_STEP ((int64_t)1 << 53) /* integers a JSON double holds exactly */

nl_status nl_ckpt_state_parse(const char *src, const char *json, nl_ckpt_state *st) {
    cJSON *o = json ? cJSON_Parse(json) : NULL;
    if (!o) return nl_fail(NL_ERR_FORMAT, "%s: nanolm.train is not valid JSON", src);
    nl_status rc = NL_OK;
    if (!cJSON_IsObject(o)) {
        rc = nl_fail(NL_ERR_FORMAT, "%s: nanolm.train is not a JSON object", src);
        goto done;
    }
    int64_t v;
    if ((rc = get_int(src, o, "step", "step", 0, NL_MAX_EXACT_STEP, &st->step))) goto done;
    const cJSON *rng = cJSON_GetObjectItemCaseSensitive(o, "rng");
    if (!cJSON_IsArray(rng) || cJSON_GetArraySize(rng) != 4) {
        rc = nl_fail(NL_ERR_FORMAT, "%s: nanolm.train rng is not an array of 4 strings", src);
        goto done;
    }
    uint64_t any = 0;
    for (int k = 0; k < 4; k++) {
        const cJSON *e = cJSON_GetArrayItem(rng, k);
        const char *s = cJSON_IsString(e) ? e->valuestring : NULL;
        char *end = NULL;
        errno = 0;
        unsigned long long u = s && s[0] >= '0' && s[0] <= '9' ? strtoull(s, &end, 10) : 0;
        if (!s || !end || *end || errno || end - s > 20) {
            rc = nl_fail(NL_ERR_FORMAT, "%s: nanolm.train rng[%d] is not a decimal 64-bit unsigned integer", src, k);
            goto done;
        }
        st->rng.s[k] = (uint64_t)u;
        any |= u;
    }
    if (!any) { /* xoshiro's one forbidden state: it would return zeros forever */
        rc = nl_fail(NL_ERR_FORMAT, "%s: nanolm.train rng is all zero", src);
        goto done;
    }
    const cJSON *pr = cJSON_GetObjectItemCaseSensitive(o, "precision");
    if (!cJSON_IsString(pr)) {
        rc = nl_fail(NL_ERR_FORMAT, "%s: nanolm.train precision is missing or not a string", src);
        goto done;
    }
    if (!strcmp(pr->valuestring, "fp32"))
        st->precision = NL_PREC_FP32;
    else if (!strcmp(pr->valuestring, "bf16"))
        st->precision = NL_PREC_BF16;
    else if (!strcmp(pr->valuestring, "fp16"))
        st->precision = NL_PREC_FP16;
    else {
        rc = nl_fail(NL_ERR_FORMAT, "%s: nanolm.train precision \"%.40s\" is not one of fp32, bf16, fp16", src,
                     pr->valuestring);
        goto done;
    }
    const cJSON *ad = cJSON_GetObjectItemCaseSensitive(o, "adamw"), *sc = cJSON_GetObjectItemCaseSensitive(o, "scaler");
    if (!cJSON_IsObject(ad) || !cJSON_IsObject(sc)) {
        rc = nl_fail(NL_ERR_FORMAT, "%s: nanolm.train %s is missing or not an object", src,
                     cJSON_IsObject(ad) ? "scaler" : "adamw");
        goto done;
    }
    float b1, b2, eps, wd;
    if ((rc = get_int(src, ad, "t", "adamw.t", 0, st->step, &v))) goto done;
    if ((rc = get_float(src, ad, "beta1", "adamw.beta1", 0, 1, 1, &b1)) ||
        (rc = get_float(src, ad, "beta2", "adamw.beta2", 0, 1, 1, &b2)) ||
        (rc = get_float(src, ad, "eps", "adamw.eps", 1e-30, 1, 0, &eps)) ||
        (rc = get_float(src, ad, "weight_decay", "adamw.weight_decay", 0, 1e6, 0, &wd)))
        goto done;
    (void)b1, (void)b2, (void)eps, (void)wd;
    if (st->opt) st->opt->t = v; /* the hyper-parameters are the run's own (validated only) */
    nl_scaler_init(&st->scaler);
    if ((rc = get_float(src, sc, "scale", "scaler.scale", 1e-38, 3.4e38, 0, &st->scaler.scale)) ||
        (rc = get_int(src, sc, "good_steps", "scaler.good_steps", 0, st->step, &st->scaler.good_steps)) ||
        (rc = get_int(src, sc, "skipped", "scaler.skipped", 0, st->step, &st->scaler.skipped)) ||
        (rc = get_int(src, sc, "growth_interval", "scaler.growth_interval", 1, NL_MAX_EXACT_STEP,
                      &st->scaler.growth_interval)))
        goto done;
    /* the run block (absent in checkpoints written before it existed: defaults, warmup unknown) */
    memset(&st->run, 0, sizeof st->run);
    st->run.loss_scaling = 1;
    st->run.warmup = -1;
    snprintf(st->run.schedule, sizeof st->run.schedule, "cosine");
    const cJSON *run = cJSON_GetObjectItemCaseSensitive(o, "run");
    if (run) {
        if (!cJSON_IsObject(run)) {
            rc = nl_fail(NL_ERR_FORMAT, "%s: nanolm.train run is not an object", src);
            goto done;
        }
        if ((rc = get_int(src, run, "mup_base_dim", "run.mup_base_dim", 0, 1 << 20, &st->run.mup_base_dim)) ||
            (rc = get_int(src, run, "loss_scaling", "run.loss_scaling", 0, 1, &v)))
            goto done;
        st->run.loss_scaling = (int)v;
        if ((rc = get_str(src, run, "qat", "run.qat", "", st->run.qat, sizeof st->run.qat)) ||
            (rc = get_str(src, run, "fp8", "run.fp8", "", st->run.fp8, sizeof st->run.fp8)) ||
            (rc = get_str(src, run, "schedule", "run.schedule", "cosine", st->run.schedule, sizeof st->run.schedule)) ||
            (rc = get_int(src, run, "warmup", "run.warmup", 0, NL_MAX_EXACT_STEP, &st->run.warmup)))
            goto done;
        if (strcmp(st->run.schedule, "cosine")) {
            rc = nl_fail(NL_ERR_FORMAT, "%s: nanolm.train run.schedule \"%s\" is not a known schedule (cosine)", src,
                         st->run.schedule);
            goto done;
        }
    }
done:
    cJSON_Delete(o);
    return rc;
}

/* The moments must be finite and the second one non-negative (a NaN would poison every step). */
static nl_status check_moments(const char *path, const nl_model *m, const nl_adamw *opt) {
    const nl_param_info *tab;
    int nt = nl_model_params_table(m, &tab);
    for (int k = 0; k < nt; k++)
        for (size_t i = 0; i < tab[k].numel; i++) {
            float a = opt->m[tab[k].offset + i], b = opt->v[tab[k].offset + i];
            if (!isfinite(a) || !isfinite(b) || b < 0)
                return nl_fail(NL_ERR_FORMAT,
                               "%s: optimizer.%s.%s[%zu] is %g (moments must be finite, exp_avg_sq >= 0)", path,
                               !isfinite(a) ? "exp_avg" : "exp_avg_sq", tab[k].name, i, (double)(!isfinite(a) ? a : b));
        }
    return NL_OK;
}

nl_status nl_ckpt_load_state(const char *path, const nl_model *m, nl_ckpt_state *st) {
    nl_st_file f;
    NL_TRY(nl_st_open(&f, path));
    nl_status rc = NL_OK;
    const char *tj = nl_st_meta(&f, "nanolm.train");
    if (!tj) {
        rc = nl_fail(NL_ERR_FORMAT, "%s: no training state (__metadata__ nanolm.train); was it saved by nanolm train?",
                     path);
        goto done;
    }
    if ((rc = nl_ckpt_state_parse(path, tj, st))) goto done;
    if (st->opt) {
        rc = nl_model_load_st_params(&f, m, "optimizer.exp_avg.", st->opt->m);
        if (!rc) rc = nl_model_load_st_params(&f, m, "optimizer.exp_avg_sq.", st->opt->v);
        if (!rc) rc = check_moments(path, m, st->opt);
    }
done:
    nl_st_close(&f);
    return rc;
}

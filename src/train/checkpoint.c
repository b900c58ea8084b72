/* NanoLM checkpoints: safetensors with HF Llama names + training state (see nanolm/checkpoint.h). */
#include <cjson/cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nanolm/checkpoint.h"
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

/* Loads every model tensor from an opened file into m->params (shapes checked by the reader). */
static nl_status load_params(const nl_st_file *f, nl_model *m, const char *prefix, float *dst) {
    const nl_param_info *tab;
    int nt = nl_model_params_table(m, &tab);
    char name[160];
    for (int i = 0; i < nt; i++) {
        snprintf(name, sizeof name, "%s%s", prefix, tab[i].name);
        const nl_st_tensor *t = nl_st_find(f, name);
        if (t && t->dtype != NL_ST_F32 && t->dtype != NL_ST_BF16 && t->dtype != NL_ST_F16)
            return nl_fail(NL_ERR_FORMAT, "%s: tensor %s has dtype %s, expected F32, BF16 or F16", f->path, name,
                           nl_st_dtype_name(t->dtype));
        NL_TRY(nl_st_read_f32(f, name, tab[i].ndim, tab[i].shape, dst + tab[i].offset));
    }
    return NL_OK;
}

/* llama2.c legacy .bin: arrays stacked over layers, (L, out, in), mapped onto the flat layout. */
static nl_status load_llama2c(const char *path, nl_model *m) {
    nl_llama2c c;
    NL_TRY(nl_llama2c_read(&c, path));
    nl_status rc = nl_model_init(m, &c.arch);
    if (rc) {
        nl_llama2c_free(&c);
        return rc;
    }
    static const struct {
        const char *name;
        nl_param_kind kind;
    } map[] = {{"token_embedding", NL_PARAM_EMBED},
               {"rms_att", NL_PARAM_RMS_ATT},
               {"wq", NL_PARAM_WQ},
               {"wk", NL_PARAM_WK},
               {"wv", NL_PARAM_WV},
               {"wo", NL_PARAM_WO},
               {"rms_ffn", NL_PARAM_RMS_FFN},
               {"w1", NL_PARAM_W1},
               {"w2", NL_PARAM_W2},
               {"w3", NL_PARAM_W3},
               {"rms_final", NL_PARAM_RMS_FINAL},
               {"wcls", NL_PARAM_CLS}};
    for (size_t k = 0; k < sizeof map / sizeof map[0]; k++) {
        const nl_llama2c_tensor *t = nl_llama2c_find(&c, map[k].name);
        if (!t) {
            if (map[k].kind == NL_PARAM_CLS && m->arch.tied_embeddings) continue;
            rc = nl_fail(NL_ERR_FORMAT, "%s: no array %s", path, map[k].name);
            break;
        }
        /* the tensors of this kind, in layer order, must add up to the array */
        int64_t used = 0;
        for (int i = 0; i < m->n_tensors; i++) {
            const nl_param_info *p = &m->table[i];
            if (p->kind != map[k].kind) continue;
            if (used + (int64_t)p->numel > t->numel) break;
            memcpy(m->params + p->offset, t->data + used, p->numel * sizeof(float));
            used += (int64_t)p->numel;
        }
        if (used != t->numel) {
            rc = nl_fail(NL_ERR_FORMAT, "%s: array %s has %lld floats but the arch needs %lld", path, map[k].name,
                         (long long)t->numel, (long long)used);
            break;
        }
    }
    nl_llama2c_free(&c);
    if (rc) nl_model_free(m);
    return rc;
}

/* 1 when the file looks like safetensors (u64 header length, then '{'). */
static int is_safetensors(const char *path) {
    FILE *fp = NULL;
    if (nl_file_open_read_stdio(path, &fp)) return 0;
    unsigned char b[9];
    int ok = fp && fread(b, 1, 9, fp) == 9 && b[8] == '{';
    if (fp) fclose(fp);
    return ok;
}

nl_status nl_ckpt_load_model(const char *path, nl_model *m, char *tokenizer) {
    memset(m, 0, sizeof *m);
    if (!is_safetensors(path)) {
        FILE *fp;
        NL_TRY(nl_file_open_read_stdio(path, &fp));
        fclose(fp);
        NL_TRY(load_llama2c(path, m));
        if (tokenizer) snprintf(tokenizer, 64, "tok512");
        return NL_OK;
    }
    nl_st_file f;
    NL_TRY(nl_st_open(&f, path));
    const char *aj = nl_st_meta(&f, "nanolm.arch");
    nl_arch a;
    nl_status rc = aj ? nl_arch_from_json(path, aj, &a)
                      : nl_fail(NL_ERR_FORMAT, "%s: no __metadata__ nanolm.arch (not a nanolm checkpoint)", path);
    if (!rc) { /* refuse a model larger than memory before allocating it (no OOM kill) */
        nl_arch_params np;
        nl_arch_count_params(&a, &np);
        char what[512];
        snprintf(what, sizeof what, "%s: a model of %lld parameters", path, (long long)np.total);
        rc = nl_mem_require((uint64_t)np.total * sizeof(float), what);
    }
    if (!rc) rc = nl_model_init(m, &a);
    if (!rc) rc = load_params(&f, m, "", m->params);
    if (!rc && tokenizer) {
        const char *tk = nl_st_meta(&f, "nanolm.tokenizer");
        snprintf(tokenizer, 64, "%s", tk ? tk : "byte");
    }
    if (rc) nl_model_free(m);
    nl_st_close(&f);
    return rc;
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
        rc = load_params(&f, (nl_model *)m, "optimizer.exp_avg.", st->opt->m);
        if (!rc) rc = load_params(&f, (nl_model *)m, "optimizer.exp_avg_sq.", st->opt->v);
        if (!rc) rc = check_moments(path, m, st->opt);
    }
done:
    nl_st_close(&f);
    return rc;
}

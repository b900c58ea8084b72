/* NanoLM checkpoints: safetensors with HF Llama names + training state (see nanolm/checkpoint.h). */
#include <cjson/cJSON.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nanolm/checkpoint.h"
#include "nanolm/resources.h"
#include "nanolm/llama2c.h"
#include "nanolm/safetensors.h"

static const char *prec_name(nl_precision p) {
    return p == NL_PREC_BF16 ? "bf16" : p == NL_PREC_FP16 ? "fp16" : "fp32";
}


nl_status nl_ckpt_save(const char *path, const nl_model *m, const char *tokenizer, const nl_ckpt_state *st) {
    nl_st_writer w;
    nl_st_writer_init(&w);
    nl_status rc = NL_OK;
    char *aj = nl_arch_to_json(&m->arch), *tj = NULL;
    char (*names)[112] = NULL;
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
        cJSON_AddStringToObject(o, "precision", prec_name(st->precision));
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
        tj = cJSON_PrintUnformatted(o);
        cJSON_Delete(o);
        rc = nl_st_writer_meta(&w, "nanolm.train", tj);
        names = calloc((size_t)nt * 2, sizeof *names);
        for (int i = 0; i < nt && !rc; i++) {
            snprintf(names[2 * i], sizeof names[0], "optimizer.exp_avg.%s", tab[i].name);
            snprintf(names[2 * i + 1], sizeof names[0], "optimizer.exp_avg_sq.%s", tab[i].name);
            rc = nl_st_writer_add(&w, names[2 * i], NL_ST_F32, tab[i].ndim, tab[i].shape, st->opt->m + tab[i].offset);
            if (!rc)
                rc = nl_st_writer_add(&w, names[2 * i + 1], NL_ST_F32, tab[i].ndim, tab[i].shape, st->opt->v + tab[i].offset);
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
    static const struct { const char *name; nl_param_kind kind; } map[] = {
        {"token_embedding", NL_PARAM_EMBED}, {"rms_att", NL_PARAM_RMS_ATT}, {"wq", NL_PARAM_WQ}, {"wk", NL_PARAM_WK},
        {"wv", NL_PARAM_WV}, {"wo", NL_PARAM_WO}, {"rms_ffn", NL_PARAM_RMS_FFN}, {"w1", NL_PARAM_W1},
        {"w2", NL_PARAM_W2}, {"w3", NL_PARAM_W3}, {"rms_final", NL_PARAM_RMS_FINAL}, {"wcls", NL_PARAM_CLS}};
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

nl_status nl_ckpt_load_state(const char *path, const nl_model *m, nl_ckpt_state *st) {
    nl_st_file f;
    NL_TRY(nl_st_open(&f, path));
    nl_status rc = NL_OK;
    const char *tj = nl_st_meta(&f, "nanolm.train");
    cJSON *o = tj ? cJSON_Parse(tj) : NULL;
    if (!o) {
        rc = nl_fail(NL_ERR_FORMAT, "%s: no training state (__metadata__ nanolm.train); was it saved by nanolm train?", path);
        goto done;
    }
    cJSON *step = cJSON_GetObjectItemCaseSensitive(o, "step"), *rng = cJSON_GetObjectItemCaseSensitive(o, "rng");
    cJSON *ad = cJSON_GetObjectItemCaseSensitive(o, "adamw"), *sc = cJSON_GetObjectItemCaseSensitive(o, "scaler");
    cJSON *pr = cJSON_GetObjectItemCaseSensitive(o, "precision");
    if (!cJSON_IsNumber(step) || !cJSON_IsArray(rng) || cJSON_GetArraySize(rng) != 4 || !cJSON_IsObject(ad) ||
        !cJSON_IsObject(sc) || !cJSON_IsString(pr)) {
        rc = nl_fail(NL_ERR_FORMAT, "%s: nanolm.train is missing step, rng, adamw, scaler or precision", path);
        goto done;
    }
    st->step = (int64_t)step->valuedouble;
    for (int k = 0; k < 4; k++) {
        cJSON *e = cJSON_GetArrayItem(rng, k);
        if (!cJSON_IsString(e)) {
            rc = nl_fail(NL_ERR_FORMAT, "%s: nanolm.train rng[%d] is not a string", path, k);
            goto done;
        }
        st->rng.s[k] = strtoull(e->valuestring, NULL, 10);
    }
    st->precision = !strcmp(pr->valuestring, "bf16") ? NL_PREC_BF16 : !strcmp(pr->valuestring, "fp16") ? NL_PREC_FP16 : NL_PREC_FP32;
    cJSON *v;
    if (st->opt) {
        if (cJSON_IsNumber(v = cJSON_GetObjectItemCaseSensitive(ad, "t"))) st->opt->t = (int64_t)v->valuedouble;
        rc = load_params(&f, (nl_model *)m, "optimizer.exp_avg.", st->opt->m);
        if (!rc) rc = load_params(&f, (nl_model *)m, "optimizer.exp_avg_sq.", st->opt->v);
        if (rc) goto done;
    }
    nl_scaler_init(&st->scaler);
    if (cJSON_IsNumber(v = cJSON_GetObjectItemCaseSensitive(sc, "scale"))) st->scaler.scale = (float)v->valuedouble;
    if (cJSON_IsNumber(v = cJSON_GetObjectItemCaseSensitive(sc, "good_steps"))) st->scaler.good_steps = (int64_t)v->valuedouble;
    if (cJSON_IsNumber(v = cJSON_GetObjectItemCaseSensitive(sc, "skipped"))) st->scaler.skipped = (int64_t)v->valuedouble;
    if (cJSON_IsNumber(v = cJSON_GetObjectItemCaseSensitive(sc, "growth_interval"))) st->scaler.growth_interval = (int64_t)v->valuedouble;
done:
    cJSON_Delete(o);
    nl_st_close(&f);
    return rc;
}

/* Checkpoint-format dispatch and the NanoLM / llama2.c checkpoint loaders. See
 * include/nanolm/model_load.h. */
#include "nanolm/model_load.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nanolm/bpe.h"
#include "nanolm/gguf_model.h"
#include "nanolm/hf.h"
#include "nanolm/llama2c.h"
#include "nanolm/quantize_model.h"
#include "nanolm/resources.h"
#include "nanolm/safetensors.h"

/* Loads every model tensor from an opened file into m->params (shapes checked by the reader). */
nl_status nl_model_load_st_params(const nl_st_file *f, const nl_model *m, const char *prefix, float *dst) {
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

nl_status nl_model_load_ckpt(const char *path, nl_model *m, char *tokenizer) {
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
    if (!rc) rc = nl_model_load_st_params(&f, m, "", m->params);
    if (!rc && tokenizer) {
        const char *tk = nl_st_meta(&f, "nanolm.tokenizer");
        snprintf(tokenizer, 64, "%s", tk ? tk : "byte");
    }
    if (rc) nl_model_free(m);
    nl_st_close(&f);
    return rc;
}

nl_status nl_model_load(const char *ckpt, const char *tok_path, int64_t max_seq, nl_model *m, nl_tokenizer *tok,
                        nl_model_source *src) {
    nl_model_source local;
    if (!src) src = &local;
    memset(src, 0, sizeof *src);
    memset(m, 0, sizeof *m);
    if (tok) memset(tok, 0, sizeof *tok);
    snprintf(src->tokenizer, sizeof src->tokenizer, "byte");
    if (nl_hf_is_folder(ckpt)) {
        src->format = NL_CKPT_HF;
        snprintf(src->tokenizer, sizeof src->tokenizer, "hf");
        NL_TRY(nl_hf_load_model(ckpt, max_seq, m));
    } else if (nl_gguf_is_file(ckpt)) {
        src->format = NL_CKPT_GGUF;
        snprintf(src->tokenizer, sizeof src->tokenizer, "gguf");
        nl_gguf_info info;
        NL_TRY(nl_gguf_load_model(ckpt, max_seq, m, &info));
        src->gguf_type = info.linear_type;
    } else if (nl_qmodel_is_quantized(ckpt)) {
        src->format = NL_CKPT_QUANTIZED;
        nl_qmodel qm;
        NL_TRY(nl_qmodel_load(ckpt, m, &qm, src->tokenizer));
        src->int8_per_channel = nl_qmodel_w8a8_ok(&qm.spec);
        nl_qmodel_free(&qm);
    } else {
        src->format = is_safetensors(ckpt) ? NL_CKPT_SAFETENSORS : NL_CKPT_LLAMA2C;
        NL_TRY(nl_model_load_ckpt(ckpt, m, src->tokenizer));
    }
    if (!tok) return NL_OK;
    nl_status rc = src->format == NL_CKPT_GGUF && !tok_path
                       ? nl_gguf_load_tokenizer(ckpt, m->V, tok)
                       : nl_hf_load_tokenizer(ckpt, src->tokenizer, tok_path, m->V, tok);
    if (rc) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", nl_last_error());
        nl_model_free(m);
        memset(m, 0, sizeof *m);
        return nl_fail(rc, "%s", msg);
    }
    return NL_OK;
}

nl_status nl_model_load_arch(const char *ckpt, nl_arch *a) {
    size_t n = strlen(ckpt);
    if (nl_hf_is_folder(ckpt) || (n >= 11 && !strcmp(ckpt + n - 11, "config.json")))
        return nl_arch_from_hf_config(ckpt, a);
    if (nl_gguf_is_file(ckpt)) return nl_gguf_arch(ckpt, 0, a);
    nl_model m;
    nl_model_source src;
    NL_TRY(nl_model_load(ckpt, NULL, 0, &m, NULL, &src));
    *a = m.arch;
    nl_model_free(&m);
    return NL_OK;
}

nl_status nl_model_load_chat_template(nl_chat_template **out, const char *ckpt, const char *path,
                                      const nl_tokenizer *tok) {
    *out = NULL;
    int folder = ckpt && nl_hf_is_folder(ckpt), gguf = ckpt && !folder && nl_gguf_is_file(ckpt);
    nl_chat_template *own = NULL;
    if (folder || gguf) {
        nl_status rc = folder ? nl_chat_template_load_hf(&own, ckpt) : nl_chat_template_load_gguf(&own, ckpt);
        if (rc && rc != NL_ERR_UNSUPPORTED && !path) return rc;
    }
    if (!path) {
        *out = own;
        return NL_OK;
    }
    char *text = NULL;
    size_t n = 0;
    nl_status rc = nl_read_file(path, &text, &n);
    if (!rc) rc = nl_chat_template_parse(out, text, n, path);
    nl_free(text);
    if (!rc && own) {
        rc = nl_chat_template_set_tokens(*out, nl_chat_template_bos(own), nl_chat_template_eos(own));
    } else if (!rc) {
        const nl_bpe *b = tok && tok->kind == NL_TOKENIZER_HF ? tok->bpe : NULL;
        rc = nl_chat_template_set_tokens(*out, b && tok->bos_id >= 0 ? nl_bpe_piece(b, tok->bos_id) : NULL,
                                         b && tok->eos_id >= 0 ? nl_bpe_piece(b, tok->eos_id) : NULL);
    }
    nl_chat_template_free(own);
    if (rc) {
        nl_chat_template_free(*out);
        *out = NULL;
    }
    return rc;
}

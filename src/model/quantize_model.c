/* quantize_model / model_size_bytes on NanoLM, and quantized safetensors checkpoints
 * (see nanolm/quantize_model.h). Walks the model's parameter table; the quantizers and the int8
 * kernels live in numerics/ and know nothing of models. */
#include <cblas.h>
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nanolm/formats.h"
#include "nanolm/model_load.h"
#include "nanolm/quantize_model.h"
#include "nanolm/safetensors.h"

/* Slot of a parameter kind among the 7 linear weights of a layer, or -1. */
static int linear_slot(nl_param_kind k) {
    switch (k) {
    case NL_PARAM_WQ: return 0;
    case NL_PARAM_WK: return 1;
    case NL_PARAM_WV: return 2;
    case NL_PARAM_WO: return 3;
    case NL_PARAM_W1: return 4;
    case NL_PARAM_W3: return 5;
    case NL_PARAM_W2: return 6;
    default: return -1;
    }
}

/* The linear sites of a layer and the slots whose rows they stack. */
static const int SITE_FIRST[4] = {0, 3, 4, 6}, SITE_COUNT[4] = {3, 1, 2, 1};

static int site_index(nl_linear_kind k) {
    switch (k) {
    case NL_LIN_QKV: return 0;
    case NL_LIN_O: return 1;
    case NL_LIN_GATE_UP: return 2;
    case NL_LIN_DOWN: return 3;
    default: return -1;
    }
}

static void sgemm_nt(float *out, const float *in, const float *w, int64_t n, int64_t in_dim, int64_t out_dim) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)out_dim, (int)in_dim, 1.0f, in, (int)in_dim, w,
                (int)in_dim, 0.0f, out, (int)out_dim);
}

static void fill_nan(float *out, int64_t n) {
    for (int64_t i = 0; i < n; i++) out[i] = NAN;
}

/* The installed linear: quantized sites of the transformer layers, fp32 classifier. A failure
 * inside (NaN activations, no memory) cannot be returned through the hook: the output becomes
 * NaN, which the loss then shows, and the message stays in nl_last_error(). */
static void qm_forward(void *user, const nl_linear_site *site, float *out, const float *in, const float *w, int64_t n,
                       int64_t in_dim, int64_t out_dim) {
    nl_qmodel *qm = user;
    int s = site_index(site->kind);
    if (s < 0 || site->layer < 0 || site->layer >= qm->L) {
        sgemm_nt(out, in, w, n, in_dim, out_dim);
        return;
    }
    if (qm->lin) {
        if (nl_qlinear_forward(&qm->lin[site->layer * 4 + s], in, n, out)) fill_nan(out, n * out_dim);
        return;
    }
    int64_t row = 0;
    for (int k = 0; k < SITE_COUNT[s]; k++) {
        const nl_qtensor *t = &qm->qt[site->layer * NL_QMODEL_PER_LAYER + SITE_FIRST[s] + k];
        if (nl_quant_dequantize(t, qm->scratch + row * in_dim)) {
            fill_nan(out, n * out_dim);
            return;
        }
        row += t->rows;
    }
    sgemm_nt(out, in, qm->scratch, n, in_dim, out_dim);
}

/* Finds the 7 linear weights of every layer in the model's table. */
static nl_status find_linear(nl_qmodel *qm, const nl_model *m) {
    const nl_param_info *tab;
    int nt = nl_model_params_table(m, &tab);
    for (int i = 0; i < nt; i++) {
        int slot = linear_slot(tab[i].kind);
        if (slot < 0) continue;
        if (tab[i].layer < 0 || tab[i].layer >= qm->L || tab[i].ndim != 2)
            return nl_fail(NL_ERR_INVALID, "quantize_model: unexpected linear tensor %s", tab[i].name);
        qm->info[tab[i].layer * NL_QMODEL_PER_LAYER + slot] = &tab[i];
    }
    for (int64_t i = 0; i < qm->L * NL_QMODEL_PER_LAYER; i++)
        if (!qm->info[i])
            return nl_fail(NL_ERR_INVALID, "quantize_model: layer %lld lacks a linear weight", (long long)(i / 7));
    return NL_OK;
}

int nl_qmodel_w8a8_ok(const nl_quant_spec *spec) {
    return spec->kind == NL_QUANT_SYMMETRIC && spec->bits == 8 && spec->gran == NL_QUANT_PER_CHANNEL;
}

static nl_status alloc_tables(nl_qmodel *qm, nl_model *m, const nl_quant_spec *spec, nl_qlinear_mode mode) {
    memset(qm, 0, sizeof *qm);
    NL_TRY(nl_quant_check_spec(spec));
    if (mode != NL_QLINEAR_W8A8 && mode != NL_QLINEAR_WEIGHT_ONLY)
        return nl_fail(NL_ERR_INVALID, "quantize_model: unknown mode %d", (int)mode);
    if (mode == NL_QLINEAR_W8A8 && !nl_qmodel_w8a8_ok(spec)) {
        char b[64];
        return nl_fail(NL_ERR_UNSUPPORTED, "W8A8 needs int8-channel weights, not %s (use weight-only)",
                       nl_quant_spec_name(spec, b, sizeof b));
    }
    qm->model = m;
    qm->spec = *spec;
    qm->mode = mode;
    qm->L = m->L;
    qm->qt = nl_calloc((size_t)(m->L * NL_QMODEL_PER_LAYER), sizeof(nl_qtensor), "quantized linear weights");
    qm->info = nl_calloc((size_t)(m->L * NL_QMODEL_PER_LAYER), sizeof(*qm->info), "quantized weight table");
    if (!qm->qt || !qm->info) return NL_ERR_NOMEM;
    return find_linear(qm, m);
}

/* Builds the execution side (QuantizedLinear per site, or the dequantization scratch) from the
 * filled qtensors and installs the hook. */
static nl_status build_and_install(nl_qmodel *qm) {
    nl_model *m = qm->model;
    const int int8_channel = nl_qmodel_w8a8_ok(&qm->spec);
    size_t max_site = 0;
    for (int64_t l = 0; l < qm->L; l++)
        for (int s = 0; s < 4; s++) {
            size_t n = 0;
            for (int k = 0; k < SITE_COUNT[s]; k++) {
                const nl_qtensor *t = &qm->qt[l * NL_QMODEL_PER_LAYER + SITE_FIRST[s] + k];
                n += (size_t)(t->rows * t->cols);
            }
            if (n > max_site) max_site = n;
        }
    if (int8_channel) {
        qm->lin = nl_calloc((size_t)(qm->L * 4), sizeof(nl_qlinear), "QuantizedLinear layers");
        int8_t *codes = nl_malloc(max_site, "stacked codes");
        float *scales = nl_malloc(max_site * sizeof(float), "stacked scales");
        if (!qm->lin || !codes || !scales) {
            nl_free(codes);
            nl_free(scales);
            return NL_ERR_NOMEM;
        }
        nl_status rc = NL_OK;
        for (int64_t l = 0; l < qm->L && !rc; l++)
            for (int s = 0; s < 4 && !rc; s++) {
                int64_t rows = 0, cols = 0;
                for (int k = 0; k < SITE_COUNT[s]; k++) {
                    const nl_qtensor *t = &qm->qt[l * NL_QMODEL_PER_LAYER + SITE_FIRST[s] + k];
                    memcpy(codes + rows * t->cols, t->codes, (size_t)(t->rows * t->cols));
                    memcpy(scales + rows, t->scales, (size_t)t->rows * sizeof(float));
                    rows += t->rows;
                    cols = t->cols;
                }
                rc = nl_qlinear_init_codes(&qm->lin[l * 4 + s], codes, scales, rows, cols, qm->mode);
            }
        nl_free(codes);
        nl_free(scales);
        if (rc) return rc;
    } else {
        qm->scratch = nl_malloc(max_site * sizeof(float), "dequantized layer weights");
        if (!qm->scratch) return NL_ERR_NOMEM;
    }
    qm->ops.forward = qm_forward;
    qm->ops.backward = NULL; /* backward (if anyone runs it) uses the fp32 weights */
    qm->ops.user = qm;
    m->linear_ops = &qm->ops;
    return NL_OK;
}

nl_status nl_qmodel_quantize(nl_qmodel *qm, nl_model *m, const nl_quant_spec *spec, nl_qlinear_mode mode) {
    nl_status rc = alloc_tables(qm, m, spec, mode);
    for (int64_t i = 0; !rc && i < qm->L * NL_QMODEL_PER_LAYER; i++) {
        const nl_param_info *p = qm->info[i];
        rc = nl_quant_tensor(m->params + p->offset, p->shape[0], p->shape[1], spec, &qm->qt[i]);
        if (rc) {
            char msg[512]; /* nl_last_error() is the buffer nl_fail writes: copy it first */
            snprintf(msg, sizeof msg, "%s", nl_last_error());
            rc = nl_fail(rc, "quantize_model: %s: %s", p->name, msg);
        }
    }
    if (!rc) rc = build_and_install(qm);
    if (rc) {
        nl_status keep = rc;
        char msg[512];
        snprintf(msg, sizeof msg, "%s", nl_last_error());
        nl_qmodel_free(qm);
        return nl_fail(keep, "%s", msg);
    }
    return NL_OK;
}

void nl_qmodel_free(nl_qmodel *qm) {
    if (!qm) return;
    if (qm->model && qm->model->linear_ops == &qm->ops) qm->model->linear_ops = NULL;
    if (qm->qt)
        for (int64_t i = 0; i < qm->L * NL_QMODEL_PER_LAYER; i++) nl_qtensor_free(&qm->qt[i]);
    if (qm->lin)
        for (int64_t i = 0; i < qm->L * 4; i++) nl_qlinear_free(&qm->lin[i]);
    nl_free(qm->qt);
    nl_free(qm->info);
    nl_free(qm->lin);
    nl_free(qm->scratch);
    memset(qm, 0, sizeof *qm);
}

size_t nl_qmodel_size_bytes(const nl_model *m, const nl_qmodel *qm, size_t *linear_bytes) {
    const nl_param_info *tab;
    int nt = nl_model_params_table(m, &tab);
    size_t other = 0, lin = 0;
    for (int i = 0; i < nt; i++) {
        if (linear_slot(tab[i].kind) >= 0)
            lin += tab[i].numel * sizeof(float);
        else
            other += tab[i].numel * sizeof(float);
    }
    if (qm) {
        lin = 0;
        for (int64_t i = 0; i < qm->L * NL_QMODEL_PER_LAYER; i++) lin += nl_qtensor_bytes(&qm->qt[i]);
    }
    if (linear_bytes) *linear_bytes = lin;
    return other + lin;
}

/* ---- checkpoints --------------------------------------------------------------------------------- */

static const char *mode_name(nl_qlinear_mode m) { return m == NL_QLINEAR_W8A8 ? "w8a8" : "weight-only"; }

static int codes_signed(const nl_quant_spec *s) {
    if (s->kind == NL_QUANT_AFFINE) return !s->is_unsigned;
    if (s->kind == NL_QUANT_MX) return s->mx_elem == NL_MX_INT8;
    return 1;
}


nl_status nl_qmodel_save(const nl_qmodel *qm, const char *path, const char *tokenizer) {
    const nl_model *m = qm->model;
    nl_st_writer w;
    nl_st_writer_init(&w);
    char scheme[64], name[128];
    nl_quant_spec_name(&qm->spec, scheme, sizeof scheme);
    char *aj = nl_arch_to_json(&m->arch);
    nl_status rc = aj ? NL_OK : nl_fail(NL_ERR_NOMEM, "arch metadata");
    if (!rc) rc = nl_st_writer_meta(&w, "format", "pt");
    if (!rc) rc = nl_st_writer_meta(&w, "nanolm.arch", aj);
    if (!rc) rc = nl_st_writer_meta(&w, "nanolm.tokenizer", tokenizer ? tokenizer : "byte");
    if (!rc) rc = nl_st_writer_meta(&w, "nanolm.quant.scheme", scheme);
    if (!rc) rc = nl_st_writer_meta(&w, "nanolm.quant.mode", mode_name(qm->mode));
    const nl_param_info *tab;
    int nt = nl_model_params_table(m, &tab);
    for (int i = 0; i < nt && !rc; i++) {
        int slot = linear_slot(tab[i].kind);
        if (slot < 0) {
            rc = nl_st_writer_add(&w, tab[i].name, NL_ST_F32, tab[i].ndim, tab[i].shape, m->params + tab[i].offset);
            continue;
        }
        const nl_qtensor *t = &qm->qt[tab[i].layer * NL_QMODEL_PER_LAYER + slot];
        int64_t cs[2] = {t->rows, t->row_bytes}, ss[1] = {t->n_scales};
        snprintf(name, sizeof name, "%s.qcodes", tab[i].name);
        rc = nl_st_writer_add(&w, name, codes_signed(&qm->spec) ? NL_ST_I8 : NL_ST_U8, 2, cs, t->codes);
        if (!rc && t->scale_e8m0) {
            snprintf(name, sizeof name, "%s.qscale_e8m0", tab[i].name);
            rc = nl_st_writer_add(&w, name, NL_ST_U8, 1, ss, t->scale_e8m0);
        } else if (!rc) {
            snprintf(name, sizeof name, "%s.qscale", tab[i].name);
            rc = nl_st_writer_add(&w, name, NL_ST_F32, 1, ss, t->scales);
        }
        if (!rc && t->zero_points) {
            snprintf(name, sizeof name, "%s.qzero", tab[i].name);
            rc = nl_st_writer_add(&w, name, NL_ST_I32, 1, ss, t->zero_points);
        }
    }
    if (!rc) rc = nl_st_writer_write(&w, path);
    nl_st_writer_free(&w);
    free(aj);
    return rc;
}

int nl_qmodel_is_quantized(const char *path) {
    nl_st_file f;
    if (nl_st_open(&f, path)) {
        nl_clear_error();
        return 0;
    }
    int q = nl_st_meta(&f, "nanolm.quant.scheme") != NULL;
    nl_st_close(&f);
    return q;
}

/* Copies a byte tensor `name` of exactly (d0, d1) into dst. */
static nl_status read_bytes(const nl_st_file *f, const char *name, int ndim, int64_t d0, int64_t d1, size_t elem,
                            void *dst) {
    const nl_st_tensor *t = nl_st_find(f, name);
    if (!t) return nl_fail(NL_ERR_FORMAT, "%s: no tensor %s", f->path, name);
    int64_t want = ndim == 2 ? d0 * d1 : d0;
    if (t->ndim != ndim || t->numel != want || nl_st_dtype_size(t->dtype) != elem || t->shape[0] != d0)
        return nl_fail(NL_ERR_FORMAT, "%s: tensor %s has the wrong shape or dtype (%s)", f->path, name,
                       nl_st_dtype_name(t->dtype));
    memcpy(dst, t->data, (size_t)want * elem);
    return NL_OK;
}

/* Refuses integer codes outside the scheme's range (symmetric: +-(2^(b-1) - 1); affine:
 * [-2^(b-1), 2^(b-1) - 1] or [0, 2^b - 1] unsigned): a nibble of 8 in int4, or int4 data
 * relabelled as int2, would otherwise dequantize to values the quantizer never writes. MX
 * codes are element formats where every bit pattern is defined. */
static nl_status check_codes(const char *path, const char *name, const nl_qtensor *t) {
    const nl_quant_spec *sp = &t->spec;
    if (sp->kind == NL_QUANT_MX) return NL_OK;
    int32_t lo, hi;
    if (sp->kind == NL_QUANT_SYMMETRIC) {
        hi = (1 << (sp->bits - 1)) - 1;
        lo = -hi;
    } else if (sp->is_unsigned) {
        lo = 0;
        hi = (1 << sp->bits) - 1;
    } else {
        lo = -(1 << (sp->bits - 1));
        hi = (1 << (sp->bits - 1)) - 1;
    }
    for (int64_t r = 0; r < t->rows; r++)
        for (int64_t c = 0; c < t->cols; c++) {
            int32_t v = nl_qtensor_code(t, r, c);
            if (v < lo || v > hi)
                return nl_fail(NL_ERR_FORMAT, "%s: %s[%lld, %lld] = %d is outside the %d-bit code range [%d, %d]", path,
                               name, (long long)r, (long long)c, v, sp->bits, lo, hi);
        }
    return NL_OK;
}

nl_status nl_qmodel_load(const char *path, nl_model *m, nl_qmodel *qm, char *tokenizer) {
    memset(m, 0, sizeof *m);
    memset(qm, 0, sizeof *qm);
    nl_st_file f;
    NL_TRY(nl_st_open(&f, path));
    const char *aj = nl_st_meta(&f, "nanolm.arch"), *sj = nl_st_meta(&f, "nanolm.quant.scheme");
    const char *mj = nl_st_meta(&f, "nanolm.quant.mode");
    nl_arch a;
    nl_quant_spec spec;
    nl_status rc = NL_OK;
    if (!aj || !sj)
        rc = nl_fail(NL_ERR_FORMAT, "%s: not a quantized nanolm checkpoint (no nanolm.arch / nanolm.quant.scheme)",
                     path);
    if (!rc) rc = nl_arch_from_json(path, aj, &a);
    if (!rc && nl_quant_spec_parse(sj, &spec)) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", nl_last_error());
        rc = nl_fail(NL_ERR_FORMAT, "%s: %s", path, msg);
    }
    nl_qlinear_mode mode = mj && !strcmp(mj, "w8a8") ? NL_QLINEAR_W8A8 : NL_QLINEAR_WEIGHT_ONLY;
    if (!rc && mj && strcmp(mj, "w8a8") && strcmp(mj, "weight-only"))
        rc = nl_fail(NL_ERR_FORMAT, "%s: unknown nanolm.quant.mode \"%s\" (known: weight-only, w8a8)", path, mj);
    if (!rc) rc = nl_model_init(m, &a);
    if (!rc) rc = alloc_tables(qm, m, &spec, mode);
    const nl_param_info *tab;
    int nt = rc ? 0 : nl_model_params_table(m, &tab);
    char name[128];
    for (int i = 0; i < nt && !rc; i++) {
        int slot = linear_slot(tab[i].kind);
        if (slot < 0) {
            rc = nl_st_read_f32(&f, tab[i].name, tab[i].ndim, tab[i].shape, m->params + tab[i].offset);
            continue;
        }
        nl_qtensor *t = &qm->qt[tab[i].layer * NL_QMODEL_PER_LAYER + slot];
        rc = nl_qtensor_alloc(t, &spec, tab[i].shape[0], tab[i].shape[1]);
        if (!rc) {
            snprintf(name, sizeof name, "%s.qcodes", tab[i].name);
            rc = read_bytes(&f, name, 2, t->rows, t->row_bytes, 1, t->codes);
        }
        if (!rc) rc = check_codes(path, name, t);
        if (!rc && t->scale_e8m0) {
            snprintf(name, sizeof name, "%s.qscale_e8m0", tab[i].name);
            rc = read_bytes(&f, name, 1, t->n_scales, 0, 1, t->scale_e8m0);
            for (int64_t g = 0; !rc && g < t->n_scales; g++) {
                if (t->scale_e8m0[g] == 0xFF)
                    rc = nl_fail(NL_ERR_FORMAT, "%s: %s[%lld] is the E8M0 NaN", path, name, (long long)g);
                else
                    t->scales[g] = nl_fmt_decode(NL_FMT_E8M0, t->scale_e8m0[g]);
            }
        } else if (!rc) {
            snprintf(name, sizeof name, "%s.qscale", tab[i].name);
            rc = read_bytes(&f, name, 1, t->n_scales, 0, 4, t->scales);
            for (int64_t g = 0; !rc && g < t->n_scales; g++)
                if (!isfinite(t->scales[g]) || t->scales[g] < 0)
                    rc = nl_fail(NL_ERR_FORMAT, "%s: %s[%lld] = %g is not a valid scale", path, name, (long long)g,
                                 (double)t->scales[g]);
        }
        if (!rc && t->zero_points) {
            snprintf(name, sizeof name, "%s.qzero", tab[i].name);
            rc = read_bytes(&f, name, 1, t->n_scales, 0, 4, t->zero_points);
        }
        /* The model's fp32 copy holds what the codes say. */
        if (!rc) rc = nl_quant_dequantize(t, m->params + tab[i].offset);
    }
    if (!rc) rc = build_and_install(qm);
    if (!rc && tokenizer) {
        const char *tk = nl_st_meta(&f, "nanolm.tokenizer");
        snprintf(tokenizer, 64, "%s", tk ? tk : "byte");
    }
    nl_st_close(&f);
    if (rc) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", nl_last_error());
        nl_qmodel_free(qm);
        nl_model_free(m);
        return nl_fail(rc, "%s", msg);
    }
    return NL_OK;
}

nl_status nl_qmodel_open(const char *ckpt, const char *tok_path, int64_t max_seq, nl_model *m, nl_tokenizer *tok,
                         nl_qmodel *qm, int *quantized, char *tkind) {
    memset(qm, 0, sizeof *qm);
    memset(tok, 0, sizeof *tok);
    snprintf(tkind, 64, "byte");
    *quantized = nl_qmodel_is_quantized(ckpt);
    if (!*quantized) {
        NL_TRY(nl_model_load(ckpt, tok_path, max_seq, m, tok, NULL));
        if (tok_path) snprintf(tkind, 64, "tok512");
        return NL_OK;
    }
    NL_TRY(nl_qmodel_load(ckpt, m, qm, tkind));
    nl_status rc =
        tok_path ? nl_tokenizer_load_llama2c(tok, tok_path, (int)m->V)
        : !strcmp(tkind, "byte")
            ? nl_tokenizer_init_byte(tok)
            : nl_fail(NL_ERR_INVALID, "%s uses the %s tokenizer: pass its file with --tokenizer", ckpt, tkind);
    if (rc) {
        nl_qmodel_free(qm);
        nl_model_free(m);
    }
    return rc;
}

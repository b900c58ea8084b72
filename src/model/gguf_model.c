/* GGUF models <-> nl_model. See include/nanolm/gguf_model.h. */
#include "nanolm/gguf_model.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nanolm/bpe.h"
#include "nanolm/ggml_quant.h"
#include "nanolm/resources.h"

static const char SPM_SPACE[] = "\xe2\x96\x81"; /* U+2581 */

int nl_gguf_is_file(const char *path) {
    FILE *fp = NULL;
    if (nl_file_open_read_stdio(path, &fp)) {
        nl_clear_error();
        return 0;
    }
    unsigned char b[4];
    int ok = fp && fread(b, 1, 4, fp) == 4 && !memcmp(b, "GGUF", 4);
    if (fp) fclose(fp);
    return ok;
}

/* ---- architecture ----------------------------------------------------------------------------- */

static nl_status key_int(const nl_gguf_file *f, const char *key, int64_t lo, int64_t hi, int64_t *out) {
    NL_TRY(nl_gguf_get_int(f, key, out));
    if (*out < lo || *out > hi)
        return nl_fail(NL_ERR_FORMAT, "%s: KV %s = %lld is outside %lld..%lld", f->path, key, (long long)*out,
                       (long long)lo, (long long)hi);
    return NL_OK;
}

nl_status nl_gguf_read_arch(const nl_gguf_file *f, int64_t max_seq, nl_arch *a) {
    memset(a, 0, sizeof *a);
    char archname[64];
    if (!nl_gguf_str_copy(f, "general.architecture", archname, sizeof archname))
        return nl_fail(NL_ERR_FORMAT, "%s: no string KV general.architecture", f->path);
    if (strcmp(archname, "llama"))
        return nl_fail(NL_ERR_FORMAT, "%s: general.architecture \"%s\" is not supported (llama is)", f->path, archname);
    if (!nl_gguf_str_copy(f, "general.name", a->name, sizeof a->name)) {
        const char *s = strrchr(f->path, '/');
        snprintf(a->name, sizeof a->name, "%s", s ? s + 1 : f->path);
        char *dot = strrchr(a->name, '.');
        if (dot) *dot = 0;
    }
    const int64_t big = (int64_t)1 << 40;
    NL_TRY(key_int(f, "llama.embedding_length", 1, big, &a->dim));
    NL_TRY(key_int(f, "llama.block_count", 1, 1 << 16, &a->n_layers));
    NL_TRY(key_int(f, "llama.feed_forward_length", 1, big, &a->hidden_dim));
    NL_TRY(key_int(f, "llama.attention.head_count", 1, 1 << 16, &a->n_heads));
    if (nl_gguf_find_kv(f, "llama.attention.head_count_kv"))
        NL_TRY(key_int(f, "llama.attention.head_count_kv", 1, 1 << 16, &a->n_kv_heads));
    else
        a->n_kv_heads = a->n_heads;
    NL_TRY(key_int(f, "llama.context_length", 1, big, &a->seq_len));
    if (max_seq > 0 && a->seq_len > max_seq) a->seq_len = max_seq;
    int64_t kl = 0;
    if (nl_gguf_find_kv(f, "llama.attention.key_length"))
        NL_TRY(key_int(f, "llama.attention.key_length", 1, 1 << 16, &kl));
    if (kl && kl * a->n_heads != a->dim) a->head_dim = kl;
    int64_t vl = kl;
    if (nl_gguf_find_kv(f, "llama.attention.value_length"))
        NL_TRY(key_int(f, "llama.attention.value_length", 1, 1 << 16, &vl));
    if (vl != kl)
        return nl_fail(NL_ERR_FORMAT, "%s: llama.attention.value_length %lld differs from key_length %lld", f->path,
                       (long long)vl, (long long)kl);
    int64_t rd = 0, hd = kl ? kl : a->dim / a->n_heads;
    if (nl_gguf_find_kv(f, "llama.rope.dimension_count"))
        NL_TRY(key_int(f, "llama.rope.dimension_count", 1, 1 << 16, &rd));
    if (rd && rd != hd)
        return nl_fail(NL_ERR_FORMAT,
                       "%s: llama.rope.dimension_count %lld: partial RoPE (head size %lld) is not supported", f->path,
                       (long long)rd, (long long)hd);
    NL_TRY(nl_gguf_get_float_def(f, "llama.rope.freq_base", 10000.0, &a->rope_theta));
    NL_TRY(nl_gguf_get_float_def(f, "llama.attention.layer_norm_rms_epsilon", 1e-5, &a->norm_eps));
    char scal[32];
    if (nl_gguf_str_copy(f, "llama.rope.scaling.type", scal, sizeof scal) && strcmp(scal, "none"))
        return nl_fail(NL_ERR_FORMAT, "%s: llama.rope.scaling.type \"%s\" is not supported", f->path, scal);
    if (nl_gguf_find_tensor(f, "rope_freqs.weight"))
        return nl_fail(NL_ERR_FORMAT, "%s: tensor rope_freqs.weight (Llama 3 RoPE frequency factors) is not supported",
                       f->path);
    if (nl_gguf_find_kv(f, "llama.expert_count"))
        return nl_fail(NL_ERR_FORMAT, "%s: llama.expert_count: mixture-of-experts GGUF models are not supported",
                       f->path);
    const nl_gguf_tensor *emb = nl_gguf_find_tensor(f, "token_embd.weight");
    if (!emb || emb->ndim != 2) return nl_fail(NL_ERR_FORMAT, "%s: no 2-D tensor token_embd.weight", f->path);
    if (emb->ne[0] != a->dim)
        return nl_fail(NL_ERR_FORMAT, "%s: token_embd.weight rows have %lld values but llama.embedding_length is %lld",
                       f->path, (long long)emb->ne[0], (long long)a->dim);
    a->vocab_size = emb->ne[1];
    int64_t vs;
    NL_TRY(nl_gguf_get_int_def(f, "llama.vocab_size", a->vocab_size, &vs));
    if (vs != a->vocab_size)
        return nl_fail(NL_ERR_FORMAT, "%s: llama.vocab_size %lld but token_embd.weight has %lld rows", f->path,
                       (long long)vs, (long long)a->vocab_size);
    a->tied_embeddings = nl_gguf_find_tensor(f, "output.weight") == NULL;
    nl_status rc = nl_arch_validate(a);
    if (rc) {
        char msg[400];
        snprintf(msg, sizeof msg, "%s", nl_last_error());
        return nl_fail(NL_ERR_FORMAT, "%s: %s", f->path, msg);
    }
    return NL_OK;
}

nl_status nl_gguf_arch(const char *path, int64_t max_seq, nl_arch *a) {
    nl_gguf_file f;
    NL_TRY(nl_gguf_open(&f, path));
    nl_status rc = nl_gguf_read_arch(&f, max_seq, a);
    nl_gguf_close(&f);
    return rc;
}

/* ---- weights ---------------------------------------------------------------------------------- */

/* The GGUF name of a parameter, or 0 when nanolm has none for its kind. */
static int gguf_name(const nl_param_info *p, char *buf, size_t n) {
    static const char *const blk[] = {
        [NL_PARAM_RMS_ATT] = "attn_norm", [NL_PARAM_WQ] = "attn_q",      [NL_PARAM_WK] = "attn_k",
        [NL_PARAM_WV] = "attn_v",         [NL_PARAM_WO] = "attn_output", [NL_PARAM_RMS_FFN] = "ffn_norm",
        [NL_PARAM_W1] = "ffn_gate",       [NL_PARAM_W3] = "ffn_up",      [NL_PARAM_W2] = "ffn_down"};
    switch (p->kind) {
    case NL_PARAM_EMBED: snprintf(buf, n, "token_embd.weight"); return 1;
    case NL_PARAM_RMS_FINAL: snprintf(buf, n, "output_norm.weight"); return 1;
    case NL_PARAM_CLS: snprintf(buf, n, "output.weight"); return 1;
    case NL_PARAM_RMS_ATT:
    case NL_PARAM_WQ:
    case NL_PARAM_WK:
    case NL_PARAM_WV:
    case NL_PARAM_WO:
    case NL_PARAM_RMS_FFN:
    case NL_PARAM_W1:
    case NL_PARAM_W3:
    case NL_PARAM_W2: snprintf(buf, n, "blk.%d.%s.weight", p->layer, blk[p->kind]); return 1;
    default: return 0;
    }
}

static void add_type(nl_gguf_info *info, uint32_t t) {
    for (int i = 0; i < info->n_types; i++)
        if (info->types[i] == t) return;
    if (info->n_types < 8) info->types[info->n_types++] = t;
}

nl_status nl_gguf_load_model(const char *path, int64_t max_seq, nl_model *m, nl_gguf_info *info) {
    memset(m, 0, sizeof *m);
    nl_gguf_info local;
    if (!info) info = &local;
    memset(info, 0, sizeof *info);
    nl_gguf_file f;
    NL_TRY(nl_gguf_open(&f, path));
    nl_arch a;
    nl_status rc = nl_gguf_read_arch(&f, max_seq, &a);
    if (!rc) {
        nl_arch_params np;
        nl_arch_count_params(&a, &np);
        char what[512];
        snprintf(what, sizeof what, "%s: a model of %lld parameters", path, (long long)np.total);
        rc = nl_mem_require((uint64_t)np.total * sizeof(float), what);
    }
    if (!rc) rc = nl_model_init(m, &a);
    char *used = rc ? NULL : calloc((size_t)(f.n_tensors ? f.n_tensors : 1), 1);
    if (!rc && !used) rc = nl_fail(NL_ERR_NOMEM, "out of memory");
    const nl_param_info *tab;
    int nt = rc ? 0 : nl_model_params_table(m, &tab);
    char name[96];
    for (int i = 0; i < nt && !rc; i++) {
        const nl_param_info *p = &tab[i];
        if (!gguf_name(p, name, sizeof name)) {
            rc = nl_fail(NL_ERR_FORMAT, "%s: nanolm parameter %s has no GGUF counterpart", path, p->name);
            break;
        }
        const nl_gguf_tensor *t = nl_gguf_find_tensor(&f, name);
        if (!t) {
            rc = nl_fail(NL_ERR_FORMAT, "%s: no tensor %s", path, name);
            break;
        }
        used[t - f.tensors] = 1;
        int ok = t->ndim == p->ndim &&
                 (p->ndim == 1 ? t->ne[0] == p->shape[0] : t->ne[0] == p->shape[1] && t->ne[1] == p->shape[0]);
        if (!ok) {
            rc = nl_fail(NL_ERR_FORMAT, "%s: tensor %s has ne [%lld, %lld] (%d-D) but the model needs [%lld, %lld]",
                         path, name, (long long)t->ne[0], (long long)t->ne[1], t->ndim,
                         (long long)(p->ndim == 1 ? p->shape[0] : p->shape[1]),
                         (long long)(p->ndim == 1 ? 1 : p->shape[0]));
            break;
        }
        if (!nl_ggml_can_dequantize(t->type)) {
            rc = nl_fail(NL_ERR_FORMAT,
                         "%s: tensor %s has type %s (nanolm reads f32, f16, bf16, q8_0, q4_0, q4_1, "
                         "q4_K, q6_K)",
                         path, name, nl_ggml_type_name(t->type));
            break;
        }
        add_type(info, t->type);
        if (p->kind == NL_PARAM_WQ && p->layer == 0) info->linear_type = t->type;
        rc = nl_ggml_to_f32(t->type, t->data, t->numel, m->params + p->offset);
        for (size_t k = 0; !rc && k < p->numel; k++)
            if (!isfinite(m->params[p->offset + k]))
                rc = nl_fail(NL_ERR_FORMAT, "%s: tensor %s holds a non-finite value at element %zu", path, name, k);
    }
    for (int64_t i = 0; !rc && i < f.n_tensors; i++)
        if (!used[i])
            rc = nl_fail(NL_ERR_FORMAT, "%s: tensor %s is not part of a llama model nanolm runs", path,
                         f.tensors[i].name);
    free(used);
    nl_gguf_close(&f);
    if (rc) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", nl_last_error());
        nl_model_free(m);
        memset(m, 0, sizeof *m);
        return nl_fail(rc, "%s", msg);
    }
    return NL_OK;
}

/* One decode weight from the Q4_0 tensors names[0..n) stacked by rows (NULL-terminated). */
static nl_status q4_group(const nl_gguf_file *f, const char *const *names, int n, int64_t K, nl_mv_weight *w,
                          int *replaced) {
    const nl_gguf_tensor *t[3];
    int64_t rows = 0;
    uint64_t bytes = 0;
    for (int i = 0; i < n; i++) {
        t[i] = nl_gguf_find_tensor(f, names[i]);
        if (!t[i] || t[i]->type != NL_GGML_Q4_0 || t[i]->ndim != 2 || t[i]->ne[0] != K) return NL_OK;
        rows += t[i]->ne[1];
        bytes += t[i]->bytes;
    }
    if (rows != w->rows || K != w->cols) return NL_OK;
    uint8_t *buf = NULL;
    const void *src = t[0]->data;
    if (n > 1) {
        buf = nl_malloc((size_t)bytes, "stacked Q4_0 blocks");
        if (!buf) return NL_ERR_NOMEM;
        size_t off = 0;
        for (int i = 0; i < n; i++) {
            memcpy(buf + off, t[i]->data, (size_t)t[i]->bytes);
            off += (size_t)t[i]->bytes;
        }
        src = buf;
    }
    nl_mv_weight q;
    nl_status rc = nl_mv_weight_init_q4_0(&q, src, rows, K);
    nl_free(buf);
    if (rc) return rc;
    q.path = w->path; /* the int4 layout is the same on every path */
    nl_mv_weight_free(w);
    *w = q;
    (*replaced)++;
    return NL_OK;
}

nl_status nl_gguf_int4_weights(const char *path, const nl_model *m, nl_mv_weight *w, int *replaced) {
    int local = 0;
    if (!replaced) replaced = &local;
    *replaced = 0;
    nl_gguf_file f;
    NL_TRY(nl_gguf_open(&f, path));
    nl_status rc = NL_OK;
    char nm[5][64];
    for (int64_t l = 0; l < m->L && !rc; l++) {
        static const char *const parts[5] = {"attn_q", "attn_k", "attn_v", "ffn_gate", "ffn_up"};
        for (int k = 0; k < 5; k++) snprintf(nm[k], sizeof nm[k], "blk.%lld.%s.weight", (long long)l, parts[k]);
        const char *qkv[3] = {nm[0], nm[1], nm[2]}, *gu[2] = {nm[3], nm[4]};
        rc = q4_group(&f, qkv, 3, m->C, &w[4 * l + 0], replaced);
        snprintf(nm[0], sizeof nm[0], "blk.%lld.attn_output.weight", (long long)l);
        const char *o[1] = {nm[0]};
        if (!rc) rc = q4_group(&f, o, 1, m->NH * m->hd, &w[4 * l + 1], replaced);
        if (!rc) rc = q4_group(&f, gu, 2, m->C, &w[4 * l + 2], replaced);
        snprintf(nm[1], sizeof nm[1], "blk.%lld.ffn_down.weight", (long long)l);
        const char *d[1] = {nm[1]};
        if (!rc) rc = q4_group(&f, d, 1, m->H, &w[4 * l + 3], replaced);
    }
    const char *cls[1] = {m->arch.tied_embeddings ? "token_embd.weight" : "output.weight"};
    if (!rc) rc = q4_group(&f, cls, 1, m->C, &w[4 * m->L], replaced);
    nl_gguf_close(&f);
    return rc;
}

/* ---- tokenizer -------------------------------------------------------------------------------- */

static const nl_gguf_kv *arr_kv(const nl_gguf_file *f, const char *key, nl_gguf_vtype elem, uint64_t n, nl_status *rc) {
    const nl_gguf_kv *kv = nl_gguf_find_kv(f, key);
    *rc = NL_OK;
    if (!kv) return NULL;
    int ok = kv->type == NL_GGUF_ARRAY &&
             (kv->arr_type == elem ||
              (elem == NL_GGUF_INT32 && (kv->arr_type == NL_GGUF_UINT32 || kv->arr_type == NL_GGUF_INT64)));
    if (!ok)
        *rc = nl_fail(NL_ERR_FORMAT, "%s: KV %s is not an array of %s", f->path, key, nl_gguf_vtype_name(elem));
    else if (n && kv->n != n)
        *rc = nl_fail(NL_ERR_FORMAT, "%s: KV %s has %llu entries but tokenizer.ggml.tokens has %llu", f->path, key,
                      (unsigned long long)kv->n, (unsigned long long)n);
    return *rc ? NULL : kv;
}

/* SentencePiece vocabulary onto the llama2.c tokenizer: U+2581 -> ' '. */
static nl_status load_spm(const nl_gguf_file *f, const nl_gguf_kv *toks, int64_t bos, int64_t eos, nl_tokenizer *t) {
    nl_status rc;
    const nl_gguf_kv *sc = arr_kv(f, "tokenizer.ggml.scores", NL_GGUF_FLOAT32, toks->n, &rc);
    if (rc) return rc;
    int n = (int)toks->n;
    char **pieces = calloc((size_t)n, sizeof *pieces);
    float *scores = calloc((size_t)n, sizeof *scores);
    if (!pieces || !scores) rc = nl_fail(NL_ERR_NOMEM, "out of memory");
    for (int i = 0; i < n && !rc; i++) {
        uint64_t len;
        const char *s = nl_gguf_arr_str(toks, (uint64_t)i, &len);
        char *p = malloc((size_t)len + 1);
        if (!p) {
            rc = nl_fail(NL_ERR_NOMEM, "out of memory");
            break;
        }
        size_t k = 0;
        for (uint64_t j = 0; j < len;) {
            if (j + 3 <= len && !memcmp(s + j, SPM_SPACE, 3)) {
                p[k++] = ' ';
                j += 3;
            } else
                p[k++] = s[j++];
        }
        p[k] = 0;
        if (memchr(s, 0, (size_t)len)) rc = nl_fail(NL_ERR_FORMAT, "%s: token %d contains a NUL byte", f->path, i);
        pieces[i] = p;
        scores[i] = sc ? (float)nl_gguf_arr_float(sc, (uint64_t)i) : 0.0f;
    }
    if (!rc) rc = nl_tokenizer_init_spm(t, n, (const char *const *)pieces, NULL, scores, (int)bos, (int)eos, f->path);
    for (int i = 0; pieces && i < n; i++) free(pieces[i]);
    free(pieces);
    free(scores);
    return rc;
}

/* Pre-tokenizer regexes of llama.cpp's tokenizer.ggml.pre names (as the models' tokenizer.json). */
static const char LLAMA3_REGEX[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
                                   "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char QWEN2_REGEX[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
                                  "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

static cJSON *byte_level(int use_regex) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "type", "ByteLevel");
    cJSON_AddBoolToObject(o, "add_prefix_space", 0);
    cJSON_AddBoolToObject(o, "trim_offsets", 1);
    cJSON_AddBoolToObject(o, "use_regex", use_regex);
    return o;
}

/* gpt2 (byte-level BPE): synthesizes the tokenizer.json that says the same and parses it. */
static nl_status load_gpt2(const nl_gguf_file *f, const nl_gguf_kv *toks, int64_t bos, int add_bos, int V,
                           nl_tokenizer *t) {
    nl_status rc;
    const nl_gguf_kv *merges = arr_kv(f, "tokenizer.ggml.merges", NL_GGUF_STRING, 0, &rc);
    if (rc) return rc;
    if (!merges) return nl_fail(NL_ERR_FORMAT, "%s: tokenizer.ggml.model gpt2 needs tokenizer.ggml.merges", f->path);
    const nl_gguf_kv *types = arr_kv(f, "tokenizer.ggml.token_type", NL_GGUF_INT32, toks->n, &rc);
    if (rc) return rc;
    char pre[64];
    if (!nl_gguf_str_copy(f, "tokenizer.ggml.pre", pre, sizeof pre)) snprintf(pre, sizeof pre, "default");
    const char *regex = NULL;
    int ignore_merges = 0;
    if (!strcmp(pre, "llama-bpe") || !strcmp(pre, "llama3")) {
        regex = LLAMA3_REGEX;
        ignore_merges = 1;
    } else if (!strcmp(pre, "qwen2"))
        regex = QWEN2_REGEX;
    else if (strcmp(pre, "default") && strcmp(pre, "gpt-2") && strcmp(pre, "gpt2") && strcmp(pre, "smollm"))
        return nl_fail(NL_ERR_FORMAT,
                       "%s: tokenizer.ggml.pre \"%s\" is not supported (default, gpt-2, llama-bpe, qwen2, smollm)",
                       f->path, pre);
    cJSON *root = cJSON_CreateObject(), *added = cJSON_AddArrayToObject(root, "added_tokens");
    cJSON *model = cJSON_CreateObject(), *vocab = cJSON_AddObjectToObject(model, "vocab");
    cJSON *mg = cJSON_AddArrayToObject(model, "merges");
    char *buf = NULL;
    for (uint64_t i = 0; i < toks->n && !rc; i++) {
        uint64_t len;
        const char *s = nl_gguf_arr_str(toks, i, &len);
        free(buf);
        buf = malloc((size_t)len + 1);
        if (!buf) {
            rc = nl_fail(NL_ERR_NOMEM, "out of memory");
            break;
        }
        memcpy(buf, s, (size_t)len);
        buf[len] = 0;
        int64_t ty = types ? nl_gguf_arr_int(types, i) : 1;
        if (ty == 3 || ty == 4) { /* control, user-defined: added tokens */
            cJSON *a = cJSON_CreateObject();
            cJSON_AddNumberToObject(a, "id", (double)i);
            cJSON_AddStringToObject(a, "content", buf);
            cJSON_AddBoolToObject(a, "single_word", 0);
            cJSON_AddBoolToObject(a, "lstrip", 0);
            cJSON_AddBoolToObject(a, "rstrip", 0);
            cJSON_AddBoolToObject(a, "normalized", ty == 4);
            cJSON_AddBoolToObject(a, "special", ty == 3);
            cJSON_AddItemToArray(added, a);
        }
        if (!cJSON_GetObjectItemCaseSensitive(vocab, buf)) cJSON_AddNumberToObject(vocab, buf, (double)i);
    }
    for (uint64_t i = 0; i < merges->n && !rc; i++) {
        uint64_t len;
        const char *s = nl_gguf_arr_str(merges, i, &len);
        free(buf);
        buf = malloc((size_t)len + 1);
        if (!buf) {
            rc = nl_fail(NL_ERR_NOMEM, "out of memory");
            break;
        }
        memcpy(buf, s, (size_t)len);
        buf[len] = 0;
        cJSON_AddItemToArray(mg, cJSON_CreateString(buf));
    }
    free(buf);
    cJSON_AddStringToObject(model, "type", "BPE");
    cJSON_AddBoolToObject(model, "ignore_merges", ignore_merges);
    cJSON_AddBoolToObject(model, "byte_fallback", 0);
    if (regex) {
        cJSON *seq = cJSON_CreateObject(), *list = cJSON_CreateArray(), *split = cJSON_CreateObject();
        cJSON_AddStringToObject(seq, "type", "Sequence");
        cJSON_AddStringToObject(split, "type", "Split");
        cJSON *pat = cJSON_AddObjectToObject(split, "pattern");
        cJSON_AddStringToObject(pat, "Regex", regex);
        cJSON_AddStringToObject(split, "behavior", "Isolated");
        cJSON_AddBoolToObject(split, "invert", 0);
        cJSON_AddItemToArray(list, split);
        cJSON_AddItemToArray(list, byte_level(0));
        cJSON_AddItemToObject(seq, "pretokenizers", list);
        cJSON_AddItemToObject(root, "pre_tokenizer", seq);
    } else
        cJSON_AddItemToObject(root, "pre_tokenizer", byte_level(1));
    cJSON_AddItemToObject(root, "decoder", byte_level(1));
    cJSON_AddItemToObject(root, "model", model);
    char *json = rc ? NULL : cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    if (!rc && !json) rc = nl_fail(NL_ERR_NOMEM, "out of memory");
    if (!rc) rc = nl_tokenizer_parse_json(t, json, strlen(json), f->path, V);
    cJSON_free(json);
    if (!rc) t->bos_id = add_bos && bos >= 0 && bos < V ? (int)bos : -1;
    return rc;
}

nl_status nl_gguf_load_tokenizer(const char *path, int64_t V, nl_tokenizer *tok) {
    memset(tok, 0, sizeof *tok);
    nl_gguf_file f;
    NL_TRY(nl_gguf_open(&f, path));
    nl_status rc = NL_OK;
    char kind[32] = "", model[32] = "";
    nl_gguf_str_copy(&f, "nanolm.tokenizer", kind, sizeof kind);
    int has_model = nl_gguf_str_copy(&f, "tokenizer.ggml.model", model, sizeof model);
    int64_t bos = -1, eos = -1, add_bos = 1;
    if (!rc) rc = nl_gguf_get_int_def(&f, "tokenizer.ggml.bos_token_id", -1, &bos);
    if (!rc) rc = nl_gguf_get_int_def(&f, "tokenizer.ggml.eos_token_id", -1, &eos);
    if (!rc) rc = nl_gguf_get_int_def(&f, "tokenizer.ggml.add_bos_token", 1, &add_bos);
    const nl_gguf_kv *hf = nl_gguf_find_kv(&f, "tokenizer.huggingface.json");
    const nl_gguf_kv *toks = NULL;
    if (rc) {
    } else if (!strcmp(kind, "byte")) {
        rc = nl_tokenizer_init_byte(tok);
    } else if (hf && hf->type == NL_GGUF_STRING) {
        rc = nl_tokenizer_parse_json(tok, hf->str, (size_t)hf->str_len, path, (int)V);
    } else if (!has_model) {
        rc = nl_fail(NL_ERR_FORMAT, "%s: no tokenizer.ggml.model (pass --tokenizer)", path);
    } else if (!(toks = arr_kv(&f, "tokenizer.ggml.tokens", NL_GGUF_STRING, 0, &rc)) && !rc) {
        rc = nl_fail(NL_ERR_FORMAT, "%s: no tokenizer.ggml.tokens", path);
    } else if (!rc && (int64_t)toks->n > V) {
        rc = nl_fail(NL_ERR_FORMAT, "%s: tokenizer.ggml.tokens has %llu entries but the model's vocabulary is %lld",
                     path, (unsigned long long)toks->n, (long long)V);
    } else if (!rc && !strcmp(model, "llama")) {
        rc = load_spm(&f, toks, bos, eos, tok);
        if (!rc && !add_bos) tok->bos_id = -1;
    } else if (!rc && !strcmp(model, "gpt2")) {
        rc = load_gpt2(&f, toks, bos, (int)add_bos, (int)V, tok);
        if (!rc && eos >= 0 && eos < V) tok->eos_id = (int)eos;
    } else if (!rc) {
        rc = nl_fail(NL_ERR_FORMAT, "%s: tokenizer.ggml.model \"%s\" is not supported (llama, gpt2)", path, model);
    }
    nl_gguf_close(&f);
    return rc;
}

/* ---- writer ----------------------------------------------------------------------------------- */

/* llama.cpp's general.file_type (llama_ftype) of a matrix type. */
static uint32_t file_type(uint32_t t) {
    switch (t) {
    case NL_GGML_F16: return 1;
    case NL_GGML_Q4_0: return 2;
    case NL_GGML_Q8_0: return 7;
    case NL_GGML_BF16: return 32;
    default: return 0;
    }
}

static nl_status write_tokenizer(nl_gguf_writer *w, const nl_tokenizer *tok, int64_t V) {
    if (!tok) return NL_OK;
    if (tok->kind == NL_TOKENIZER_HF) {
        size_t n;
        const char *j = nl_bpe_json(tok->bpe, &n);
        char *s = malloc(n + 1);
        if (!s) return nl_fail(NL_ERR_NOMEM, "out of memory");
        memcpy(s, j, n);
        s[n] = 0;
        nl_status rc = nl_gguf_writer_str(w, "tokenizer.huggingface.json", s);
        free(s);
        return rc;
    }
    /* llama2.c and byte vocabularies as SentencePiece ("llama"): llama.cpp reads them as its SPM */
    int n = tok->kind == NL_TOKENIZER_BYTE ? (int)V : tok->vocab_size;
    char **pieces = calloc((size_t)n, sizeof *pieces);
    float *scores = calloc((size_t)n, sizeof *scores);
    int32_t *types = calloc((size_t)n, sizeof *types);
    nl_status rc = pieces && scores && types ? NL_OK : nl_fail(NL_ERR_NOMEM, "out of memory");
    for (int i = 0; i < n && !rc; i++) {
        char tmp[32];
        const char *src;
        if (tok->kind == NL_TOKENIZER_BYTE) {
            snprintf(tmp, sizeof tmp, i < 256 ? "<0x%02X>" : "<unused%d>", i < 256 ? i : i - 256);
            src = tmp;
            types[i] = i < 256 ? 6 : 5; /* byte, unused */
        } else {
            src = tok->pieces[i];
            int byte = 0;
            types[i] = i == 0 ? 2 : (i == tok->bos_id || i == tok->eos_id) ? 3 : (i >= 3 && i < 259) ? 6 : 1;
            (void)byte;
            scores[i] = tok->scores[i];
        }
        size_t len = strlen(src), k = 0;
        char *p = malloc(3 * len + 1);
        if (!p) {
            rc = nl_fail(NL_ERR_NOMEM, "out of memory");
            break;
        }
        for (size_t j = 0; j < len; j++) {
            if (src[j] == ' ' && types[i] == 1) {
                memcpy(p + k, SPM_SPACE, 3);
                k += 3;
            } else
                p[k++] = src[j];
        }
        p[k] = 0;
        pieces[i] = p;
    }
    if (!rc) rc = nl_gguf_writer_str(w, "tokenizer.ggml.model", "llama");
    if (!rc) rc = nl_gguf_writer_arr_str(w, "tokenizer.ggml.tokens", (uint64_t)n, (const char *const *)pieces, NULL);
    if (!rc) rc = nl_gguf_writer_arr(w, "tokenizer.ggml.scores", NL_GGUF_FLOAT32, (uint64_t)n, scores);
    if (!rc) rc = nl_gguf_writer_arr(w, "tokenizer.ggml.token_type", NL_GGUF_INT32, (uint64_t)n, types);
    if (tok->kind == NL_TOKENIZER_BYTE) {
        if (!rc) rc = nl_gguf_writer_str(w, "nanolm.tokenizer", "byte");
        if (!rc) rc = nl_gguf_writer_bool(w, "tokenizer.ggml.add_bos_token", 0);
    } else {
        if (!rc) rc = nl_gguf_writer_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)tok->bos_id);
        if (!rc) rc = nl_gguf_writer_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)tok->eos_id);
        if (!rc) rc = nl_gguf_writer_u32(w, "tokenizer.ggml.unknown_token_id", 0);
        if (!rc) rc = nl_gguf_writer_bool(w, "tokenizer.ggml.add_bos_token", 1);
    }
    for (int i = 0; pieces && i < n; i++) free(pieces[i]);
    free(pieces);
    free(scores);
    free(types);
    return rc;
}

nl_status nl_gguf_save(const char *path, const nl_model *m, const nl_tokenizer *tok, uint32_t type) {
    const nl_arch *a = &m->arch;
    if (a->n_experts || a->qkv_bias)
        return nl_fail(NL_ERR_INVALID, "GGUF export: %s models are not supported (llama architecture only)",
                       a->n_experts ? "mixture-of-experts" : "q/k/v bias");
    if (a->rope_scaling_factor > 0)
        return nl_fail(NL_ERR_INVALID, "GGUF export: Llama 3 RoPE scaling is not supported");
    if (!nl_ggml_can_quantize(type))
        return nl_fail(NL_ERR_INVALID, "GGUF export: type %s is not supported (f32, f16, bf16, q8_0, q4_0)",
                       nl_ggml_type_name(type) ? nl_ggml_type_name(type) : "?");
    nl_gguf_writer w;
    nl_gguf_writer_init(&w);
    nl_status rc = nl_gguf_writer_str(&w, "general.architecture", "llama");
    if (!rc) rc = nl_gguf_writer_str(&w, "general.name", a->name[0] ? a->name : "nanolm");
    if (!rc) rc = nl_gguf_writer_u32(&w, "general.file_type", file_type(type));
    if (!rc) rc = nl_gguf_writer_u32(&w, "llama.context_length", (uint32_t)a->seq_len);
    if (!rc) rc = nl_gguf_writer_u32(&w, "llama.embedding_length", (uint32_t)a->dim);
    if (!rc) rc = nl_gguf_writer_u32(&w, "llama.block_count", (uint32_t)a->n_layers);
    if (!rc) rc = nl_gguf_writer_u32(&w, "llama.feed_forward_length", (uint32_t)a->hidden_dim);
    if (!rc) rc = nl_gguf_writer_u32(&w, "llama.attention.head_count", (uint32_t)a->n_heads);
    if (!rc) rc = nl_gguf_writer_u32(&w, "llama.attention.head_count_kv", (uint32_t)a->n_kv_heads);
    if (!rc) rc = nl_gguf_writer_u32(&w, "llama.attention.key_length", (uint32_t)m->hd);
    if (!rc) rc = nl_gguf_writer_u32(&w, "llama.attention.value_length", (uint32_t)m->hd);
    if (!rc) rc = nl_gguf_writer_u32(&w, "llama.rope.dimension_count", (uint32_t)m->hd);
    if (!rc) rc = nl_gguf_writer_f32(&w, "llama.rope.freq_base", (float)a->rope_theta);
    if (!rc) rc = nl_gguf_writer_f32(&w, "llama.attention.layer_norm_rms_epsilon", (float)a->norm_eps);
    if (!rc) rc = nl_gguf_writer_u32(&w, "llama.vocab_size", (uint32_t)a->vocab_size);
    if (!rc) rc = write_tokenizer(&w, tok, a->vocab_size);
    const nl_param_info *tab;
    int nt = nl_model_params_table(m, &tab);
    char name[96];
    for (int i = 0; i < nt && !rc; i++) {
        const nl_param_info *p = &tab[i];
        if (!gguf_name(p, name, sizeof name)) {
            rc = nl_fail(NL_ERR_INVALID, "GGUF export: parameter %s has no GGUF name", p->name);
            break;
        }
        int64_t ne[2] = {p->ndim == 1 ? p->shape[0] : p->shape[1], p->ndim == 1 ? 1 : p->shape[0]};
        uint32_t t = p->ndim == 1 ? NL_GGML_F32 : type;
        if (ne[0] % nl_ggml_block_elems(t)) t = NL_GGML_F32;
        uint64_t bytes = nl_ggml_nbytes(t, p->ndim, ne);
        void *buf = nl_malloc((size_t)bytes, name);
        if (!buf) {
            rc = NL_ERR_NOMEM;
            break;
        }
        rc = nl_ggml_from_f32(t, m->params + p->offset, (int64_t)p->numel, buf);
        if (rc) {
            char msg[400];
            snprintf(msg, sizeof msg, "%s", nl_last_error());
            rc = nl_fail(rc, "GGUF export: tensor %s: %s", name, msg);
            nl_free(buf);
            break;
        }
        rc = nl_gguf_writer_tensor_owned(&w, name, t, p->ndim, ne, buf);
    }
    if (!rc) rc = nl_gguf_writer_write(&w, path);
    nl_gguf_writer_free(&w);
    return rc;
}

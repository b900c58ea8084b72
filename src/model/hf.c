/*
 * Hugging Face model folders: config.json, sharded safetensors, export (see nanolm/hf.h).
 */
#include "nanolm/hf.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "nanolm/formats.h"
#include "nanolm/gguf_model.h"
#include "nanolm/resources.h"

int nl_hf_is_folder(const char *path) {
    struct stat st;
    return path && stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

void nl_hf_permute_rows(float *dst, const float *src, int64_t n_heads, int64_t hd, int64_t cols, int to_hf) {
    int64_t half = hd / 2;
    for (int64_t h = 0; h < n_heads; h++)
        for (int64_t i = 0; i < half; i++)
            for (int p = 0; p < 2; p++) {
                int64_t nano = h * hd + 2 * i + p, hf = h * hd + p * half + i;
                const float *s = src + (to_hf ? nano : hf) * cols;
                float *d = dst + (to_hf ? hf : nano) * cols;
                memcpy(d, s, (size_t)cols * sizeof(float));
            }
}

/* ---- config.json ---------------------------------------------------------------------------- */

/* "DIR/NAME" into buf. */
static const char *join(char *buf, size_t n, const char *dir, const char *name) {
    size_t l = strlen(dir);
    snprintf(buf, n, "%s%s%s", dir, l && dir[l - 1] == '/' ? "" : "/", name);
    return buf;
}

/* Reads and parses a JSON file; errors name it. */
static nl_status read_json(const char *path, cJSON **out) {
    char *txt = NULL;
    size_t n = 0;
    *out = NULL;
    struct stat st;
    if (stat(path, &st) != 0) return nl_fail(NL_ERR_IO, "%s: %s", path, strerror(errno));
    if (!S_ISREG(st.st_mode)) return nl_fail(NL_ERR_IO, "%s: not a regular file", path);
    NL_TRY(nl_read_file(path, &txt, &n));
    const char *end = NULL;
    *out = cJSON_ParseWithLengthOpts(txt, n, &end, 0);
    if (!*out) {
        long at = end ? (long)(end - txt) : -1;
        nl_free(txt);
        return nl_fail(NL_ERR_FORMAT, "%s: not valid JSON (near byte %ld)", path, at);
    }
    nl_free(txt);
    if (!cJSON_IsObject(*out)) {
        cJSON_Delete(*out);
        *out = NULL;
        return nl_fail(NL_ERR_FORMAT, "%s: not a JSON object", path);
    }
    return NL_OK;
}

/* A positive integer key (required unless def > 0, which is then the default). */
static nl_status cfg_int(const char *file, const cJSON *o, const char *key, int64_t def, int64_t *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v || cJSON_IsNull(v)) {
        if (def > 0) {
            *out = def;
            return NL_OK;
        }
        return nl_fail(NL_ERR_FORMAT, "%s: key \"%s\" is missing", file, key);
    }
    double d = cJSON_IsNumber(v) ? v->valuedouble : -1;
    if (!(d >= 1 && d <= 0x1p40) || d != floor(d))
        return nl_fail(NL_ERR_FORMAT, "%s: key \"%s\" must be a positive integer", file, key);
    *out = (int64_t)d;
    return NL_OK;
}

/* A finite positive number (default def when absent). */
static nl_status cfg_real(const char *file, const cJSON *o, const char *key, double def, double *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v || cJSON_IsNull(v)) {
        if (def > 0) {
            *out = def;
            return NL_OK;
        }
        return nl_fail(NL_ERR_FORMAT, "%s: key \"%s\" is missing", file, key);
    }
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || !(v->valuedouble > 0))
        return nl_fail(NL_ERR_FORMAT, "%s: key \"%s\" must be a finite positive number", file, key);
    *out = v->valuedouble;
    return NL_OK;
}

/* A boolean key (absent or null: def). */
static nl_status cfg_bool(const char *file, const cJSON *o, const char *key, int def, int *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v || cJSON_IsNull(v))
        *out = def;
    else if (cJSON_IsBool(v))
        *out = cJSON_IsTrue(v);
    else
        return nl_fail(NL_ERR_FORMAT, "%s: key \"%s\" must be true or false", file, key);
    return NL_OK;
}

enum { FAM_LLAMA, FAM_MISTRAL, FAM_QWEN2 };
static const char *const fam_names[] = {"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM"};

static nl_status parse_config(const char *file, const cJSON *o, nl_arch *a) {
    memset(a, 0, sizeof *a);
    const cJSON *ar = cJSON_GetObjectItemCaseSensitive(o, "architectures");
    const cJSON *an = cJSON_IsArray(ar) && cJSON_GetArraySize(ar) == 1 ? cJSON_GetArrayItem(ar, 0) : NULL;
    if (!cJSON_IsString(an))
        return nl_fail(NL_ERR_FORMAT,
                       "%s: key \"architectures\" must be a list of one name (such as [\"LlamaForCausalLM\"])", file);
    int fam = -1;
    for (int k = 0; k < 3; k++)
        if (!strcmp(an->valuestring, fam_names[k])) fam = k;
    if (fam < 0)
        return nl_fail(NL_ERR_FORMAT,
                       "%s: key \"architectures\": \"%s\" is not an architecture nanolm loads (LlamaForCausalLM, "
                       "MistralForCausalLM, Qwen2ForCausalLM)",
                       file, an->valuestring);
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(o, "model_type");
    snprintf(a->name, sizeof a->name, "%s", cJSON_IsString(mt) ? mt->valuestring : fam_names[fam]);
    NL_TRY(cfg_int(file, o, "vocab_size", 0, &a->vocab_size));
    NL_TRY(cfg_int(file, o, "hidden_size", 0, &a->dim));
    NL_TRY(cfg_int(file, o, "intermediate_size", 0, &a->hidden_dim));
    NL_TRY(cfg_int(file, o, "num_hidden_layers", 0, &a->n_layers));
    NL_TRY(cfg_int(file, o, "num_attention_heads", 0, &a->n_heads));
    NL_TRY(cfg_int(file, o, "num_key_value_heads", a->n_heads, &a->n_kv_heads));
    if (a->dim % a->n_heads == 0)
        NL_TRY(cfg_int(file, o, "head_dim", a->dim / a->n_heads, &a->head_dim));
    else
        NL_TRY(cfg_int(file, o, "head_dim", 0, &a->head_dim));
    if (a->head_dim == a->dim / a->n_heads && a->dim % a->n_heads == 0) a->head_dim = 0; /* the default */
    NL_TRY(cfg_int(file, o, "max_position_embeddings", 0, &a->seq_len));
    NL_TRY(cfg_real(file, o, "rms_norm_eps", 0, &a->norm_eps));
    NL_TRY(cfg_real(file, o, "rope_theta", 10000.0, &a->rope_theta));
    NL_TRY(cfg_bool(file, o, "tie_word_embeddings", 0, &a->tied_embeddings));
    const cJSON *act = cJSON_GetObjectItemCaseSensitive(o, "hidden_act");
    if (act && !(cJSON_IsString(act) && !strcmp(act->valuestring, "silu")))
        return nl_fail(NL_ERR_FORMAT, "%s: key \"hidden_act\" is %s%s%s; nanolm computes SwiGLU with silu only", file,
                       cJSON_IsString(act) ? "\"" : "", cJSON_IsString(act) ? act->valuestring : "not a string",
                       cJSON_IsString(act) ? "\"" : "");
    if (fam == FAM_QWEN2) {
        a->qkv_bias = 1; /* Qwen2Attention: q/k/v with bias, o_proj without */
    } else {
        static const char *const nobias[] = {"attention_bias", "mlp_bias"};
        for (int k = 0; k < 2; k++) {
            int b;
            NL_TRY(cfg_bool(file, o, nobias[k], 0, &b));
            if (b)
                return nl_fail(NL_ERR_FORMAT, "%s: key \"%s\" is true; nanolm loads %s without biases", file, nobias[k],
                               fam_names[fam]);
        }
    }
    /* Sliding-window attention equals full attention within the window: cap the context there. */
    const cJSON *sw = cJSON_GetObjectItemCaseSensitive(o, "sliding_window");
    int use_sw = fam == FAM_MISTRAL;
    if (fam == FAM_QWEN2) NL_TRY(cfg_bool(file, o, "use_sliding_window", 0, &use_sw));
    if (use_sw && sw && !cJSON_IsNull(sw)) {
        int64_t w;
        NL_TRY(cfg_int(file, o, "sliding_window", 0, &w));
        if (w < a->seq_len) a->seq_len = w;
    }
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(o, "rope_scaling");
    if (rs && !cJSON_IsNull(rs)) {
        if (!cJSON_IsObject(rs))
            return nl_fail(NL_ERR_FORMAT, "%s: key \"rope_scaling\" must be an object or null", file);
        const cJSON *ty = cJSON_GetObjectItemCaseSensitive(rs, "rope_type");
        if (!ty) ty = cJSON_GetObjectItemCaseSensitive(rs, "type");
        if (!cJSON_IsString(ty))
            return nl_fail(NL_ERR_FORMAT, "%s: key \"rope_scaling\" has no string \"rope_type\"", file);
        if (!strcmp(ty->valuestring, "llama3")) {
            NL_TRY(cfg_real(file, rs, "factor", 0, &a->rope_scaling_factor));
            NL_TRY(cfg_real(file, rs, "low_freq_factor", 0, &a->rope_low_freq_factor));
            NL_TRY(cfg_real(file, rs, "high_freq_factor", 0, &a->rope_high_freq_factor));
            NL_TRY(cfg_int(file, rs, "original_max_position_embeddings", 0, &a->rope_original_max_pos));
        } else if (strcmp(ty->valuestring, "default")) {
            return nl_fail(NL_ERR_FORMAT,
                           "%s: key \"rope_scaling\": rope_type \"%s\" is not supported (nanolm implements llama3)",
                           file, ty->valuestring);
        }
    }
    if (nl_arch_validate(a)) {
        char msg[400];
        snprintf(msg, sizeof msg, "%s", nl_last_error());
        return nl_fail(NL_ERR_FORMAT, "%s: %s", file, msg);
    }
    return NL_OK;
}

nl_status nl_arch_from_hf_config(const char *path, nl_arch *a) {
    char buf[4096];
    const char *file = nl_hf_is_folder(path) ? join(buf, sizeof buf, path, "config.json") : path;
    cJSON *o;
    NL_TRY(read_json(file, &o));
    nl_status rc = parse_config(file, o, a);
    cJSON_Delete(o);
    return rc;
}

/* ---- loading the weights -------------------------------------------------------------------- */

typedef struct shard_set {
    int n;
    char **names;      /* (n,) file names as the index gives them */
    nl_st_file *files; /* (n,) opened */
    cJSON *index;      /* parsed index (NULL: one model.safetensors) */
    const cJSON *map;  /* index weight_map */
    char index_path[4096];
} shard_set;

static void shards_close(shard_set *s) {
    for (int i = 0; i < s->n; i++) {
        nl_st_close(&s->files[i]);
        free(s->names[i]);
    }
    free(s->names);
    free(s->files);
    cJSON_Delete(s->index);
    memset(s, 0, sizeof *s);
}

static int shard_find(const shard_set *s, const char *name) {
    for (int i = 0; i < s->n; i++)
        if (!strcmp(s->names[i], name)) return i;
    return -1;
}

/* Opens model.safetensors, or the index and every shard it names. */
static nl_status shards_open(shard_set *s, const char *dir) {
    memset(s, 0, sizeof *s);
    char path[4096];
    struct stat st;
    join(s->index_path, sizeof s->index_path, dir, "model.safetensors.index.json");
    if (stat(s->index_path, &st) != 0) {
        join(path, sizeof path, dir, "model.safetensors");
        if (stat(path, &st) != 0)
            return nl_fail(NL_ERR_IO, "%s: no model.safetensors or model.safetensors.index.json in the folder", dir);
        s->names = calloc(1, sizeof *s->names);
        s->files = calloc(1, sizeof *s->files);
        if (!s->names || !s->files || !(s->names[0] = strdup("model.safetensors"))) {
            shards_close(s);
            return nl_fail(NL_ERR_NOMEM, "out of memory opening %s", path);
        }
        s->n = 1;
        nl_status rc = nl_st_open(&s->files[0], path);
        if (rc) shards_close(s);
        return rc;
    }
    NL_TRY(read_json(s->index_path, &s->index));
    s->map = cJSON_GetObjectItemCaseSensitive(s->index, "weight_map");
    if (!cJSON_IsObject(s->map)) {
        nl_status rc = nl_fail(NL_ERR_FORMAT, "%s: key \"weight_map\" is missing or not an object", s->index_path);
        shards_close(s);
        return rc;
    }
    int cap = cJSON_GetArraySize(s->map);
    s->names = calloc((size_t)cap + 1, sizeof *s->names);
    s->files = calloc((size_t)cap + 1, sizeof *s->files);
    if (!s->names || !s->files) {
        nl_status rc = nl_fail(NL_ERR_NOMEM, "out of memory reading %s", s->index_path);
        shards_close(s);
        return rc;
    }
    const cJSON *e;
    nl_status rc = NL_OK;
    cJSON_ArrayForEach(e, s->map) {
        if (!cJSON_IsString(e) || strchr(e->valuestring, '/') || !e->valuestring[0]) {
            rc = nl_fail(NL_ERR_FORMAT, "%s: weight_map[\"%s\"] must be a file name in the folder", s->index_path,
                         e->string);
            break;
        }
        if (shard_find(s, e->valuestring) >= 0) continue;
        join(path, sizeof path, dir, e->valuestring);
        if (stat(path, &st) != 0) {
            rc = nl_fail(NL_ERR_IO, "%s: weight_map[\"%s\"] names the shard %s, which is missing (%s)", s->index_path,
                         e->string, e->valuestring, strerror(errno));
            break;
        }
        if (!(s->names[s->n] = strdup(e->valuestring))) {
            rc = nl_fail(NL_ERR_NOMEM, "out of memory reading %s", s->index_path);
            break;
        }
        s->n++;
        if ((rc = nl_st_open(&s->files[s->n - 1], path))) break;
    }
    if (rc) shards_close(s);
    return rc;
}

/* The tensor `name` and its file (errors name the index or the shard). */
static nl_status shards_get(const shard_set *s, const char *name, const nl_st_file **f, const nl_st_tensor **t) {
    int i = 0;
    if (s->index) {
        const cJSON *e = cJSON_GetObjectItemCaseSensitive(s->map, name);
        if (!e) return nl_fail(NL_ERR_FORMAT, "%s: weight_map has no tensor \"%s\"", s->index_path, name);
        i = shard_find(s, e->valuestring);
    }
    *f = &s->files[i];
    *t = nl_st_find(*f, name);
    if (!*t)
        return nl_fail(NL_ERR_FORMAT, "%s: no tensor \"%s\"%s", (*f)->path, name,
                       s->index ? " (the index says it is in this shard)" : "");
    return NL_OK;
}

/* 1 for tensors a folder may hold that nanolm does not need. */
static int ignorable(const char *name, const nl_model *m) {
    size_t n = strlen(name);
    const char *sfx = "rotary_emb.inv_freq";
    if (n >= strlen(sfx) && !strcmp(name + n - strlen(sfx), sfx)) return 1;
    return m->arch.tied_embeddings && !strcmp(name, "lm_head.weight");
}

static nl_status load_tensor(const shard_set *s, nl_model *m, const nl_param_info *p, float *scratch) {
    const nl_st_file *f;
    const nl_st_tensor *t;
    NL_TRY(shards_get(s, p->name, &f, &t));
    if (t->dtype != NL_ST_F32 && t->dtype != NL_ST_BF16 && t->dtype != NL_ST_F16)
        return nl_fail(NL_ERR_FORMAT, "%s: tensor \"%s\" has dtype %s; nanolm reads F32, BF16 and F16", f->path,
                       p->name, nl_st_dtype_name(t->dtype));
    int same = t->ndim == p->ndim;
    for (int d = 0; same && d < p->ndim; d++) same = t->shape[d] == p->shape[d];
    if (!same) {
        char a[160], b[160];
        return nl_fail(NL_ERR_FORMAT, "%s: tensor \"%s\" has shape %s but config.json needs %s", f->path, p->name,
                       nl_st_shape_str(t->ndim, t->shape, a, sizeof a),
                       nl_st_shape_str(p->ndim, p->shape, b, sizeof b));
    }
    float *dst = m->params + p->offset;
    int heads = p->kind == NL_PARAM_WQ || p->kind == NL_PARAM_BQ   ? (int)m->NH
                : p->kind == NL_PARAM_WK || p->kind == NL_PARAM_BK ? (int)m->KVH
                                                                   : 0;
    if (!heads) {
        nl_st_tensor_to_f32(t, dst);
        return NL_OK;
    }
    nl_st_tensor_to_f32(t, scratch);
    nl_hf_permute_rows(dst, scratch, heads, m->hd, p->ndim == 2 ? p->shape[1] : 1, 0);
    return NL_OK;
}

nl_status nl_hf_load_model(const char *dir, int64_t max_seq, nl_model *m) {
    memset(m, 0, sizeof *m);
    nl_arch a;
    NL_TRY(nl_arch_from_hf_config(dir, &a));
    if (max_seq > 0 && a.seq_len > max_seq) a.seq_len = max_seq;
    shard_set s;
    NL_TRY(shards_open(&s, dir));
    nl_arch_params np;
    nl_arch_count_params(&a, &np);
    char what[4200];
    snprintf(what, sizeof what, "%s: a model of %lld parameters", dir, (long long)np.total);
    nl_status rc = nl_mem_require((uint64_t)np.total * sizeof(float), what);
    if (!rc) rc = nl_model_init(m, &a);
    float *scratch = NULL;
    if (!rc) {
        scratch = nl_malloc((size_t)(m->NH * m->hd * m->C) * sizeof(float), "q/k reorder buffer");
        if (!scratch) rc = NL_ERR_NOMEM;
    }
    for (int i = 0; !rc && i < m->n_tensors; i++) rc = load_tensor(&s, m, &m->table[i], scratch);
    /* every tensor of the folder must have been used (an o_proj bias would be dropped) */
    for (int k = 0; !rc && k < s.n; k++)
        for (int j = 0; !rc && j < s.files[k].n_tensors; j++) {
            const char *nm = s.files[k].tensors[j].name;
            if (ignorable(nm, m) || nl_model_find_param(m, nm)) continue;
            rc = nl_fail(NL_ERR_FORMAT, "%s: tensor \"%s\" is not part of a %s model with this config.json",
                         s.files[k].path, nm, m->arch.name);
        }
    nl_free(scratch);
    shards_close(&s);
    if (rc) nl_model_free(m);
    return rc;
}

nl_status nl_hf_load_tokenizer(const char *model_path, const char *kind, const char *tok_path, int64_t V,
                               nl_tokenizer *tok) {
    memset(tok, 0, sizeof *tok);
    if (tok_path) {
        size_t n = strlen(tok_path);
        return n >= 5 && !strcmp(tok_path + n - 5, ".json") ? nl_tokenizer_load_json(tok, tok_path, (int)V)
                                                            : nl_tokenizer_load_llama2c(tok, tok_path, (int)V);
    }
    if (nl_hf_is_folder(model_path)) {
        char path[4096];
        struct stat st;
        join(path, sizeof path, model_path, "tokenizer.json");
        if (stat(path, &st) != 0)
            return nl_fail(NL_ERR_INVALID, "%s has no tokenizer.json: pass one with --tokenizer", model_path);
        return nl_tokenizer_load_json(tok, path, (int)V);
    }
    if (kind && !strcmp(kind, "byte")) {
        NL_TRY(nl_tokenizer_init_byte(tok));
        if (V != 256) {
            nl_tokenizer_free(tok);
            return nl_fail(NL_ERR_FORMAT, "%s: byte tokenizer but vocab %lld", model_path, (long long)V);
        }
        return NL_OK;
    }
    return nl_fail(NL_ERR_INVALID, "%s uses the %s tokenizer: pass its file with --tokenizer", model_path,
                   kind ? kind : "?");
}

nl_status nl_hf_open_tokenizer(const char *path, nl_tokenizer *tok) {
    memset(tok, 0, sizeof *tok);
    if (!path || !path[0]) return nl_fail(NL_ERR_INVALID, "no tokenizer path given");
    if (!strcmp(path, "byte")) return nl_tokenizer_init_byte(tok);
    size_t n = strlen(path);
    if ((n >= 5 && !strcmp(path + n - 5, ".gguf")) || nl_gguf_is_file(path)) {
        /* the vocabulary: the model's (llama architecture), else the tokenizer's own token count */
        nl_arch a;
        int64_t V = 0;
        if (nl_gguf_arch(path, 0, &a) == NL_OK) {
            V = a.vocab_size;
        } else {
            nl_gguf_file f;
            NL_TRY(nl_gguf_open(&f, path));
            const nl_gguf_kv *kv = nl_gguf_find_kv(&f, "tokenizer.ggml.tokens");
            V = kv && kv->type == NL_GGUF_ARRAY ? (int64_t)kv->n : 0;
            nl_gguf_close(&f);
        }
        return nl_gguf_load_tokenizer(path, V, tok);
    }
    if (nl_hf_is_folder(path)) return nl_hf_load_tokenizer(path, NULL, NULL, 0, tok);
    return nl_hf_load_tokenizer(NULL, NULL, path, 0, tok);
}

/* ---- export --------------------------------------------------------------------------------- */

static cJSON *config_json(const nl_model *m, const nl_tokenizer *tok, nl_st_dtype dtype) {
    const nl_arch *a = &m->arch;
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    cJSON *ar = cJSON_AddArrayToObject(o, "architectures");
    cJSON_AddItemToArray(ar, cJSON_CreateString(a->qkv_bias ? "Qwen2ForCausalLM" : "LlamaForCausalLM"));
    cJSON_AddStringToObject(o, "model_type", a->qkv_bias ? "qwen2" : "llama");
    cJSON_AddNumberToObject(o, "vocab_size", (double)a->vocab_size);
    cJSON_AddNumberToObject(o, "hidden_size", (double)a->dim);
    cJSON_AddNumberToObject(o, "intermediate_size", (double)a->hidden_dim);
    cJSON_AddNumberToObject(o, "num_hidden_layers", (double)a->n_layers);
    cJSON_AddNumberToObject(o, "num_attention_heads", (double)a->n_heads);
    cJSON_AddNumberToObject(o, "num_key_value_heads", (double)a->n_kv_heads);
    cJSON_AddNumberToObject(o, "head_dim", (double)m->hd);
    cJSON_AddNumberToObject(o, "max_position_embeddings", (double)a->seq_len);
    cJSON_AddNumberToObject(o, "rms_norm_eps", a->norm_eps);
    cJSON_AddNumberToObject(o, "rope_theta", a->rope_theta);
    if (a->rope_scaling_factor > 0) {
        cJSON *rs = cJSON_AddObjectToObject(o, "rope_scaling");
        cJSON_AddStringToObject(rs, "rope_type", "llama3");
        cJSON_AddNumberToObject(rs, "factor", a->rope_scaling_factor);
        cJSON_AddNumberToObject(rs, "low_freq_factor", a->rope_low_freq_factor);
        cJSON_AddNumberToObject(rs, "high_freq_factor", a->rope_high_freq_factor);
        cJSON_AddNumberToObject(rs, "original_max_position_embeddings", (double)a->rope_original_max_pos);
    } else {
        cJSON_AddNullToObject(o, "rope_scaling");
    }
    cJSON_AddBoolToObject(o, "tie_word_embeddings", a->tied_embeddings);
    cJSON_AddStringToObject(o, "hidden_act", "silu");
    if (!a->qkv_bias) {
        cJSON_AddBoolToObject(o, "attention_bias", 0);
        cJSON_AddBoolToObject(o, "mlp_bias", 0);
    }
    if (tok && tok->bos_id >= 0) cJSON_AddNumberToObject(o, "bos_token_id", tok->bos_id);
    if (tok && tok->eos_id >= 0) cJSON_AddNumberToObject(o, "eos_token_id", tok->eos_id);
    cJSON_AddStringToObject(o, "torch_dtype",
                            dtype == NL_ST_BF16  ? "bfloat16"
                            : dtype == NL_ST_F16 ? "float16"
                                                 : "float32");
    return o;
}

/* Writes a cJSON value to path atomically (pretty-printed, newline at the end). */
static nl_status write_json(const char *path, const cJSON *o) {
    char *s = cJSON_Print(o);
    if (!s) return nl_fail(NL_ERR_NOMEM, "out of memory writing %s", path);
    size_t n = strlen(s);
    char *t = realloc(s, n + 2);
    if (!t) {
        free(s);
        return nl_fail(NL_ERR_NOMEM, "out of memory writing %s", path);
    }
    t[n] = '\n';
    t[n + 1] = 0;
    nl_status rc = nl_write_file_atomic(path, t, n + 1);
    free(t);
    return rc;
}

/* The tensor p of m as dtype (a nl_malloc'd buffer), q/k rows in Hugging Face's order. */
static void *export_tensor(const nl_model *m, const nl_param_info *p, nl_st_dtype dtype, float *scratch) {
    const float *src = m->params + p->offset;
    int heads = p->kind == NL_PARAM_WQ || p->kind == NL_PARAM_BQ   ? (int)m->NH
                : p->kind == NL_PARAM_WK || p->kind == NL_PARAM_BK ? (int)m->KVH
                                                                   : 0;
    if (heads) {
        nl_hf_permute_rows(scratch, src, heads, m->hd, p->ndim == 2 ? p->shape[1] : 1, 1);
        src = scratch;
    }
    size_t es = nl_st_dtype_size(dtype);
    size_t bytes = p->numel * es;
    void *out = nl_malloc(bytes > 0 ? bytes : 1, "exported tensor");
    if (!out) return NULL;
    if (dtype == NL_ST_F32) {
        memcpy(out, src, p->numel * sizeof(float));
    } else if (dtype == NL_ST_BF16) {
        uint16_t *o = out;
        for (size_t i = 0; i < p->numel; i++) o[i] = nl_bf16_from_f32(src[i]);
    } else {
        if (nl_fmt_encode_array(NL_FMT_FP16, src, p->numel, out)) {
            nl_free(out);
            return NULL;
        }
    }
    return out;
}

nl_status nl_hf_save(const char *dir, const nl_model *m, const nl_tokenizer *tok, nl_st_dtype dtype,
                     uint64_t shard_bytes) {
    if (m->moe) return nl_fail(NL_ERR_INVALID, "%s: a mixture-of-experts model has no Llama-family folder form", dir);
    if (m->no_embed || m->no_tail) return nl_fail(NL_ERR_INVALID, "%s: cannot export a part of a model", dir);
    if (dtype != NL_ST_F32 && dtype != NL_ST_BF16 && dtype != NL_ST_F16)
        return nl_fail(NL_ERR_INVALID, "%s: export dtype %s (F32, BF16 or F16)", dir, nl_st_dtype_name(dtype));
    if (mkdir(dir, 0777) != 0 && errno != EEXIST)
        return nl_fail(NL_ERR_IO, "cannot create %s: %s", dir, strerror(errno));
    if (!nl_hf_is_folder(dir)) return nl_fail(NL_ERR_IO, "%s exists and is not a folder", dir);
    char path[4096];
    size_t es = nl_st_dtype_size(dtype);
    /* shard assignment: consecutive tensors until the next would pass shard_bytes */
    int *shard_of = calloc((size_t)m->n_tensors, sizeof(int));
    if (!shard_of) return nl_fail(NL_ERR_NOMEM, "out of memory exporting %s", dir);
    int n_shards = 1;
    uint64_t cur = 0, total = 0;
    for (int i = 0; i < m->n_tensors; i++) {
        uint64_t b = (uint64_t)m->table[i].numel * es;
        if (shard_bytes && cur > 0 && cur + b > shard_bytes) {
            n_shards++;
            cur = 0;
        }
        shard_of[i] = n_shards - 1;
        cur += b;
        total += b;
    }
    nl_status rc = NL_OK;
    float *scratch = nl_malloc((size_t)(m->NH * m->hd * m->C) * sizeof(float), "q/k reorder buffer");
    if (!scratch) rc = NL_ERR_NOMEM;
    cJSON *index = n_shards > 1 ? cJSON_CreateObject() : NULL, *wmap = NULL;
    if (index) {
        cJSON *md = cJSON_AddObjectToObject(index, "metadata");
        cJSON_AddNumberToObject(md, "total_size", (double)total);
        wmap = cJSON_AddObjectToObject(index, "weight_map");
    }
    for (int s = 0; !rc && s < n_shards; s++) {
        char fname[64];
        if (n_shards == 1)
            snprintf(fname, sizeof fname, "model.safetensors");
        else
            snprintf(fname, sizeof fname, "model-%05d-of-%05d.safetensors", s + 1, n_shards);
        nl_st_writer w;
        nl_st_writer_init(&w);
        rc = nl_st_writer_meta(&w, "format", "pt");
        for (int i = 0; !rc && i < m->n_tensors; i++) {
            if (shard_of[i] != s) continue;
            const nl_param_info *p = &m->table[i];
            void *buf = export_tensor(m, p, dtype, scratch);
            if (!buf) {
                rc = nl_fail(NL_ERR_NOMEM, "out of memory exporting %s", p->name);
                break;
            }
            rc = nl_st_writer_add_owned(&w, p->name, dtype, p->ndim, p->shape, buf);
            if (!rc && wmap) cJSON_AddStringToObject(wmap, p->name, fname);
        }
        if (!rc) rc = nl_st_writer_write(&w, join(path, sizeof path, dir, fname));
        nl_st_writer_free(&w);
    }
    if (!rc && index) rc = write_json(join(path, sizeof path, dir, "model.safetensors.index.json"), index);
    if (!rc) {
        cJSON *cfg = config_json(m, tok, dtype);
        rc = cfg ? write_json(join(path, sizeof path, dir, "config.json"), cfg)
                 : nl_fail(NL_ERR_NOMEM, "out of memory writing %s/config.json", dir);
        cJSON_Delete(cfg);
    }
    if (!rc && tok) rc = nl_tokenizer_save_json(tok, join(path, sizeof path, dir, "tokenizer.json"));
    cJSON_Delete(index);
    nl_free(scratch);
    free(shard_of);
    return rc;
}

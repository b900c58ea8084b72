/* Transformer shapes: validation, exact parameter counts, NanoLM presets. */
#include <stddef.h>
#include <stdint.h>
#include "nanolm/arch.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

int64_t nl_arch_head_dim(const nl_arch *a) {
    return a->head_dim > 0 ? a->head_dim : (a->n_heads > 0 ? a->dim / a->n_heads : 0);
}

static double count_params(const nl_arch *a, nl_arch_params *p);

nl_status nl_arch_validate(const nl_arch *a) {
#define POS(f)                                                                                                         \
    if (a->f <= 0)                                                                                                     \
    return nl_fail(NL_ERR_INVALID, "arch %s: " #f " must be positive, got %lld", a->name, (long long)a->f)
    POS(vocab_size);
    POS(dim);
    POS(n_layers);
    POS(n_heads);
    POS(n_kv_heads);
    POS(seq_len);
#undef POS
    if (a->head_dim <= 0 && a->dim % a->n_heads)
        return nl_fail(NL_ERR_INVALID, "arch %s: dim %lld is not a multiple of n_heads %lld", a->name,
                       (long long)a->dim, (long long)a->n_heads);
    if (a->n_heads % a->n_kv_heads)
        return nl_fail(NL_ERR_INVALID, "arch %s: n_heads %lld is not a multiple of n_kv_heads %lld", a->name,
                       (long long)a->n_heads, (long long)a->n_kv_heads);
    if (nl_arch_head_dim(a) % 2)
        return nl_fail(NL_ERR_INVALID, "arch %s: head size %lld must be even for RoPE", a->name,
                       (long long)nl_arch_head_dim(a));
    if (a->n_experts < 0 || a->n_shared_experts < 0 || a->top_k < 0)
        return nl_fail(NL_ERR_INVALID, "arch %s: negative expert counts", a->name);
    if (a->n_experts > 0 && (a->top_k < 1 || a->top_k > a->n_experts || a->expert_hidden_dim <= 0))
        return nl_fail(NL_ERR_INVALID, "arch %s: MoE needs 1 <= top_k <= n_experts and expert_hidden_dim > 0", a->name);
    if (a->hidden_dim <= 0 && (a->n_experts == 0 || a->first_moe_layer > 0))
        return nl_fail(NL_ERR_INVALID, "arch %s: hidden_dim must be positive for dense layers", a->name);
    if (a->rope_scaling_factor != 0 &&
        (!(a->rope_scaling_factor >= 1) || !isfinite(a->rope_scaling_factor) || !(a->rope_low_freq_factor > 0) ||
         !(a->rope_high_freq_factor > a->rope_low_freq_factor) || !isfinite(a->rope_high_freq_factor) ||
         a->rope_original_max_pos <= 0))
        return nl_fail(NL_ERR_INVALID,
                       "arch %s: llama3 rope scaling needs factor >= 1, 0 < low_freq_factor < high_freq_factor and "
                       "original_max_position_embeddings > 0 (got %g, %g, %g, %lld)",
                       a->name, a->rope_scaling_factor, a->rope_low_freq_factor, a->rope_high_freq_factor,
                       (long long)a->rope_original_max_pos);
    /* sizes multiply: the parameter count must stay an exact integer in int64 and in size_t */
    nl_arch_params p;
    double total = count_params(a, &p);
    if (total >= (double)NL_ARCH_MAX_PARAMS)
        return nl_fail(NL_ERR_INVALID, "arch %s: %.4g parameters; the shape multiplies past 2^53 (%.4g)", a->name,
                       total, (double)NL_ARCH_MAX_PARAMS);
    double kv_width = (double)a->n_kv_heads * (double)nl_arch_head_dim(a) + (double)a->kv_lora_rank;
    if ((double)a->seq_len * (double)a->n_layers * 2 * kv_width >= (double)NL_ARCH_MAX_PARAMS)
        return nl_fail(
            NL_ERR_INVALID,
            "arch %s: a full context's KV cache (seq_len %lld x %lld layers x 2 x %.0f) multiplies past 2^53", a->name,
            (long long)a->seq_len, (long long)a->n_layers, kv_width);
    return NL_OK;
}

double nl_arch_rope_inv_freq(const nl_arch *a, int64_t i) {
    double hd = (double)nl_arch_head_dim(a);
    double f = pow(a->rope_theta, -(double)(2 * i) / hd);
    if (!(a->rope_scaling_factor > 0)) return f;
    /* transformers' _compute_llama3_parameters (modeling_rope_utils.py) */
    double pi = 3.14159265358979323846, old = (double)a->rope_original_max_pos;
    double low_wavelen = old / a->rope_low_freq_factor, high_wavelen = old / a->rope_high_freq_factor;
    double wavelen = 2 * pi / f;
    if (wavelen > low_wavelen) return f / a->rope_scaling_factor;
    if (wavelen < high_wavelen) return f;
    double smooth = (old / wavelen - a->rope_low_freq_factor) / (a->rope_high_freq_factor - a->rope_low_freq_factor);
    return (1 - smooth) * f / a->rope_scaling_factor + smooth * f;
}

/* A count computed in double: exact below 2^53 (every term is a non-negative integer no larger
 * than the total), and clamped rather than overflowed for shapes nl_arch_validate refuses. */
static int64_t count_i64(double x) { return x >= 0x1p62 ? INT64_MAX : x <= -0x1p62 ? INT64_MIN : (int64_t)x; }

/* Fills p and returns the total, unclamped. */
static double count_params(const nl_arch *a, nl_arch_params *p) {
    memset(p, 0, sizeof *p);
    double hd = (double)nl_arch_head_dim(a), dim = (double)a->dim, nh = (double)a->n_heads;
    double q = nh * hd, kv = (double)a->n_kv_heads * hd, L = (double)a->n_layers;
    double moe_layers = 0;
    if (a->n_experts > 0) {
        moe_layers = L - (double)a->first_moe_layer;
        if (moe_layers < 0) moe_layers = 0;
    }
    double dense_layers = L - moe_layers, emb = (double)a->vocab_size * dim, att;
    if (a->kv_lora_rank > 0) {
        /* MLA (DeepSeek-V2 sec. 2.1): q = W_qb·norm(W_qa x) (or W_q x), [c_kv, k_rope] = W_kva x,
         * [k_nope, v] = W_kvb·norm(c_kv), out = W_o v; the two low-rank norms count here. */
        double qk = hd + (double)a->qk_rope_head_dim, qr = (double)a->q_lora_rank, kvr = (double)a->kv_lora_rank;
        double wq = a->q_lora_rank > 0 ? dim * qr + qr + qr * nh * qk : dim * nh * qk;
        double wkv = dim * (kvr + (double)a->qk_rope_head_dim) + kvr + kvr * nh * (hd + (double)a->v_head_dim);
        att = L * (wq + wkv + nh * (double)a->v_head_dim * dim);
    } else {
        att = L * (dim * q + 2 * dim * kv + q * dim + (a->qkv_bias ? q + 2 * kv : 0));
    }
    double dense = dense_layers * 3 * dim * (double)a->hidden_dim;
    double expert = 3 * dim * (double)a->expert_hidden_dim;
    double experts = moe_layers * (double)a->n_experts * expert,
           shared = moe_layers * (double)a->n_shared_experts * expert;
    double router = moe_layers * dim * (double)a->n_experts, norms = (2 * L + 1) * dim;
    double cls = a->tied_embeddings ? 0 : emb;
    double total = emb + cls + att + dense + experts + shared + router + norms;
    p->embedding = count_i64(emb);
    p->classifier = count_i64(cls);
    p->attention = count_i64(att);
    p->mlp_dense = count_i64(dense);
    p->mlp_experts = count_i64(experts);
    p->mlp_shared = count_i64(shared);
    p->router = count_i64(router);
    p->norms = count_i64(norms);
    p->total = count_i64(total);
    p->non_embedding = count_i64(total - emb - cls);
    p->active = count_i64(total - experts + moe_layers * (double)a->top_k * expert);
    return total;
}

void nl_arch_count_params(const nl_arch *a, nl_arch_params *p) { (void)count_params(a, p); }

static const nl_arch presets[] = {
    /* llama2.c's stories260K (tinyllamas): the shape of data/stories260K. */
    {.name = "stories260k",
     .vocab_size = 512,
     .dim = 64,
     .n_layers = 5,
     .n_heads = 8,
     .n_kv_heads = 4,
     .hidden_dim = 172,
     .seq_len = 512,
     .rope_theta = 10000.0,
     .norm_eps = 1e-5,
     .tied_embeddings = 1},
    /* nanoGPT's CPU example size, byte-level vocabulary. */
    {.name = "shakespeare-char",
     .vocab_size = 256,
     .dim = 128,
     .n_layers = 4,
     .n_heads = 4,
     .n_kv_heads = 4,
     .hidden_dim = 352,
     .seq_len = 64,
     .rope_theta = 10000.0,
     .norm_eps = 1e-5,
     .tied_embeddings = 0},
    {.name = "small",
     .vocab_size = 256,
     .dim = 384,
     .n_layers = 6,
     .n_heads = 6,
     .n_kv_heads = 6,
     .hidden_dim = 1024,
     .seq_len = 256,
     .rope_theta = 10000.0,
     .norm_eps = 1e-5,
     .tied_embeddings = 0},
};

static const char *const preset_names[] = {"stories260k", "shakespeare-char", "small", NULL};

const char *const *nl_arch_preset_names(void) { return preset_names; }

size_t nl_arch_sizeof(void) { return sizeof(nl_arch); }
size_t nl_arch_last_offset(void) { return offsetof(nl_arch, rope_original_max_pos); }

void nl_arch_override_apply(const nl_arch_override *o, nl_arch *a) {
    if (o->dim) a->dim = o->dim;
    if (o->layers) a->n_layers = o->layers;
    if (o->heads) a->n_heads = a->n_kv_heads = o->heads;
    if (o->kv_heads) a->n_kv_heads = o->kv_heads;
    if (o->hidden) a->hidden_dim = o->hidden;
    if (o->experts) a->n_experts = o->experts;
    if (o->top_k) a->top_k = o->top_k;
    if (o->shared_experts >= 0) a->n_shared_experts = o->shared_experts;
    if (o->expert_hidden) a->expert_hidden_dim = o->expert_hidden;
}

nl_status nl_arch_preset(const char *name, nl_arch *out) {
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++)
        if (strcmp(presets[i].name, name) == 0) {
            *out = presets[i];
            return NL_OK;
        }
    return nl_fail(NL_ERR_INVALID, "unknown preset '%s' (known: stories260k, shakespeare-char, small)", name);
}

/* ---- JSON ------------------------------------------------------------------------------------ */

/* One field per line: clang-format 14 does not settle on a layout for this list. */
/* clang-format off */
#define ARCH_INT_FIELDS(X)      \
    X(vocab_size, 1)            \
    X(dim, 1)                   \
    X(n_layers, 1)              \
    X(n_heads, 1)               \
    X(n_kv_heads, 1)            \
    X(hidden_dim, 1)            \
    X(seq_len, 1)               \
    X(head_dim, 0)              \
    X(n_experts, 0)             \
    X(n_shared_experts, 0)      \
    X(top_k, 0)                 \
    X(expert_hidden_dim, 0)     \
    X(first_moe_layer, 0)       \
    X(rope_original_max_pos, 0)
/* clang-format on */

char *nl_arch_to_json(const nl_arch *a) {
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    cJSON_AddStringToObject(o, "name", a->name);
    cJSON_AddNumberToObject(o, "vocab_size", (double)a->vocab_size);
    cJSON_AddNumberToObject(o, "dim", (double)a->dim);
    cJSON_AddNumberToObject(o, "n_layers", (double)a->n_layers);
    cJSON_AddNumberToObject(o, "n_heads", (double)a->n_heads);
    cJSON_AddNumberToObject(o, "n_kv_heads", (double)a->n_kv_heads);
    cJSON_AddNumberToObject(o, "hidden_dim", (double)a->hidden_dim);
    cJSON_AddNumberToObject(o, "seq_len", (double)a->seq_len);
    cJSON_AddNumberToObject(o, "rope_theta", a->rope_theta);
    cJSON_AddNumberToObject(o, "norm_eps", a->norm_eps);
    cJSON_AddNumberToObject(o, "tied_embeddings", a->tied_embeddings);
    cJSON_AddNumberToObject(o, "head_dim", (double)a->head_dim);
    if (a->qkv_bias) cJSON_AddBoolToObject(o, "qkv_bias", 1);
    if (a->rope_scaling_factor > 0) { /* only when set: plain models keep the shorter header */
        cJSON_AddNumberToObject(o, "rope_scaling_factor", a->rope_scaling_factor);
        cJSON_AddNumberToObject(o, "rope_low_freq_factor", a->rope_low_freq_factor);
        cJSON_AddNumberToObject(o, "rope_high_freq_factor", a->rope_high_freq_factor);
        cJSON_AddNumberToObject(o, "rope_original_max_pos", (double)a->rope_original_max_pos);
    }
    if (a->n_experts > 0) { /* dense models keep the shorter header of earlier checkpoints */
        cJSON_AddNumberToObject(o, "n_experts", (double)a->n_experts);
        cJSON_AddNumberToObject(o, "n_shared_experts", (double)a->n_shared_experts);
        cJSON_AddNumberToObject(o, "top_k", (double)a->top_k);
        cJSON_AddNumberToObject(o, "expert_hidden_dim", (double)a->expert_hidden_dim);
        cJSON_AddNumberToObject(o, "first_moe_layer", (double)a->first_moe_layer);
    }
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

nl_status nl_arch_from_json(const char *what, const char *json, nl_arch *a) {
    cJSON *o = cJSON_Parse(json);
    if (!o) return nl_fail(NL_ERR_FORMAT, "%s: the arch metadata is not valid JSON", what);
    memset(a, 0, sizeof *a);
    cJSON *v;
#define X(f, req)                                                                                                      \
    v = cJSON_GetObjectItemCaseSensitive(o, #f);                                                                       \
    if (!cJSON_IsNumber(v) && req) {                                                                                   \
        cJSON_Delete(o);                                                                                               \
        return nl_fail(NL_ERR_FORMAT, "%s: the arch metadata has no number '%s'", what, #f);                           \
    }                                                                                                                  \
    if (cJSON_IsNumber(v)) {                                                                                           \
        double val = v->valuedouble;                                                                                   \
        if (!(val >= 0 && val <= 0x1p40) || val != floor(val)) {                                                       \
            cJSON_Delete(o); /* v belongs to o: use the copied value from here on */                                   \
            return nl_fail(NL_ERR_FORMAT, "%s: arch field '%s' = %g is not an integer in [0, 2^40]", what, #f, val);   \
        }                                                                                                              \
        a->f = (int64_t)val;                                                                                           \
    }
    ARCH_INT_FIELDS(X)
#undef X
    if (cJSON_IsString(v = cJSON_GetObjectItemCaseSensitive(o, "name")))
        snprintf(a->name, sizeof a->name, "%s", v->valuestring);
    /* Real-valued fields: absent takes the Llama default; present must be a finite number
     * (cJSON reads 1e999 as infinity, and a string must not fall back to the default). */
    static const struct {
        const char *key;
        double def;
        int positive;
    } reals[] = {{"rope_theta", 10000.0, 1},       {"norm_eps", 1e-5, 1},
                 {"tied_embeddings", 0.0, 0},      {"rope_scaling_factor", 0.0, 0},
                 {"rope_low_freq_factor", 0.0, 0}, {"rope_high_freq_factor", 0.0, 0}};
    double rv[sizeof reals / sizeof reals[0]];
    for (size_t k = 0; k < sizeof reals / sizeof reals[0]; k++) {
        v = cJSON_GetObjectItemCaseSensitive(o, reals[k].key);
        rv[k] = reals[k].def;
        if (!v) continue;
        if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || v->valuedouble < 0 ||
            (reals[k].positive && !(v->valuedouble > 0))) {
            char shown[64];
            if (cJSON_IsNumber(v))
                snprintf(shown, sizeof shown, "%g", v->valuedouble);
            else
                snprintf(shown, sizeof shown, "%s", cJSON_IsString(v) ? "a string" : "not a number");
            cJSON_Delete(o);
            return nl_fail(NL_ERR_FORMAT, "%s: arch field '%s' = %s is not a finite %s number", what, reals[k].key,
                           shown, reals[k].positive ? "positive" : "non-negative");
        }
        rv[k] = v->valuedouble;
    }
    a->rope_theta = rv[0];
    a->norm_eps = rv[1];
    a->tied_embeddings = rv[2] != 0;
    a->rope_scaling_factor = rv[3];
    a->rope_low_freq_factor = rv[4];
    a->rope_high_freq_factor = rv[5];
    if (cJSON_IsBool(v = cJSON_GetObjectItemCaseSensitive(o, "qkv_bias")))
        a->qkv_bias = cJSON_IsTrue(v);
    else if (cJSON_IsNumber(v))
        a->qkv_bias = v->valuedouble != 0;
    cJSON_Delete(o);
    if (nl_arch_validate(a)) return nl_fail(NL_ERR_FORMAT, "%s: %s", what, nl_last_error());
    return NL_OK;
}

/* The serving engine's cost model on a measured CPU (plan_engine.h). */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "nanolm/plan_engine.h"

static const char *const FMT[3] = {"fp32", "bf16", "int8"};

void nl_engine_plan_req_default(nl_engine_plan_req *q) {
    memset(q, 0, sizeof *q);
    q->prompt = 512;
    q->output = 128;
    q->batch = 32;
    q->chunk = 256;
    q->max_step_tokens = 512;
}

/* ---- the --hw JSON entry ------------------------------------------------------------------------ */

typedef struct rate_field {
    const char *name;
    size_t off;
} rate_field;
#define RF(f)                                                                                                          \
    { "cpu_" #f, offsetof(nl_cpu_rates, f) }
static const rate_field SCALARS[] = {RF(read_bw_1t),  RF(read_bw_nt),      RF(attn_flops_chunk), RF(rope_kv_chunk_s),
                                     RF(row_layer_s), RF(step_overhead_s), RF(layer_overhead_s)};
/* per KV format and decode rows D = nl_cpu_m[i], i < NL_CPU_NB: "cpu_<field>_kv<format>_d<D>" */
static const rate_field PER_D[] = {RF(attn_row_s), RF(attn_pos_s), RF(rope_kv_s)};
#undef RF
#define NSCALARS (sizeof SCALARS / sizeof SCALARS[0])
#define NPER_D   (sizeof PER_D / sizeof PER_D[0])

static const char *const KVFMT[2] = {"fp32", "int8"};
static void per_d_key(char *k, size_t n, int f, int kv, int i) {
    snprintf(k, n, "%s_kv%s_d%lld", PER_D[f].name, KVFMT[kv], (long long)nl_cpu_m[i]);
}

static double max_rate(const double *g) {
    double m = 0;
    for (int i = 0; i < NL_CPU_NM; i++) m = g[i] > m ? g[i] : m;
    return m;
}

nl_status nl_cpu_rates_json(const nl_cpu_rates *r, double mem_bytes, const char *source, char **buf) {
    *buf = NULL;
    cJSON *o = cJSON_CreateObject();
    if (!o) return nl_fail(NL_ERR_NOMEM, "bench machine: out of memory");
    cJSON_AddStringToObject(o, "name", r->name);
    cJSON_AddStringToObject(o, "source", source ? source : "nanolm bench machine");
    /* the catalog's fields, so that other plan commands read the entry too */
    cJSON_AddNumberToObject(o, "flops_bf16", max_rate(r->gemm[0]));
    cJSON_AddNumberToObject(o, "flops_fp8", max_rate(r->gemm[2]));
    cJSON_AddNumberToObject(o, "mem_bytes", mem_bytes);
    cJSON_AddNumberToObject(o, "hbm_bw", r->read_bw_nt);
    cJSON_AddNumberToObject(o, "intra_bw", r->read_bw_nt);
    cJSON_AddNumberToObject(o, "inter_bw", r->read_bw_nt);
    cJSON_AddNumberToObject(o, "gpus_per_node", 1);
    cJSON_AddNumberToObject(o, "price_per_hour", 0);
    cJSON_AddNumberToObject(o, "cpu_threads", r->threads);
    for (size_t i = 0; i < NSCALARS; i++)
        cJSON_AddNumberToObject(o, SCALARS[i].name, *(const double *)((const char *)r + SCALARS[i].off));
    for (size_t f = 0; f < NPER_D; f++)
        for (int kv = 0; kv < 2; kv++)
            for (int i = 0; i < NL_CPU_NB; i++) {
                char k[48];
                per_d_key(k, sizeof k, (int)f, kv, i);
                cJSON_AddNumberToObject(o, k, ((const double *)((const char *)r + PER_D[f].off))[kv * NL_CPU_NB + i]);
            }
    for (int f = 0; f < 3; f++)
        for (int i = 0; i < NL_CPU_NM; i++) {
            char k[48];
            snprintf(k, sizeof k, "cpu_gemm_%s_m%lld", FMT[f], (long long)nl_cpu_m[i]);
            cJSON_AddNumberToObject(o, k, r->gemm[f][i]);
        }
    char *s = cJSON_Print(o);
    cJSON_Delete(o);
    if (!s) return nl_fail(NL_ERR_NOMEM, "bench machine: out of memory");
    size_t n = strlen(s);
    *buf = nl_malloc(n + 2, "machine JSON");
    if (*buf) {
        memcpy(*buf, s, n);
        (*buf)[n] = '\n';
        (*buf)[n + 1] = 0;
    }
    cJSON_free(s);
    return *buf ? NL_OK : NL_ERR_NOMEM;
}

static nl_status get_positive(const char *path, const char *entry, cJSON *o, const char *key, double *v) {
    cJSON *it = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!it)
        return nl_fail(NL_ERR_FORMAT, "%s: entry '%s' has no \"%s\" (write the file with `nanolm bench machine`)", path,
                       entry, key);
    if (!cJSON_IsNumber(it) || !isfinite(it->valuedouble) || it->valuedouble < 0)
        return nl_fail(NL_ERR_FORMAT, "%s: entry '%s': \"%s\" must be a number >= 0", path, entry, key);
    *v = it->valuedouble;
    return NL_OK;
}

static nl_status rates_from(const char *path, cJSON *o, nl_cpu_rates *r) {
    memset(r, 0, sizeof *r);
    cJSON *n = cJSON_GetObjectItemCaseSensitive(o, "name");
    snprintf(r->name, sizeof r->name, "%s", cJSON_IsString(n) ? n->valuestring : "?");
    double t = 0;
    NL_TRY(get_positive(path, r->name, o, "cpu_threads", &t));
    r->threads = (int)t;
    for (size_t i = 0; i < NSCALARS; i++)
        NL_TRY(get_positive(path, r->name, o, SCALARS[i].name, (double *)((char *)r + SCALARS[i].off)));
    for (size_t f = 0; f < NPER_D; f++)
        for (int kv = 0; kv < 2; kv++)
            for (int i = 0; i < NL_CPU_NB; i++) {
                char k[48];
                per_d_key(k, sizeof k, (int)f, kv, i);
                NL_TRY(get_positive(path, r->name, o, k, (double *)((char *)r + PER_D[f].off) + kv * NL_CPU_NB + i));
            }
    for (int f = 0; f < 3; f++)
        for (int i = 0; i < NL_CPU_NM; i++) {
            char k[48];
            snprintf(k, sizeof k, "cpu_gemm_%s_m%lld", FMT[f], (long long)nl_cpu_m[i]);
            NL_TRY(get_positive(path, r->name, o, k, &r->gemm[f][i]));
        }
    if (!(r->read_bw_nt > 0) || !(r->attn_flops_chunk > 0))
        return nl_fail(NL_ERR_FORMAT, "%s: entry '%s': cpu_read_bw_nt and cpu_attn_flops_chunk must be > 0", path,
                       r->name);
    return NL_OK;
}

nl_status nl_cpu_rates_load(const char *path, const char *name, nl_cpu_rates *out) {
    memset(out, 0, sizeof *out);
    char *text = NULL;
    size_t bytes = 0;
    NL_TRY(nl_read_file(path, &text, &bytes));
    cJSON *root = cJSON_ParseWithLength(text, bytes);
    nl_free(text);
    if (!root) return nl_fail(NL_ERR_FORMAT, "%s: not valid JSON", path);
    int arr = cJSON_IsArray(root);
    nl_status rc = nl_fail(NL_ERR_INVALID,
                           "%s: no entry%s%s has measured CPU rates (\"cpu_...\" fields of `nanolm bench machine`)",
                           path, name ? " named " : "", name ? name : "");
    for (cJSON *o = arr ? root->child : root; o; o = arr ? o->next : NULL) {
        if (!cJSON_IsObject(o) || !cJSON_GetObjectItemCaseSensitive(o, "cpu_threads")) continue;
        cJSON *n = cJSON_GetObjectItemCaseSensitive(o, "name");
        if (name && !(cJSON_IsString(n) && !strcasecmp(n->valuestring, name))) continue;
        rc = rates_from(path, o, out);
        break;
    }
    cJSON_Delete(root);
    return rc;
}

/* ---- the model ---------------------------------------------------------------------------------- */

/* The kernel's FLOP/s at M rows: log-log interpolation between the measured M, clamped outside. */
static double rate_at(const double *g, int64_t m) {
    if (m <= nl_cpu_m[0]) return g[0];
    for (int i = 1; i < NL_CPU_NM; i++)
        if (m <= nl_cpu_m[i]) {
            double t = (log((double)m) - log((double)nl_cpu_m[i - 1])) /
                       (log((double)nl_cpu_m[i]) - log((double)nl_cpu_m[i - 1]));
            return exp(log(g[i - 1]) + t * (log(g[i]) - log(g[i - 1])));
        }
    return g[NL_CPU_NM - 1];
}

static double weight_bytes_of(int fmt, double n, double k) {
    return fmt == 2 ? n * k + n * 4 : n * k * (fmt == 1 ? 2 : 4); /* int8: codes + an fp32 scale per row */
}

/* One linear (N, K) over m rows: FLOPs / the kernel's rate at m, measured on this footprint. */
static double linear_s(const nl_engine_plan_req *q, const nl_cpu_rates *r, double n, double k, int64_t m) {
    if (m < 1) return 0;
    return 2.0 * (double)m * n * k / rate_at(r->gemm[q->weights], m);
}

typedef struct shape {
    double C, QKV, ATT, H, V, L, NH, KVH, hd;
} shape;

static shape shape_of(const nl_arch *a) {
    shape s;
    s.hd = (double)nl_arch_head_dim(a);
    s.C = (double)a->dim;
    s.NH = (double)a->n_heads;
    s.KVH = (double)a->n_kv_heads;
    s.QKV = (s.NH + 2 * s.KVH) * s.hd;
    s.ATT = s.NH * s.hd;
    s.H = (double)a->hidden_dim;
    s.V = (double)a->vocab_size;
    s.L = (double)a->n_layers;
    return s;
}

static double kv_bytes_per_pos(const nl_engine_plan_req *q, const shape *s) {
    /* per layer: K and V of one position (int8: codes + an fp16 scale per kv head) */
    return q->kv == 1 ? 2 * (s->KVH * s->hd + s->KVH * 2) : 2 * s->KVH * s->hd * 4;
}

/* v[0 .. NL_CPU_NB) measured at D = nl_cpu_m[i] decode rows: linear in log D between them,
 * clamped outside (a time per row, which may be 0, so not log-log). */
static double per_d_at(const double *v, int64_t d) {
    if (d <= nl_cpu_m[0]) return v[0];
    for (int i = 1; i < NL_CPU_NB; i++)
        if (d <= nl_cpu_m[i]) {
            double t = (log((double)d) - log((double)nl_cpu_m[i - 1])) /
                       (log((double)nl_cpu_m[i]) - log((double)nl_cpu_m[i - 1]));
            return v[i - 1] + t * (v[i] - v[i - 1]);
        }
    return v[NL_CPU_NB - 1];
}

/* Seconds per layer of the step's decode rows outside the linears: attention of its n_decode
 * tokens over ctx_decode positions in all, and their RoPE + KV store, at the rates measured
 * for that many decode rows. */
static double decode_rows_s(const nl_cpu_rates *r, int kv, const shape *s, int64_t n_decode, double ctx_decode) {
    if (n_decode < 1) return 0;
    double attn = s->NH * ((double)n_decode * per_d_at(r->attn_row_s[kv], n_decode) +
                           ctx_decode * per_d_at(r->attn_pos_s[kv], n_decode));
    return attn + (double)n_decode * per_d_at(r->rope_kv_s[kv], n_decode);
}

double nl_plan_engine_step_s(const nl_engine_plan_req *q, const nl_cpu_rates *r, int64_t rows, int64_t n_decode,
                             int64_t n_out, double ctx_decode, double ctx_chunk) {
    shape s = shape_of(&q->arch);
    double lin = linear_s(q, r, s.QKV, s.C, rows) + linear_s(q, r, s.C, s.ATT, rows) +
                 linear_s(q, r, 2 * s.H, s.C, rows) + linear_s(q, r, s.C, s.H, rows);
    double chunk = 4 * s.NH * s.hd * ctx_chunk / r->attn_flops_chunk + (double)(rows - n_decode) * r->rope_kv_chunk_s;
    return r->step_overhead_s +
           s.L * (r->layer_overhead_s + lin + decode_rows_s(r, q->kv, &s, n_decode, ctx_decode) + chunk +
                  (double)rows * r->row_layer_s) +
           linear_s(q, r, s.V, s.C, n_out);
}

/* B identical requests submitted together, through the engine's schedule (engine.c: decodes
 * first, then prompt chunks oldest first within the step budget, at most one chunk of prompt
 * tokens per step when chunking). Returns the seconds until all
 * are done; *first_s the seconds until the first one's prefill is done. */
static double simulate(const nl_engine_plan_req *q, const nl_cpu_rates *r, int64_t B, double *first_s, int64_t *steps) {
    int64_t cached[1024], done[1024];
    if (B > 1024) B = 1024;
    for (int64_t i = 0; i < B; i++) cached[i] = done[i] = 0;
    double t = 0;
    int64_t n_steps = 0, finished = 0;
    *first_s = 0;
    while (finished < B && n_steps < 10000000) {
        int64_t rows = 0, n_out = 0, n_decode = 0, budget = q->max_step_tokens;
        double ctx = 0, ctx_chunk = 0;
        for (int64_t i = 0; i < B; i++) /* decodes */
            if (cached[i] >= q->prompt && done[i] < q->output) {
                ctx += (double)(cached[i] + 1);
                rows++, n_out++, budget--;
            }
        n_decode = rows;
        /* with chunking, the prompt tokens of a step are one chunk in all (engine.c schedule) */
        if (q->chunk > 0 && budget > q->chunk) budget = q->chunk;
        int64_t chunk_of[1024] = {0};
        for (int64_t i = 0; i < B && budget > 0; i++) { /* prompt chunks */
            int64_t left = q->prompt - cached[i];
            if (left < 1) continue;
            int64_t c = left;
            if (q->chunk > 0 && c > q->chunk) c = q->chunk;
            if (c > budget) {
                if (q->chunk == 0 && left <= q->max_step_tokens && rows > 0) continue;
                c = budget;
            }
            chunk_of[i] = c;
            ctx_chunk += (double)c * (double)cached[i] + (double)c * (double)(c + 1) / 2;
            rows += c, budget -= c;
            if (cached[i] + c == q->prompt) n_out++;
        }
        t += nl_plan_engine_step_s(q, r, rows, n_decode, n_out, ctx, ctx_chunk);
        n_steps++;
        for (int64_t i = 0; i < B; i++) {
            if (chunk_of[i]) {
                cached[i] += chunk_of[i];
                if (cached[i] == q->prompt) {
                    done[i] = 1; /* the prefill samples the first token */
                    if (!*first_s) *first_s = t;
                    if (done[i] == q->output) finished++;
                }
            } else if (cached[i] >= q->prompt && done[i] < q->output) {
                cached[i]++;
                if (++done[i] == q->output) finished++;
            }
        }
    }
    *steps = n_steps;
    return t;
}

nl_status nl_plan_engine(const nl_engine_plan_req *q, const nl_cpu_rates *r, nl_engine_plan *out) {
    memset(out, 0, sizeof *out);
    const nl_arch *a = &q->arch;
    if (a->dim < 1 || a->n_layers < 1 || a->n_heads < 1 || a->n_kv_heads < 1 || a->hidden_dim < 1 || a->vocab_size < 1)
        return nl_fail(NL_ERR_INVALID,
                       "plan serve: model '%s' needs dim, n_layers, n_heads, n_kv_heads, hidden_dim and "
                       "vocab_size > 0",
                       a->name);
    if (a->n_experts > 0)
        return nl_fail(NL_ERR_UNSUPPORTED, "plan serve: the engine does not serve MoE model '%s'", a->name);
    if (q->weights < 0 || q->weights > 2 || q->kv < 0 || q->kv > 1)
        return nl_fail(NL_ERR_INVALID, "plan serve: unknown weight (%d) or KV (%d) format", q->weights, q->kv);
    if (q->prompt < 1 || q->output < 1 || q->batch < 1 || q->batch > 1024 || q->max_step_tokens < 1 || q->chunk < 0)
        return nl_fail(NL_ERR_INVALID,
                       "plan serve: prompt and output >= 1, batch in [1, 1024], chunk >= 0, step tokens >= 1");
    if (!(r->read_bw_nt > 0) || !(r->attn_flops_chunk > 0))
        return nl_fail(NL_ERR_INVALID, "plan serve: '%s' has no measured bandwidth or attention rate", r->name);
    for (int i = 0; i < NL_CPU_NM; i++)
        if (!(r->gemm[q->weights][i] > 0))
            return nl_fail(NL_ERR_INVALID, "plan serve: '%s' has no measured %s kernel rate at M = %lld", r->name,
                           FMT[q->weights], (long long)nl_cpu_m[i]);
    for (int i = 0; i < NL_CPU_NB; i++)
        if (!(r->attn_pos_s[q->kv][i] > 0) || !(r->rope_kv_s[q->kv][i] > 0))
            return nl_fail(NL_ERR_INVALID,
                           "plan serve: '%s' has no measured decode rates for a %s KV cache at D = %lld", r->name,
                           KVFMT[q->kv], (long long)nl_cpu_m[i]);
    shape s = shape_of(a);
    int64_t steps = 0;
    nl_engine_plan_req one = *q;
    one.output = 1;
    double first = 0;
    out->prefill_s = simulate(&one, r, 1, &first, &steps);
    out->prefill_steps = steps;
    static const int64_t bs[NL_ENGINE_PLAN_NB] = {1, 8, 32};
    double ctx = (double)q->prompt + (double)q->output / 2;
    for (int i = 0; i < NL_ENGINE_PLAN_NB; i++) {
        out->decode_batch[i] = bs[i];
        out->decode_step_s[i] = nl_plan_engine_step_s(q, r, bs[i], bs[i], bs[i], (double)bs[i] * ctx, 0);
        out->decode_tokens_per_s[i] = (double)bs[i] / out->decode_step_s[i];
    }
    double total = simulate(q, r, q->batch, &first, &steps);
    out->throughput_tokens_per_s = (double)q->batch * (double)q->output / total;
    out->linear_s = s.L * (linear_s(q, r, s.QKV, s.C, 1) + linear_s(q, r, s.C, s.ATT, 1) +
                           linear_s(q, r, 2 * s.H, s.C, 1) + linear_s(q, r, s.C, s.H, 1)) +
                    linear_s(q, r, s.V, s.C, 1);
    out->attention_s = s.L * s.NH * (r->attn_row_s[q->kv][0] + ctx * r->attn_pos_s[q->kv][0]);
    out->rows_s = s.L * (r->row_layer_s + r->rope_kv_s[q->kv][0]);
    out->overhead_s = r->step_overhead_s + s.L * r->layer_overhead_s;
    out->weight_bytes = s.L * (weight_bytes_of(q->weights, s.QKV, s.C) + weight_bytes_of(q->weights, s.C, s.ATT) +
                               weight_bytes_of(q->weights, 2 * s.H, s.C) + weight_bytes_of(q->weights, s.C, s.H)) +
                        weight_bytes_of(q->weights, s.V, s.C);
    out->kv_bytes_per_token = s.L * kv_bytes_per_pos(q, &s);
    return NL_OK;
}

double nl_plan_engine_probe_step_s(const nl_arch *a, const nl_cpu_rates *r, double ctx) {
    nl_engine_plan_req q;
    nl_engine_plan_req_default(&q);
    q.arch = *a;
    return nl_plan_engine_step_s(&q, r, 1, 1, 1, ctx, 0);
}

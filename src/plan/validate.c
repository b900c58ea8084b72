/* The planner against published runs: loads tests/validation/published.json (one object per
 * published figure) and prices each entry with the default assumptions. The published figure
 * is always the source's; the prediction is computed here in the source's own unit (its FLOP
 * count where it quotes TFLOP/s or MFU), so the two compare like for like. */
#include "nanolm/plan.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *str(cJSON *o, const char *k, const char *dflt) {
    cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsString(v) ? v->valuestring : dflt;
}
static double num(cJSON *o, const char *k, double dflt) {
    cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsNumber(v) ? v->valuedouble : dflt;
}

static nl_status bad(const char *path, const char *id, const char *what) {
    return nl_fail(NL_ERR_FORMAT, "%s: entry '%s': %s", path, id, what);
}

/* An inline shape: {"family", "vocab_size", "dim", "n_layers", "n_heads", "n_kv_heads",
 * "hidden_dim", "seq_len"}. */
static nl_status arch_of(const char *path, const char *id, cJSON *j, nl_arch *a, nl_family *fam) {
    memset(a, 0, sizeof *a);
    snprintf(a->name, sizeof a->name, "%s", id);
    a->vocab_size = (int64_t)num(j, "vocab_size", 0);
    a->dim = (int64_t)num(j, "dim", 0);
    a->n_layers = (int64_t)num(j, "n_layers", 0);
    a->n_heads = (int64_t)num(j, "n_heads", 0);
    a->n_kv_heads = (int64_t)num(j, "n_kv_heads", (double)a->n_heads);
    a->hidden_dim = (int64_t)num(j, "hidden_dim", 0);
    a->seq_len = (int64_t)num(j, "seq_len", 2048);
    a->rope_theta = 1e4;
    a->norm_eps = 1e-5;
    a->tied_embeddings = (int)num(j, "tied_embeddings", 1);
    if (a->vocab_size < 1 || a->dim < 1 || a->n_layers < 1 || a->n_heads < 1 || a->hidden_dim < 1 ||
        a->dim % a->n_heads)
        return bad(path, id, "arch needs vocab_size, dim, n_layers, n_heads (dividing dim), hidden_dim");
    if (nl_plan_family(str(j, "family", "llama"), fam)) return bad(path, id, nl_last_error());
    return NL_OK;
}

static nl_status layout_of(const char *path, const char *id, cJSON *j, nl_layout *L) {
    memset(L, 0, sizeof *L);
    L->dp = (int64_t)num(j, "dp", 1);
    L->tp = (int64_t)num(j, "tp", 1);
    L->pp = (int64_t)num(j, "pp", 1);
    L->vpp = (int64_t)num(j, "vpp", 1);
    L->cp = (int64_t)num(j, "cp", 1);
    L->ep = (int64_t)num(j, "ep", 1);
    L->micro_batch = (int64_t)num(j, "micro_batch", 1);
    L->sp = (int)num(j, "sp", 0);
    const char *z = str(j, "zero", "0");
    if (!strcmp(z, "0"))
        L->zero = NL_ZERO_0;
    else if (!strcmp(z, "1"))
        L->zero = NL_ZERO_1;
    else if (!strcmp(z, "2"))
        L->zero = NL_ZERO_2;
    else if (!strcmp(z, "3"))
        L->zero = NL_ZERO_3;
    else if (!strcmp(z, "hsdp"))
        L->zero = NL_ZERO_HSDP;
    else
        return bad(path, id, "layout.zero must be 0, 1, 2, 3 or hsdp");
    const char *r = str(j, "recompute", "none");
    if (!strcmp(r, "none"))
        L->recompute = NL_RECOMPUTE_NONE;
    else if (!strcmp(r, "selective"))
        L->recompute = NL_RECOMPUTE_SELECTIVE;
    else if (!strcmp(r, "full"))
        L->recompute = NL_RECOMPUTE_FULL;
    else
        return bad(path, id, "layout.recompute must be none, selective or full");
    if (L->dp < 1 || L->tp < 1 || L->pp < 1 || L->vpp < 1 || L->cp < 1 || L->ep < 1 || L->micro_batch < 1)
        return bad(path, id, "layout degrees must be >= 1");
    return NL_OK;
}

/* FLOPs per step as the source counts them; -1 for a convention it does not know. */
static double source_flops(const char *conv, const nl_arch *a, double model_flops, double B, double s) {
    double l = (double)a->n_layers, h = (double)a->dim, V = (double)a->vocab_size;
    /* Narayanan et al. 2021 eq. (3): with full recomputation, 96 B s l h^2 (1 + s/6h + V/16lh). */
    if (!strcmp(conv, "megatron-recompute")) return 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h));
    /* Korthikanti et al. 2022 sec. 6: model FLOPs 72 B s l h^2 (1 + s/6h + V/12lh). */
    if (!strcmp(conv, "megatron-model")) return 72 * B * s * l * h * h * (1 + s / (6 * h) + V / (12 * l * h));
    /* Hoffmann et al. 2022 (Chinchilla) appendix F: per sequence, the embedding and the logits
     * as matmuls (2 s V h each), per layer the projections, the full s x s scores and their
     * reduction, 3 FLOPs per score for the softmax and a two-matrix MLP; the backward twice the
     * forward, no recomputation. */
    if (!strcmp(conv, "chinchilla")) {
        double H = (double)a->n_heads, kH = H * (double)nl_arch_head_dim(a), F = (double)a->hidden_dim;
        double layer = 6 * s * h * kH + 4 * s * s * kH + 3 * H * s * s + 2 * s * kH * h + 4 * s * h * F;
        return 3 * B * (4 * s * V * h + l * layer);
    }
    if (!strcmp(conv, "6n-attn")) return model_flops; /* 6 N per token plus the causal attention scores */
    return -1;
}

static nl_status run_train(const nl_catalog *cat, const char *path, const char *id, cJSON *e, const nl_arch *a,
                           const nl_family *fam, nl_valid_case *c) {
    nl_train_req q;
    memset(&q, 0, sizeof q);
    q.arch = *a;
    q.fam = *fam;
    if (nl_catalog_find_hw(cat, str(e, "gpu", "?"), &q.hw)) return bad(path, id, nl_last_error());
    if (nl_plan_recipe(str(e, "recipe", "bf16"), &q.recipe)) return bad(path, id, nl_last_error());
    nl_eff_default(&q.eff);
    q.gpus = (int64_t)num(e, "gpus", 0);
    q.seq = (int64_t)num(e, "seq", 0);
    q.global_batch = (int64_t)num(e, "global_batch", 0);
    q.tokens = 1e12;
    nl_layout L;
    NL_TRY(layout_of(path, id, cJSON_GetObjectItemCaseSensitive(e, "layout"), &L));
    if (q.gpus < 1 || q.seq < 1 || q.global_batch < L.dp * L.micro_batch || q.global_batch % (L.dp * L.micro_batch))
        return bad(path, id, "gpus, seq, global_batch (a multiple of dp x micro_batch) are required");
    L.n_micro = q.global_batch / (L.dp * L.micro_batch);
    const char *sched = str(cJSON_GetObjectItemCaseSensitive(e, "layout"), "schedule", "1f1b");
    int sc = nl_plan_schedule(sched);
    if (sc < 0) return bad(path, id, "layout.schedule must be 1f1b, dualpipe or zb-h1");
    q.schedule = (nl_sched)sc;
    const char *attn = str(e, "attention", "flash");
    q.attn_materialized = !strcmp(attn, "materialized");
    q.attn_triton = !strcmp(attn, "flash-triton");
    q.distribute_saved = (int)num(cJSON_GetObjectItemCaseSensitive(e, "layout"), "distribute_saved", 0);
    q.moe_node_limit = (int64_t)num(cJSON_GetObjectItemCaseSensitive(e, "layout"), "moe_node_limit", 0);
    q.zero3_calls_per_layer = (int64_t)num(cJSON_GetObjectItemCaseSensitive(e, "layout"), "zero3_calls_per_layer", 0);
    q.zero3_prefetch = num(cJSON_GetObjectItemCaseSensitive(e, "layout"), "zero3_prefetch", 0);
    q.zero3_nic_spread = (int)num(cJSON_GetObjectItemCaseSensitive(e, "layout"), "zero3_nic_spread", 0);
    if (!q.attn_materialized && !q.attn_triton && strcmp(attn, "flash"))
        return bad(path, id, "attention must be flash, flash-triton or materialized");
    nl_train_eval ev;
    if (nl_plan_train_eval(&q, &L, &ev)) return bad(path, id, nl_last_error());
    c->fits = ev.fits;
    double B = (double)q.global_batch, s = (double)q.seq, gpus = (double)q.gpus;
    const char *m = c->metric;
    double fl = source_flops(str(e, "flops", "6n-attn"), a, ev.model_flops_per_step, B, s);
    if (fl < 0) return bad(path, id, "flops must be 6n-attn, megatron-recompute, megatron-model or chinchilla");
    if (!strcmp(m, "tflops_per_gpu"))
        c->predicted = fl / ev.t_step / gpus / 1e12;
    else if (!strcmp(m, "mfu"))
        c->predicted = 100 * fl / ev.t_step / gpus / q.hw.flops_bf16;
    else if (!strcmp(m, "tokens_per_s_per_gpu"))
        c->predicted = B * s / ev.t_step / gpus;
    else if (!strcmp(m, "gpu_hours_per_t_tokens"))
        c->predicted = 1e12 / (B * s / ev.t_step) * gpus / 3600;
    else
        return bad(path, id, "unknown training metric");
    return NL_OK;
}

static nl_status run_memory(const char *path, const char *id, cJSON *e, const nl_arch *a, int have_arch,
                            const nl_family *fam, nl_valid_case *c) {
    nl_layout L;
    NL_TRY(layout_of(path, id, cJSON_GetObjectItemCaseSensitive(e, "layout"), &L));
    const char *m = c->metric;
    if (!strcmp(m, "state_gb") || !strcmp(m, "state_bytes_per_param")) {
        nl_recipe r;
        if (nl_plan_recipe(str(e, "recipe", "bf16"), &r)) return bad(path, id, nl_last_error());
        nl_state_bytes sb;
        nl_plan_state_bytes(&r, L.zero, L.dp, 0, &sb);
        c->predicted = !strcmp(m, "state_gb") ? sb.total * num(e, "params", 0) / 1e9 : sb.total;
        return NL_OK;
    }
    if (!strcmp(m, "act_bytes_per_layer")) {
        if (!have_arch) return bad(path, id, "act_bytes_per_layer needs an arch");
        double seq = num(e, "seq", (double)a->seq_len);
        nl_act_opts o = {.tp = L.tp, .sp = L.sp, .flash = 0, .recompute = L.recompute, .seq = seq, .bytes_per_elem = 2};
        o.fam = *fam;
        nl_act_layer al;
        nl_plan_act_layer(a, &o, &al);
        c->predicted = al.bytes_per_token * seq * (double)L.micro_batch;
        return NL_OK;
    }
    return bad(path, id, "unknown memory metric");
}

static nl_status run_serve(const nl_catalog *cat, const char *path, const char *id, cJSON *e, const nl_arch *a,
                           const nl_family *fam, nl_valid_case *c) {
    nl_serve_req q;
    nl_serve_req_default(&q);
    q.arch = *a;
    q.fam = *fam;
    if (nl_catalog_find_hw(cat, str(e, "gpu", "?"), &q.hw)) return bad(path, id, nl_last_error());
    q.tp = (int64_t)num(e, "tp", 1);
    q.batch = (int64_t)num(e, "batch", 1);
    q.prompt = num(e, "prompt", 128);
    q.output = num(e, "output", 128);
    const char *prec = str(e, "precision", "fp16");
    q.weight_bytes = q.kv_bytes = !strcmp(prec, "fp8") ? 1 : 2;
    q.fp8 = !strcmp(prec, "fp8");
    nl_serve_plan p;
    if (nl_plan_serve(&q, &p)) return bad(path, id, nl_last_error());
    const char *m = c->metric;
    if (!strcmp(m, "ttft_ms"))
        c->predicted = p.ttft_s * 1e3;
    else if (!strcmp(m, "tpot_ms"))
        c->predicted = p.tpot_s * 1e3;
    else if (!strcmp(m, "out_tok_s") || !strcmp(m, "out_tok_s_per_gpu")) {
        /* A static batch (TensorRT-LLM's gptSessionBenchmark): the whole batch is prefilled,
         * then `output` decode steps at the average context. */
        double t = p.batch_prefill_s + q.output * p.tpot_s;
        c->predicted = (double)q.batch * q.output / t / (!strcmp(m, "out_tok_s") ? 1.0 : (double)q.tp);
    } else
        return bad(path, id, "unknown serving metric");
    return NL_OK;
}

/* A collective's bus bandwidth as nccl-tests reports it (busbw = algbw x 2(p-1)/p for an
 * all-reduce, x (p-1)/p for an all-gather or reduce-scatter, doc/PERFORMANCE.md of nccl-tests):
 * the planner's wire bytes of the operation over its alpha-beta time, for a buffer of `bytes`. */
static nl_status run_collective(const nl_catalog *cat, const char *path, const char *id, cJSON *e, nl_valid_case *c) {
    nl_hw hw;
    if (nl_catalog_find_hw(cat, str(e, "gpu", "?"), &hw)) return bad(path, id, nl_last_error());
    const char *op = str(e, "collective", "?");
    nl_coll k;
    if (!strcmp(op, "all-reduce"))
        k = NL_ALL_REDUCE;
    else if (!strcmp(op, "all-gather"))
        k = NL_ALL_GATHER;
    else if (!strcmp(op, "reduce-scatter"))
        k = NL_REDUCE_SCATTER;
    else
        return bad(path, id, "collective must be all-reduce, all-gather or reduce-scatter");
    int64_t p = (int64_t)num(e, "gpus", 0);
    double bytes = num(e, "bytes", 0);
    if (p < 2 || !(bytes > 0)) return bad(path, id, "a collective needs gpus >= 2 and bytes > 0");
    if (strcmp(c->metric, "busbw_gbs")) return bad(path, id, "unknown collective metric");
    /* "algo": "ring" is a run with NCCL_ALGO=RING: no NVLink SHARP. */
    const char *algo = str(e, "algo", "auto");
    if (!strcmp(algo, "ring"))
        hw.nvls_eff = 0;
    else if (strcmp(algo, "auto"))
        return bad(path, id, "algo must be auto or ring");
    /* p consecutive GPUs: across nodes, a whole node's GPUs are members. */
    double t = nl_plan_coll_time(&hw, k, p, bytes, p > hw.gpus_per_node ? (int)hw.gpus_per_node : 0);
    c->predicted = nl_plan_coll_bytes(k, p, bytes) / t / 1e9;
    return NL_OK;
}

static int cmp_d(const void *x, const void *y) {
    double a = *(const double *)x, b = *(const double *)y;
    return a < b ? -1 : a > b;
}

nl_status nl_plan_validate(const nl_catalog *cat0, const char *path, nl_valid_result *r) {
    memset(r, 0, sizeof *r);
    char *text = NULL;
    size_t bytes = 0;
    NL_TRY(nl_read_file(path, &text, &bytes));
    cJSON *root = cJSON_Parse(text);
    nl_free(text);
    if (!root || !cJSON_IsArray(root)) {
        cJSON_Delete(root);
        return nl_fail(NL_ERR_FORMAT, "%s: expected a JSON array of published figures", path);
    }
    nl_catalog *cat = malloc(sizeof *cat); /* the catalog is large; one private copy */
    size_t n = (size_t)cJSON_GetArraySize(root);
    r->cases = calloc(n ? n : 1, sizeof *r->cases);
    if (!cat || !r->cases) {
        free(cat);
        free(r->cases);
        r->cases = NULL;
        cJSON_Delete(root);
        return nl_fail(NL_ERR_NOMEM, "%s: out of memory", path);
    }
    *cat = *cat0;
    nl_status st = NL_OK;
    cJSON *e;
    cJSON_ArrayForEach(e, root) {
        nl_valid_case *c = &r->cases[r->n];
        const char *id = str(e, "id", NULL);
        if (!cJSON_IsObject(e) || !id) {
            st = nl_fail(NL_ERR_FORMAT, "%s: entry %zu has no \"id\"", path, r->n + 1);
            break;
        }
        snprintf(c->id, sizeof c->id, "%s", id);
        snprintf(c->group, sizeof c->group, "%s", str(e, "group", ""));
        snprintf(c->metric, sizeof c->metric, "%s", str(e, "metric", ""));
        snprintf(c->unit, sizeof c->unit, "%s", str(e, "unit", ""));
        snprintf(c->source, sizeof c->source, "%s", str(e, "source", ""));
        c->published = num(e, "published", NAN);
        c->formula = (int)num(e, "formula", 0);
        c->fits = -1;
        if (!(c->published > 0) || !str(e, "source", NULL)) {
            st = bad(path, id, "needs \"source\" and a positive \"published\"");
            break;
        }
        nl_arch a;
        nl_family fam;
        nl_plan_family("llama", &fam);
        int have_arch = 0;
        cJSON *ja = cJSON_GetObjectItemCaseSensitive(e, "arch");
        if (cJSON_IsObject(ja)) {
            if ((st = arch_of(path, id, ja, &a, &fam))) break;
            have_arch = 1;
        } else if (str(e, "model", NULL) && nl_catalog_find_model(cat, str(e, "model", ""), &a) == NL_OK) {
            nl_catalog_family(cat, a.name, &fam);
            have_arch = 1;
        }
        if (!strcmp(c->group, "train")) {
            if (!have_arch) {
                st = bad(path, id, "unknown model (give a catalog name or an \"arch\")");
                break;
            }
            st = run_train(cat, path, id, e, &a, &fam, c);
        } else if (!strcmp(c->group, "memory")) {
            st = run_memory(path, id, e, &a, have_arch, &fam, c);
        } else if (!strcmp(c->group, "serve")) {
            if (!have_arch) {
                st = bad(path, id, "unknown model (give a catalog name or an \"arch\")");
                break;
            }
            st = run_serve(cat, path, id, e, &a, &fam, c);
        } else if (!strcmp(c->group, "collective")) {
            st = run_collective(cat, path, id, e, c);
        } else {
            st = bad(path, id, "group must be train, memory, serve or collective");
        }
        if (st) break;
        c->err = c->predicted / c->published - 1;
        if (c->fits == 0) r->n_nofit++;
        r->n++;
    }
    cJSON_Delete(root);
    free(cat);
    if (st) {
        nl_plan_validate_free(r);
        return st;
    }
    static const char *groups[] = {"train", "memory", "serve", "collective"};
    double *buf = malloc((r->n ? r->n : 1) * sizeof *buf);
    if (!buf) {
        nl_plan_validate_free(r);
        return nl_fail(NL_ERR_NOMEM, "validate: out of memory");
    }
    for (int g = 0; g < 4; g++) {
        nl_valid_group *G = &r->groups[g];
        snprintf(G->group, sizeof G->group, "%s", groups[g]);
        int k = 0;
        for (size_t i = 0; i < r->n; i++) {
            const nl_valid_case *c = &r->cases[i];
            if (strcmp(c->group, groups[g])) continue;
            double ae = fabs(c->err);
            buf[k++] = ae;
            if (ae >= G->worst_abs) {
                G->worst_abs = ae;
                snprintf(G->worst_id, sizeof G->worst_id, "%s", c->id);
            }
            if (c->formula) {
                G->n_formula++;
                if (ae > G->worst_formula_abs) G->worst_formula_abs = ae;
            }
        }
        G->n = k;
        if (k) {
            qsort(buf, (size_t)k, sizeof *buf, cmp_d);
            G->median_abs = k % 2 ? buf[k / 2] : 0.5 * (buf[k / 2 - 1] + buf[k / 2]);
        }
    }
    free(buf);
    return NL_OK;
}

void nl_plan_validate_free(nl_valid_result *r) {
    free(r->cases);
    memset(r, 0, sizeof *r);
}

/* The planner against published runs: loads a validation set (tests/validation/published.json,
 * one object per published figure), runs each case's command ("plan train ...", "plan serve ...",
 * "budget ...") through the runner the CLI gives, with --json, and reads the figure from what the
 * command prints: validation checks the program users run. The published figure is always the
 * source's; the prediction is converted here to the source's own unit (its FLOP count where it
 * quotes TFLOP/s or MFU), which is arithmetic on the command's output, not pricing. With
 * holdout, the calibrated constants (the GEMM efficiency per GPU generation) are refit leaving
 * out one source at a time, through the commands' own --gemm-eff. */
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

/* FLOPs per step as the source counts them; -1 for a convention it does not know. */
static double source_flops(const char *conv, cJSON *a, double model_flops, double B, double s) {
    double l = num(a, "n_layers", 0), h = num(a, "dim", 0), V = num(a, "vocab_size", 0);
    /* Narayanan et al. 2021 eq. (3): with full recomputation, 96 B s l h^2 (1 + s/6h + V/16lh). */
    if (!strcmp(conv, "megatron-recompute")) return 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h));
    /* Korthikanti et al. 2022 sec. 6: model FLOPs 72 B s l h^2 (1 + s/6h + V/12lh). */
    if (!strcmp(conv, "megatron-model")) return 72 * B * s * l * h * h * (1 + s / (6 * h) + V / (12 * l * h));
    /* Hoffmann et al. 2022 (Chinchilla) appendix F: per sequence, the embedding and the logits
     * as matmuls (2 s V h each), per layer the projections, the full s x s scores and their
     * reduction, 3 FLOPs per score for the softmax and a two-matrix MLP; the backward twice the
     * forward, no recomputation. */
    if (!strcmp(conv, "chinchilla")) {
        double H = num(a, "n_heads", 0), kH = H * num(a, "head_dim", 0), F = num(a, "hidden_dim", 0);
        double layer = 6 * s * h * kH + 4 * s * s * kH + 3 * H * s * s + 2 * s * kH * h + 4 * s * h * F;
        return 3 * B * (4 * s * V * h + l * layer);
    }
    /* Dao 2023 (FlashAttention-2) sec. 4.2, "following Megatron-LM": per sequence
     * 6 s N + 12 l h s^2, N the parameters, the attention term not halved for the causal mask. */
    if (!strcmp(conv, "fa2")) return B * (6 * s * num(a, "params", 0) + 12 * l * h * s * s);
    if (!strcmp(conv, "6n-attn")) return model_flops; /* 6 N per token plus the causal attention scores */
    return -1;
}

/* A case's figure from its command's JSON output. *rejected: a training command refused the
 * published layout as not fitting (its message names the need). */
typedef struct run_out {
    double predicted;
    int rejected;
} run_out;

static nl_status figure_train(const char *path, const char *id, cJSON *e, cJSON *j, run_out *o) {
    cJSON *ranked = cJSON_GetObjectItemCaseSensitive(j, "ranked"), *a = cJSON_GetObjectItemCaseSensitive(j, "arch");
    cJSON *best = cJSON_GetArrayItem(ranked, 0);
    if (!best || !cJSON_IsObject(a)) return bad(path, id, "the command printed no ranked layout");
    double t = num(best, "t_step", 0), B = num(j, "global_batch", 0), s = num(j, "seq", 0), gpus = num(j, "gpus", 0);
    double peak = num(j, "flops_bf16", 0);
    if (!(t > 0) || !(B > 0) || !(s > 0) || !(gpus > 0) || !(peak > 0))
        return bad(path, id, "incomplete plan train output");
    double model_flops = num(best, "mfu", 0) * t * gpus * peak;
    if (!cJSON_HasObjectItem(a, "params")) cJSON_AddNumberToObject(a, "params", num(j, "params", 0));
    double fl = source_flops(str(e, "flops", "6n-attn"), a, model_flops, B, s);
    if (fl < 0) return bad(path, id, "flops must be 6n-attn, megatron-recompute, megatron-model, chinchilla or fa2");
    const char *m = str(e, "metric", "");
    if (!strcmp(m, "tflops_per_gpu"))
        o->predicted = fl / t / gpus / 1e12;
    else if (!strcmp(m, "mfu"))
        o->predicted = 100 * fl / t / gpus / peak;
    else if (!strcmp(m, "tokens_per_s_per_gpu"))
        o->predicted = B * s / t / gpus;
    else if (!strcmp(m, "step_s"))
        o->predicted = t;
    else if (!strcmp(m, "gpu_hours_per_t_tokens"))
        o->predicted = 1e12 / (B * s / t) * gpus / 3600;
    else if (!strcmp(m, "gpu_hours")) /* the GPU-hours plan train prints for the command's --tokens */
        o->predicted = num(best, "gpu_hours", NAN);
    else
        return bad(path, id, "unknown training metric");
    return NL_OK;
}

static nl_status figure_serve(const char *path, const char *id, cJSON *e, cJSON *j, run_out *o) {
    const char *m = str(e, "metric", "");
    double B = num(j, "batch", 0), out = num(j, "output", 0), tp = num(j, "tp", 0);
    if (!strcmp(m, "ttft_ms"))
        o->predicted = num(j, "ttft_s", NAN) * 1e3;
    else if (!strcmp(m, "tpot_ms"))
        o->predicted = num(j, "tpot_s", NAN) * 1e3;
    else if (!strcmp(m,
                     "batch_latency_s")) /* vLLM's benchmark_latency: one static batch, prefill then `output` steps */
        o->predicted = num(j, "batch_prefill_s", NAN) + out * num(j, "tpot_s", NAN);
    else if (!strcmp(m, "out_tok_s") || !strcmp(m, "out_tok_s_per_gpu")) {
        /* A static batch (TensorRT-LLM's gptSessionBenchmark): the whole batch is prefilled,
         * then `output` decode steps at the average context. */
        double t = num(j, "batch_prefill_s", NAN) + out * num(j, "tpot_s", NAN);
        o->predicted = B * out / t / (!strcmp(m, "out_tok_s") ? 1.0 : tp);
    } else
        return bad(path, id, "unknown serving metric");
    return NL_OK;
}

static nl_status figure_memory(const char *path, const char *id, cJSON *e, cJSON *j, run_out *o) {
    const char *m = str(e, "metric", "");
    if (!strcmp(m, "state_gb") || !strcmp(m, "state_bytes_per_param")) {
        cJSON *st = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(j, "stages"), 0);
        if (!st) return bad(path, id, "the budget command printed no ZeRO stage (give --zero)");
        o->predicted = !strcmp(m, "state_gb") ? num(st, "bytes_per_gpu", NAN) / 1e9 : num(st, "bytes_per_param", NAN);
        return NL_OK;
    }
    if (!strcmp(m, "act_bytes_per_layer")) {
        cJSON *act = cJSON_GetObjectItemCaseSensitive(j, "activations");
        if (!act) return bad(path, id, "the budget command printed no activations (give --model)");
        o->predicted = num(act, "bytes_per_token_layer", NAN) * num(act, "tokens", NAN);
        return NL_OK;
    }
    return bad(path, id, "unknown memory metric");
}

/* Runs a case's command (with `extra` options appended) and reads its figure. */
static nl_status run_case(const char *path, const char *id, cJSON *e, const char *extra, nl_valid_runner run, void *ctx,
                          run_out *o) {
    memset(o, 0, sizeof *o);
    const char *group = str(e, "group", ""), *command = str(e, "command", NULL);
    if (!command) return bad(path, id, "needs a \"command\" (plan train, plan serve or budget)");
    char line[1024];
    if (snprintf(line, sizeof line, "%s --json%s%s", command, extra ? " " : "", extra ? extra : "") >= (int)sizeof line)
        return bad(path, id, "command too long");
    int status = -1;
    char *text = run(line, &status, ctx);
    if (!text) return bad(path, id, "the command could not be run");
    nl_status st = NL_OK;
    if (status != 0) {
        if (!strcmp(group, "train") && strstr(text, "fits on no layout")) {
            o->rejected = 1;
            o->predicted = NAN;
        } else {
            char msg[1200];
            snprintf(msg, sizeof msg, "'%s' failed: %.900s", command, text);
            st = bad(path, id, msg);
        }
        free(text);
        return st;
    }
    cJSON *j = cJSON_Parse(text);
    free(text);
    if (!j) return bad(path, id, "the command's --json output does not parse");
    if (!strcmp(group, "train"))
        st = figure_train(path, id, e, j, o);
    else if (!strcmp(group, "serve"))
        st = figure_serve(path, id, e, j, o);
    else if (!strcmp(group, "memory"))
        st = figure_memory(path, id, e, j, o);
    else
        st = bad(path, id, "group must be train, memory, serve or collective");
    cJSON_Delete(j);
    if (!st && !(o->predicted > 0) && !o->rejected) st = bad(path, id, "the command's figure is not positive");
    return st;
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

static double median(double *v, int k) {
    if (k <= 0) return 0;
    qsort(v, (size_t)k, sizeof *v, cmp_d);
    return k % 2 ? v[k / 2] : 0.5 * (v[k / 2 - 1] + v[k / 2]);
}

static const char *groups_names[4] = {"train", "memory", "serve", "collective"};

/* Median and worst |error| per group; holdout: the leave-one-source-out errors. */
static void summarize(nl_valid_result *r, int holdout, double *buf) {
    for (int g = 0; g < 4; g++) {
        nl_valid_group *G = holdout ? &r->holdout[g] : &r->groups[g];
        memset(G, 0, sizeof *G);
        snprintf(G->group, sizeof G->group, "%s", groups_names[g]);
        int k = 0;
        for (size_t i = 0; i < r->n; i++) {
            const nl_valid_case *c = &r->cases[i];
            double e = holdout ? c->err_holdout : c->err;
            if (strcmp(c->group, groups_names[g]) || !isfinite(e)) continue;
            double ae = fabs(e);
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
        G->median_abs = median(buf, k);
    }
}

/* ---- leave-one-source-out ------------------------------------------------------------------ */
/* The calibrated constants: the catalog's GEMM efficiency of each GPU generation (catalog.c; the
 * other assumptions are measurements or published kernel rates, docs/planning.md). */
static const struct {
    const char *name, *gpus[4];
} calibrated[NL_VALID_CONSTS] = {{"gemm_eff a100", {"a100", "a100-40", NULL, NULL}},
                                 {"gemm_eff hopper", {"h100", "h200", "h800", NULL}}};
#define GRID_LO 0.40
#define GRID_N  51 /* 0.40 .. 0.90 */

static int const_of(const char *gpu) {
    for (int k = 0; k < NL_VALID_CONSTS; k++)
        for (int i = 0; calibrated[k].gpus[i]; i++)
            if (!strcmp(gpu, calibrated[k].gpus[i])) return k;
    return -1;
}

/* The grid value with the smallest median |error| over the cases of constant k whose source is
 * not `leave` (NULL: all), errors err[case][grid]; ties go to the lower value. */
static double fit_const(const nl_valid_result *r, int k, const double *err, const char *leave, double *buf) {
    double best = NAN, best_med = INFINITY;
    for (int gi = 0; gi < GRID_N; gi++) {
        int n = 0;
        for (size_t i = 0; i < r->n; i++) {
            const nl_valid_case *c = &r->cases[i];
            if (const_of(c->gpu) != k || (strcmp(c->group, "train") && strcmp(c->group, "serve"))) continue;
            if (leave && !strcmp(c->source_id, leave)) continue;
            double e = err[i * GRID_N + (size_t)gi];
            if (isfinite(e)) buf[n++] = fabs(e);
        }
        if (!n) return NAN; /* nothing left to fit on */
        double m = median(buf, n);
        if (m < best_med - 1e-12) {
            best_med = m;
            best = GRID_LO + 0.01 * gi;
        }
    }
    return best;
}

static nl_status holdout(const nl_catalog *cat, const char *path, cJSON *root, nl_valid_runner run, void *ctx,
                         nl_valid_result *r, double *buf) {
    double *err = malloc(r->n * GRID_N * sizeof *err), *pred = malloc(r->n * GRID_N * sizeof *pred);
    if (!err || !pred) {
        free(err);
        free(pred);
        return nl_fail(NL_ERR_NOMEM, "validate: out of memory");
    }
    nl_status st = NL_OK;
    size_t i = 0;
    cJSON *e;
    /* Every calibrated case priced at every grid value, through the command's --gemm-eff. */
    cJSON_ArrayForEach(e, root) {
        nl_valid_case *c = &r->cases[i];
        int k = const_of(c->gpu);
        int fitted = k >= 0 && (!strcmp(c->group, "train") || !strcmp(c->group, "serve"));
        for (int gi = 0; gi < GRID_N && !st; gi++) {
            err[i * GRID_N + (size_t)gi] = pred[i * GRID_N + (size_t)gi] = NAN;
            if (!fitted) continue;
            char extra[48];
            snprintf(extra, sizeof extra, "--gemm-eff %.2f", GRID_LO + 0.01 * gi);
            run_out o;
            st = run_case(path, c->id, e, extra, run, ctx, &o);
            pred[i * GRID_N + (size_t)gi] = o.predicted;
            err[i * GRID_N + (size_t)gi] = o.predicted / c->published - 1;
        }
        if (st) break;
        i++;
    }
    for (int k = 0; k < NL_VALID_CONSTS && !st; k++) {
        nl_valid_const *K = &r->consts[k];
        snprintf(K->name, sizeof K->name, "%s", calibrated[k].name);
        size_t len = 0;
        for (int g = 0; calibrated[k].gpus[g]; g++) {
            nl_hw hw;
            if (g == 0 && nl_catalog_find_hw(cat, calibrated[k].gpus[g], &hw) == NL_OK) K->catalog = hw.gemm_eff;
            len += (size_t)snprintf(K->gpus + len, sizeof K->gpus - len, "%s%s", g ? ", " : "", calibrated[k].gpus[g]);
        }
        K->fit_all = fit_const(r, k, err, NULL, buf);
        for (size_t c = 0; c < r->n; c++) {
            const nl_valid_case *x = &r->cases[c];
            if (const_of(x->gpu) != k || (strcmp(x->group, "train") && strcmp(x->group, "serve"))) continue;
            K->n_cases++;
            if (!strstr(K->sources, x->source_id)) {
                size_t sl = strlen(K->sources);
                snprintf(K->sources + sl, sizeof K->sources - sl, "%s%s", sl ? ", " : "", x->source_id);
            }
        }
    }
    /* Each case at the constant fit without its own source. */
    for (size_t c = 0; c < r->n && !st; c++) {
        nl_valid_case *x = &r->cases[c];
        int k = const_of(x->gpu);
        x->predicted_holdout = x->predicted;
        x->err_holdout = x->err;
        if (k < 0 || (strcmp(x->group, "train") && strcmp(x->group, "serve"))) continue;
        double v = fit_const(r, k, err, x->source_id, buf);
        if (!isfinite(v)) v = r->consts[k].catalog; /* its source is the only one: the catalog's value */
        int gi = (int)lround((v - GRID_LO) / 0.01);
        if (gi < 0 || gi >= GRID_N) {
            /* a catalog value outside the grid: price it directly */
            char extra[48];
            snprintf(extra, sizeof extra, "--gemm-eff %.4f", v);
            run_out o;
            cJSON *ce = cJSON_GetArrayItem(root, (int)c);
            if ((st = run_case(path, x->id, ce, extra, run, ctx, &o))) break;
            x->predicted_holdout = o.predicted;
        } else
            x->predicted_holdout = pred[c * GRID_N + (size_t)gi];
        x->err_holdout = x->predicted_holdout / x->published - 1;
        x->gemm_eff_holdout = v;
    }
    free(err);
    free(pred);
    if (!st) {
        summarize(r, 1, buf);
        r->has_holdout = 1;
    }
    return st;
}

nl_status nl_plan_validate(const nl_catalog *cat0, const char *path, nl_valid_runner run, void *ctx, int with_holdout,
                           nl_valid_result *r) {
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
    double *buf = malloc((n ? n : 1) * sizeof *buf);
    if (!cat || !r->cases || !buf) {
        free(cat);
        free(buf);
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
        snprintf(c->source_id, sizeof c->source_id, "%s", str(e, "source_id", str(e, "source", "")));
        snprintf(c->command, sizeof c->command, "%s", str(e, "command", ""));
        const char *g = strstr(c->command, "--gpu ");
        if (g) sscanf(g + 6, "%31s", c->gpu);
        c->published = num(e, "published", NAN);
        c->formula = (int)num(e, "formula", 0);
        c->fits = -1;
        if (!(c->published > 0) || !str(e, "source", NULL)) {
            st = bad(path, id, "needs \"source\" and a positive \"published\"");
            break;
        }
        if (!strcmp(c->group, "collective")) {
            snprintf(c->gpu, sizeof c->gpu, "%s", str(e, "gpu", ""));
            st = run_collective(cat, path, id, e, c);
        } else {
            if (!run) {
                st = bad(path, id, "no runner for its command");
                break;
            }
            run_out o;
            st = run_case(path, id, e, NULL, run, ctx, &o);
            c->predicted = o.predicted;
            if (!strcmp(c->group, "train")) c->fits = !o.rejected;
        }
        if (st) break;
        c->err = c->predicted / c->published - 1;
        c->predicted_holdout = c->predicted;
        c->err_holdout = c->err;
        if (c->fits == 0) r->n_nofit++;
        r->n++;
    }
    if (!st) summarize(r, 0, buf);
    if (!st && with_holdout) st = holdout(cat, path, root, run, ctx, r, buf);
    cJSON_Delete(root);
    free(cat);
    free(buf);
    if (st) nl_plan_validate_free(r);
    return st;
}

void nl_plan_validate_free(nl_valid_result *r) {
    free(r->cases);
    memset(r, 0, sizeof *r);
}

const char *nl_plan_validate_default_file(char *buf, size_t n) {
    const char *src = getenv("NANOLM_SRC");
    FILE *f = fopen("tests/validation/published.json", "rb");
    if (f) {
        fclose(f);
        return "tests/validation/published.json";
    }
    if (!src) return NULL;
    snprintf(buf, n, "%s/tests/validation/published.json", src);
    return buf;
}

/* nanolm plan catalog|train|layer|serve|pipeline: parallel training and serving plans. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cli_opt.h"
#include "nanolm/capture.h"
#include "nanolm/layer_study.h"
#include "nanolm/plan.h"
#include "nanolm/plan_engine.h"
#include "nanolm/train_layout.h"
#include "plan_opts.h"
#include "report.h"

static void usage(FILE *f) {
    fprintf(
        f,
        "usage: nanolm plan catalog [--hw FILE.json] [--model-file FILE.json] [--json]\n"
        "       nanolm plan train --model M --gpus N [options]   (nanolm plan train --help)\n"
        "       nanolm plan layer --model M [--tp T] [--dp D] [options]\n"
        "       nanolm plan serve --model M [--tp N] [--prompt P] [--output O] [options]\n"
        "       nanolm plan serve --hw cpu.json --model M|CHECKPOINT [options]\n"
        "                         (cpu.json from `nanolm bench machine --json`: nanolm's own engine on this CPU)\n"
        "       nanolm plan pipeline --stages P --microbatches M [--svg FILE]\n"
        "       nanolm plan validate [--file FILE.json] [--holdout source] [--json] [--svg FILE]\n"
        "                         (every published figure of tests/validation/published.json, through its command)\n\n"
        "Each subcommand's --help lists its options; the planner's assumptions (--gemm-eff, --dp-overlap,\n"
        "--link-eff, --mfu, --napkin, ...) are shared by train, layer and serve; see docs/planning.md.\n");
}

/* The option groups of plan train, layer and serve: model, hardware, the command's own groups,
 * assumptions, --json. */
typedef struct plan_groups {
    nl_opt model[3], hw[3], assume[NL_PLAN_ASSUMPTION_OPTS], out[1];
} plan_groups;

/* Fills g bound to a and *json, and groups[] in help order with the command's own groups in the
 * middle; groups must hold nown + 4. Returns how many groups. */
static int plan_groups_init(plan_groups *g, nl_plan_args *a, int *json, nl_optgroup *groups, const nl_optgroup *own,
                            int nown) {
    nl_plan_args_init(a);
    *json = 0;
    nl_plan_model_opts(g->model, a);
    nl_plan_hw_opts(g->hw, a, 1);
    int na = nl_plan_assumption_opts(g->assume, a), n = 0;
    g->out[0] = (nl_opt)NL_OPT_FLAG("json", json, "print the result as JSON");
    groups[n++] = (nl_optgroup){"model", g->model, 3};
    groups[n++] = (nl_optgroup){"hardware", g->hw, 3};
    for (int i = 0; i < nown; i++) groups[n++] = own[i];
    groups[n++] = (nl_optgroup){"assumptions (docs/planning.md)", g->assume, na};
    groups[n++] = (nl_optgroup){"output", g->out, 1};
    return n;
}

/* ---- plan train ------------------------------------------------------------------------------ */

typedef struct train_args {
    nl_plan_args pa;
    int json;
    int64_t top;
    double tokens;
    const char *svg, *zero, *recompute, *schedule;
    nl_train_layout lay; /* the run, the fixed layout and the training stack */
} train_args;

static int train_parse(train_args *t, int argc, char **argv) {
    memset(&t->lay, 0, sizeof t->lay);
    t->top = 8;
    t->tokens = 0;
    t->svg = t->zero = t->recompute = t->schedule = NULL;
    nl_opt run[] = {
        NL_OPT_INT("gpus", &t->lay.gpus, 1, 1 << 20, "N", "GPUs in all (required)"),
        NL_OPT_SI("tokens", &t->tokens, 1, INFINITY, "D", "training tokens (default 20 per parameter)"),
        NL_OPT_INT("global-batch", &t->lay.global_batch, 1, 1 << 24, "B", "sequences per step (default ~4M tokens)"),
        NL_OPT_INT("seq", &t->lay.seq, 1, 1 << 24, "S", "tokens per sequence (default: the model's context)"),
        NL_OPT_INT("top", &t->top, 1, 1000, "K", "layouts to list (default 8)"),
        NL_OPT_STR("svg", &t->svg, "FILE", "memory bars of the best and rejected layouts"),
    };
    nl_opt sp = NL_OPT_CHOICE("sp", &t->lay.sp, "on|off", "sequence parallelism with tp (default: searched)");
    sp.given = &t->lay.sp_given;
    nl_opt fix[] = {
        NL_OPT_INT("dp", &t->lay.fix[0], 1, 1 << 20, "D", "data-parallel degree"),
        NL_OPT_INT("tp", &t->lay.fix[1], 1, 1024, "T", "tensor-parallel degree"),
        NL_OPT_INT("pp", &t->lay.fix[2], 1, 1024, "P", "pipeline stages"),
        NL_OPT_INT("cp", &t->lay.fix[3], 1, 1024, "C", "context-parallel degree"),
        NL_OPT_INT("ep", &t->lay.fix[4], 1, 4096, "E", "expert-parallel degree"),
        NL_OPT_INT("micro-batch", &t->lay.fix[5], 1, 1 << 16, "B", "sequences per micro-batch"),
        NL_OPT_STR("zero", &t->zero, "0|1|2|3|hsdp", "ZeRO stage"),
        NL_OPT_STR("recompute", &t->recompute, "none|selective|full", "activation recomputation"),
        NL_OPT_INT("interleave", &t->lay.interleave, 1, 64, "V", "pipeline chunks per GPU"),
        NL_OPT_INT("first-stage-layers", &t->lay.first_layers, 1, 1 << 16, "N",
                   "layers on the first pipeline stage (with --last-stage-layers; default: even stages)"),
        NL_OPT_INT("last-stage-layers", &t->lay.last_layers, 1, 1 << 16, "N",
                   "layers on the last pipeline stage (Llama 3 405B: 7 and 7 of 126 on 16 stages)"),
        sp,
        NL_OPT_STR("schedule", &t->schedule, "1f1b|zb-h1|dualpipe", "pipeline schedule (default 1f1b)"),
        NL_OPT_INT("moe-node-limit", &t->lay.node_limit, 1, 1 << 16, "M",
                   "MoE tokens routed to at most M nodes (DeepSeek-V3: 4; default: no limit)"),
    };
    nl_opt stack[] = {
        NL_OPT_STR("attention", &t->lay.attention, "flash|flash-v1|flash-triton|materialized",
                   "the attention kernel (default flash: FlashAttention-2/3's published rates; flash-v1 and "
                   "flash-triton: FlashAttention (v1)'s rate, which the Triton kernel runs at; materialized: the s x s "
                   "scores in memory, as Megatron-LM 2021, BLOOM, OPT)"),
        NL_OPT_FLAG("distribute-saved", &t->lay.dist_saved,
                    "full recomputation keeps 1/tp of each checkpoint per rank (Megatron-LM's "
                    "--distribute-saved-activations)"),
        NL_OPT_INT("zero3-calls-per-layer", &t->lay.z3_calls, 1, 1024, "N",
                   "ZeRO-3 gathers per layer and pass (default 1, FSDP's flat parameter; DeepSpeed: one per "
                   "parameter tensor)"),
        NL_OPT_SI("zero3-prefetch", &t->lay.z3_prefetch, 1, INFINITY, "P",
                  "ZeRO-3 parameters gathered ahead of compute per call (default: the next layer, FSDP; "
                  "DeepSpeed's stage3_prefetch_bucket_size 50M)"),
        NL_OPT_FLAG("zero3-nic-spread", &t->lay.z3_spread,
                    "ZeRO-3 rings across nodes spread over the node's NICs (default: each GPU's own NIC)"),
    };
    const nl_optgroup own[] = {{"run", run, NL_NOPTS(run)},
                               {"layout (each fixes that part; the rest is searched)", fix, NL_NOPTS(fix)},
                               {"the training stack (docs/planning.md)", stack, NL_NOPTS(stack)}};
    plan_groups g;
    nl_optgroup groups[7];
    int ng = plan_groups_init(&g, &t->pa, &t->json, groups, own, 3);
    nl_cmdspec spec = {"plan train",
                       "nanolm plan train --model M --gpus N [options]",
                       "Every parallel layout of N GPUs (dp, tp, pp, cp, ep, micro-batch, ZeRO, recomputation)\n"
                       "priced for memory and step time, ranked by time to train; why the best one wins.",
                       groups,
                       ng,
                       0};
    int rc = nl_cli_parse(&spec, argc, argv, NULL, NULL);
    if (rc) return rc;
    if ((rc = nl_plan_args_load(&t->pa, "plan train"))) return rc;
    if (t->lay.gpus < 1) return nl_cli_usage_error("plan train: --gpus is required");
    return 0;
}

/* The request of plan train: the shared groups, the run and the fixed parts of the layout. */
static int train_request(train_args *t, nl_train_req *q) {
    int zero = 0, recompute = 0, sched = NL_SCHED_1F1B;
    if (t->zero && (zero = nl_zero_parse(t->zero) + 1) < 1)
        return nl_cli_usage_error("plan train: unknown --zero '%s' (0, 1, 2, 3, hsdp)", t->zero);
    if (t->recompute && (recompute = nl_recompute_parse(t->recompute) + 1) < 1)
        return nl_cli_usage_error("plan train: unknown --recompute '%s' (none, selective, full)", t->recompute);
    if (t->schedule && (sched = nl_plan_schedule(t->schedule)) < 0)
        return nl_cli_usage_error("plan train: unknown --schedule '%s' (1f1b, dualpipe, zb-h1)", t->schedule);
    int rc = nl_plan_args_request(&t->pa, "plan train", q);
    if (rc) return rc;
    t->lay.zero_plus1 = zero;
    t->lay.recompute_plus1 = recompute;
    t->lay.schedule = (nl_sched)sched;
    if (nl_train_layout_request(&t->lay, q)) return nl_cli_usage_error("plan train: %s", nl_last_error());
    return 0;
}

/* The JSON columns of one evaluated layout (the text columns are the caller's); "reason" only
 * with_reason. Fills c (room for EVAL_JSON_COLS) and returns how many. */
#define EVAL_JSON_COLS 34
static int eval_cols(nl_report_col *c, int with_reason) {
    static const char *keys[EVAL_JSON_COLS] = {
        "layout",      "dp",           "tp",        "pp",        "cp",         "ep",        "zero",
        "micro_batch", "n_micro",      "vpp",       "recompute", "fits",       "reason",    "mem_total",
        "mem_weights", "mem_grads",    "mem_optim", "mem_act",   "mem_logits", "t_compute", "t_bubble",
        "t_dp",        "t_tp",         "t_pp",      "t_cp",      "t_ep",       "t_exposed", "t_optim",
        "t_step",      "tokens_per_s", "mfu",       "total_s",   "gpu_hours",  "cost"};
    int n = 0;
    for (int i = 0; i < EVAL_JSON_COLS; i++)
        if (with_reason || strcmp(keys[i], "reason")) c[n++] = (nl_report_col){keys[i], "", NULL};
    return n;
}

/* The cells of eval_cols(with_reason) for e. */
static void eval_cells(nl_report *r, const nl_train_eval *e, int with_reason) {
    char lb[160];
    const nl_layout *L = &e->L;
    nl_report_cell_str(r, nl_layout_str(L, lb, sizeof lb));
    const double dims[] = {L->dp, L->tp, L->pp, L->cp, L->ep};
    for (int i = 0; i < 5; i++) nl_report_cell_num(r, dims[i]);
    nl_report_cell_str(r, nl_zero_name(L->zero));
    nl_report_cell_num(r, (double)L->micro_batch);
    nl_report_cell_num(r, (double)L->n_micro);
    nl_report_cell_num(r, (double)L->vpp);
    nl_report_cell_str(r, nl_recompute_name(L->recompute));
    nl_report_cell_bool(r, e->fits);
    if (with_reason) nl_report_cell_str(r, e->reason);
    const double v[] = {e->mem_total, e->mem_weights, e->mem_grads, e->mem_optim, e->mem_act,      e->mem_logits,
                        e->t_compute, e->t_bubble,    e->t_dp,      e->t_tp,      e->t_pp,         e->t_cp,
                        e->t_ep,      e->t_exposed,   e->t_optim,   e->t_step,    e->tokens_per_s, e->mfu,
                        e->total_s,   e->gpu_hours,   e->cost};
    for (int i = 0; i < (int)(sizeof v / sizeof v[0]); i++) nl_report_cell_num(r, v[i]);
}

/* The ranked layouts: the text table, and every field under "ranked" in the JSON. */
static void report_ranked(nl_report *r, const nl_train_result *res, int64_t top) {
    nl_report_col cols[11 + EVAL_JSON_COLS] = {{NULL, "#", "%-.0f"},
                                               {NULL, "layout", NULL},
                                               {NULL, "mem GB", "%-.1f"},
                                               {NULL, "step s", "%-.3f"},
                                               {NULL, "exposed comm", "%-.0f ms"},
                                               {NULL, "bubble", "%-.0f ms"},
                                               {NULL, "tokens/s", "%-.0f"},
                                               {NULL, "MFU", "%-.1f%%"},
                                               {NULL, "days", "%-.1f"},
                                               {NULL, "GPU-hours", "%-.0f"},
                                               {NULL, "cost $", "%-.0f"}};
    int n = 11 + eval_cols(cols + 11, 0); /* no "reason": every ranked layout fits */
    nl_report_table(r, "ranked", NULL, n, cols);
    for (size_t i = 0; i < res->n_fit && i < (size_t)top; i++) {
        const nl_train_eval *e = &res->evals[i];
        char lb[160];
        nl_report_cell_num(r, (double)(i + 1));
        nl_report_cell_str(r, nl_layout_str(&e->L, lb, sizeof lb));
        const double v[] = {e->mem_total / 1e9, e->t_step,       e->t_exposed * 1e3,
                            e->t_bubble * 1e3,  e->tokens_per_s, 100 * e->mfu,
                            e->total_s / 86400, e->gpu_hours,    e->cost};
        for (int k = 0; k < 9; k++) nl_report_cell_num(r, v[k]);
        eval_cells(r, e, 0);
        nl_report_row_end(r);
    }
}

/* The rejected layouts: the first `top` in the JSON; in the text the four smallest and the largest. */
static void report_rejected(nl_report *r, const nl_train_result *res, int64_t top) {
    nl_report_col cols[EVAL_JSON_COLS];
    nl_report_table(r, "rejected", NULL, eval_cols(cols, 1), cols);
    for (size_t i = res->n_fit; i < res->n && i < res->n_fit + (size_t)top; i++) {
        eval_cells(r, &res->evals[i], 1);
        nl_report_row_end(r);
    }
}

static void report_rejected_text(nl_report *r, const nl_train_result *res) {
    if (res->n <= res->n_fit) return;
    char lb[160];
    nl_report_note(r, "%s", "");
    nl_report_note(r, "Rejected (smallest memory first):");
    for (size_t i = res->n_fit; i < res->n && i < res->n_fit + 4; i++)
        nl_report_note(r, "  %s: %s", nl_layout_str(&res->evals[i].L, lb, sizeof lb), res->evals[i].reason);
    /* The layout with the most state, to show why sharding is needed. */
    const nl_train_eval *w = &res->evals[res->n - 1];
    nl_report_note(r, "  ...\n  %s: %s", nl_layout_str(&w->L, lb, sizeof lb), w->reason);
}

static void report_train(nl_report *r, const train_args *t, const nl_train_req *q, const nl_train_result *res,
                         double N) {
    char a1[32], a2[32], a3[32], ex[4096];
    nl_report_str(r, "model", "", q->arch.name);
    nl_report_num(r, "params", "", N, NULL, NULL);
    /* the shape and family priced (what a source's own FLOP count needs) */
    nl_report_begin_object(r, "arch", NULL);
    nl_report_str(r, "family", "", q->fam.name);
    const struct {
        const char *k;
        int64_t v;
    } shape[] = {{"vocab_size", q->arch.vocab_size}, {"dim", q->arch.dim},
                 {"n_layers", q->arch.n_layers},     {"n_heads", q->arch.n_heads},
                 {"n_kv_heads", q->arch.n_kv_heads}, {"head_dim", nl_arch_head_dim(&q->arch)},
                 {"hidden_dim", q->arch.hidden_dim}};
    for (size_t i = 0; i < sizeof shape / sizeof shape[0]; i++) nl_report_int(r, shape[i].k, "", shape[i].v, NULL);
    nl_report_end_object(r);
    nl_report_str(r, "gpu", "", q->hw.name);
    nl_report_num(r, "flops_bf16", "", q->hw.flops_bf16, NULL, NULL);
    nl_report_int(r, "gpus", "", t->lay.gpus, NULL);
    nl_report_num(r, "tokens", "", q->tokens, NULL, NULL);
    nl_report_int(r, "seq", "", q->seq, NULL);
    nl_report_int(r, "global_batch", "", q->global_batch, NULL);
    nl_report_int(r, "layouts", "", (long long)res->n, NULL);
    nl_report_int(r, "layouts_fit", "", (long long)res->n_fit, NULL);
    nl_report_num(r, "search_s", "", res->search_s, NULL, NULL);
    nl_report_note(r,
                   "Plan: %s (%s parameters) on %lld x %s, %s tokens, global batch %lld x %lld = %s tokens, recipe %s.",
                   q->arch.name, nl_fmt_count(N, a1, sizeof a1), (long long)t->lay.gpus, q->hw.name,
                   nl_fmt_count(q->tokens, a2, sizeof a2), (long long)q->global_batch, (long long)q->seq,
                   nl_fmt_count((double)q->global_batch * (double)q->seq, a3, sizeof a3), q->recipe.name);
    nl_report_note(r, "Searched %zu layouts in %.1f ms: %zu fit in memory, %zu do not.", res->n, res->search_s * 1e3,
                   res->n_fit, res->n - res->n_fit);
    report_ranked(r, res, t->top);
    report_rejected(r, res, t->top);
    nl_plan_train_explain(q, res, ex, sizeof ex);
    nl_report_note(r, "%s", "");
    nl_report_set_gap(r, 1);
    nl_report_str(r, "explanation", "Why #1:", ex);
    report_rejected_text(r, res);
    nl_report_note(r, "%s", "");
    nl_plan_report_assumptions(r, q);
}

static int cmd_train(int argc, char **argv) {
    train_args t;
    int rc = train_parse(&t, argc, argv);
    if (rc) return rc == NL_CLI_HELP ? NL_EXIT_OK : rc;
    nl_train_req q;
    if ((rc = train_request(&t, &q))) return rc;
    nl_arch_params ap;
    nl_plan_count_params(&q.arch, &q.fam, &ap);
    double N = t.pa.params > 0 ? t.pa.params : (double)ap.total;
    q.tokens = t.tokens > 0 ? t.tokens : 20 * N;
    nl_train_result res;
    if (nl_plan_train_search(&q, &res)) return nl_cli_fail("plan train");
    if (t.svg && nl_plan_svg_search(t.svg, &res, q.hw.mem_bytes)) {
        nl_plan_train_free(&res);
        return nl_cli_fail("--svg");
    }
    nl_report *r = nl_report_new("plan train");
    report_train(r, &t, &q, &res, N);
    nl_plan_train_free(&res);
    return nl_report_print(r, t.json);
}

/* ---- plan layer ------------------------------------------------------------------------------ */

typedef struct layer_args {
    nl_plan_args pa;
    int json, sp;
    int64_t tp, pp, dp, ep, micro;
    double tokens;
    const char *zero;
} layer_args;

static int layer_parse(layer_args *l, int argc, char **argv) {
    l->tp = l->pp = l->dp = l->ep = l->micro = 1;
    l->tokens = 0;
    l->sp = 0;
    l->zero = NULL;
    nl_opt layout[] = {
        NL_OPT_INT("tp", &l->tp, 1, 1024, "T", "tensor-parallel degree (default 1)"),
        NL_OPT_FLAG("sp", &l->sp, "sequence parallelism with --tp"),
        NL_OPT_INT("pp", &l->pp, 1, 1024, "P", "pipeline stages (default 1)"),
        NL_OPT_INT("dp", &l->dp, 1, 1 << 20, "D", "data-parallel degree (default 1)"),
        NL_OPT_INT("ep", &l->ep, 1, 4096, "E", "expert-parallel degree (default 1)"),
        NL_OPT_STR("zero", &l->zero, "0|1|2|3|hsdp", "ZeRO stage (default 0)"),
        NL_OPT_SI("tokens-per-gpu", &l->tokens, 1, INFINITY, "T",
                  "tokens per GPU per microbatch (default: the context)"),
        nl_opt_aliased(
            (nl_opt)NL_OPT_INT("microbatches", &l->micro, 1, 1 << 20, "M", "microbatches per step (default 1)"),
            "micro"),
    };
    const nl_optgroup own[] = {{"layout", layout, NL_NOPTS(layout)}};
    plan_groups g;
    nl_optgroup groups[5];
    int ng = plan_groups_init(&g, &l->pa, &l->json, groups, own, 1);
    nl_cmdspec spec = {"plan layer",
                       "nanolm plan layer --model M [--tp T] [--dp D] [options]",
                       "The collectives one transformer layer issues under a layout: what, on which group, how many\n"
                       "bytes through each GPU and how long (alpha-beta model), per layer and per step.",
                       groups,
                       ng,
                       0};
    int rc = nl_cli_parse(&spec, argc, argv, NULL, NULL);
    if (rc) return rc;
    return nl_plan_args_load(&l->pa, "plan layer");
}

static void report_collectives(nl_report *r, const nl_layer_plan *lp) {
    nl_report_table(r, "collectives", NULL, 17,
                    (const nl_report_col[]){{NULL, "when", NULL},
                                            {NULL, "what", NULL},
                                            {NULL, "collective", NULL},
                                            {NULL, "group", NULL},
                                            {NULL, "array", NULL},
                                            {NULL, "through each GPU", NULL},
                                            {NULL, "time", "%-.3g ms"},
                                            {NULL, "per step", NULL},
                                            {"what", "", NULL},
                                            {"when", "", NULL},
                                            {"collective", "", NULL},
                                            {"group", "", NULL},
                                            {"p", "", NULL},
                                            {"bytes", "", NULL},
                                            {"wire_bytes", "", NULL},
                                            {"time_s", "", NULL},
                                            {"count_per_step", "", NULL}});
    for (int i = 0; i < lp->n; i++) {
        const nl_layer_coll *x = &lp->c[i];
        char g[64], b1[32], b2[32];
        snprintf(g, sizeof g, "%s %lld", x->group, (long long)x->p);
        const char *text[] = {x->when,
                              x->what,
                              nl_coll_name(x->coll),
                              g,
                              nl_fmt_bytes(x->bytes, b1, sizeof b1),
                              nl_fmt_bytes(x->wire_bytes, b2, sizeof b2)};
        for (int k = 0; k < 6; k++) nl_report_cell_str(r, text[k]);
        char count[32];
        snprintf(count, sizeof count, "x%.0f", x->count);
        nl_report_cell_num(r, x->time_s * 1e3);
        nl_report_cell_str(r, count);
        const char *json[] = {x->what, x->when, nl_coll_name(x->coll), x->group};
        for (int k = 0; k < 4; k++) nl_report_cell_str(r, json[k]);
        const double v[] = {(double)x->p, x->bytes, x->wire_bytes, x->time_s, x->count};
        for (int k = 0; k < 5; k++) nl_report_cell_num(r, v[k]);
        nl_report_row_end(r);
    }
}

/* The prose under the table: totals, FSDP, against DDP, the MoE layer, when TP is compute-bound. */
static void report_layer_notes(nl_report *r, const layer_args *l, int zero, const nl_train_req *q,
                               const nl_layer_study *x) {
    const nl_layer_plan *lp = &x->lp;
    nl_report_note(r, "%s", "");
    nl_report_note(r,
                   "Per layer, tensor/expert/pipeline collectives: %.3g ms in forward, %.3g ms in backward. Per step: "
                   "%.3g ms in all,\n%.3g ms of it data-parallel/ZeRO; compute per step %.3g s (%s), so communication "
                   "is %.1f%% of it.",
                   lp->per_layer_fwd_s * 1e3, lp->per_layer_bwd_s * 1e3, lp->per_step_s * 1e3, x->dp_traffic * 1e3,
                   lp->compute_step_s, q->eff.fixed_mfu > 0 ? "6*N*tokens at the fixed MFU" : "kernel model",
                   100 * lp->per_step_s / lp->compute_step_s);
    if (zero == NL_ZERO_3 || zero == NL_ZERO_HSDP) {
        char b1[32];
        nl_report_note(
            r, "FSDP issues these layer by layer, prefetching the next layer's weights: %lld gathers of ~%s each way.",
            (long long)q->arch.n_layers, nl_fmt_bytes(x->fsdp_gather / (double)q->arch.n_layers, b1, sizeof b1));
    }
    if (l->dp > 1)
        nl_report_note(r,
                       "Against plain DDP (one all-reduce of the gradients, %.3g ms): this layout's data-parallel "
                       "traffic is %.2fx.\nAn all-reduce is a reduce-scatter plus an all-gather, so ZeRO-1/2 "
                       "(reduce-scatter the gradients, all-gather\nthe updated weights) move exactly what DDP moves; "
                       "ZeRO-3/FSDP gathers the weights twice (forward and\nbackward) and reduce-scatters once: 3 x "
                       "(p-1)/p against 2 x (p-1)/p, 1.5x DDP.",
                       lp->ddp_step_s * 1e3, x->dp_traffic / lp->ddp_step_s);
    if (l->ep > 1)
        nl_report_note(
            r,
            "One MoE layer's forward compute (2 x %.3gM active parameters x %lld tokens at %.0f%% of peak): %.3g ms.",
            x->active_layer / 1e6, (long long)x->T, 100 * x->mfu, x->layer_fwd * 1e3);
    nl_report_note(r,
                   "Tensor parallelism of a (B x D)(D x F) matmul split along D over %g GPUs is compute-bound when\n"
                   "D > 2(p-1) P / W = %.0f (P = %.0f TFLOP/s, W = %.0f GB/s); %s has D = %lld.",
                   x->p2, x->tp_bound, x->peak / 1e12, q->hw.intra_bw * q->hw.intra_eff / 1e9, q->arch.name,
                   (long long)q->arch.dim);
}

static void report_layer(nl_report *r, const layer_args *l, int zero, const nl_train_req *q, const nl_layer_study *x) {
    const nl_layer_plan *lp = &x->lp;
    char a1[32];
    nl_report_str(r, "model", "", q->arch.name);
    nl_report_num(r, "params", "", x->N, NULL, NULL);
    nl_report_num(r, "tokens_per_gpu", "", x->T, NULL, NULL);
    nl_report_note(r,
                   "Collectives of %s (%s parameters) at dp %lld, tp %lld%s, pp %lld, ep %lld, %s; %lld tokens per GPU "
                   "per microbatch,\n%lld microbatch(es) per step; %s NVLink %.0f GB/s x %.2f, network %.0f GB/s x "
                   "%.2f, latency %.0f us.",
                   q->arch.name, nl_fmt_count(x->N, a1, sizeof a1), (long long)l->dp, (long long)l->tp,
                   l->sp ? "+sp" : "", (long long)l->pp, (long long)l->ep, nl_zero_name((nl_zero)zero), (long long)x->T,
                   (long long)l->micro, q->hw.name, q->hw.intra_bw / 1e9, q->hw.intra_eff, q->hw.inter_bw / 1e9,
                   q->hw.inter_eff, q->hw.latency_s * 1e6);
    report_collectives(r, lp);
    const struct {
        const char *key;
        double v;
    } v[] = {{"per_layer_forward_s", lp->per_layer_fwd_s},
             {"per_layer_backward_s", lp->per_layer_bwd_s},
             {"per_step_s", lp->per_step_s},
             {"dp_per_step_s", x->dp_traffic},
             {"ddp_allreduce_s", lp->ddp_step_s},
             {"compute_step_s", lp->compute_step_s},
             {"layer_forward_compute_s", x->layer_fwd},
             {"tp_compute_bound_dim", x->tp_bound}};
    for (int i = 0; i < 8; i++) nl_report_num(r, v[i].key, "", v[i].v, NULL, NULL);
    report_layer_notes(r, l, zero, q, x);
}

static int cmd_layer(int argc, char **argv) {
    layer_args l;
    int rc = layer_parse(&l, argc, argv);
    if (rc) return rc == NL_CLI_HELP ? NL_EXIT_OK : rc;
    int zero = NL_ZERO_0;
    if (l.zero && (zero = nl_zero_parse(l.zero)) < 0)
        return nl_cli_usage_error("plan layer: unknown --zero '%s' (0, 1, 2, 3, hsdp)", l.zero);
    nl_train_req q;
    if ((rc = nl_plan_args_request(&l.pa, "plan layer", &q))) return rc;
    nl_layer_study_req a = {l.dp, l.tp, l.pp, l.ep, l.micro, (nl_zero)zero, l.sp, l.tokens, l.pa.params};
    nl_layer_study x;
    if (nl_plan_layer_study(&q, &a, &x)) return nl_cli_fail("plan layer");
    nl_report *r = nl_report_new("plan layer");
    report_layer(r, &l, zero, &q, &x);
    return nl_report_print(r, l.json);
}

/* ---- plan serve ------------------------------------------------------------------------------ */

typedef struct serve_args {
    nl_plan_args pa;
    int json;
    nl_serve_req sq;
    nl_engine_plan_req eq; /* with --hw from `nanolm bench machine`: --weights, --kv, --max-step-tokens */
    int precision, engine_given;
} serve_args;

static int serve_parse(serve_args *s, int argc, char **argv) {
    nl_serve_req_default(&s->sq);
    nl_engine_plan_req_default(&s->eq);
    s->precision = s->engine_given = 0;
    nl_serve_req *q = &s->sq;
    nl_opt serve[] = {
        NL_OPT_INT("tp", &q->tp, 1, 1024, "N", "tensor-parallel GPUs (default 1)"),
        NL_OPT_SI("prompt", &q->prompt, 1, INFINITY, "P", "prompt tokens (default 2000)"),
        NL_OPT_SI("output", &q->output, 1, INFINITY, "O", "answer tokens (default 500)"),
        NL_OPT_INT("batch", &q->batch, 1, 1 << 20, "B", "concurrent sequences (default 32)"),
        NL_OPT_SI("context", &q->context, 1, INFINITY, "C", "decode context (default prompt + output/2)"),
        NL_OPT_SI("chunk", &q->chunk, 0, INFINITY, "K", "chunked-prefill tokens per step (default 256)"),
        NL_OPT_DBL("prefill-mfu", &q->prefill_mfu, 0.001, 1, "X", "share of peak in prefill (default: the GPU's)"),
        NL_OPT_CHOICE("precision", &s->precision, "bf16|fp16|fp8|int8",
                      "weights and KV cache (default bf16; int8 is weight-only, GEMMs stay bf16)"),
        NL_OPT_INT("fsdp", &q->fsdp, 1, 4096, "N", "weights sharded FSDP-style over N GPUs"),
        NL_OPT_CHOICE(
            "decode-attn", &q->decode_attn, "grouped|per-head",
            "a KV head's cache read once per step (default) or once per query head (TensorRT-LLM before XQA)"),
    };
    nl_opt engine[] = {
        NL_OPT_CHOICE("weights", &s->eq.weights, "fp32|bf16|int8", "the engine's weight format (default fp32)"),
        NL_OPT_CHOICE("kv", &s->eq.kv, "fp32|int8", "the engine's KV cache format (default fp32)"),
        NL_OPT_INT("max-step-tokens", &s->eq.max_step_tokens, 1, 1 << 20, "N",
                   "the engine's token budget per step (default 512)"),
    };
    for (int i = 0; i < 3; i++) engine[i].given = &s->engine_given;
    const nl_optgroup own[] = {{"serving", serve, NL_NOPTS(serve)},
                               {"this CPU's engine (with --hw from `nanolm bench machine --json`)", engine, 3}};
    plan_groups g;
    nl_optgroup groups[6];
    int ng = plan_groups_init(&g, &s->pa, &s->json, groups, own, 2);
    nl_cmdspec spec = {"plan serve",
                       "nanolm plan serve --model M [options]",
                       "Prefill, decode, TTFT/TPOT, chunked prefill and disaggregation on GPUs; with --hw cpu.json\n"
                       "(from `nanolm bench machine --json`) nanolm's own engine on this CPU.",
                       groups,
                       ng,
                       0};
    int rc = nl_cli_parse(&spec, argc, argv, NULL, NULL);
    if (rc) return rc;
    /* Weights and KV cache: bf16/fp16 (2 bytes), fp8 (1, GEMMs at the fp8 peak), int8 (1, weight-only). */
    q->weight_bytes = q->kv_bytes = s->precision < 2 ? 2 : 1;
    q->fp8 = s->precision == 2;
    return nl_plan_args_load(&s->pa, "plan serve");
}

/* plan serve against a CPU measured by `nanolm bench machine`: the engine's cost model. */
static int serve_engine(serve_args *s, const nl_cpu_rates *cpu) {
    nl_engine_plan_req eq = s->eq;
    if (!s->pa.model) return nl_cli_usage_error("plan serve: --model is required");
    if (nl_cli_model_arch(&s->pa.cat, s->pa.model, &eq.arch))
        return nl_cli_usage_error("plan serve: --model: %s", nl_last_error());
    eq.prompt = (int64_t)s->sq.prompt;
    eq.output = (int64_t)s->sq.output;
    eq.batch = s->sq.batch;
    eq.chunk = s->sq.chunk >= 0 ? (int64_t)s->sq.chunk : 256;
    return nl_cli_plan_serve_engine(cpu, &eq, s->json);
}

static void report_serve_table(nl_report *r, const nl_serve_req *sq, const nl_serve_plan *sp, double ctx) {
    const nl_hw *hw = &sq->hw;
    long long tp = (long long)sq->tp, batch = (long long)sq->batch;
    nl_report_table(r, NULL, NULL, 3,
                    (const nl_report_col[]){{NULL, "quantity", NULL}, {NULL, "value", NULL}, {NULL, "how", NULL}});
    nl_plan_table_rowf(r, 3, "prefill FLOPs|%.3g|2 x %.3gB matmul params x %.0f + causal attention", sp->prefill_flops,
                       sp->matmul_params / 1e9, sq->prompt);
    /* Every figure of the "how" column is a term of the value it explains (nl_serve_plan). */
    char how[256];
    int n = snprintf(how, sizeof how, "compute %.1f ms at %.0f%% of %.0f TFLOP/s (%s) x %lld GPUs",
                     sp->prefill_compute_s * 1e3, 100 * sp->prefill_eff, sp->prefill_peak / 1e12,
                     sq->fp8 ? "fp8" : "bf16", tp);
    if (sp->prefill_weight_s > sp->prefill_compute_s && n < (int)sizeof how)
        n += snprintf(how + n, sizeof how - (size_t)n, ", bound by the weight %s %.1f ms",
                      sp->fsdp_gather_s >= sp->prefill_weight_s ? "all-gathers" : "reads", sp->prefill_weight_s * 1e3);
    if (sp->prefill_comm_s > 0 && n < (int)sizeof how)
        n += snprintf(how + n, sizeof how - (size_t)n, " + TP %.1f ms", sp->prefill_comm_s * 1e3);
    if (n < (int)sizeof how) snprintf(how + n, sizeof how - (size_t)n, " + launches %.1f ms", sp->launch_s * 1e3);
    nl_plan_table_rowf(r, 3, "prefill = TTFT|%.1f ms|%s", sp->prefill_s * 1e3, how);
    nl_plan_table_rowf(r, 3, "KV cache per token|%.0f KiB|2 x layers x kv heads x head dim x %g bytes",
                       sp->kv_bytes_per_token / 1024, sq->kv_bytes);
    nl_plan_table_rowf(r, 3, "KV cache of the prompt|%.0f MB|to ship when prefill runs elsewhere",
                       sp->prompt_kv_bytes / 1e6);
    nl_plan_table_rowf(r, 3, "decode: weight reads|%.2f ms|%.1f GB / %lld GPUs / (%.2f TB/s x %.2f achieved)",
                       sp->weight_read_s * 1e3, sp->params * sq->weight_bytes / 1e9, tp, hw->hbm_bw / 1e12,
                       sq->hbm_eff);
    if (sq->fsdp > 1)
        nl_plan_table_rowf(r, 3, "decode: FSDP weight all-gathers|%.2f ms|%lld shards per layer, %.1fx the HBM read",
                           sp->fsdp_gather_s * 1e3, (long long)sq->fsdp, sp->fsdp_gather_s / sp->weight_read_s);
    if (sp->kv_reads_per_head > 1)
        nl_plan_table_rowf(
            r, 3,
            "decode: KV reads|%.2f ms|%lld x %.0f context x %.0f KiB x %g query heads per KV head / %lld "
            "GPUs' HBM (per-head kernel)",
            sp->kv_read_s * 1e3, batch, ctx, sp->kv_bytes_per_token / 1024, sp->kv_reads_per_head, tp);
    else
        nl_plan_table_rowf(r, 3, "decode: KV reads|%.2f ms|%lld x %.0f context x %.0f KiB / %g GPUs' HBM",
                           sp->kv_read_s * 1e3, batch, ctx, sp->kv_bytes_per_token / 1024,
                           (double)sq->tp / sp->kv_replication);
    nl_plan_table_rowf(r, 3, "decode: compute|%.2f ms|at %.0f%% of %.0f TFLOP/s: %s", sp->decode_compute_s * 1e3,
                       100 * (sq->prefill_mfu > 0 ? sq->prefill_mfu
                              : hw->gemm_eff > 0  ? hw->gemm_eff
                                                  : 0.6),
                       sp->prefill_peak / 1e12,
                       sp->decode_compute_s < sp->decode_mem_s ? "memory bound" : "compute bound");
    if (tp > 1) {
        nl_plan_table_rowf(r, 3, "decode step before TP comm|%.2f ms|weights and KV split over %lld GPUs",
                           sp->decode_step_s * 1e3, tp);
        nl_plan_table_rowf(r, 3, "TP all-reduces per step|%.0f x %.0f KiB|2 per layer, B x D x 2 bytes",
                           sp->tp_allreduces, sp->tp_allreduce_bytes / 1024);
        nl_plan_table_rowf(r, 3, "TP communication|%.2f ms|of which launch latency %.2f ms", sp->tp_comm_s * 1e3,
                           sp->tp_comm_latency_s * 1e3);
    }
    nl_plan_table_rowf(r, 3, "decode step = TPOT|%.2f ms|weights %.2f ms (%s) + KV %.2f ms%s + launches %.2f ms",
                       sp->decode_step_total_s * 1e3, sp->decode_weight_s * 1e3,
                       sp->decode_weight_s > fmax(sp->weight_read_s, sp->fsdp_gather_s) ? "GEMMs compute bound"
                       : sp->fsdp_gather_s > sp->weight_read_s                          ? "FSDP all-gathers"
                                                                                        : "HBM reads",
                       sp->decode_kv_s * 1e3, tp > 1 ? " + TP comm" : "", sp->launch_s * 1e3);
    nl_plan_table_rowf(r, 3, "one prefill stalls decode|%.1f steps|prefill / step", sp->stall_steps);
    nl_plan_table_rowf(r, 3,
                       "chunk of %.0f + %lld decode tokens|%.2f ms|matmul compute at peak vs %.2f ms of weight reads",
                       sq->chunk, batch, sp->chunk_compute_s * 1e3, sp->weight_read_s * 1e3);
    nl_plan_table_rowf(r, 3, "prompt tokens free per step|%.0f|until compute reaches the step's memory time",
                       sp->chunk_free_tokens);
    nl_plan_table_rowf(r, 3, "prefill group throughput|%.1f req/s|1 / TTFT", sp->prefill_rps);
    nl_plan_table_rowf(r, 3, "decode group throughput|%.1f req/s|B / (answer x step)", sp->decode_rps);
    nl_plan_table_rowf(r, 3, "decode groups per prefill group|%.2f|disaggregated pools (DistServe, Splitwise)",
                       sp->decode_per_prefill);
    nl_plan_table_rowf(r, 3, "memory per GPU|%.1f GB|weights %.1f + KV %.1f (%s)", sp->mem_total / 1e9,
                       sp->mem_weights / 1e9, sp->mem_kv / 1e9, sp->fits ? "fits" : "does NOT fit");
}

static void report_serve(nl_report *r, const nl_serve_req *sq, const nl_serve_plan *sp) {
    double ctx = sq->context > 0 ? sq->context : sq->prompt + sq->output / 2;
    char a1[32];
    nl_report_str(r, "model", "", sq->arch.name);
    nl_report_str(r, "gpu", "", sq->hw.name);
    nl_report_int(r, "tp", "", sq->tp, NULL);
    nl_report_int(r, "batch", "", sq->batch, NULL);
    nl_report_num(r, "prompt", "", sq->prompt, NULL, NULL);
    nl_report_num(r, "output", "", sq->output, NULL, NULL);
    nl_report_num(r, "context", "", ctx, NULL, NULL);
#define F(k) nl_report_num(r, #k, "", sp->k, NULL, NULL)
    F(params), F(matmul_params), F(prefill_flops), F(prefill_s), F(kv_bytes_per_token), F(prompt_kv_bytes);
    F(weight_read_s), F(kv_read_s), F(decode_compute_s), F(decode_mem_s), F(decode_step_s), F(tp_allreduces);
    F(tp_allreduce_bytes), F(tp_comm_s), F(tp_comm_latency_s), F(decode_step_total_s), F(ttft_s), F(tpot_s);
    F(batch_prefill_s), F(batch_prefill_comm_s), F(stall_steps), F(chunk_compute_s), F(chunk_free_tokens),
        F(prefill_rps), F(decode_rps), F(decode_per_prefill);
    F(mem_weights), F(mem_kv), F(mem_total), F(fsdp_gather_s), F(prefill_compute_s), F(prefill_weight_s);
    F(prefill_comm_s), F(launch_s), F(prefill_eff), F(prefill_peak), F(decode_weight_s), F(decode_kv_s);
    F(kv_reads_per_head);
#undef F
    nl_report_bool(r, "fits", "", sp->fits);
    nl_report_note(
        r, "Serving %s (%s parameters) on %lld x %s: prompt %.0f, answer %.0f tokens, %lld concurrent sequences.",
        sq->arch.name, nl_fmt_count(sp->params, a1, sizeof a1), (long long)sq->tp, sq->hw.name, sq->prompt, sq->output,
        (long long)sq->batch);
    report_serve_table(r, sq, sp, ctx);
}

static int cmd_serve(int argc, char **argv) {
    serve_args s;
    int rc = serve_parse(&s, argc, argv);
    if (rc) return rc == NL_CLI_HELP ? NL_EXIT_OK : rc;
    nl_plan_args *pa = &s.pa;
    const char *hw_path = pa->hw_files.n ? pa->hw_files.v[pa->hw_files.n - 1] : NULL;
    nl_cpu_rates cpu;
    nl_status cpu_rc = hw_path ? nl_cpu_rates_load(hw_path, pa->gpu_given ? pa->gpu : NULL, &cpu) : NL_ERR_INVALID;
    if (cpu_rc && cpu_rc != NL_ERR_INVALID) return nl_cli_fail("plan serve: --hw");
    if (!cpu_rc) return serve_engine(&s, &cpu);
    if (s.engine_given)
        return nl_cli_usage_error(
            "plan serve: --weights, --kv and --max-step-tokens need a --hw file written by `nanolm bench machine`");
    nl_train_req q;
    if ((rc = nl_plan_args_request(pa, "plan serve", &q))) return rc;
    nl_serve_req *sq = &s.sq;
    sq->arch = q.arch;
    sq->hw = q.hw;
    sq->fam = q.fam;
    nl_plan_assume_serve(&pa->as, sq);
    nl_serve_plan sp;
    if (nl_plan_serve(sq, &sp)) return nl_cli_fail("plan serve");
    nl_report *r = nl_report_new("plan serve");
    report_serve(r, sq, &sp);
    return nl_report_print(r, s.json);
}

/* ---- plan catalog ---------------------------------------------------------------------------- */

static void report_catalog_gpus(nl_report *r, const nl_catalog *cat) {
    nl_report_table(r, "gpus", NULL, 24,
                    (const nl_report_col[]){{"name", "gpu", NULL},          {NULL, "bf16 TFLOP/s", "%-.0f"},
                                            {NULL, "fp8 TFLOP/s", "%-.0f"}, {NULL, "HBM GB", "%-.0f"},
                                            {NULL, "HBM TB/s", "%-.2f"},    {NULL, "NVLink GB/s", "%-.0f"},
                                            {NULL, "net GB/s", "%-.0f"},    {NULL, "node", "%-.0f"},
                                            {NULL, "NICs", NULL},           {NULL, "$/h", "%-.2f"},
                                            {"flops_bf16", "", NULL},       {"flops_fp8", "", NULL},
                                            {"mem_bytes", "", NULL},        {"hbm_bw", "", NULL},
                                            {"intra_bw", "", NULL},         {"inter_bw", "", NULL},
                                            {"gpus_per_node", "", NULL},    {"latency_s", "", NULL},
                                            {"intra_eff", "", NULL},        {"inter_eff", "", NULL},
                                            {"price_per_hour", "", NULL},   {"nics_per_node", "", NULL},
                                            {"nic_bw", "", NULL},           {"source", "source", NULL}});
    for (size_t i = 0; i < cat->n_hw; i++) {
        const nl_hw *h = &cat->hw[i];
        char nics[32] = "-";
        if (h->nics_per_node > 0)
            snprintf(nics, sizeof nics, "%lldx%.0f Gb/s", (long long)h->nics_per_node, h->nic_bw * 8 / 1e9);
        nl_report_cell_str(r, h->name);
        const double text[] = {h->flops_bf16 / 1e12, h->flops_fp8 / 1e12, h->mem_bytes / 1e9,      h->hbm_bw / 1e12,
                               h->intra_bw / 1e9,    h->inter_bw / 1e9,   (double)h->gpus_per_node};
        for (int k = 0; k < 7; k++) nl_report_cell_num(r, text[k]);
        nl_report_cell_str(r, nics);
        nl_report_cell_num(r, h->price_per_hour);
        const double json[] = {h->flops_bf16,
                               h->flops_fp8,
                               h->mem_bytes,
                               h->hbm_bw,
                               h->intra_bw,
                               h->inter_bw,
                               (double)h->gpus_per_node,
                               h->latency_s,
                               h->intra_eff,
                               h->inter_eff,
                               h->price_per_hour,
                               (double)h->nics_per_node,
                               h->nic_bw};
        for (int k = 0; k < 13; k++) nl_report_cell_num(r, json[k]);
        nl_report_cell_str(r, h->source);
        nl_report_row_end(r);
    }
}

static void report_catalog_models(nl_report *r, const nl_catalog *cat) {
    nl_report_table(r, "models", NULL, 18,
                    (const nl_report_col[]){{"name", "model", NULL},
                                            {NULL, "params", NULL},
                                            {NULL, "active", NULL},
                                            {"params", "", NULL},
                                            {"params_active", "", NULL},
                                            {"params_non_embedding", "", NULL},
                                            {"dim", "D", "%-.0f"},
                                            {"n_layers", "layers", "%-.0f"},
                                            {NULL, "heads/kv", NULL},
                                            {"n_heads", "", NULL},
                                            {"n_kv_heads", "", NULL},
                                            {"hidden_dim", "F", "%-.0f"},
                                            {"vocab_size", "vocab", "%-.0f"},
                                            {"seq_len", "", NULL},
                                            {"n_experts", "", NULL},
                                            {"top_k", "", NULL},
                                            {NULL, "experts", NULL},
                                            {"source", "source", NULL}});
    for (size_t i = 0; i < cat->n_models; i++) {
        const nl_arch *a = &cat->models[i].arch;
        nl_arch_params p;
        nl_family fam;
        nl_catalog_family(cat, a->name, &fam);
        nl_plan_count_params(a, &fam, &p);
        char n1[32], n2[32], hk[48], ex[48] = "-";
        if (a->n_experts)
            snprintf(ex, sizeof ex, "%lld+%lld top-%lld F=%lld", (long long)a->n_experts,
                     (long long)a->n_shared_experts, (long long)a->top_k, (long long)a->expert_hidden_dim);
        snprintf(hk, sizeof hk, "%lld/%lld", (long long)a->n_heads, (long long)a->n_kv_heads);
        nl_report_cell_str(r, a->name);
        nl_report_cell_str(r, nl_fmt_count((double)p.total, n1, sizeof n1));
        nl_report_cell_str(r, nl_fmt_count((double)p.active, n2, sizeof n2));
        const double v1[] = {(double)p.total, (double)p.active, (double)p.non_embedding, (double)a->dim,
                             (double)a->n_layers};
        for (int k = 0; k < 5; k++) nl_report_cell_num(r, v1[k]);
        nl_report_cell_str(r, hk);
        const double v2[] = {(double)a->n_heads, (double)a->n_kv_heads, (double)a->hidden_dim, (double)a->vocab_size,
                             (double)a->seq_len, (double)a->n_experts,  (double)a->top_k};
        for (int k = 0; k < 7; k++) nl_report_cell_num(r, v2[k]);
        nl_report_cell_str(r, ex);
        nl_report_cell_str(r, cat->models[i].source);
        nl_report_row_end(r);
    }
}

static int cmd_catalog(int argc, char **argv) {
    nl_plan_args pa;
    int json = 0;
    nl_plan_args_init(&pa);
    nl_opt model[3], hw[3];
    nl_plan_model_opts(model, &pa);
    nl_plan_hw_opts(hw, &pa, 0);
    nl_opt opts[] = {hw[1], model[2], NL_OPT_FLAG("json", &json, "print the catalog as JSON")};
    nl_optgroup groups[] = {{NULL, opts, NL_NOPTS(opts)}};
    nl_cmdspec spec = {"plan catalog",
                       "nanolm plan catalog [--hw FILE.json] [--model-file FILE.json] [--json]",
                       "The GPUs and model shapes the planner knows, with their sources.",
                       groups,
                       1,
                       0};
    int rc = nl_cli_parse(&spec, argc, argv, NULL, NULL);
    if (rc) return rc == NL_CLI_HELP ? NL_EXIT_OK : rc;
    if ((rc = nl_plan_args_load(&pa, "plan catalog"))) return rc;
    nl_report *r = nl_report_new("plan catalog");
    report_catalog_gpus(r, &pa.cat);
    report_catalog_models(r, &pa.cat);
    return nl_report_print(r, json);
}

/* ---- plan pipeline --------------------------------------------------------------------------- */

static int cmd_pipeline(int argc, char **argv) {
    int64_t p = 4, m = 8;
    const char *svg = NULL;
    int json = 0;
    nl_opt opts[] = {
        NL_OPT_INT("stages", &p, 1, 64, "P", "pipeline stages (default 4)"),
        nl_opt_aliased((nl_opt)NL_OPT_INT("microbatches", &m, 1, 256, "M", "microbatches per step (default 8)"),
                       "micro"),
        NL_OPT_STR("svg", &svg, "FILE", "GPipe and 1F1B timelines"),
        NL_OPT_FLAG("json", &json, "print the result as JSON"),
    };
    nl_optgroup groups[] = {{NULL, opts, NL_NOPTS(opts)}};
    nl_cmdspec spec = {"plan pipeline",
                       "nanolm plan pipeline --stages P --microbatches M [--svg FILE] [--json]",
                       "The pipeline bubble and the activations in flight for GPipe and 1F1B.",
                       groups,
                       1,
                       0};
    int rc = nl_cli_parse(&spec, argc, argv, NULL, NULL);
    if (rc) return rc == NL_CLI_HELP ? NL_EXIT_OK : rc;
    double bubble = (double)(p - 1) / (double)(m + p - 1);
    int64_t inflight = p < m ? p : m;
    if (svg && nl_plan_svg_pipeline(svg, p, m)) return nl_cli_fail("--svg");
    nl_report *r = nl_report_new("plan pipeline");
    nl_report_int(r, "stages", "", p, NULL);
    nl_report_int(r, "microbatches", "", m, NULL);
    nl_report_num(r, "bubble", "", bubble, NULL, NULL);
    nl_report_int(r, "inflight_gpipe", "", m, NULL);
    nl_report_int(r, "inflight_1f1b", "", inflight, NULL);
    nl_report_note(r,
                   "%lld stages, %lld microbatches: bubble (p-1)/(m+p-1) = %lld/%lld = %.1f%% for GPipe and 1F1B "
                   "alike\n(Huang et al. 2019; Narayanan et al. 2021); interleaving v chunks per GPU divides it by v.\n"
                   "Activations in flight on the first stage: GPipe %lld microbatches, 1F1B %lld.",
                   (long long)p, (long long)m, (long long)(p - 1), (long long)(m + p - 1), 100 * bubble, (long long)m,
                   (long long)inflight);
    if (svg) nl_report_note(r, "timelines written to %s", svg);
    return nl_report_print(r, json);
}

/* ---- plan validate --------------------------------------------------------------------------- */

int nl_cmd_budget(int argc, char **argv);
int nl_cmd_plan(int argc, char **argv);

char *nl_cli_validate_run(const char *command, int *status, void *ctx) {
    (void)ctx;
    char line[1024], *argv[128];
    int argc = 0;
    if (snprintf(line, sizeof line, "%s", command) >= (int)sizeof line) return NULL;
    for (char *t = strtok(line, " "); t && argc < 127; t = strtok(NULL, " ")) argv[argc++] = t;
    argv[argc] = NULL;
    if (argc < 1 || (strcmp(argv[0], "plan") && strcmp(argv[0], "budget"))) return NULL;
    return nl_capture_run(!strcmp(argv[0], "plan") ? nl_cmd_plan : nl_cmd_budget, argc, argv, status);
}

static void report_validate_cases(nl_report *r, const nl_valid_result *v) {
    nl_report_table(r, "cases", NULL, 18,
                    (const nl_report_col[]){{"group", "group", NULL},
                                            {"id", "case", NULL},
                                            {"source_id", "source", NULL},
                                            {"metric", "metric", NULL},
                                            {"unit", "", NULL},
                                            {"source", "", NULL},
                                            {"command", "", NULL},
                                            {"published", "published", "%-.4g"},
                                            {"predicted", "predicted", "%-.4g"},
                                            {NULL, "error", "%-+.1f%%"},
                                            {"error", "", NULL},
                                            {"predicted_holdout", "", NULL},
                                            {NULL, "LOSO error", "%-+.1f%%"},
                                            {"error_holdout", "", NULL},
                                            {"gemm_eff_holdout", "", NULL},
                                            {NULL, "fits", NULL},
                                            {"fits", "", NULL},
                                            {"formula", "", NULL}});
    for (size_t i = 0; i < v->n; i++) {
        const nl_valid_case *x = &v->cases[i];
        const char *s[] = {x->group, x->id, x->source_id, x->metric, x->unit, x->source, x->command};
        for (int k = 0; k < 7; k++) nl_report_cell_str(r, s[k]);
        nl_report_cell_num(r, x->published);
        nl_report_cell_num(r, x->predicted);
        nl_report_cell_num(r, 100 * x->err);
        nl_report_cell_num(r, x->err);
        nl_report_cell_num(r, x->predicted_holdout);
        nl_report_cell_num(r, 100 * x->err_holdout);
        nl_report_cell_num(r, x->err_holdout);
        nl_report_cell_num(r, x->gemm_eff_holdout);
        nl_report_cell_str(r, x->fits < 0 ? "" : x->fits ? "yes" : "NO");
        if (x->fits < 0)
            nl_report_cell_str(r, NULL); /* serving cases: no layout to fit */
        else
            nl_report_cell_bool(r, x->fits);
        nl_report_cell_bool(r, x->formula);
        nl_report_row_end(r);
    }
}

static void report_groups(nl_report *r, const char *key, const nl_valid_group *g) {
    nl_report_table(r, key, NULL, 7,
                    (const nl_report_col[]){{"group", "", NULL},
                                            {"n", "", NULL},
                                            {"median_abs_error", "", NULL},
                                            {"worst_abs_error", "", NULL},
                                            {"worst", "", NULL},
                                            {"n_formula", "", NULL},
                                            {"worst_formula_abs_error", "", NULL}});
    for (int k = 0; k < 4; k++) {
        const nl_valid_group *G = &g[k];
        nl_report_cell_str(r, G->group);
        nl_report_cell_int(r, G->n);
        nl_report_cell_num(r, G->median_abs);
        nl_report_cell_num(r, G->worst_abs);
        nl_report_cell_str(r, G->worst_id);
        nl_report_cell_int(r, G->n_formula);
        nl_report_cell_num(r, G->worst_formula_abs);
        nl_report_row_end(r);
    }
}

static void summary_notes(nl_report *r, const char *title, const nl_valid_group *g) {
    nl_report_note(r, "%s", title);
    for (int k = 0; k < 4; k++) {
        const nl_valid_group *G = &g[k];
        char f[96] = "";
        if (!G->n) {
            nl_report_note(r, "  %-10s no cases", G->group);
            continue;
        }
        if (G->n_formula)
            snprintf(f, sizeof f, "; %d spelled-out accounting cases, worst %.2f%%", G->n_formula,
                     100 * G->worst_formula_abs);
        nl_report_note(r, "  %-10s %2d cases  median %5.1f%%  worst %5.1f%% (%s)%s", G->group, G->n,
                       100 * G->median_abs, 100 * G->worst_abs, G->worst_id, f);
    }
}

static void report_validate(nl_report *r, const nl_valid_result *v, const char *file) {
    report_validate_cases(r, v);
    report_groups(r, "groups", v->groups);
    if (v->has_holdout) {
        report_groups(r, "groups_holdout", v->holdout);
        nl_report_table(r, "constants", NULL, 6,
                        (const nl_report_col[]){{"name", "", NULL},
                                                {"gpus", "", NULL},
                                                {"catalog", "", NULL},
                                                {"fit_all", "", NULL},
                                                {"n_cases", "", NULL},
                                                {"sources", "", NULL}});
        for (int k = 0; k < NL_VALID_CONSTS; k++) {
            const nl_valid_const *K = &v->consts[k];
            nl_report_cell_str(r, K->name);
            nl_report_cell_str(r, K->gpus);
            nl_report_cell_num(r, K->catalog);
            nl_report_cell_num(r, K->fit_all);
            nl_report_cell_int(r, K->n_cases);
            nl_report_cell_str(r, K->sources);
            nl_report_row_end(r);
        }
    }
    nl_report_int(r, "published_layouts_rejected", "", v->n_nofit, NULL);
    nl_report_note(r, "%s", "");
    summary_notes(r, "In sample (the catalog's constants; |error| = |predicted / published - 1|):", v->groups);
    if (v->has_holdout) {
        nl_report_note(r, "%s", "");
        summary_notes(
            r, "Leave-one-source-out (each case priced with the constants refit without its source):", v->holdout);
        nl_report_note(r, "Calibrated constants (median |error| of the training and serving cases, grid 0.40..0.90):");
        for (int k = 0; k < NL_VALID_CONSTS; k++) {
            const nl_valid_const *K = &v->consts[k];
            nl_report_note(r, "  %-16s %-20s catalog %.2f, fit on all %.2f, %d cases from %s", K->name, K->gpus,
                           K->catalog, K->fit_all, K->n_cases, K->sources);
        }
    }
    nl_report_note(r, "  published training layouts the planner rejects as not fitting: %d", v->n_nofit);
    nl_report_note(r, "Each case is its \"command\" in %s (--json prints them); sources likewise.", file);
}

/* nanolm plan validate: the planner against published runs, through the commands users run. */
static int cmd_validate(int argc, char **argv) {
    const char *file = NULL, *svg = NULL, *hold = NULL;
    int json = 0;
    nl_opt opts[] = {
        NL_OPT_STR("file", &file, "FILE.json", "the published figures (default tests/validation/published.json)"),
        NL_OPT_STR("holdout", &hold, "source",
                   "also refit the calibrated constants leaving out one source at a time and report each case's "
                   "leave-one-source-out error"),
        NL_OPT_FLAG("json", &json, "print every case and group as JSON"),
        NL_OPT_STR("svg", &svg, "FILE", "predicted against published, one point per case"),
    };
    nl_optgroup groups[] = {{NULL, opts, NL_NOPTS(opts)}};
    nl_cmdspec spec = {
        "plan validate",
        "nanolm plan validate [--file FILE.json] [--holdout source] [--json] [--svg FILE]",
        "Runs every case's command (plan train, plan serve, budget) of tests/validation/published.json "
        "and\ncompares its figure with the published one; with --holdout source, also leave-one-source-out.",
        groups,
        1,
        0};
    int rc = nl_cli_parse(&spec, argc, argv, NULL, NULL);
    if (rc) return rc == NL_CLI_HELP ? NL_EXIT_OK : rc;
    if (hold && strcmp(hold, "source"))
        return nl_cli_usage_error("plan validate: --holdout takes 'source' (leave one source out), got '%s'", hold);
    char def[4096];
    if (!file && !(file = nl_plan_validate_default_file(def, sizeof def)))
        return nl_cli_usage_error("plan validate: tests/validation/published.json is not in this directory; "
                                  "run from the repository root or give --file FILE.json");
    nl_catalog *cat = malloc(sizeof *cat);
    if (!cat) return nl_cli_usage_error("plan validate: out of memory");
    nl_catalog_init(cat);
    nl_valid_result v;
    nl_status st = nl_plan_validate(cat, file, nl_cli_validate_run, NULL, hold != NULL, &v);
    free(cat);
    if (st) return nl_cli_fail("plan validate");
    if (svg && nl_plan_svg_validate(svg, &v)) {
        nl_plan_validate_free(&v);
        return nl_cli_fail("--svg");
    }
    nl_report *r = nl_report_new("plan validate");
    report_validate(r, &v, file);
    nl_plan_validate_free(&v);
    return nl_report_print(r, json);
}

int nl_cmd_plan(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? NL_EXIT_USAGE : NL_EXIT_OK;
    }
    const char *sub = argv[1];
    if (!strcmp(sub, "catalog")) return cmd_catalog(argc - 1, argv + 1);
    if (!strcmp(sub, "train")) return cmd_train(argc - 1, argv + 1);
    if (!strcmp(sub, "layer")) return cmd_layer(argc - 1, argv + 1);
    if (!strcmp(sub, "serve")) return cmd_serve(argc - 1, argv + 1);
    if (!strcmp(sub, "pipeline")) return cmd_pipeline(argc - 1, argv + 1);
    if (!strcmp(sub, "validate")) return cmd_validate(argc - 1, argv + 1);
    return nl_cli_usage_error("plan: unknown subcommand '%s' (catalog, train, layer, serve, pipeline, validate)", sub);
}

/* nanolm budget: memory of training state (by recipe and ZeRO stage) and of activations. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "cli_opt.h"
#include "nanolm/budget.h"
#include "plan_opts.h"
#include "report.h"

/* The command line: the shared model and hardware groups, then the layout and the batch. */
typedef struct budget_args {
    nl_plan_args pa;
    nl_budget_layout L;
    const char *zero, *recompute, *svg;
    int json;
} budget_args;

/* What the command computes before writing anything (nanolm/budget.h), and the ZeRO stage asked for. */
typedef struct budget {
    nl_budget m;
    int zero;
} budget;

static int parse_args(budget_args *b, int argc, char **argv) {
    memset(b, 0, sizeof *b);
    nl_plan_args_init(&b->pa);
    b->L.gpus = b->L.tp = b->L.pp = b->L.ep = b->L.batch = 1;
    nl_opt model[3], hw[3];
    nl_plan_model_opts(model, &b->pa);
    nl_plan_hw_opts(hw, &b->pa, 1);
    nl_opt layout[] = {
        NL_OPT_INT("gpus", &b->L.gpus, 1, 1 << 24, "N", "GPUs in all (default 1)"),
        NL_OPT_INT("tp", &b->L.tp, 1, 1024, "T", "tensor-parallel degree (default 1)"),
        NL_OPT_INT("pp", &b->L.pp, 1, 1024, "P", "pipeline stages (default 1)"),
        NL_OPT_INT("ep", &b->L.ep, 1, 4096, "E", "expert-parallel degree; needs a --model with experts (default 1)"),
        NL_OPT_STR("zero", &b->zero, "0|1|2|3|hsdp", "only this ZeRO stage (default: every stage that shards)"),
        NL_OPT_FLAG("sp", &b->L.sp, "sequence parallelism with --tp"),
    };
    nl_opt batch[] = {
        NL_OPT_INT("batch", &b->L.batch, 1, 1 << 24, "B", "sequences per micro-batch for the activations (default 1)"),
        NL_OPT_INT("seq", &b->L.seq, 1, 1 << 24, "S", "tokens per sequence (default: the model's context)"),
        NL_OPT_STR("recompute", &b->recompute, "none|selective|full", "activation recomputation (default none)"),
        NL_OPT_FLAG("no-flash", &b->L.no_flash, "attention that materialises the scores"),
        nl_opt_aliased((nl_opt)NL_OPT_INT("microbatches", &b->L.micro, 1, 1 << 20, "M",
                                          "microbatches in a pipeline (default 2 x pp)"),
                       "micro"),
        NL_OPT_STR("svg", &b->svg, "FILE", "memory bars per ZeRO stage"),
        NL_OPT_FLAG("json", &b->json, "print the result as JSON"),
    };
    nl_optgroup groups[] = {{"model", model, 3},
                            {"hardware", hw, 3},
                            {"layout", layout, NL_NOPTS(layout)},
                            {"batch and output", batch, NL_NOPTS(batch)}};
    nl_cmdspec spec = {"budget",
                       "nanolm budget (--model M | --params N) [options]",
                       "Training state per GPU for every ZeRO stage (or the one given), the parameters one GPU\n"
                       "holds under tp/pp/ep, and with --model the activations kept for backward, term by term\n"
                       "(Korthikanti et al. 2022 adapted to RMSNorm, GQA, SwiGLU), for --batch sequences of --seq\n"
                       "tokens, beside Korthikanti's published formula and recomputation. GB = 1e9 bytes, GiB = 2^30.",
                       groups,
                       NL_NOPTS(groups),
                       0};
    int rc = nl_cli_parse(&spec, argc, argv, NULL, NULL);
    if (rc) return rc;
    return nl_plan_args_load(&b->pa, "budget");
}

/* Resolves the names and checks the layout; fills everything but the per-stage figures. */
static int setup(budget_args *ba, budget *b) {
    nl_plan_args *pa = &ba->pa;
    memset(b, 0, sizeof *b);
    nl_budget *m = &b->m;
    b->zero = -1;
    if (ba->zero && (b->zero = nl_zero_parse(ba->zero)) < 0)
        return nl_cli_usage_error("budget: unknown --zero '%s' (0, 1, 2, 3, hsdp)", ba->zero);
    ba->L.recompute = NL_RECOMPUTE_NONE;
    if (ba->recompute && (ba->L.recompute = nl_recompute_parse(ba->recompute)) < 0)
        return nl_cli_usage_error("budget: unknown --recompute '%s' (none, selective, full)", ba->recompute);
    if (!pa->model && !(pa->params > 0)) return nl_cli_usage_error("budget: give --model NAME or --params N");
    if (nl_plan_recipe(pa->recipe, &m->rec)) return nl_cli_usage_error("budget: --recipe: %s", nl_last_error());
    if (nl_catalog_find_hw(&pa->cat, pa->gpu, &m->hw)) return nl_cli_usage_error("budget: --gpu: %s", nl_last_error());
    m->has_model = pa->model != NULL;
    nl_plan_family("llama", &m->fam);
    if (m->has_model && nl_cli_model_arch_fam(&pa->cat, pa->model, &m->a, &m->fam))
        return nl_cli_usage_error("budget: --model: %s", nl_last_error());
    if (nl_budget_count(&ba->L, pa->params, m)) return nl_cli_usage_error("budget: %s", nl_last_error());
    if (ba->L.seq == 0 && m->has_model) ba->L.seq = m->a.seq_len;
    return 0;
}

static void report_params(nl_report *r, const budget_args *ba, const budget *b) {
    const nl_recipe *rec = &b->m.rec;
    double per_param = rec->weight_bytes + rec->grad_bytes + rec->optim_bytes;
    char a1[32], a2[32], a3[32], a4[32], a5[32], a6[32];
    nl_report_str(r, "recipe", "", rec->name);
    nl_report_num(r, "params", "", b->m.total, NULL, NULL);
    nl_report_num(r, "params_non_embedding", "", b->m.nonemb, NULL, NULL);
    nl_report_num(r, "params_active", "", b->m.active, NULL, NULL);
    nl_report_num(r, "params_active_non_embedding", "", b->m.active - (b->m.total - b->m.nonemb), NULL, NULL);
    nl_report_num(r, "params_per_gpu", "", b->m.per_gpu, NULL, NULL);
    nl_report_num(r, "params_per_gpu_non_embedding", "", b->m.per_gpu_ne, NULL, NULL);
    nl_report_num(r, "state_bytes_total", "", b->m.total * per_param, NULL, NULL);
    nl_report_note(r, "Parameters%s%s: %s total (%s without embeddings), %s active per token (%s without embeddings).",
                   b->m.has_model ? " of " : "", b->m.has_model ? b->m.a.name : "",
                   nl_fmt_count(b->m.total, a1, sizeof a1), nl_fmt_count(b->m.nonemb, a2, sizeof a2),
                   nl_fmt_count(b->m.active, a3, sizeof a3),
                   nl_fmt_count(b->m.active - (b->m.total - b->m.nonemb), a6, sizeof a6));
    nl_report_note(r,
                   "One GPU at tp %lld, pp %lld, ep %lld holds %s parameters (%s without embeddings) = %.2f GB of %s "
                   "weights (%.2f GB).",
                   (long long)ba->L.tp, (long long)ba->L.pp, (long long)ba->L.ep,
                   nl_fmt_count(b->m.per_gpu, a4, sizeof a4), nl_fmt_count(b->m.per_gpu_ne, a5, sizeof a5),
                   b->m.per_gpu * rec->weight_bytes / 1e9, rec->name, b->m.per_gpu_ne * rec->weight_bytes / 1e9);
    nl_report_note(r, "Training state (%s: %g + %g + %g = %g bytes/param; %s): %.3g TB in all.", rec->name,
                   rec->weight_bytes, rec->grad_bytes, rec->optim_bytes, per_param, rec->source,
                   b->m.total * per_param / 1e12);
}

static void report_stages(nl_report *r, const budget_args *ba, const budget *b) {
    char title[256];
    snprintf(title, sizeof title,
             "State per GPU by ZeRO stage (Rajbhandari et al. 2020; hsdp shards over %lld GPUs of a node),\n"
             "before activations, against %s's %.0f GB:",
             (long long)b->m.shard, b->m.hw.name, b->m.hw.mem_bytes / 1e9);
    nl_report_table(r, "stages", title, 9,
                    (const nl_report_col[]){{"stage", "stage", NULL},
                                            {"dp", "dp", "%-.0f"},
                                            {NULL, "weights", "%-.3g"},
                                            {NULL, "grads", "%-.3g"},
                                            {NULL, "optimizer", "%-.3g"},
                                            {"bytes_per_param", "bytes/param", "%-.3g"},
                                            {"bytes_per_gpu", "", NULL},
                                            {NULL, "GB per GPU", "%-.2f"},
                                            {"fits", "fits ", NULL}});
    for (int z = 0; z <= 4; z++) {
        if (b->zero >= 0 && z != b->zero) continue;
        if (b->zero < 0 && z == NL_ZERO_HSDP && b->m.dp <= b->m.shard) continue;
        if (b->zero < 0 && z > 0 && b->m.dp == 1) continue; /* nothing to shard over */
        nl_state_bytes sd;
        double bytes = nl_budget_stage_bytes(&ba->L, &b->m, z, &sd);
        nl_report_cell_str(r, nl_zero_name((nl_zero)z));
        nl_report_cell_num(r, (double)b->m.dp);
        nl_report_cell_num(r, sd.weights);
        nl_report_cell_num(r, sd.grads);
        nl_report_cell_num(r, sd.optim);
        nl_report_cell_num(r, bytes / b->m.per_gpu);
        nl_report_cell_num(r, bytes);
        nl_report_cell_num(r, bytes / 1e9);
        nl_report_cell_bool(r, bytes <= b->m.hw.mem_bytes);
        nl_report_row_end(r);
    }
}

typedef nl_budget_act budget_act;

/* The term-by-term table: JSON rows under "terms", the text table with its total row. */
static void report_terms(nl_report *r, const budget_args *ba, const budget *b, const budget_act *x) {
    const double gib = 1024.0 * 1024 * 1024, D = (double)b->m.a.dim, per = x->tokens * x->layers;
    nl_report_table(
        r, "terms", NULL, 3,
        (const nl_report_col[]){{"tensor", "", NULL}, {"bytes_per_token_layer", "", NULL}, {"bytes", "", NULL}});
    for (int i = 0; i < x->al.n; i++) {
        nl_report_cell_str(r, x->al.terms[i].name);
        nl_report_cell_num(r, x->al.terms[i].bytes);
        nl_report_cell_num(r, x->al.terms[i].bytes * per);
        nl_report_row_end(r);
    }
    char title[512];
    snprintf(title, sizeof title,
             "Activations kept for backward: %lld x %lld tokens, %g layers%s, bf16, %s attention, recompute %s,\n"
             "tp %lld%s. Per token per layer (Korthikanti et al. 2022 sec. 4 walk, Llama layer):",
             (long long)ba->L.batch, (long long)ba->L.seq, x->layers, ba->L.pp > 1 ? " (one stage)" : "",
             ba->L.no_flash ? "plain" : "flash", nl_recompute_name((nl_recompute)ba->L.recompute), (long long)ba->L.tp,
             ba->L.sp ? " + sequence parallel" : "");
    nl_report_table(r, NULL, title, 4,
                    (const nl_report_col[]){{NULL, "tensor", NULL},
                                            {NULL, "bytes/token/layer", "%-.0f"},
                                            {NULL, "x D", "%-.3g"},
                                            {NULL, "GiB", "%-.2f"}});
    for (int i = 0; i <= x->al.n; i++) {
        double v = i < x->al.n ? x->al.terms[i].bytes : x->al.bytes_per_token;
        nl_report_cell_str(r, i < x->al.n ? x->al.terms[i].name : "total");
        nl_report_cell_num(r, v);
        nl_report_cell_num(r, v / D);
        nl_report_cell_num(r, v * per / gib);
        nl_report_row_end(r);
    }
}

static void report_act(nl_report *r, const budget_args *ba, const budget *b, const budget_act *x) {
    const double gib = 1024.0 * 1024 * 1024, per = x->tokens * x->layers;
    nl_report_begin_object(r, "activations", NULL);
    nl_report_num(r, "tokens", "", x->tokens, NULL, NULL);
    nl_report_num(r, "layers", "", x->layers, NULL, NULL);
    report_terms(r, ba, b, x);
    nl_report_num(r, "bytes_per_token_layer", "", x->al.bytes_per_token, NULL, NULL);
    nl_report_num(r, "bytes_per_hidden_unit", "", x->al.bytes_per_token / (double)b->m.a.dim, NULL, NULL);
    nl_report_num(r, "bytes", "", x->bytes, NULL, NULL);
    const struct {
        const char *key, *label;
        double per_token;
    } rows[] = {
        {NULL, "this walk, no recompute", x->al.bytes_per_token},
        {"selective_bytes",
         ba->L.no_flash ? "this walk, selective (recompute the scores)"
                        : "this walk, selective (recompute: nothing kept to drop with flash)",
         x->sel.bytes_per_token},
        {"full_bytes", "this walk, full (layer input only)", x->full.bytes_per_token},
        {"korthikanti_bytes", "Korthikanti eq.1 sbh(34+5as/h), no flash", x->k_none},
        {"korthikanti_flash_bytes", "Korthikanti 34sbh (flash or selective)", x->k_flash},
        {"korthikanti_full_bytes", "Korthikanti 2sbh (full recompute)", x->k_full},
    };
    for (int i = 1; i < 6; i++) nl_report_num(r, rows[i].key, "", rows[i].per_token * per, NULL, NULL);
    nl_report_num(r, "logits_bytes", "", x->logits, NULL, NULL);
    nl_report_num(r, "microbatches_in_flight_1f1b", "", x->inflight_1f1b, NULL, NULL);
    nl_report_num(r, "microbatches_in_flight_gpipe", "", x->inflight_gpipe, NULL, NULL);
    nl_report_table(r, NULL, "The same batch other ways:", 3,
                    (const nl_report_col[]){
                        {NULL, "accounting", NULL}, {NULL, "bytes/token/layer", "%-.0f"}, {NULL, "GiB", "%-.1f"}});
    for (int i = 0; i < 6; i++) {
        nl_report_cell_str(r, rows[i].label);
        nl_report_cell_num(r, rows[i].per_token);
        nl_report_cell_num(r, rows[i].per_token * per / gib);
        nl_report_row_end(r);
    }
    nl_report_end_object(r);
    nl_report_note(r, "%s", "");
    nl_report_note(r, "Logits (bf16) + fp32 loss copy: %.1f GiB. One layer's working set while recomputing: %.2f GiB.",
                   x->logits / gib, x->al.working_bytes_per_token * x->tokens / gib);
    if (ba->L.pp > 1)
        nl_report_note(r,
                       "Pipeline of %lld stages, %lld microbatches of this size: the first stage holds %g in flight "
                       "with 1F1B\n(%.1f GiB) and %g with GPipe (%.1f GiB).",
                       (long long)ba->L.pp, (long long)x->micro, x->inflight_1f1b, x->bytes * x->inflight_1f1b / gib,
                       x->inflight_gpipe, x->bytes * x->inflight_gpipe / gib);
}

int nl_cmd_budget(int argc, char **argv) {
    budget_args ba;
    int rc = parse_args(&ba, argc, argv);
    if (rc) return rc == NL_CLI_HELP ? NL_EXIT_OK : rc;
    budget b;
    if ((rc = setup(&ba, &b))) return rc;
    budget_act x;
    memset(&x, 0, sizeof x);
    if (b.m.has_model) nl_budget_activations(&ba.L, &b.m, &x);
    nl_train_eval ev[4];
    nl_budget_bars(&ba.L, &b.m, &x, ev);
    if (ba.svg && nl_plan_svg_memory(ba.svg, ev, 4, b.m.hw.mem_bytes)) return nl_cli_fail("--svg");
    nl_report *r = nl_report_new("budget");
    report_params(r, &ba, &b);
    report_stages(r, &ba, &b);
    if (b.m.has_model) report_act(r, &ba, &b, &x);
    return nl_report_print(r, ba.json);
}

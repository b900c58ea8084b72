/* nanolm plan catalog|train|layer|serve|pipeline: parallel training and serving plans. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "nanolm/plan.h"
#include "nanolm/plan_engine.h"
#include "plan_opts.h"

static void usage(FILE *f) {
    fprintf(
        f,
        "usage: nanolm plan catalog [--hw FILE.json] [--model-file FILE.json] [--json]\n"
        "       nanolm plan train --model M|FILE.json --gpus N [--gpu G] [--tokens D] [--global-batch B] [--seq S]\n"
        "                         [--recipe bf16] [--params N] [--top K] [--svg FILE] [--json] [assumptions]\n"
        "                         [--dp D --tp T --pp P --cp C --ep E --micro-batch B --zero Z --recompute R]\n"
        "                         [--interleave V] [--sp on|off] [--schedule 1f1b|zb-h1|dualpipe]\n"
        "                         (each of these fixes that part of the layout; the rest is searched)\n"
        "       nanolm plan layer --model M [--params N] --tp T [--sp] [--pp P] [--dp D] [--ep E]\n"
        "                         [--zero 0|1|2|3|hsdp] [--tokens-per-gpu T] [--micro M] [--json] [assumptions]\n"
        "       nanolm plan serve --model M [--gpu G] [--tp N] [--prompt P] [--output O] [--batch B]\n"
        "                         [--context C] [--chunk K] [--prefill-mfu X] [--precision bf16|fp8|int8] [--fsdp N]\n"
        "                         [--napkin] [--json]\n"
        "       nanolm plan serve --hw cpu.json --model M|CHECKPOINT [--prompt P] [--output O] [--batch B] [--chunk "
        "K]\n"
        "                         [--weights fp32|bf16|int8] [--kv fp32|int8] [--max-step-tokens N] [--json]\n"
        "                         (cpu.json from `nanolm bench machine --json`: nanolm's own engine on this CPU)\n"
        "       nanolm plan pipeline --stages P --micro M --svg FILE\n"
        "       nanolm plan validate [--file FILE.json] [--json] [--svg FILE]\n"
        "                         (every published figure of tests/validation/published.json, default assumptions)\n\n"
        "assumptions (each overrides a named default; see docs/planning.md):\n"
        "  --gemm-eff 0.6  --attn-eff 0.4  --kernel-us 5  --dp-overlap 0.8  --usable-mem 0.9\n"
        "  --tp-overlap 0  --reserved-gb 2  --link-eff 0.8  --latency-us 10  --price $/h  --gpus-per-node 8\n"
        "  --mfu X          time = 6*N*tokens / (peak * X) instead of the kernel model\n"
        "  --napkin         the course's napkin: --mfu 0.4, --link-eff 1, --latency-us 0\n"
        "  --hw FILE.json / --model-file FILE.json add or override catalog entries\n");
}

/* Options shared by train and layer. */
typedef struct common {
    nl_catalog cat;
    const char *model, *gpu, *recipe;
    const char *hw_path; /* the last --hw file (plan serve reads its measured CPU rates) */
    int gpu_given;
    double params, link_eff, latency_us, price, mfu, tokens;
    int64_t gpn;
    int napkin, json;
    nl_eff eff;
} common;

enum {
    O_TPO = 999,
    O_GEMM = 1000,
    O_ATTN,
    O_KERN,
    O_DPO,
    O_USABLE,
    O_RES,
    O_LINK,
    O_LAT,
    O_PRICE,
    O_GPN,
    O_MFU,
    O_NAPKIN,
    O_HW,
    O_MF
};

#define COMMON_OPTS                                                                                                    \
    {"model", required_argument, 0, 'M'}, {"gpu", required_argument, 0, 'G'}, {"params", required_argument, 0, 'n'},   \
        {"recipe", required_argument, 0, 'r'}, {"gemm-eff", required_argument, 0, O_GEMM},                             \
        {"attn-eff", required_argument, 0, O_ATTN}, {"tp-overlap", required_argument, 0, O_TPO},                       \
        {"kernel-us", required_argument, 0, O_KERN}, {"dp-overlap", required_argument, 0, O_DPO},                      \
        {"usable-mem", required_argument, 0, O_USABLE}, {"reserved-gb", required_argument, 0, O_RES},                  \
        {"link-eff", required_argument, 0, O_LINK}, {"latency-us", required_argument, 0, O_LAT},                       \
        {"price", required_argument, 0, O_PRICE}, {"gpus-per-node", required_argument, 0, O_GPN},                      \
        {"mfu", required_argument, 0, O_MFU}, {"napkin", no_argument, 0, O_NAPKIN},                                    \
        {"hw", required_argument, 0, O_HW}, {"model-file", required_argument, 0, O_MF}, {"json", no_argument, 0, 'j'}, \
    {                                                                                                                  \
        "help", no_argument, 0, 'h'                                                                                    \
    }

static void common_init(common *o) {
    memset(o, 0, sizeof *o);
    nl_catalog_init(&o->cat);
    o->gpu = "h100";
    o->recipe = "bf16";
    o->link_eff = -1;
    o->latency_us = -1;
    o->price = -1;
    nl_eff_default(&o->eff);
}

static int range_err(const char *opt, const char *arg) {
    nl_cli_usage_error("value '%s' of %s is out of range (see nanolm plan --help)", arg, opt);
    return -1;
}

/* Returns 1 if handled, 0 if not a common option, -1 on a bad value (message printed), -3 when a
 * catalog file failed (message printed). */
static int common_opt(common *o, int c, const char *arg) {
    double v;
    switch (c) {
    case 'M': o->model = arg; return 1;
    case 'G':
        o->gpu = arg;
        o->gpu_given = 1;
        return 1;
    case 'n':
        if (nl_cli_double_si("--params", arg, &o->params)) return -1;
        if (!(o->params > 0)) {
            nl_cli_usage_error("--params must be a positive count (like 7B), got '%s'", arg);
            return -1;
        }
        return 1;
    case 'r': o->recipe = arg; return 1;
    case O_GEMM:
        if (nl_cli_double("--gemm-eff", arg, &v)) return -1;
        if (!(v > 0 && v <= 1)) return range_err("--gemm-eff", arg);
        o->eff.gemm = v;
        return 1;
    case O_ATTN:
        if (nl_cli_double("--attn-eff", arg, &v)) return -1;
        if (!(v > 0 && v <= 1)) return range_err("--attn-eff", arg);
        o->eff.attn = v;
        return 1;
    case O_TPO:
        if (nl_cli_double("--tp-overlap", arg, &v)) return -1;
        if (v < 0 || v > 1) return range_err("--tp-overlap", arg);
        o->eff.tp_overlap = v;
        return 1;
    case O_KERN:
        if (nl_cli_double("--kernel-us", arg, &v)) return -1;
        if (v < 0) return range_err("--kernel-us", arg);
        o->eff.kernel_s = v * 1e-6;
        return 1;
    case O_DPO:
        if (nl_cli_double("--dp-overlap", arg, &v)) return -1;
        if (v < 0 || v > 1) return range_err("--dp-overlap", arg);
        o->eff.dp_overlap = v;
        return 1;
    case O_USABLE:
        if (nl_cli_double("--usable-mem", arg, &v)) return -1;
        if (!(v > 0 && v <= 1)) return range_err("--usable-mem", arg);
        o->eff.usable_mem = v;
        return 1;
    case O_RES:
        if (nl_cli_double("--reserved-gb", arg, &v)) return -1;
        if (v < 0) return range_err("--reserved-gb", arg);
        o->eff.reserved_bytes = v * 1e9;
        return 1;
    case O_LINK:
        if (nl_cli_double("--link-eff", arg, &v)) return -1;
        if (!(v > 0 && v <= 1)) return range_err("--link-eff", arg);
        o->link_eff = v;
        return 1;
    case O_LAT:
        if (nl_cli_double("--latency-us", arg, &v)) return -1;
        if (v < 0) return range_err("--latency-us", arg);
        o->latency_us = v;
        return 1;
    case O_PRICE:
        if (nl_cli_double("--price", arg, &v)) return -1;
        if (v < 0) return range_err("--price", arg);
        o->price = v;
        return 1;
    case O_GPN: {
        int64_t g;
        if (nl_cli_int("--gpus-per-node", arg, 1, 1024, &g)) return -1;
        o->gpn = g;
        return 1;
    }
    case O_MFU:
        if (nl_cli_double("--mfu", arg, &v)) return -1;
        if (!(v > 0 && v <= 1)) return range_err("--mfu", arg);
        o->mfu = v;
        return 1;
    case O_NAPKIN: o->napkin = 1; return 1;
    case O_HW:
        if (nl_catalog_load_hw(&o->cat, arg)) {
            nl_cli_fail("--hw");
            return -3;
        }
        o->hw_path = arg;
        return 1;
    case O_MF:
        if (nl_catalog_load_model(&o->cat, arg)) {
            nl_cli_fail("--model-file");
            return -3;
        }
        return 1;
    case 'j': o->json = 1; return 1;
    default: return 0;
    }
}

static int common_rc(int r, const char *cmd, int c) {
    (void)cmd;
    (void)c;
    if (r == -3) return NL_EXIT_FAIL;
    return NL_EXIT_USAGE;
}

/* Fills the request's model, GPU, recipe and assumptions. */
static int common_finish(common *o, const char *cmd, nl_train_req *q) {
    memset(q, 0, sizeof *q);
    if (!o->model) return nl_cli_usage_error("%s: --model is required", cmd);
    if (nl_cli_model_arch(&o->cat, o->model, &q->arch))
        return nl_cli_usage_error("%s: --model: %s", cmd, nl_last_error());
    if (nl_catalog_find_hw(&o->cat, o->gpu, &q->hw)) return nl_cli_usage_error("%s: --gpu: %s", cmd, nl_last_error());
    if (nl_plan_recipe(o->recipe, &q->recipe)) return nl_cli_usage_error("%s: --recipe: %s", cmd, nl_last_error());
    if (o->napkin) {
        q->hw.intra_eff = q->hw.inter_eff = 1;
        q->hw.latency_s = 0;
        o->eff.fixed_mfu = 0.4;
    }
    if (o->link_eff > 0) q->hw.intra_eff = q->hw.inter_eff = o->link_eff;
    if (o->latency_us >= 0) q->hw.latency_s = o->latency_us * 1e-6;
    if (o->price >= 0) q->hw.price_per_hour = o->price;
    if (o->gpn > 0) q->hw.gpus_per_node = o->gpn;
    if (o->mfu > 0) o->eff.fixed_mfu = o->mfu;
    q->eff = o->eff;
    q->params_override = o->params;
    nl_catalog_family(&o->cat, q->arch.name, &q->fam);
    return 0;
}

static void print_assumptions(const nl_train_req *q) {
    const nl_eff *e = &q->eff;
    printf("Assumptions (override with the option named):\n");
    if (e->fixed_mfu > 0)
        printf("  --mfu %.2f          compute = 6*N*tokens / (peak * MFU), the napkin model\n", e->fixed_mfu);
    else
        printf("  --gemm-eff %.2f     share of %s's %.0f TFLOP/s GEMMs get in a training stack (roofline per GEMM;\n"
               "                     calibrated on published runs, docs/planning.md)\n"
               "  --attn-eff %.2f     flash attention (FA2 ~0.35, FA3 ~0.75 of H100 peak; Shah et al. 2024)\n"
               "  --kernel-us %.0f      per kernel launch, %.0f kernels per layer forward, twice in backward\n",
               e->gemm > 0 ? e->gemm : q->hw.gemm_eff, q->hw.name, q->hw.flops_bf16 / 1e12, e->attn, e->kernel_s * 1e6,
               e->kernels_per_layer);
    printf("  --tp-overlap %.2f   share of tensor-parallel communication hidden behind GEMMs\n", e->tp_overlap);
    printf("  --dp-overlap %.2f   share of backward that hides data-parallel communication\n"
           "  --link-eff %.2f     achieved share of NVLink %.0f GB/s and network %.0f GB/s per GPU, nodes of %lld\n"
           "  --latency-us %.0f    per collective call\n"
           "  --usable-mem %.2f   of %.0f GB, minus --reserved-gb %.1f\n"
           "  --price %.2f        $ per GPU-hour\n",
           e->dp_overlap, q->hw.intra_eff, q->hw.intra_bw / 1e9, q->hw.inter_bw / 1e9, (long long)q->hw.gpus_per_node,
           q->hw.latency_s * 1e6, e->usable_mem, q->hw.mem_bytes / 1e9, e->reserved_bytes / 1e9, q->hw.price_per_hour);
}

static cJSON *eval_json(const nl_train_eval *e) {
    cJSON *o = cJSON_CreateObject();
    char lb[160];
    cJSON_AddStringToObject(o, "layout", nl_layout_str(&e->L, lb, sizeof lb));
    cJSON_AddNumberToObject(o, "dp", (double)e->L.dp);
    cJSON_AddNumberToObject(o, "tp", (double)e->L.tp);
    cJSON_AddNumberToObject(o, "pp", (double)e->L.pp);
    cJSON_AddNumberToObject(o, "cp", (double)e->L.cp);
    cJSON_AddNumberToObject(o, "ep", (double)e->L.ep);
    cJSON_AddStringToObject(o, "zero", nl_zero_name(e->L.zero));
    cJSON_AddNumberToObject(o, "micro_batch", (double)e->L.micro_batch);
    cJSON_AddNumberToObject(o, "n_micro", (double)e->L.n_micro);
    cJSON_AddNumberToObject(o, "vpp", (double)e->L.vpp);
    cJSON_AddStringToObject(o, "recompute", nl_recompute_name(e->L.recompute));
    cJSON_AddBoolToObject(o, "fits", e->fits);
    if (!e->fits) cJSON_AddStringToObject(o, "reason", e->reason);
    cJSON_AddNumberToObject(o, "mem_total", e->mem_total);
    cJSON_AddNumberToObject(o, "mem_weights", e->mem_weights);
    cJSON_AddNumberToObject(o, "mem_grads", e->mem_grads);
    cJSON_AddNumberToObject(o, "mem_optim", e->mem_optim);
    cJSON_AddNumberToObject(o, "mem_act", e->mem_act);
    cJSON_AddNumberToObject(o, "mem_logits", e->mem_logits);
    cJSON_AddNumberToObject(o, "t_compute", e->t_compute);
    cJSON_AddNumberToObject(o, "t_bubble", e->t_bubble);
    cJSON_AddNumberToObject(o, "t_dp", e->t_dp);
    cJSON_AddNumberToObject(o, "t_tp", e->t_tp);
    cJSON_AddNumberToObject(o, "t_pp", e->t_pp);
    cJSON_AddNumberToObject(o, "t_cp", e->t_cp);
    cJSON_AddNumberToObject(o, "t_ep", e->t_ep);
    cJSON_AddNumberToObject(o, "t_exposed", e->t_exposed);
    cJSON_AddNumberToObject(o, "t_optim", e->t_optim);
    cJSON_AddNumberToObject(o, "t_step", e->t_step);
    cJSON_AddNumberToObject(o, "tokens_per_s", e->tokens_per_s);
    cJSON_AddNumberToObject(o, "mfu", e->mfu);
    cJSON_AddNumberToObject(o, "total_s", e->total_s);
    cJSON_AddNumberToObject(o, "gpu_hours", e->gpu_hours);
    cJSON_AddNumberToObject(o, "cost", e->cost);
    return o;
}

static int cmd_train(int argc, char **argv) {
    static const struct option opts[] = {COMMON_OPTS,
                                         {"gpus", required_argument, 0, 'g'},
                                         {"tokens", required_argument, 0, 'd'},
                                         {"global-batch", required_argument, 0, 'b'},
                                         {"seq", required_argument, 0, 's'},
                                         {"top", required_argument, 0, 'k'},
                                         {"svg", required_argument, 0, 'v'},
                                         {"dp", required_argument, 0, 'D'},
                                         {"tp", required_argument, 0, 'T'},
                                         {"pp", required_argument, 0, 'P'},
                                         {"cp", required_argument, 0, 'C'},
                                         {"ep", required_argument, 0, 'E'},
                                         {"micro-batch", required_argument, 0, 'B'},
                                         {"zero", required_argument, 0, 'Z'},
                                         {"recompute", required_argument, 0, 'R'},
                                         {"interleave", required_argument, 0, 'V'},
                                         {"sp", required_argument, 0, 'S'},
                                         {"schedule", required_argument, 0, 'H'},
                                         {0, 0, 0, 0}};
    int64_t fx[6] = {0}, fvpp = 0;
    int fsp = 0, sched = NL_SCHED_1F1B;
    int fz = 0, fr = 0;
    common o;
    common_init(&o);
    int64_t gpus = 0, gb = 0, seq = 0, top = 8;
    const char *svg = NULL;
    int c;
    while ((c = getopt_long(argc, argv, "M:G:n:r:g:d:b:s:k:v:D:T:P:C:E:B:Z:R:V:S:H:jh", opts, NULL)) != -1) {
        int r = common_opt(&o, c, optarg);
        if (r == 1) continue;
        if (r < 0) return common_rc(r, "plan train", c);
        switch (c) {
        case 'D':
            if (nl_cli_int("--dp", optarg, 1, 1 << 20, &fx[0])) return NL_EXIT_USAGE;
            break;
        case 'T':
            if (nl_cli_int("--tp", optarg, 1, 1024, &fx[1])) return NL_EXIT_USAGE;
            break;
        case 'P':
            if (nl_cli_int("--pp", optarg, 1, 1024, &fx[2])) return NL_EXIT_USAGE;
            break;
        case 'C':
            if (nl_cli_int("--cp", optarg, 1, 1024, &fx[3])) return NL_EXIT_USAGE;
            break;
        case 'E':
            if (nl_cli_int("--ep", optarg, 1, 4096, &fx[4])) return NL_EXIT_USAGE;
            break;
        case 'B':
            if (nl_cli_int("--micro-batch", optarg, 1, 1 << 16, &fx[5])) return NL_EXIT_USAGE;
            break;
        case 'Z':
            if ((fz = nl_parse_zero(optarg)) < 0)
                return nl_cli_usage_error("plan train: unknown --zero '%s' (0, 1, 2, 3, hsdp)", optarg);
            fz++;
            break;
        case 'R':
            if ((fr = nl_parse_recompute(optarg)) < 0)
                return nl_cli_usage_error("plan train: unknown --recompute '%s' (none, selective, full)", optarg);
            fr++;
            break;
        case 'V':
            if (nl_cli_int("--interleave", optarg, 1, 64, &fvpp)) return NL_EXIT_USAGE;
            break;
        case 'S':
            if (!strcmp(optarg, "on"))
                fsp = 2;
            else if (!strcmp(optarg, "off"))
                fsp = 1;
            else
                return nl_cli_usage_error("plan train: --sp must be on or off, got '%s'", optarg);
            break;
        case 'H':
            if ((sched = nl_plan_schedule(optarg)) < 0)
                return nl_cli_usage_error("plan train: unknown --schedule '%s' (1f1b, dualpipe, zb-h1)", optarg);
            break;
        case 'g':
            if (nl_cli_int("--gpus", optarg, 1, 1 << 20, &gpus)) return NL_EXIT_USAGE;
            break;
        case 'd':
            if (nl_cli_double_si("--tokens", optarg, &o.tokens) || !(o.tokens > 0))
                return nl_cli_usage_error("plan train: bad --tokens");
            break;
        case 'b':
            if (nl_cli_int("--global-batch", optarg, 1, 1 << 24, &gb)) return NL_EXIT_USAGE;
            break;
        case 's':
            if (nl_cli_int("--seq", optarg, 1, 1 << 24, &seq)) return NL_EXIT_USAGE;
            break;
        case 'k':
            if (nl_cli_int("--top", optarg, 1, 1000, &top)) return NL_EXIT_USAGE;
            break;
        case 'v': svg = optarg; break;
        case 'h': usage(stdout); return NL_EXIT_OK;
        default: return nl_cli_bad_option("plan train", argv);
        }
    }
    if (optind < argc) return nl_cli_usage_error("plan train: unexpected argument '%s'", argv[optind]);
    if (gpus < 1) return nl_cli_usage_error("plan train: --gpus is required");
    nl_train_req q;
    int rc = common_finish(&o, "plan train", &q);
    if (rc) return rc;
    q.gpus = gpus;
    q.seq = seq > 0 ? seq : q.arch.seq_len;
    q.fix.dp = fx[0];
    q.fix.tp = fx[1];
    q.fix.pp = fx[2];
    q.fix.cp = fx[3];
    q.fix.ep = fx[4];
    q.fix.micro_batch = fx[5];
    q.fix.zero_plus1 = fz;
    q.fix.recompute_plus1 = fr;
    q.fix.vpp = fvpp;
    q.fix.sp_plus1 = fsp;
    q.schedule = (nl_sched)sched;
    nl_arch_params ap;
    nl_plan_count_params(&q.arch, &q.fam, &ap);
    double N = o.params > 0 ? o.params : (double)ap.total;
    /* Default batch: ~4M tokens (Llama 2 and 3 trained 7-8B models with 4M-token batches). */
    q.global_batch = gb > 0 ? gb : (int64_t)fmax(1, round(4194304.0 / (double)q.seq));
    q.tokens = o.tokens > 0 ? o.tokens : 20 * N;
    nl_train_result res;
    if (nl_plan_train_search(&q, &res)) return nl_cli_fail("plan train");
    if (svg) {
        nl_train_eval sel[16];
        size_t ns = 0;
        for (size_t i = 0; i < res.n_fit && ns < 8; i++) sel[ns++] = res.evals[i];
        for (size_t i = res.n_fit; i < res.n && ns < 12; i++) sel[ns++] = res.evals[i];
        if (nl_plan_svg_memory(svg, sel, ns, q.hw.mem_bytes)) {
            nl_plan_train_free(&res);
            return nl_cli_fail("--svg");
        }
    }
    if (o.json) {
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "model", q.arch.name);
        cJSON_AddNumberToObject(j, "params", N);
        cJSON_AddStringToObject(j, "gpu", q.hw.name);
        cJSON_AddNumberToObject(j, "gpus", (double)gpus);
        cJSON_AddNumberToObject(j, "tokens", q.tokens);
        cJSON_AddNumberToObject(j, "seq", (double)q.seq);
        cJSON_AddNumberToObject(j, "global_batch", (double)q.global_batch);
        cJSON_AddNumberToObject(j, "layouts", (double)res.n);
        cJSON_AddNumberToObject(j, "layouts_fit", (double)res.n_fit);
        cJSON_AddNumberToObject(j, "search_s", res.search_s);
        cJSON *arr = cJSON_AddArrayToObject(j, "ranked");
        for (size_t i = 0; i < res.n_fit && i < (size_t)top; i++) cJSON_AddItemToArray(arr, eval_json(&res.evals[i]));
        cJSON *rej = cJSON_AddArrayToObject(j, "rejected");
        for (size_t i = res.n_fit; i < res.n && i < res.n_fit + (size_t)top; i++)
            cJSON_AddItemToArray(rej, eval_json(&res.evals[i]));
        char ex[4096];
        nl_plan_train_explain(&q, &res, ex, sizeof ex);
        cJSON_AddStringToObject(j, "explanation", ex);
        nl_plan_train_free(&res);
        return nl_cli_print_json(j);
    }
    char a1[32], a2[32], a3[32];
    printf("Plan: %s (%s parameters) on %lld x %s, %s tokens, global batch %lld x %lld = %s tokens, recipe %s.\n",
           q.arch.name, nl_fmt_count(N, a1, sizeof a1), (long long)gpus, q.hw.name,
           nl_fmt_count(q.tokens, a2, sizeof a2), (long long)q.global_batch, (long long)q.seq,
           nl_fmt_count((double)q.global_batch * (double)q.seq, a3, sizeof a3), q.recipe.name);
    printf("Searched %zu layouts in %.1f ms: %zu fit in memory, %zu do not.\n\n", res.n, res.search_s * 1e3, res.n_fit,
           res.n - res.n_fit);
    static const char *hdr[] = {"#",        "layout", "mem GB", "step s",    "exposed comm", "bubble",
                                "tokens/s", "MFU",    "days",   "GPU-hours", "cost $"};
    nl_table t;
    nl_table_init(&t, 11, hdr);
    for (size_t i = 0; i < res.n_fit && i < (size_t)top; i++) {
        const nl_train_eval *e = &res.evals[i];
        char lb[160];
        nl_table_rowf(&t, "%zu|%s|%.1f|%.3f|%.0f ms|%.0f ms|%.0f|%.1f%%|%.1f|%.0f|%.0f", i + 1,
                      nl_layout_str(&e->L, lb, sizeof lb), e->mem_total / 1e9, e->t_step, e->t_exposed * 1e3,
                      e->t_bubble * 1e3, e->tokens_per_s, 100 * e->mfu, e->total_s / 86400, e->gpu_hours, e->cost);
    }
    nl_table_print(&t, stdout);
    nl_table_free(&t);
    char ex[4096];
    nl_plan_train_explain(&q, &res, ex, sizeof ex);
    printf("\nWhy #1: %s\n", ex);
    if (res.n > res.n_fit) {
        printf("\nRejected (smallest memory first):\n");
        for (size_t i = res.n_fit; i < res.n && i < res.n_fit + 4; i++) {
            char lb[160];
            printf("  %s: %s\n", nl_layout_str(&res.evals[i].L, lb, sizeof lb), res.evals[i].reason);
        }
        /* The layout with the most state, to show why sharding is needed. */
        const nl_train_eval *w = &res.evals[res.n - 1];
        char lb[160];
        printf("  ...\n  %s: %s\n", nl_layout_str(&w->L, lb, sizeof lb), w->reason);
    }
    printf("\n");
    print_assumptions(&q);
    nl_plan_train_free(&res);
    return NL_EXIT_OK;
}

static int cmd_layer(int argc, char **argv) {
    static const struct option opts[] = {COMMON_OPTS,
                                         {"tp", required_argument, 0, 't'},
                                         {"sp", no_argument, 0, 'S'},
                                         {"pp", required_argument, 0, 'p'},
                                         {"dp", required_argument, 0, 'd'},
                                         {"ep", required_argument, 0, 'e'},
                                         {"zero", required_argument, 0, 'z'},
                                         {"tokens-per-gpu", required_argument, 0, 'T'},
                                         {"micro", required_argument, 0, 'm'},
                                         {0, 0, 0, 0}};
    common o;
    common_init(&o);
    int64_t tp = 1, pp = 1, dp = 1, ep = 1, micro = 1;
    double tokens = 0;
    int sp = 0, zero = NL_ZERO_0, c;
    while ((c = getopt_long(argc, argv, "M:G:n:r:t:Sp:d:e:z:T:m:jh", opts, NULL)) != -1) {
        int r = common_opt(&o, c, optarg);
        if (r == 1) continue;
        if (r < 0) return common_rc(r, "plan layer", c);
        switch (c) {
        case 't':
            if (nl_cli_int("--tp", optarg, 1, 1024, &tp)) return NL_EXIT_USAGE;
            break;
        case 'S': sp = 1; break;
        case 'p':
            if (nl_cli_int("--pp", optarg, 1, 1024, &pp)) return NL_EXIT_USAGE;
            break;
        case 'd':
            if (nl_cli_int("--dp", optarg, 1, 1 << 20, &dp)) return NL_EXIT_USAGE;
            break;
        case 'e':
            if (nl_cli_int("--ep", optarg, 1, 4096, &ep)) return NL_EXIT_USAGE;
            break;
        case 'z':
            if ((zero = nl_parse_zero(optarg)) < 0)
                return nl_cli_usage_error("plan layer: unknown --zero '%s' (0, 1, 2, 3, hsdp)", optarg);
            break;
        case 'T':
            if (nl_cli_double_si("--tokens-per-gpu", optarg, &tokens) || !(tokens >= 1))
                return nl_cli_usage_error("plan layer: bad --tokens-per-gpu");
            break;
        case 'm':
            if (nl_cli_int("--micro", optarg, 1, 1 << 20, &micro)) return NL_EXIT_USAGE;
            break;
        case 'h': usage(stdout); return NL_EXIT_OK;
        default: return nl_cli_bad_option("plan layer", argv);
        }
    }
    if (optind < argc) return nl_cli_usage_error("plan layer: unexpected argument '%s'", argv[optind]);
    nl_train_req q;
    int rc = common_finish(&o, "plan layer", &q);
    if (rc) return rc;
    if (tokens <= 0) tokens = (double)q.arch.seq_len;
    int64_t T = (int64_t)tokens;
    q.seq = (T % q.arch.seq_len == 0) ? q.arch.seq_len : T;
    int64_t mb = T / q.seq;
    q.gpus = dp * tp * pp;
    q.global_batch = dp * mb * micro;
    q.tokens = 1e12;
    nl_layout L = {dp, tp, pp, 1, ep, (nl_zero)zero, mb, micro, 1, NL_RECOMPUTE_NONE, sp};
    nl_layer_plan lp;
    if (nl_plan_layer(&q, &L, (double)T, &lp)) return nl_cli_fail("plan layer");
    nl_arch_params ap;
    nl_plan_count_params(&q.arch, &q.fam, &ap);
    double N = o.params > 0 ? o.params : (double)ap.total;
    double peak = q.hw.flops_bf16, mfu = q.eff.fixed_mfu > 0 ? q.eff.fixed_mfu : 0.5;
    double active_layer = (double)(ap.active - ap.embedding - ap.classifier - q.arch.dim) / (double)q.arch.n_layers;
    if (o.params > 0) active_layer *= o.params / (double)ap.total;
    double layer_fwd = 2 * active_layer * (double)T / (peak * mfu);
    double dp_traffic = 0;
    for (int i = 0; i < lp.n; i++)
        if (!strcmp(lp.c[i].when, "step")) dp_traffic += lp.c[i].time_s * lp.c[i].count;
    double p2 = (double)(tp > 1 ? tp : 2);
    double tp_bound = 2 * (p2 - 1) * peak / (q.hw.intra_bw * q.hw.intra_eff);
    if (o.json) {
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "model", q.arch.name);
        cJSON_AddNumberToObject(j, "params", N);
        cJSON_AddNumberToObject(j, "tokens_per_gpu", (double)T);
        cJSON *arr = cJSON_AddArrayToObject(j, "collectives");
        for (int i = 0; i < lp.n; i++) {
            cJSON *x = cJSON_CreateObject();
            cJSON_AddStringToObject(x, "what", lp.c[i].what);
            cJSON_AddStringToObject(x, "when", lp.c[i].when);
            cJSON_AddStringToObject(x, "collective", nl_coll_name(lp.c[i].coll));
            cJSON_AddStringToObject(x, "group", lp.c[i].group);
            cJSON_AddNumberToObject(x, "p", (double)lp.c[i].p);
            cJSON_AddNumberToObject(x, "bytes", lp.c[i].bytes);
            cJSON_AddNumberToObject(x, "wire_bytes", lp.c[i].wire_bytes);
            cJSON_AddNumberToObject(x, "time_s", lp.c[i].time_s);
            cJSON_AddNumberToObject(x, "count_per_step", lp.c[i].count);
            cJSON_AddItemToArray(arr, x);
        }
        cJSON_AddNumberToObject(j, "per_layer_forward_s", lp.per_layer_fwd_s);
        cJSON_AddNumberToObject(j, "per_layer_backward_s", lp.per_layer_bwd_s);
        cJSON_AddNumberToObject(j, "per_step_s", lp.per_step_s);
        cJSON_AddNumberToObject(j, "dp_per_step_s", dp_traffic);
        cJSON_AddNumberToObject(j, "ddp_allreduce_s", lp.ddp_step_s);
        cJSON_AddNumberToObject(j, "compute_step_s", lp.compute_step_s);
        cJSON_AddNumberToObject(j, "layer_forward_compute_s", layer_fwd);
        cJSON_AddNumberToObject(j, "tp_compute_bound_dim", tp_bound);
        return nl_cli_print_json(j);
    }
    char a1[32];
    printf("Collectives of %s (%s parameters) at dp %lld, tp %lld%s, pp %lld, ep %lld, %s; %lld tokens per GPU per "
           "microbatch,\n"
           "%lld microbatch(es) per step; %s NVLink %.0f GB/s x %.2f, network %.0f GB/s x %.2f, latency %.0f us.\n\n",
           q.arch.name, nl_fmt_count(N, a1, sizeof a1), (long long)dp, (long long)tp, sp ? "+sp" : "", (long long)pp,
           (long long)ep, nl_zero_name((nl_zero)zero), (long long)T, (long long)micro, q.hw.name, q.hw.intra_bw / 1e9,
           q.hw.intra_eff, q.hw.inter_bw / 1e9, q.hw.inter_eff, q.hw.latency_s * 1e6);
    static const char *hdr[] = {"when", "what", "collective", "group", "array", "through each GPU", "time", "per step"};
    nl_table t;
    nl_table_init(&t, 8, hdr);
    for (int i = 0; i < lp.n; i++) {
        const nl_layer_coll *x = &lp.c[i];
        char b1[32], b2[32];
        nl_table_rowf(&t, "%s|%s|%s|%s %lld|%s|%s|%.3g ms|x%.0f", x->when, x->what, nl_coll_name(x->coll), x->group,
                      (long long)x->p, nl_fmt_bytes(x->bytes, b1, sizeof b1),
                      nl_fmt_bytes(x->wire_bytes, b2, sizeof b2), x->time_s * 1e3, x->count);
    }
    nl_table_print(&t, stdout);
    nl_table_free(&t);
    printf("\nPer layer, tensor/expert/pipeline collectives: %.3g ms in forward, %.3g ms in backward. Per step: %.3g "
           "ms in all,\n"
           "%.3g ms of it data-parallel/ZeRO; compute per step %.3g s (%s), so communication is %.1f%% of it.\n",
           lp.per_layer_fwd_s * 1e3, lp.per_layer_bwd_s * 1e3, lp.per_step_s * 1e3, dp_traffic * 1e3, lp.compute_step_s,
           q.eff.fixed_mfu > 0 ? "6*N*tokens at the fixed MFU" : "kernel model",
           100 * lp.per_step_s / lp.compute_step_s);
    if (zero == NL_ZERO_3 || zero == NL_ZERO_HSDP) {
        double layer_bytes = 0;
        for (int i = 0; i < lp.n; i++)
            if (strstr(lp.c[i].what, "all-gather")) {
                layer_bytes = lp.c[i].bytes;
                break;
            }
        char b1[32];
        printf(
            "FSDP issues these layer by layer, prefetching the next layer's weights: %lld gathers of ~%s each way.\n",
            (long long)q.arch.n_layers, nl_fmt_bytes(layer_bytes / (double)q.arch.n_layers, b1, sizeof b1));
    }
    if (dp > 1)
        printf("Against plain DDP (one all-reduce of the gradients, %.3g ms): this layout's data-parallel traffic is "
               "%.2fx.\n"
               "An all-reduce is a reduce-scatter plus an all-gather, so ZeRO-1/2 (reduce-scatter the gradients, "
               "all-gather\n"
               "the updated weights) move exactly what DDP moves; ZeRO-3/FSDP gathers the weights twice (forward and\n"
               "backward) and reduce-scatters once: 3 x (p-1)/p against 2 x (p-1)/p, 1.5x DDP.\n",
               lp.ddp_step_s * 1e3, dp_traffic / lp.ddp_step_s);
    if (ep > 1)
        printf(
            "One MoE layer's forward compute (2 x %.3gM active parameters x %lld tokens at %.0f%% of peak): %.3g ms.\n",
            active_layer / 1e6, (long long)T, 100 * mfu, layer_fwd * 1e3);
    printf("Tensor parallelism of a (B x D)(D x F) matmul split along D over %g GPUs is compute-bound when\n"
           "D > 2(p-1) P / W = %.0f (P = %.0f TFLOP/s, W = %.0f GB/s); %s has D = %lld.\n",
           p2, tp_bound, peak / 1e12, q.hw.intra_bw * q.hw.intra_eff / 1e9, q.arch.name, (long long)q.arch.dim);
    return NL_EXIT_OK;
}

static int cmd_serve(int argc, char **argv) {
    static const struct option opts[] = {COMMON_OPTS,
                                         {"tp", required_argument, 0, 't'},
                                         {"prompt", required_argument, 0, 'P'},
                                         {"output", required_argument, 0, 'O'},
                                         {"batch", required_argument, 0, 'b'},
                                         {"context", required_argument, 0, 'C'},
                                         {"chunk", required_argument, 0, 'K'},
                                         {"prefill-mfu", required_argument, 0, 'F'},
                                         {"precision", required_argument, 0, 'Q'},
                                         {"fsdp", required_argument, 0, 'S'},
                                         {"weights", required_argument, 0, 'W'},
                                         {"kv", required_argument, 0, 'V'},
                                         {"max-step-tokens", required_argument, 0, 'X'},
                                         {0, 0, 0, 0}};
    common o;
    common_init(&o);
    nl_serve_req sq;
    nl_serve_req_default(&sq);
    int64_t tp = 1, batch = 32, step_tokens = 512;
    int c, eng_weights = 0, eng_kv = 0, eng_opts = 0;
    while ((c = getopt_long(argc, argv, "M:G:n:r:t:P:O:b:C:K:F:Q:S:W:V:X:jh", opts, NULL)) != -1) {
        int r = common_opt(&o, c, optarg);
        if (r == 1) continue;
        if (r < 0) return common_rc(r, "plan serve", c);
        switch (c) {
        case 't':
            if (nl_cli_int("--tp", optarg, 1, 1024, &tp)) return NL_EXIT_USAGE;
            break;
        case 'P':
            if (nl_cli_double_si("--prompt", optarg, &sq.prompt) || !(sq.prompt >= 1))
                return nl_cli_usage_error("plan serve: bad --prompt");
            break;
        case 'O':
            if (nl_cli_double_si("--output", optarg, &sq.output) || !(sq.output >= 1))
                return nl_cli_usage_error("plan serve: bad --output");
            break;
        case 'b':
            if (nl_cli_int("--batch", optarg, 1, 1 << 20, &batch)) return NL_EXIT_USAGE;
            break;
        case 'S':
            if (nl_cli_int("--fsdp", optarg, 1, 4096, &sq.fsdp)) return NL_EXIT_USAGE;
            break;
        case 'C':
            if (nl_cli_double_si("--context", optarg, &sq.context) || !(sq.context >= 1))
                return nl_cli_usage_error("plan serve: bad --context");
            break;
        case 'K':
            if (nl_cli_double_si("--chunk", optarg, &sq.chunk) || sq.chunk < 0)
                return nl_cli_usage_error("plan serve: bad --chunk");
            break;
        case 'F':
            if (nl_cli_double("--prefill-mfu", optarg, &sq.prefill_mfu) || !(sq.prefill_mfu > 0 && sq.prefill_mfu <= 1))
                return nl_cli_usage_error("plan serve: --prefill-mfu must be in (0, 1]");
            break;
        case 'Q':
            /* Weights and KV cache: bf16 (2 bytes), fp8 (1, GEMMs at the fp8 peak), int8 (1,
             * weight-only: GEMMs stay bf16). */
            if (!strcmp(optarg, "bf16") || !strcmp(optarg, "fp16")) {
                sq.weight_bytes = sq.kv_bytes = 2;
                sq.fp8 = 0;
            } else if (!strcmp(optarg, "fp8")) {
                sq.weight_bytes = sq.kv_bytes = 1;
                sq.fp8 = 1;
            } else if (!strcmp(optarg, "int8")) {
                sq.weight_bytes = sq.kv_bytes = 1;
                sq.fp8 = 0;
            } else
                return nl_cli_usage_error("plan serve: unknown --precision '%s' (bf16, fp16, fp8, int8)", optarg);
            break;
        case 'W': /* the engine's weight and KV formats: a --hw file of `nanolm bench machine` */
            eng_opts = 1;
            if ((eng_weights = !strcmp(optarg, "fp32")   ? 0
                               : !strcmp(optarg, "bf16") ? 1
                               : !strcmp(optarg, "int8") ? 2
                                                         : -1) < 0)
                return nl_cli_usage_error("plan serve: unknown --weights '%s' (fp32, bf16, int8)", optarg);
            break;
        case 'V':
            eng_opts = 1;
            if ((eng_kv = !strcmp(optarg, "fp32") ? 0 : !strcmp(optarg, "int8") ? 1 : -1) < 0)
                return nl_cli_usage_error("plan serve: unknown --kv '%s' (fp32, int8)", optarg);
            break;
        case 'X':
            eng_opts = 1;
            if (nl_cli_int("--max-step-tokens", optarg, 1, 1 << 20, &step_tokens)) return NL_EXIT_USAGE;
            break;
        case 'h': usage(stdout); return NL_EXIT_OK;
        default: return nl_cli_bad_option("plan serve", argv);
        }
    }
    if (optind < argc) return nl_cli_usage_error("plan serve: unexpected argument '%s'", argv[optind]);
    nl_cpu_rates cpu;
    nl_status cpu_rc = o.hw_path ? nl_cpu_rates_load(o.hw_path, o.gpu_given ? o.gpu : NULL, &cpu) : NL_ERR_INVALID;
    if (cpu_rc && cpu_rc != NL_ERR_INVALID) return nl_cli_fail("plan serve: --hw");
    if (!cpu_rc) { /* a CPU measured by `nanolm bench machine`: this engine's cost model */
        nl_engine_plan_req eq;
        nl_engine_plan_req_default(&eq);
        if (!o.model) return nl_cli_usage_error("plan serve: --model is required");
        if (nl_cli_model_arch(&o.cat, o.model, &eq.arch))
            return nl_cli_usage_error("plan serve: --model: %s", nl_last_error());
        eq.weights = eng_weights;
        eq.kv = eng_kv;
        eq.prompt = (int64_t)sq.prompt;
        eq.output = (int64_t)sq.output;
        eq.batch = batch;
        eq.chunk = sq.chunk >= 0 ? (int64_t)sq.chunk : 256;
        eq.max_step_tokens = step_tokens;
        return nl_cli_plan_serve_engine(&cpu, &eq, o.json);
    }
    if (eng_opts)
        return nl_cli_usage_error(
            "plan serve: --weights, --kv and --max-step-tokens need a --hw file written by `nanolm bench machine`");
    nl_train_req q;
    int rc = common_finish(&o, "plan serve", &q);
    if (rc) return rc;
    sq.arch = q.arch;
    sq.hw = q.hw;
    nl_catalog_family(&o.cat, q.arch.name, &sq.fam);
    if (o.napkin) { /* the course's roofline: 50% MFU prefill, full HBM bandwidth, no launches */
        if (!(sq.prefill_mfu > 0)) sq.prefill_mfu = 0.5;
        sq.kernel_s = 0;
        sq.hbm_eff = 1;
    }
    sq.tp = tp;
    sq.batch = batch;
    nl_serve_plan sp;
    if (nl_plan_serve(&sq, &sp)) return nl_cli_fail("plan serve");
    double ctx = sq.context > 0 ? sq.context : sq.prompt + sq.output / 2;
    if (o.json) {
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "model", q.arch.name);
        cJSON_AddStringToObject(j, "gpu", q.hw.name);
        cJSON_AddNumberToObject(j, "tp", (double)tp);
        cJSON_AddNumberToObject(j, "batch", (double)batch);
        cJSON_AddNumberToObject(j, "context", ctx);
#define F(k) cJSON_AddNumberToObject(j, #k, sp.k)
        F(params);
        F(matmul_params);
        F(prefill_flops);
        F(prefill_s);
        F(kv_bytes_per_token);
        F(prompt_kv_bytes);
        F(weight_read_s);
        F(kv_read_s);
        F(decode_compute_s);
        F(decode_mem_s);
        F(decode_step_s);
        F(tp_allreduces);
        F(tp_allreduce_bytes);
        F(tp_comm_s);
        F(tp_comm_latency_s);
        F(decode_step_total_s);
        F(ttft_s);
        F(tpot_s);
        F(stall_steps);
        F(chunk_compute_s);
        F(chunk_free_tokens);
        F(prefill_rps);
        F(decode_rps);
        F(decode_per_prefill);
        F(mem_weights);
        F(mem_kv);
        F(mem_total);
        F(fsdp_gather_s);
#undef F
        cJSON_AddBoolToObject(j, "fits", sp.fits);
        return nl_cli_print_json(j);
    }
    char a1[32];
    printf("Serving %s (%s parameters) on %lld x %s: prompt %.0f, answer %.0f tokens, %lld concurrent sequences.\n\n",
           q.arch.name, nl_fmt_count(sp.params, a1, sizeof a1), (long long)tp, q.hw.name, sq.prompt, sq.output,
           (long long)batch);
    static const char *hdr[] = {"quantity", "value", "how"};
    nl_table t;
    nl_table_init(&t, 3, hdr);
    nl_table_rowf(&t, "prefill FLOPs|%.3g|2 x %.3gB matmul params x %.0f + causal attention", sp.prefill_flops,
                  sp.matmul_params / 1e9, sq.prompt);
    nl_table_rowf(&t, "prefill = TTFT|%.1f ms|at %.0f%% of %.0f TFLOP/s x %lld GPUs", sp.prefill_s * 1e3,
                  100 * (sq.prefill_mfu > 0 ? sq.prefill_mfu : q.hw.gemm_eff), q.hw.flops_bf16 / 1e12, (long long)tp);
    nl_table_rowf(&t, "KV cache per token|%.0f KiB|2 x layers x kv heads x head dim x 2 bytes",
                  sp.kv_bytes_per_token / 1024);
    nl_table_rowf(&t, "KV cache of the prompt|%.0f MB|to ship when prefill runs elsewhere", sp.prompt_kv_bytes / 1e6);
    nl_table_rowf(&t, "decode: weight reads|%.2f ms|%.1f GB / %lld / %.2f TB/s", sp.weight_read_s * 1e3,
                  sp.params * sq.weight_bytes / 1e9, (long long)tp, q.hw.hbm_bw / 1e12);
    if (sq.fsdp > 1)
        nl_table_rowf(&t, "decode: FSDP weight all-gathers|%.2f ms|%lld shards per layer, %.1fx the HBM read",
                      sp.fsdp_gather_s * 1e3, (long long)sq.fsdp, sp.fsdp_gather_s / sp.weight_read_s);
    nl_table_rowf(&t, "decode: KV reads|%.2f ms|%lld x %.0f context x %.0f KiB", sp.kv_read_s * 1e3, (long long)batch,
                  ctx, sp.kv_bytes_per_token / 1024);
    nl_table_rowf(&t, "decode: compute at peak|%.2f ms|%s", sp.decode_compute_s * 1e3,
                  sp.decode_compute_s < sp.decode_mem_s ? "memory bound" : "compute bound");
    if (tp > 1) {
        nl_table_rowf(&t, "decode step before TP comm|%.2f ms|weights and KV split over %lld GPUs",
                      sp.decode_step_s * 1e3, (long long)tp);
        nl_table_rowf(&t, "TP all-reduces per step|%.0f x %.0f KiB|2 per layer, B x D x 2 bytes", sp.tp_allreduces,
                      sp.tp_allreduce_bytes / 1024);
        nl_table_rowf(&t, "TP communication|%.2f ms|of which launch latency %.2f ms", sp.tp_comm_s * 1e3,
                      sp.tp_comm_latency_s * 1e3);
    }
    nl_table_rowf(&t, "decode step = TPOT|%.2f ms|%.0f tokens/s per sequence", sp.decode_step_total_s * 1e3,
                  1 / sp.decode_step_total_s);
    nl_table_rowf(&t, "one prefill stalls decode|%.1f steps|prefill / step", sp.stall_steps);
    nl_table_rowf(&t, "chunk of %.0f + %lld decode tokens|%.2f ms|matmul compute vs %.2f ms of weight reads", sq.chunk,
                  (long long)batch, sp.chunk_compute_s * 1e3, sp.weight_read_s * 1e3);
    nl_table_rowf(&t, "prompt tokens free per step|%.0f|until compute reaches the step's memory time",
                  sp.chunk_free_tokens);
    nl_table_rowf(&t, "prefill group throughput|%.1f req/s|1 / TTFT", sp.prefill_rps);
    nl_table_rowf(&t, "decode group throughput|%.1f req/s|B / (answer x step)", sp.decode_rps);
    nl_table_rowf(&t, "decode groups per prefill group|%.2f|disaggregated pools (DistServe, Splitwise)",
                  sp.decode_per_prefill);
    nl_table_rowf(&t, "memory per GPU|%.1f GB|weights %.1f + KV %.1f (%s)", sp.mem_total / 1e9, sp.mem_weights / 1e9,
                  sp.mem_kv / 1e9, sp.fits ? "fits" : "does NOT fit");
    nl_table_print(&t, stdout);
    nl_table_free(&t);
    return NL_EXIT_OK;
}

static int cmd_catalog(int argc, char **argv) {
    static const struct option opts[] = {{"hw", required_argument, 0, O_HW},
                                         {"model-file", required_argument, 0, O_MF},
                                         {"json", no_argument, 0, 'j'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    common o;
    common_init(&o);
    int c;
    while ((c = getopt_long(argc, argv, "jh", opts, NULL)) != -1) {
        if (c == 'h') {
            usage(stdout);
            return NL_EXIT_OK;
        }
        int r = common_opt(&o, c, optarg);
        if (r == 1) continue;
        if (r < 0) return common_rc(r, "plan catalog", c);
        return nl_cli_bad_option("plan catalog", argv);
    }
    if (optind < argc) return nl_cli_usage_error("plan catalog: unexpected argument '%s'", argv[optind]);
    if (o.json) {
        cJSON *j = cJSON_CreateObject();
        cJSON *g = cJSON_AddArrayToObject(j, "gpus");
        for (size_t i = 0; i < o.cat.n_hw; i++) {
            const nl_hw *h = &o.cat.hw[i];
            cJSON *x = cJSON_CreateObject();
            cJSON_AddStringToObject(x, "name", h->name);
            cJSON_AddNumberToObject(x, "flops_bf16", h->flops_bf16);
            cJSON_AddNumberToObject(x, "flops_fp8", h->flops_fp8);
            cJSON_AddNumberToObject(x, "mem_bytes", h->mem_bytes);
            cJSON_AddNumberToObject(x, "hbm_bw", h->hbm_bw);
            cJSON_AddNumberToObject(x, "intra_bw", h->intra_bw);
            cJSON_AddNumberToObject(x, "inter_bw", h->inter_bw);
            cJSON_AddNumberToObject(x, "gpus_per_node", (double)h->gpus_per_node);
            cJSON_AddNumberToObject(x, "latency_s", h->latency_s);
            cJSON_AddNumberToObject(x, "intra_eff", h->intra_eff);
            cJSON_AddNumberToObject(x, "inter_eff", h->inter_eff);
            cJSON_AddNumberToObject(x, "price_per_hour", h->price_per_hour);
            cJSON_AddNumberToObject(x, "nics_per_node", (double)h->nics_per_node);
            cJSON_AddNumberToObject(x, "nic_bw", h->nic_bw);
            cJSON_AddStringToObject(x, "source", h->source);
            cJSON_AddItemToArray(g, x);
        }
        cJSON *m = cJSON_AddArrayToObject(j, "models");
        for (size_t i = 0; i < o.cat.n_models; i++) {
            const nl_arch *a = &o.cat.models[i].arch;
            nl_arch_params p;
            nl_family fam;
            nl_catalog_family(&o.cat, a->name, &fam);
            nl_plan_count_params(a, &fam, &p);
            cJSON *x = cJSON_CreateObject();
            cJSON_AddStringToObject(x, "name", a->name);
            cJSON_AddNumberToObject(x, "params", (double)p.total);
            cJSON_AddNumberToObject(x, "params_active", (double)p.active);
            cJSON_AddNumberToObject(x, "params_non_embedding", (double)p.non_embedding);
            cJSON_AddNumberToObject(x, "dim", (double)a->dim);
            cJSON_AddNumberToObject(x, "n_layers", (double)a->n_layers);
            cJSON_AddNumberToObject(x, "n_heads", (double)a->n_heads);
            cJSON_AddNumberToObject(x, "n_kv_heads", (double)a->n_kv_heads);
            cJSON_AddNumberToObject(x, "hidden_dim", (double)a->hidden_dim);
            cJSON_AddNumberToObject(x, "vocab_size", (double)a->vocab_size);
            cJSON_AddNumberToObject(x, "seq_len", (double)a->seq_len);
            cJSON_AddNumberToObject(x, "n_experts", (double)a->n_experts);
            cJSON_AddNumberToObject(x, "top_k", (double)a->top_k);
            cJSON_AddStringToObject(x, "source", o.cat.models[i].source);
            cJSON_AddItemToArray(m, x);
        }
        return nl_cli_print_json(j);
    }
    static const char *h1[] = {"gpu",      "bf16 TFLOP/s", "fp8 TFLOP/s", "HBM GB", "HBM TB/s", "NVLink GB/s",
                               "net GB/s", "node",         "NICs",        "$/h",    "source"};
    nl_table t;
    nl_table_init(&t, 11, h1);
    for (size_t i = 0; i < o.cat.n_hw; i++) {
        const nl_hw *h = &o.cat.hw[i];
        char nics[32] = "-";
        if (h->nics_per_node > 0)
            snprintf(nics, sizeof nics, "%lldx%.0f Gb/s", (long long)h->nics_per_node, h->nic_bw * 8 / 1e9);
        nl_table_rowf(&t, "%s|%.0f|%.0f|%.0f|%.2f|%.0f|%.0f|%lld|%s|%.2f|%s", h->name, h->flops_bf16 / 1e12,
                      h->flops_fp8 / 1e12, h->mem_bytes / 1e9, h->hbm_bw / 1e12, h->intra_bw / 1e9, h->inter_bw / 1e9,
                      (long long)h->gpus_per_node, nics, h->price_per_hour, h->source);
    }
    nl_table_print(&t, stdout);
    nl_table_free(&t);
    printf("\n");
    static const char *h2[] = {"model",    "params", "active", "D",       "layers",
                               "heads/kv", "F",      "vocab",  "experts", "source"};
    nl_table_init(&t, 10, h2);
    for (size_t i = 0; i < o.cat.n_models; i++) {
        const nl_arch *a = &o.cat.models[i].arch;
        nl_arch_params p;
        nl_family fam;
        nl_catalog_family(&o.cat, a->name, &fam);
        nl_plan_count_params(a, &fam, &p);
        char n1[32], n2[32], ex[48] = "-";
        if (a->n_experts)
            snprintf(ex, sizeof ex, "%lld+%lld top-%lld F=%lld", (long long)a->n_experts,
                     (long long)a->n_shared_experts, (long long)a->top_k, (long long)a->expert_hidden_dim);
        nl_table_rowf(&t, "%s|%s|%s|%lld|%lld|%lld/%lld|%lld|%lld|%s|%s", a->name,
                      nl_fmt_count((double)p.total, n1, sizeof n1), nl_fmt_count((double)p.active, n2, sizeof n2),
                      (long long)a->dim, (long long)a->n_layers, (long long)a->n_heads, (long long)a->n_kv_heads,
                      (long long)a->hidden_dim, (long long)a->vocab_size, ex, o.cat.models[i].source);
    }
    nl_table_print(&t, stdout);
    nl_table_free(&t);
    return NL_EXIT_OK;
}

static int cmd_pipeline(int argc, char **argv) {
    static const struct option opts[] = {{"stages", required_argument, 0, 'p'}, {"micro", required_argument, 0, 'm'},
                                         {"svg", required_argument, 0, 'v'},    {"json", no_argument, 0, 'j'},
                                         {"help", no_argument, 0, 'h'},         {0, 0, 0, 0}};
    int64_t p = 4, m = 8;
    const char *svg = NULL;
    int json = 0, c;
    while ((c = getopt_long(argc, argv, "p:m:v:jh", opts, NULL)) != -1) {
        switch (c) {
        case 'p':
            if (nl_cli_int("--stages", optarg, 1, 64, &p)) return NL_EXIT_USAGE;
            break;
        case 'm':
            if (nl_cli_int("--micro", optarg, 1, 256, &m)) return NL_EXIT_USAGE;
            break;
        case 'v': svg = optarg; break;
        case 'j': json = 1; break;
        case 'h': usage(stdout); return NL_EXIT_OK;
        default: return nl_cli_bad_option("plan pipeline", argv);
        }
    }
    if (optind < argc) return nl_cli_usage_error("plan pipeline: unexpected argument '%s'", argv[optind]);
    double bubble = (double)(p - 1) / (double)(m + p - 1);
    if (svg && nl_plan_svg_pipeline(svg, p, m)) return nl_cli_fail("--svg");
    if (json) {
        cJSON *j = cJSON_CreateObject();
        cJSON_AddNumberToObject(j, "stages", (double)p);
        cJSON_AddNumberToObject(j, "microbatches", (double)m);
        cJSON_AddNumberToObject(j, "bubble", bubble);
        cJSON_AddNumberToObject(j, "inflight_gpipe", (double)m);
        cJSON_AddNumberToObject(j, "inflight_1f1b", (double)(p < m ? p : m));
        return nl_cli_print_json(j);
    }
    printf("%lld stages, %lld microbatches: bubble (p-1)/(m+p-1) = %lld/%lld = %.1f%% for GPipe and 1F1B alike\n"
           "(Huang et al. 2019; Narayanan et al. 2021); interleaving v chunks per GPU divides it by v.\n"
           "Activations in flight on the first stage: GPipe %lld microbatches, 1F1B %lld.\n",
           (long long)p, (long long)m, (long long)(p - 1), (long long)(m + p - 1), 100 * bubble, (long long)m,
           (long long)(p < m ? p : m));
    if (svg) printf("timelines written to %s\n", svg);
    return NL_EXIT_OK;
}

/* nanolm plan validate: the planner against published runs. */
static int cmd_validate(int argc, char **argv) {
    static const struct option opts[] = {{"file", required_argument, 0, 'f'},
                                         {"json", no_argument, 0, 'j'},
                                         {"svg", required_argument, 0, 'v'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    const char *file = NULL, *svg = NULL;
    int json = 0, c;
    while ((c = getopt_long(argc, argv, "f:jv:h", opts, NULL)) != -1) {
        switch (c) {
        case 'f': file = optarg; break;
        case 'j': json = 1; break;
        case 'v': svg = optarg; break;
        case 'h': usage(stdout); return NL_EXIT_OK;
        default: return nl_cli_bad_option("plan validate", argv);
        }
    }
    if (optind < argc) return nl_cli_usage_error("plan validate: unexpected argument '%s'", argv[optind]);
    /* The set lives in the source tree: found from the working directory (the repository root,
     * as `make run` and the tests use it) or from NANOLM_SRC. */
    char def[4096];
    if (!file) {
        const char *src = getenv("NANOLM_SRC");
        FILE *f = fopen("tests/validation/published.json", "rb");
        if (f) {
            fclose(f);
            file = "tests/validation/published.json";
        } else if (src) {
            snprintf(def, sizeof def, "%s/tests/validation/published.json", src);
            file = def;
        } else
            return nl_cli_usage_error("plan validate: tests/validation/published.json is not in this directory; "
                                      "run from the repository root or give --file FILE.json");
    }
    nl_catalog *cat = malloc(sizeof *cat);
    if (!cat) return nl_cli_usage_error("plan validate: out of memory");
    nl_catalog_init(cat);
    nl_valid_result r;
    nl_status st = nl_plan_validate(cat, file, &r);
    free(cat);
    if (st) return nl_cli_fail("plan validate");
    if (svg && nl_plan_svg_validate(svg, &r)) {
        nl_plan_validate_free(&r);
        return nl_cli_fail("--svg");
    }
    if (json) {
        cJSON *j = cJSON_CreateObject();
        cJSON *arr = cJSON_AddArrayToObject(j, "cases");
        for (size_t i = 0; i < r.n; i++) {
            const nl_valid_case *x = &r.cases[i];
            cJSON *o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "id", x->id);
            cJSON_AddStringToObject(o, "group", x->group);
            cJSON_AddStringToObject(o, "metric", x->metric);
            cJSON_AddStringToObject(o, "unit", x->unit);
            cJSON_AddStringToObject(o, "source", x->source);
            cJSON_AddNumberToObject(o, "published", x->published);
            cJSON_AddNumberToObject(o, "predicted", x->predicted);
            cJSON_AddNumberToObject(o, "error", x->err);
            if (x->fits >= 0) cJSON_AddBoolToObject(o, "fits", x->fits);
            cJSON_AddBoolToObject(o, "formula", x->formula);
            cJSON_AddItemToArray(arr, o);
        }
        cJSON *g = cJSON_AddArrayToObject(j, "groups");
        for (int k = 0; k < 4; k++) {
            const nl_valid_group *G = &r.groups[k];
            cJSON *o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "group", G->group);
            cJSON_AddNumberToObject(o, "n", G->n);
            cJSON_AddNumberToObject(o, "median_abs_error", G->median_abs);
            cJSON_AddNumberToObject(o, "worst_abs_error", G->worst_abs);
            cJSON_AddStringToObject(o, "worst", G->worst_id);
            cJSON_AddNumberToObject(o, "n_formula", G->n_formula);
            cJSON_AddNumberToObject(o, "worst_formula_abs_error", G->worst_formula_abs);
            cJSON_AddItemToArray(g, o);
        }
        cJSON_AddNumberToObject(j, "published_layouts_rejected", r.n_nofit);
        nl_plan_validate_free(&r);
        return nl_cli_print_json(j);
    }
    static const char *hdr[] = {"group", "case", "metric", "published", "predicted", "error", "fits"};
    nl_table t;
    nl_table_init(&t, 7, hdr);
    for (size_t i = 0; i < r.n; i++) {
        const nl_valid_case *x = &r.cases[i];
        nl_table_rowf(&t, "%s|%s|%s|%.4g|%.4g|%+.1f%%|%s", x->group, x->id, x->metric, x->published, x->predicted,
                      100 * x->err,
                      x->fits < 0 ? ""
                      : x->fits   ? "yes"
                                  : "NO");
    }
    nl_table_print(&t, stdout);
    nl_table_free(&t);
    printf("\nSummary (|error| = |predicted / published - 1|):\n");
    for (int k = 0; k < 4; k++) {
        const nl_valid_group *G = &r.groups[k];
        if (!G->n) {
            printf("  %-10s no cases\n", G->group);
            continue;
        }
        printf("  %-10s %2d cases  median %5.1f%%  worst %5.1f%% (%s)", G->group, G->n, 100 * G->median_abs,
               100 * G->worst_abs, G->worst_id);
        if (G->n_formula)
            printf("; %d spelled-out accounting cases, worst %.2f%%", G->n_formula, 100 * G->worst_formula_abs);
        printf("\n");
    }
    printf("  published training layouts the planner rejects as not fitting: %d\n", r.n_nofit);
    printf("Sources: each case's \"source\" in %s (--json prints them).\n", file);
    nl_plan_validate_free(&r);
    return NL_EXIT_OK;
}

int nl_cmd_plan(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? NL_EXIT_USAGE : NL_EXIT_OK;
    }
    const char *sub = argv[1];
    nl_cli_getopt_reset();
    if (!strcmp(sub, "catalog")) return cmd_catalog(argc - 1, argv + 1);
    if (!strcmp(sub, "train")) return cmd_train(argc - 1, argv + 1);
    if (!strcmp(sub, "layer")) return cmd_layer(argc - 1, argv + 1);
    if (!strcmp(sub, "serve")) return cmd_serve(argc - 1, argv + 1);
    if (!strcmp(sub, "pipeline")) return cmd_pipeline(argc - 1, argv + 1);
    if (!strcmp(sub, "validate")) return cmd_validate(argc - 1, argv + 1);
    return nl_cli_usage_error("plan: unknown subcommand '%s' (catalog, train, layer, serve, pipeline)", sub);
}

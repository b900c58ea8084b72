/* Helpers shared by the planner's commands. */
#include "plan_opts.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "nanolm/checkpoint.h"
#include "nanolm/hf.h"
#include "nanolm/model_load.h"
#include "nanolm/model.h"
#include "cli.h"

const char *nl_fmt_count(double v, char *buf, size_t n) {
    static const struct {
        double s;
        const char *u;
    } u[] = {{1e12, "T"}, {1e9, "B"}, {1e6, "M"}, {1e3, "k"}};
    for (size_t i = 0; i < 4; i++)
        if (fabs(v) >= u[i].s) {
            double x = v / u[i].s;
            snprintf(buf, n, x >= 100 ? "%.0f%s" : x >= 10 ? "%.1f%s" : "%.2f%s", x, u[i].u);
            return buf;
        }
    snprintf(buf, n, "%.3g", v);
    return buf;
}

const char *nl_fmt_bytes(double b, char *buf, size_t n) {
    if (b >= 1e12)
        snprintf(buf, n, "%.4g TB", b / 1e12);
    else if (b >= 1e9)
        snprintf(buf, n, "%.4g GB", b / 1e9);
    else if (b >= 1e6)
        snprintf(buf, n, "%.4g MB", b / 1e6);
    else if (b >= 1e3)
        snprintf(buf, n, "%.4g kB", b / 1e3);
    else
        snprintf(buf, n, "%.0f B", b);
    return buf;
}

nl_status nl_cli_model_arch(nl_catalog *cat, const char *arg, nl_arch *out) {
    return nl_cli_model_arch_fam(cat, arg, out, NULL);
}

nl_status nl_cli_model_arch_fam(nl_catalog *cat, const char *arg, nl_arch *out, nl_family *fam) {
    size_t n = strlen(arg);
    if (fam) nl_plan_family("llama", fam); /* folders and checkpoints: Llama blocks (NanoLM's, llama2.c's) */
    if (nl_hf_is_folder(arg) || (n >= 11 && !strcmp(arg + n - 11, "config.json")))
        return nl_arch_from_hf_config(arg, out);
    struct stat st;
    if (!(n >= 5 && !strcmp(arg + n - 5, ".json")) && stat(arg, &st) == 0 && S_ISREG(st.st_mode)) {
        /* a checkpoint the engine serves (GGUF metadata, NanoLM safetensors, llama2.c .bin) */
        return nl_model_load_arch(arg, out);
    }
    return nl_catalog_model_arg_fam(cat, arg, out, fam);
}

void nl_plan_args_init(nl_plan_args *a) {
    memset(a, 0, sizeof *a);
    nl_catalog_init(&a->cat);
    a->gpu = "h100";
    a->recipe = "bf16";
    nl_plan_assume_default(&a->as);
}

/* The option at opts[i] with `given` bound to flag. */
static nl_opt with_given(nl_opt o, int *flag) {
    o.given = flag;
    return o;
}

int nl_plan_model_opts(nl_opt *opts, nl_plan_args *a) {
    opts[0] = (nl_opt)NL_OPT_STR("model", &a->model, "M",
                                 "a catalog name (plan catalog), a model JSON file, a Hugging Face folder or a "
                                 "checkpoint");
    opts[1] = with_given((nl_opt)NL_OPT_SI("params", &a->params, 0, 0, "N",
                                           "parameter count (7B, 500M): alone, or a nominal size for --model's shape"),
                         &a->params_given);
    opts[2] = (nl_opt)NL_OPT_LIST("model-file", &a->model_files, "FILE.json", "add or override catalog models");
    return 3;
}

int nl_plan_hw_opts(nl_opt *opts, nl_plan_args *a, int with_recipe) {
    opts[0] = with_given((nl_opt)NL_OPT_STR("gpu", &a->gpu, "G", "GPU of the catalog (default h100)"), &a->gpu_given);
    opts[1] = (nl_opt)NL_OPT_LIST("hw", &a->hw_files, "FILE.json", "add or override catalog GPUs");
    if (!with_recipe) return 2;
    opts[2] = (nl_opt)NL_OPT_STR("recipe", &a->recipe, "R",
                                 "training precision: fp32, bf16, fp8, fp8-ds3, megatron-bf16 (default bf16)");
    return 3;
}

int nl_plan_assumption_opts(nl_opt *opts, nl_plan_args *a) {
    nl_plan_assume *as = &a->as;
    nl_eff *e = &as->eff;
    int n = 0;
    opts[n++] = (nl_opt)NL_OPT_DBL("gemm-eff", &e->gemm, 0.001, 1, "X",
                                   "share of peak a large GEMM reaches (default: the GPU's, 0.55 on H100)");
    opts[n++] =
        (nl_opt)NL_OPT_DBL("attn-eff", &e->attn, 0.001, 1, "X",
                           "share of peak of flash attention (default: published kernel rates by GPU, sequence and "
                           "head dim; 0.4 on GPUs without them)");
    opts[n++] = (nl_opt)NL_OPT_DBL("kernel-us", &as->kernel_us, 0, INFINITY, "US",
                                   "microseconds per kernel launch (default 5)");
    opts[n++] = (nl_opt)NL_OPT_DBL("tp-overlap", &e->tp_overlap, 0, 1, "X",
                                   "share of tensor-parallel communication hidden behind GEMMs (default 0)");
    opts[n++] = (nl_opt)NL_OPT_DBL("dp-overlap", &e->dp_overlap, 0, 1, "X",
                                   "share of backward that hides data-parallel communication (default 0.8)");
    opts[n++] = (nl_opt)NL_OPT_DBL("usable-mem", &e->usable_mem, 0.001, 1, "X",
                                   "share of GPU memory the allocator can use (default 0.95)");
    opts[n++] = (nl_opt)NL_OPT_DBL("reserved-gb", &as->reserved_gb, 0, INFINITY, "GB",
                                   "GB per GPU held by the context and buffers (default 2)");
    opts[n++] = (nl_opt)NL_OPT_DBL("link-eff", &as->link_eff, 0.001, 1, "X",
                                   "achieved share of NVLink and network bandwidth (default: the GPU's, 0.8)");
    opts[n++] = (nl_opt)NL_OPT_DBL("latency-us", &as->latency_us, 0, INFINITY, "US",
                                   "microseconds per collective call (default: the GPU's, 10)");
    opts[n++] = (nl_opt)NL_OPT_DBL("price", &as->price, 0, INFINITY, "$/H", "$ per GPU-hour (default: the GPU's)");
    opts[n++] =
        (nl_opt)NL_OPT_INT("gpus-per-node", &as->gpus_per_node, 1, 1024, "N", "GPUs per node (default: the GPU's, 8)");
    opts[n++] = (nl_opt)NL_OPT_DBL("mfu", &as->mfu, 0.001, 1, "X",
                                   "time = 6*N*tokens / (peak * X) instead of the kernel model");
    opts[n++] = (nl_opt)NL_OPT_FLAG(
        "napkin", &as->napkin,
        "the course's napkin: --mfu 0.4, --link-eff 1, --latency-us 0, plain rings over one link per GPU");
    return n;
}

int nl_plan_args_load(nl_plan_args *a, const char *cmd) {
    if (a->params_given && !(a->params > 0))
        return nl_cli_usage_error("%s: --params must be a positive count (like 7B), got %g", cmd, a->params);
    for (int i = 0; i < a->hw_files.n; i++)
        if (nl_catalog_load_hw(&a->cat, a->hw_files.v[i])) return nl_cli_fail("--hw");
    for (int i = 0; i < a->model_files.n; i++)
        if (nl_catalog_load_model(&a->cat, a->model_files.v[i])) return nl_cli_fail("--model-file");
    return 0;
}

int nl_plan_args_request(nl_plan_args *a, const char *cmd, nl_train_req *q) {
    memset(q, 0, sizeof *q);
    if (!a->model) return nl_cli_usage_error("%s: --model is required", cmd);
    if (nl_cli_model_arch_fam(&a->cat, a->model, &q->arch, &q->fam))
        return nl_cli_usage_error("%s: --model: %s", cmd, nl_last_error());
    if (nl_catalog_find_hw(&a->cat, a->gpu, &q->hw)) return nl_cli_usage_error("%s: --gpu: %s", cmd, nl_last_error());
    if (nl_plan_recipe(a->recipe, &q->recipe)) return nl_cli_usage_error("%s: --recipe: %s", cmd, nl_last_error());
    nl_plan_assume_train(&a->as, &q->hw, &q->eff);
    q->params_override = a->params;
    return 0;
}

void nl_plan_report_assumptions(nl_report *r, const nl_train_req *q) {
    const nl_eff *e = &q->eff;
    nl_report_note(r, "Assumptions (override with the option named):");
    if (e->fixed_mfu > 0)
        nl_report_note(r, "  --mfu %.2f          compute = 6*N*tokens / (peak * MFU), the napkin model", e->fixed_mfu);
    else {
        nl_report_note(r,
                       "  --gemm-eff %.2f     share of %s's %.0f TFLOP/s GEMMs get in a training stack (roofline per "
                       "GEMM;\n                     calibrated on published runs, docs/planning.md)",
                       e->gemm > 0 ? e->gemm : q->hw.gemm_eff, q->hw.name, q->hw.flops_bf16 / 1e12);
        if (e->attn > 0)
            nl_report_note(r, "  --attn-eff %.2f     flash attention's share of peak (given)", e->attn);
        else {
            double f, b;
            int gen =
                nl_plan_attn_eff(&q->hw, (double)q->seq, (double)nl_arch_head_dim(&q->arch), q->attn_triton, &f, &b);
            nl_report_note(r,
                           "  --attn-eff %.2f/%.2f flash attention forward/backward share of peak at sequence %lld, "
                           "head dim %lld\n                     (%s; docs/planning.md)",
                           f, b, (long long)q->seq, (long long)nl_arch_head_dim(&q->arch),
                           gen == 2   ? "FlashAttention-3's published H100 rates"
                           : gen == 1 ? "FlashAttention-2's published A100 rates"
                                      : "no published rates for this GPU: the fallback");
        }
        nl_report_note(r,
                       "  --kernel-us %.0f      per kernel launch, %.0f kernels per layer forward, twice in backward",
                       e->kernel_s * 1e6, e->kernels_per_layer);
    }
    nl_report_note(r, "  --tp-overlap %.2f   share of tensor-parallel communication hidden behind GEMMs",
                   e->tp_overlap);
    nl_report_note(r, "  --dp-overlap %.2f   share of backward that hides data-parallel communication", e->dp_overlap);
    nl_report_note(
        r, "  --link-eff %.2f     achieved share of NVLink %.0f GB/s and network %.0f GB/s per GPU, nodes of %lld",
        q->hw.intra_eff, q->hw.intra_bw / 1e9, q->hw.inter_bw / 1e9, (long long)q->hw.gpus_per_node);
    nl_report_note(r, "  --latency-us %.0f    per collective call", q->hw.latency_s * 1e6);
    nl_report_note(r, "  --usable-mem %.2f   of %.0f GB, minus --reserved-gb %.1f", e->usable_mem,
                   q->hw.mem_bytes / 1e9, e->reserved_bytes / 1e9);
    nl_report_note(r, "  --price %.2f        $ per GPU-hour", q->hw.price_per_hour);
}

void nl_plan_table_rowf(nl_report *r, int ncols, const char *fmt, ...) {
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    char *p = buf;
    for (int c = 0; c < ncols; c++) {
        char *bar = c + 1 < ncols ? strchr(p, '|') : NULL;
        if (bar) *bar = 0;
        nl_report_cell_str(r, p);
        p = bar ? bar + 1 : p + strlen(p);
    }
    nl_report_row_end(r);
}

/* Helpers shared by the planner's commands. */
#include "plan_opts.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "nanolm/checkpoint.h"
#include "nanolm/hf.h"
#include "nanolm/model.h"

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

int nl_parse_zero(const char *s) {
    if (!strcasecmp(s, "0") || !strcasecmp(s, "ddp")) return NL_ZERO_0;
    if (!strcasecmp(s, "1") || !strcasecmp(s, "zero1")) return NL_ZERO_1;
    if (!strcasecmp(s, "2") || !strcasecmp(s, "zero2")) return NL_ZERO_2;
    if (!strcasecmp(s, "3") || !strcasecmp(s, "zero3") || !strcasecmp(s, "fsdp")) return NL_ZERO_3;
    if (!strcasecmp(s, "hsdp")) return NL_ZERO_HSDP;
    return -1;
}

int nl_parse_recompute(const char *s) {
    if (!strcasecmp(s, "none")) return NL_RECOMPUTE_NONE;
    if (!strcasecmp(s, "selective")) return NL_RECOMPUTE_SELECTIVE;
    if (!strcasecmp(s, "full")) return NL_RECOMPUTE_FULL;
    return -1;
}

nl_status nl_cli_model_arch(nl_catalog *cat, const char *arg, nl_arch *out) {
    size_t n = strlen(arg);
    if (nl_hf_is_folder(arg) || (n >= 11 && !strcmp(arg + n - 11, "config.json")))
        return nl_arch_from_hf_config(arg, out);
    struct stat st;
    if (!(n >= 5 && !strcmp(arg + n - 5, ".json")) && stat(arg, &st) == 0 && S_ISREG(st.st_mode)) {
        /* a checkpoint the engine serves (NanoLM safetensors, llama2.c .bin): its shape */
        nl_model m;
        char kind[64];
        NL_TRY(nl_ckpt_load_model(arg, &m, kind));
        *out = m.arch;
        nl_model_free(&m);
        return NL_OK;
    }
    return nl_catalog_model_arg(cat, arg, out);
}

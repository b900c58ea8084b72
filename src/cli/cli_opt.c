/* Declarative command-line options: parse argv and write --help from one table (cli_opt.h). */
#include "cli_opt.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

/* Does `name` (length len) match the option's name or one of its ','-separated aliases? */
static int opt_matches(const nl_opt *o, const char *name, size_t len) {
    if (strlen(o->name) == len && !strncmp(o->name, name, len)) return 1;
    for (const char *a = o->aliases; a && *a;) {
        const char *end = strchr(a, ',');
        size_t alen = end ? (size_t)(end - a) : strlen(a);
        if (alen == len && !strncmp(a, name, len)) return 1;
        if (!end) break;
        a = end + 1;
    }
    return 0;
}

static const nl_opt *find_opt(const nl_cmdspec *spec, const char *name, size_t len) {
    for (int g = 0; g < spec->ngroups; g++)
        for (int i = 0; i < spec->groups[g].n; i++)
            if (opt_matches(&spec->groups[g].opts[i], name, len)) return &spec->groups[g].opts[i];
    return NULL;
}

const char *nl_cli_choice_name(const char *choices, int index) {
    static char buf[64];
    const char *p = choices ? choices : "";
    for (int i = 0; i < index && p; i++) {
        p = strchr(p, '|');
        if (p) p++;
    }
    if (!p) return "?";
    const char *end = strchr(p, '|');
    size_t n = end ? (size_t)(end - p) : strlen(p);
    if (n >= sizeof buf) n = sizeof buf - 1;
    memcpy(buf, p, n);
    buf[n] = 0;
    return buf;
}

static int choice_index(const char *choices, const char *value) {
    size_t vlen = strlen(value);
    int i = 0;
    for (const char *p = choices; p && *p; i++) {
        const char *end = strchr(p, '|');
        size_t n = end ? (size_t)(end - p) : strlen(p);
        if (n == vlen && !strncmp(p, value, n)) return i;
        if (!end) break;
        p = end + 1;
    }
    return -1;
}

/* Is `s` a whole number as strtod reads it ("-inf", "-nan", "-1e5")? Such a bare argument is a
 * value, not an option. */
static int is_number(const char *s) {
    char *end = NULL;
    (void)strtod(s, &end);
    return end != s && *end == 0;
}

static int has_range(const nl_opt *o) { return !(o->min == 0 && o->max == 0); }

static int range_error(const char *cmd, const nl_opt *o, const char *value) {
    if (o->max == INFINITY) return nl_cli_usage_error("%s: --%s must be >= %.17g, got %s", cmd, o->name, o->min, value);
    return nl_cli_usage_error("%s: --%s must be in [%.17g, %.17g], got %s", cmd, o->name, o->min, o->max, value);
}

/* Stores `value` into the option's destination; prints an error and returns NL_EXIT_USAGE when
 * the value is not of the option's type or outside its range. */
static int set_value(const char *cmd, const nl_opt *o, const char *value) {
    char optname[96];
    snprintf(optname, sizeof optname, "--%s", o->name);
    switch (o->type) {
    case NL_OPT_T_FLAG: *(int *)o->dest = 1; return 0;
    case NL_OPT_T_STRING:
        if (!*value) return nl_cli_usage_error("%s: --%s needs a non-empty value", cmd, o->name);
        *(const char **)o->dest = value;
        return 0;
    case NL_OPT_T_LIST: {
        nl_opt_list *l = o->dest;
        if (!*value) return nl_cli_usage_error("%s: --%s needs a non-empty value", cmd, o->name);
        if (l->n >= NL_OPT_LIST_MAX)
            return nl_cli_usage_error("%s: --%s given more than %d times", cmd, o->name, NL_OPT_LIST_MAX);
        l->v[l->n++] = value;
        return 0;
    }
    case NL_OPT_T_CHOICE: {
        int k = choice_index(o->choices, value);
        if (k < 0) return nl_cli_usage_error("%s: --%s must be one of %s, got '%s'", cmd, o->name, o->choices, value);
        *(int *)o->dest = k;
        return 0;
    }
    case NL_OPT_T_INT:
    case NL_OPT_T_INT32: {
        int64_t lo = INT64_MIN, hi = INT64_MAX;
        if (has_range(o)) {
            lo = o->min <= -9.2e18 ? INT64_MIN : (int64_t)o->min;
            hi = o->max >= 9.2e18 ? INT64_MAX : (int64_t)o->max;
        }
        if (o->type == NL_OPT_T_INT32) {
            if (lo < INT32_MIN) lo = INT32_MIN;
            if (hi > INT32_MAX) hi = INT32_MAX;
        }
        int64_t v;
        if (nl_cli_int(optname, value, lo, hi, &v)) return NL_EXIT_USAGE;
        if (o->type == NL_OPT_T_INT)
            *(int64_t *)o->dest = v;
        else
            *(int *)o->dest = (int)v;
        return 0;
    }
    case NL_OPT_T_DOUBLE:
    case NL_OPT_T_FLOAT:
    case NL_OPT_T_SI: {
        double v;
        if ((o->type == NL_OPT_T_SI ? nl_cli_double_si : nl_cli_double)(optname, value, &v)) return NL_EXIT_USAGE;
        if (has_range(o) && (v < o->min || v > o->max)) return range_error(cmd, o, value);
        if (o->type == NL_OPT_T_FLOAT) {
            if (fabs(v) > 3.4028234663852886e38)
                return nl_cli_usage_error("%s: --%s is too large for a float: %s", cmd, o->name, value);
            *(float *)o->dest = (float)v;
        } else {
            *(double *)o->dest = v;
        }
        return 0;
    }
    }
    return nl_cli_usage_error("%s: --%s has an unknown option type", cmd, o->name);
}

int nl_cli_parse(const nl_cmdspec *spec, int argc, char **argv, const char **positional, int *npositional) {
    int npos = 0, options_done = 0;
    if (npositional) *npositional = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!options_done && (!strcmp(a, "--help") || !strcmp(a, "-h"))) {
            nl_cli_help(spec, stdout);
            return NL_CLI_HELP;
        }
        if (!options_done && !strcmp(a, "--")) {
            options_done = 1;
            continue;
        }
        if (!options_done && a[0] == '-' && a[1] == '-') {
            const char *name = a + 2, *eq = strchr(name, '=');
            size_t len = eq ? (size_t)(eq - name) : strlen(name);
            const nl_opt *o = find_opt(spec, name, len);
            if (!o)
                return nl_cli_usage_error("%s: unknown option '--%.*s' (see nanolm %s --help)", spec->name, (int)len,
                                          name, spec->name);
            const char *value = NULL;
            if (o->type == NL_OPT_T_FLAG) {
                if (eq) return nl_cli_usage_error("%s: --%s takes no value, got '%s'", spec->name, o->name, a);
            } else if (eq) {
                value = eq + 1;
            } else if (i + 1 < argc) {
                value = argv[++i];
            } else {
                return nl_cli_usage_error("%s: --%s needs a value (%s)", spec->name, o->name,
                                          o->arg ? o->arg : (o->choices ? o->choices : "VALUE"));
            }
            int rc = set_value(spec->name, o, value);
            if (rc) return rc;
            if (o->given) *o->given = 1;
            continue;
        }
        if (!options_done && a[0] == '-' && a[1] && !(a[1] >= '0' && a[1] <= '9') && a[1] != '.' && !is_number(a))
            return nl_cli_usage_error("%s: unknown option '%s' (see nanolm %s --help)", spec->name, a, spec->name);
        if (npos >= spec->max_positional) return nl_cli_usage_error("%s: unexpected argument '%s'", spec->name, a);
        if (positional) positional[npos] = a;
        npos++;
    }
    if (npositional) *npositional = npos;
    return 0;
}

void nl_cli_help(const nl_cmdspec *spec, FILE *f) {
    fprintf(f, "usage: %s\n", spec->usage ? spec->usage : spec->name);
    if (spec->summary) fprintf(f, "\n%s\n", spec->summary);
    for (int g = 0; g < spec->ngroups; g++) {
        const nl_optgroup *grp = &spec->groups[g];
        if (grp->n == 0) continue;
        fprintf(f, "\n%s:\n", grp->title ? grp->title : "options");
        for (int i = 0; i < grp->n; i++) {
            const nl_opt *o = &grp->opts[i];
            char lhs[96];
            const char *meta = o->arg;
            if (!meta && o->type == NL_OPT_T_CHOICE) meta = o->choices;
            snprintf(lhs, sizeof lhs, "--%s%s%s", o->name, meta ? " " : "", meta ? meta : "");
            if (strlen(lhs) > 24)
                fprintf(f, "  %s\n  %-24s %s", lhs, "", o->help ? o->help : "");
            else
                fprintf(f, "  %-24s %s", lhs, o->help ? o->help : "");
            if (o->aliases) {
                fputs(" [also:", f);
                for (const char *a = o->aliases; *a;) {
                    size_t n = strcspn(a, ",");
                    fprintf(f, " --%.*s", (int)n, a);
                    a += n;
                    if (*a) a++;
                }
                fputc(']', f);
            }
            fputc('\n', f);
        }
    }
    fprintf(f, "\n  %-24s %s\n", "--help", "this help");
}

int nl_cli_model_opts(nl_opt *opts, nl_model_args *a, int with_weights) {
    a->ckpt = a->tokenizer = a->weights = NULL;
    opts[0] = (nl_opt)NL_OPT_STR(
        "ckpt", &a->ckpt, "F",
        "model: a Hugging Face folder, a GGUF file, a safetensors checkpoint or a llama2.c .bin (required)");
    opts[1] = (nl_opt)NL_OPT_STR("tokenizer", &a->tokenizer, "FILE",
                                 "tokenizer (tok512.bin or tokenizer.json); needed for llama2.c .bin checkpoints");
    if (!with_weights) return 2;
    opts[2] = (nl_opt)NL_OPT_STR("weights", &a->weights, "auto|fp32|bf16|int8|int4",
                                 "decode weight format (default auto: fp32; int8 for a checkpoint that quant model "
                                 "wrote or a q8_0 GGUF; int4 for a q4_0 GGUF)");
    return 3;
}

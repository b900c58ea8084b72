/*
 * Declarative command-line options: one table per command that both parses argv and writes
 * `--help`, so the two cannot disagree.
 *
 * A command declares its options as an array of nl_opt, each bound to a typed destination (a field
 * of the command's own struct), with an optional range, choices and old spellings (aliases).
 * Option groups shared by several commands (model shape, data, training, parallel layout, planner
 * assumptions) are arrays declared once by a function that fills them for a given struct; a
 * command passes a list of groups to nl_cli_parse.
 *
 *     int64_t steps = 2000; double lr = 1e-3; const char *data = NULL; int json = 0;
 *     nl_opt opts[] = {
 *         NL_OPT_STR("data", &data, "FILE", "training text (required)"),
 *         NL_OPT_INT("steps", &steps, 1, 100000000, "N", "optimizer steps (default 2000)"),
 *         NL_OPT_DBL("lr", &lr, 0, INFINITY, "X", "peak learning rate (default 1e-3)"),
 *         NL_OPT_FLAG("json", &json, "print the result as JSON"),
 *     };
 *     nl_optgroup groups[] = {{"options", opts, NL_NOPTS(opts)}};
 *     nl_cmdspec spec = {"train", "nanolm train --data FILE [options]", "train NanoLM on a text file",
 *                        groups, 1};
 *     int rc = nl_cli_parse(&spec, argc, argv, NULL);
 *     if (rc) return rc == NL_CLI_HELP ? NL_EXIT_OK : rc;
 *
 * `--help` (and `-h`) is always accepted and printed from the table. Values are given as
 * `--name VALUE` or `--name=VALUE`. Errors are one line on stderr naming the option and the value
 * ("nanolm: train: --steps must be in [1, 100000000], got 0").
 */
#ifndef NANOLM_CLI_OPT_H
#define NANOLM_CLI_OPT_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>

typedef enum nl_opt_type {
    NL_OPT_T_FLAG,   /* int *: set to 1 (no value) */
    NL_OPT_T_INT,    /* int64_t *: decimal integer in [min, max] */
    NL_OPT_T_INT32,  /* int *: decimal integer in [min, max] (min/max within int) */
    NL_OPT_T_DOUBLE, /* double *: finite number in [min, max] (min == max == 0: any finite) */
    NL_OPT_T_FLOAT,  /* float *: as DOUBLE, stored as float */
    NL_OPT_T_SI,     /* double *: number with k/M/B/T suffix (7B = 7e9) in [min, max] */
    NL_OPT_T_STRING, /* const char **: the argument as given (points into argv) */
    NL_OPT_T_CHOICE, /* int *: index of the value in `choices` ("fp32|bf16|fp16") */
    NL_OPT_T_LIST,   /* nl_opt_list *: every occurrence appended (--run A --run B), up to NL_OPT_LIST_MAX */
} nl_opt_type;

/* The destination of a repeatable option (NL_OPT_T_LIST): the values as given, in order. */
#define NL_OPT_LIST_MAX 16
typedef struct nl_opt_list {
    const char *v[NL_OPT_LIST_MAX];
    int n;
} nl_opt_list;

typedef struct nl_opt {
    const char *name; /* long name without "--" */
    nl_opt_type type;
    void *dest;          /* typed destination, see nl_opt_type */
    double min, max;     /* range for numbers (both 0: no range beyond finiteness) */
    const char *choices; /* CHOICE: '|'-separated names */
    const char *arg;     /* metavariable shown in --help ("N", "FILE"); NULL for flags */
    const char *help;    /* one line, including the default where there is one */
    const char *aliases; /* old spellings still accepted, ','-separated, or NULL */
    int *given;          /* optional: set to 1 when the option appears */
} nl_opt;

#define NL_OPT_FLAG(n, d, h)                                                                                           \
    { (n), NL_OPT_T_FLAG, (d), 0, 0, NULL, NULL, (h), NULL, NULL }
#define NL_OPT_INT(n, d, lo, hi, a, h)                                                                                 \
    { (n), NL_OPT_T_INT, (d), (lo), (hi), NULL, (a), (h), NULL, NULL }
#define NL_OPT_INT32(n, d, lo, hi, a, h)                                                                               \
    { (n), NL_OPT_T_INT32, (d), (lo), (hi), NULL, (a), (h), NULL, NULL }
#define NL_OPT_DBL(n, d, lo, hi, a, h)                                                                                 \
    { (n), NL_OPT_T_DOUBLE, (d), (lo), (hi), NULL, (a), (h), NULL, NULL }
#define NL_OPT_FLT(n, d, lo, hi, a, h)                                                                                 \
    { (n), NL_OPT_T_FLOAT, (d), (lo), (hi), NULL, (a), (h), NULL, NULL }
#define NL_OPT_SI(n, d, lo, hi, a, h)                                                                                  \
    { (n), NL_OPT_T_SI, (d), (lo), (hi), NULL, (a), (h), NULL, NULL }
#define NL_OPT_STR(n, d, a, h)                                                                                         \
    { (n), NL_OPT_T_STRING, (d), 0, 0, NULL, (a), (h), NULL, NULL }
#define NL_OPT_LIST(n, d, a, h)                                                                                        \
    { (n), NL_OPT_T_LIST, (d), 0, 0, NULL, (a), (h), NULL, NULL }
#define NL_OPT_CHOICE(n, d, c, h)                                                                                      \
    { (n), NL_OPT_T_CHOICE, (d), 0, 0, (c), NULL, (h), NULL, NULL }
#define NL_NOPTS(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* The option o with its old spellings (','-separated, without "--") still accepted:
 * nl_opt_aliased((nl_opt)NL_OPT_INT("microbatches", &m, 1, 256, "M", "..."), "micro"). */
static inline nl_opt nl_opt_aliased(nl_opt o, const char *aliases) {
    o.aliases = aliases;
    return o;
}

typedef struct nl_optgroup {
    const char *title; /* heading in --help ("training", "parallel layout"); NULL: "options" */
    nl_opt *opts;
    int n;
} nl_optgroup;

typedef struct nl_cmdspec {
    const char *name;    /* "train", "plan serve": used in error messages */
    const char *usage;   /* first help line after "usage: " */
    const char *summary; /* one paragraph printed under the usage line, or NULL */
    const nl_optgroup *groups;
    int ngroups;
    int max_positional; /* how many bare arguments are accepted (0: none) */
} nl_cmdspec;

/* The model-loading option group shared by the commands that load a checkpoint (generate, quant
 * model, quant compare): --ckpt, --tokenizer and, with_weights != 0, --weights. Fills opts (room for
 * 3) bound to a's fields and returns how many it filled; a's fields start NULL (not given). */
typedef struct nl_model_args {
    const char *ckpt;      /* a Hugging Face folder, safetensors checkpoint or llama2.c .bin */
    const char *tokenizer; /* tokenizer file, or NULL: the checkpoint's own */
    const char *weights;   /* decode weight format name (auto|fp32|bf16|int8|int4), or NULL: auto */
} nl_model_args;
int nl_cli_model_opts(nl_opt *opts, nl_model_args *a, int with_weights);

/* Returned by nl_cli_parse when --help was printed: the command returns NL_EXIT_OK. */
#define NL_CLI_HELP (-1)

/* Parses argv[1..argc) against the spec's groups (argv[0] is the command name). Bare arguments
 * (up to spec->max_positional) are stored in order in positional[] (which must hold that many)
 * and counted in *npositional (either may be NULL when max_positional is 0). "--" ends the
 * options; a bare argument that reads as a number ("-1.5", "-inf") is positional, not an option.
 * Returns 0 on success, NL_CLI_HELP after printing --help on stdout, or NL_EXIT_USAGE
 * after printing one line on stderr naming the option and what was wrong with it. */
int nl_cli_parse(const nl_cmdspec *spec, int argc, char **argv, const char **positional, int *npositional);

/* Writes the help text of the spec (usage, summary, every group's options with their metavariable,
 * choices and aliases) to f. */
void nl_cli_help(const nl_cmdspec *spec, FILE *f);

/* The name of choice `index` of a '|'-separated list, in a static buffer (for messages). */
const char *nl_cli_choice_name(const char *choices, int index);

#endif

/* Helpers shared by the planner's commands (scaling, budget, plan): formatting, and the option
 * groups declared once (model, hardware, planner assumptions) with what turns them into a request. */
#ifndef NANOLM_CLI_PLAN_OPTS_H
#define NANOLM_CLI_PLAN_OPTS_H

#include <stddef.h>
#include "cli_opt.h"
#include "nanolm/plan.h"
#include "nanolm/plan_assume.h"
#include "report.h"

/* "7.00B", "20.2B", "1.50T", "512M" (3 significant digits). */
const char *nl_fmt_count(double v, char *buf, size_t n);
/* Bytes with a decimal unit: "12.25 GB", "201.3 MB". */
const char *nl_fmt_bytes(double bytes, char *buf, size_t n);

/* The architecture named by --model: a Hugging Face model folder or its config.json (read by
 * nl_arch_from_hf_config), a checkpoint the engine serves (NanoLM safetensors, llama2.c .bin),
 * a model JSON file, or a catalog name. Errors name the input. */
nl_status nl_cli_model_arch(nl_catalog *cat, const char *arg, nl_arch *out);
/* The same with the model's family (catalog entry or the model file's "family" field; llama for a
 * folder or a checkpoint): the name of a file or of its model never sets it. */
nl_status nl_cli_model_arch_fam(nl_catalog *cat, const char *arg, nl_arch *out, nl_family *fam);

/* What the planner's shared option groups fill: the model, the hardware and the assumptions of
 * the cost model. Numbers left at their initial values mean "the default". */
typedef struct nl_plan_args {
    const char *model;       /* --model NAME|FILE|DIR, or NULL */
    double params;           /* --params N: a nominal parameter count (0: the model's own) */
    int params_given;        /* --params appeared (its value is checked to be > 0) */
    nl_opt_list model_files; /* --model-file FILE.json, in order */
    const char *gpu;         /* --gpu NAME (default h100) */
    int gpu_given;           /* --gpu appeared */
    nl_opt_list hw_files;    /* --hw FILE.json, in order */
    const char *recipe;      /* --recipe NAME (default bf16) */
    nl_plan_assume as;       /* the assumptions group: --gemm-eff, ..., --mfu, --napkin */
    nl_catalog cat;        /* the built-in catalog plus --hw / --model-file entries */
} nl_plan_args;

/* Sets every field to "not given" and the catalog to the built-in one. */
void nl_plan_args_init(nl_plan_args *a);

/* The model group: --model, --params, --model-file. Fills opts (room for 3); returns how many. */
int nl_plan_model_opts(nl_opt *opts, nl_plan_args *a);
/* The hardware group: --gpu, --hw and, with_recipe != 0, --recipe. Fills opts (room for 3). */
int nl_plan_hw_opts(nl_opt *opts, nl_plan_args *a, int with_recipe);
/* The planner's assumptions: efficiencies, overlaps, links, memory, price, --mfu, --napkin.
 * Fills opts (room for NL_PLAN_ASSUMPTION_OPTS); returns how many. */
#define NL_PLAN_ASSUMPTION_OPTS 13
int nl_plan_assumption_opts(nl_opt *opts, nl_plan_args *a);

/* After parsing: checks --params (> 0 when given) and loads the --hw and --model-file files into
 * a->cat. Returns 0, NL_EXIT_USAGE or NL_EXIT_FAIL (a file that did not load), the message printed. */
int nl_plan_args_load(nl_plan_args *a, const char *cmd);

/* Fills q's model (required), GPU, recipe and assumptions from the groups (the rest of q zero).
 * Returns 0 or NL_EXIT_USAGE after printing a message that starts with cmd. */
int nl_plan_args_request(nl_plan_args *a, const char *cmd, nl_train_req *q);

/* The assumptions a training plan used, each with the option that overrides it (text only). */
void nl_plan_report_assumptions(nl_report *r, const nl_train_req *q);

/* A row of a text-only report table from one '|'-separated printf line ("%s|%.1f ms|how"): ncols
 * string cells (the last takes the rest of the line), then the row ends. */
void nl_plan_table_rowf(nl_report *r, int ncols, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* The runner of `plan validate` (nl_valid_runner): runs "plan ..." or "budget ..." in this process
 * as a user would run it, its standard output and error captured; returns the output (the
 * error's text when it failed, malloc'd) and the exit status in *status, or NULL when the line
 * is not one of those commands or could not be captured. ctx is unused. */
char *nl_cli_validate_run(const char *command, int *status, void *ctx);

/* `plan serve` against a CPU measured by `nanolm bench machine` (cmd_plan_engine.c): prints
 * the engine cost model's predictions (plan_engine.h) as a table or JSON; returns the exit code. */
struct nl_cpu_rates;
struct nl_engine_plan_req;
int nl_cli_plan_serve_engine(const struct nl_cpu_rates *r, const struct nl_engine_plan_req *q, int json);

#endif

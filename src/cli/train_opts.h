/*
 * The option groups of the training commands, declared once (cli_opt.h): the training group
 * (schedule, optimizer, batch, validation, checkpoints, logs) that `train`, `parallel train` and
 * `moe train` share, and the parallel layout group (--dp/--tp/--pp/--cp/--ep, --zero,
 * --microbatches, --schedule, --impl, --timeout, --inject-fault) of `parallel train` and
 * `moe train`. One spelling per idea; the spellings of earlier releases are aliases.
 *
 *     nl_train_args ta = {.o = &opts};           // opts holds the command's defaults
 *     nl_opt train[NL_TRAIN_NOPTS];
 *     int n = nl_cli_train_opts(train, &ta);     // help lines say those defaults
 *     ... nl_cli_parse(...) ...
 *     if ((rc = nl_cli_train_finish(&ta, "train"))) return rc;
 */
#ifndef NANOLM_CLI_TRAIN_OPTS_H
#define NANOLM_CLI_TRAIN_OPTS_H

#include "cli_opt.h"
#include "nanolm/train.h"
#include "report.h"

/* Options of the training group that a command may leave out (nl_train_args.omit). */
enum {
    NL_TRAIN_OMIT_SVG = 1,        /* --svg */
    NL_TRAIN_OMIT_PRECISION = 2,  /* --precision */
    NL_TRAIN_OMIT_GRAD_ACCUM = 4, /* --grad-accum */
};

#define NL_TRAIN_NOPTS 20 /* room for the training group */
#define NL_TRAIN_HELP  128

/* The training group bound to a command's nl_train_opts. The command sets o (with its defaults
 * already in it), omit and the three wording flags; the group fills the rest. */
typedef struct nl_train_args {
    nl_train_opts *o;
    unsigned omit;       /* NL_TRAIN_OMIT_* */
    int seq_from_preset; /* --seq defaults to the model's window (else o->seq) */
    int lr_min_is_lr;    /* --lr-min defaults to --lr, a constant rate (else lr/10, the cosine) */
    int eval_when_asked; /* validation only with --eval-every/--eval-windows (else every o->eval_every) */
    const char *data;    /* --data FILE (required) */
    const char *log_csv; /* --log CSV, or NULL */
    const char *svg;     /* --svg PLOT, or NULL */
    int precision;       /* --precision: index in NL_TRAIN_PRECISIONS */
    int seq_given, lr_min_given, eval_given, windows_given, precision_given, warmup_given;
    char help[NL_TRAIN_NOPTS][NL_TRAIN_HELP]; /* help lines with this command's defaults */
} nl_train_args;

/* --precision's choices, in the order of nl_train_args.precision. fp8 is bf16 with FP8 linears. */
#define NL_TRAIN_PRECISIONS "fp32|bf16|fp16|fp8"
enum { NL_TRAIN_FP32, NL_TRAIN_BF16, NL_TRAIN_FP16, NL_TRAIN_FP8 };

/* Fills opts (room for NL_TRAIN_NOPTS) with the training group bound to a->o and a's fields, the
 * help lines saying the defaults now in a->o; returns how many options it filled. */
int nl_cli_train_opts(nl_opt *opts, nl_train_args *a);

/* After parsing: the derived defaults (lr_min = lr/10 or lr, warmup below steps, byte tokens,
 * the precision) and the checks every training command makes, naming the flag: --data given, --lr positive,
 * --lr-min not above --lr, and every output (--out, --log, --svg) writable before any work.
 * --seq from the preset is the command's (it knows the model). Returns 0 or the exit status
 * after one message starting "nanolm: <cmd>:". */
int nl_cli_train_finish(nl_train_args *a, const char *cmd);

/* Options of the layout group that a command offers (nl_layout_args.offer). */
enum {
    NL_LAYOUT_DP_TP_PP = 1, /* --dp --tp --pp --zero --microbatches --schedule --sp --no-overlap */
    NL_LAYOUT_EP_CP = 2,    /* --ep --cp */
    NL_LAYOUT_TIMEOUT = 4,  /* --timeout */
    NL_LAYOUT_FAULT = 8,    /* --inject-fault */
};
#define NL_LAYOUT_NOPTS 13

/* The parallel layout group: sizes of each kind of parallelism and how the ranks talk. */
typedef struct nl_layout_args {
    unsigned offer;             /* NL_LAYOUT_*: the options this command takes */
    int64_t dp, tp, pp, cp, ep; /* dp 0: the ranks left over; the others default to 1 */
    int64_t zero;               /* 0 = DDP, 1, 2, 3 */
    int64_t microbatches;       /* with --pp: micro-batches per step (default 1) */
    int schedule;               /* with --pp: index in "gpipe|1f1b" */
    int impl;                   /* collectives: index in "ours|native" */
    int sp, no_overlap;         /* --sp, --no-overlap */
    double timeout_s;           /* --timeout, when timeout_given */
    int timeout_given;
    const char *inject_fault; /* --inject-fault R[:how]@S, or NULL */
} nl_layout_args;

/* Fills a with the layout defaults and opts (room for NL_LAYOUT_NOPTS) with the options a->offer
 * names (set a->offer first); returns how many it filled. */
int nl_cli_layout_opts(nl_opt *opts, nl_layout_args *a);

/* The fields of every training command's JSON, whatever the layout: `train --json` and
 * `train --dp N --json` have the same shape, a layout adds its own fields and never renames these:
 * preset, parameters (of the whole model), steps, train_loss and val_loss (of the last logged
 * step; null when none), wall_s, tokens_per_s, skipped_steps. JSON only (each command words its
 * own text). */
void nl_cli_train_summary(nl_report *r, const nl_trainer *t, const char *preset, long long n_params, double wall_s,
                          double tokens_per_s);

/* SIGTERM / SIGINT during training (cmd_train.c): the first one sets nl_train_stop_signal (the
 * trainer finishes the step, saves, and stops); a second one exits at once. on = 1 catches both,
 * on = 0 restores what was there. */
extern volatile int nl_train_stop_signal;
void nl_train_catch_stop_signals(int on);

/* The line after a run a signal stopped: "stopped by SIGTERM after step S of N; resume with
 * --resume OUT" (or that nothing was saved); nothing when t was not stopped. */
void nl_cli_train_stopped(const nl_trainer *t, const nl_train_opts *o);

#endif

/* The training and parallel layout option groups, declared once (train_opts.h). */
#include "train_opts.h"

#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"

/* The next help line of a, formatted. */
static const char *help_line(nl_train_args *a, int *k, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static const char *help_line(nl_train_args *a, int *k, const char *fmt, ...) {
    char *h = a->help[(*k)++];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(h, NL_TRAIN_HELP, fmt, ap);
    va_end(ap);
    return h;
}

int nl_cli_train_opts(nl_opt *opts, nl_train_args *a) {
    nl_train_opts *o = a->o;
    int n = 0, k = 0;
    char seq[40];
    if (a->seq_from_preset)
        snprintf(seq, sizeof seq, ": the preset's seq_len");
    else
        snprintf(seq, sizeof seq, " %lld", (long long)o->seq);
    a->precision = o->precision == NL_PREC_BF16 ? NL_TRAIN_BF16 : o->precision == NL_PREC_FP16 ? NL_TRAIN_FP16 : 0;
    opts[n++] = (nl_opt)NL_OPT_STR("data", &a->data, "FILE",
                                   "training text (required; byte tokens, the last 10% = validation)");
    opts[n++] = (nl_opt)NL_OPT_INT("steps", &o->steps, 1, 100000000, "N",
                                   help_line(a, &k, "optimizer steps (default %lld)", (long long)o->steps));
    opts[n++] = (nl_opt)NL_OPT_INT(
        "batch", &o->batch, 1, 65536, "B",
        help_line(a, &k, "windows per micro-batch and data-parallel rank (default %lld)", (long long)o->batch));
    opts[n++] =
        (nl_opt)NL_OPT_INT("seq", &o->seq, 1, 1 << 20, "T", help_line(a, &k, "tokens per window (default%s)", seq));
    opts[n - 1].given = &a->seq_given;
    opts[n++] = (nl_opt)NL_OPT_FLT("lr", &o->lr, 0, INFINITY, "X",
                                   help_line(a, &k, "peak learning rate (default %g)", (double)o->lr));
    opts[n++] = (nl_opt)NL_OPT_FLT("lr-min", &o->lr_min, 0, INFINITY, "X",
                                   help_line(a, &k, "final learning rate of the cosine (default %s)",
                                             a->lr_min_is_lr ? "--lr: a constant rate" : "lr/10"));
    opts[n - 1].given = &a->lr_min_given;
    opts[n++] = (nl_opt)NL_OPT_INT(
        "warmup", &o->warmup, 0, 100000000, "N",
        help_line(a, &k, "linear warmup steps (default %lld; steps/10 when >= steps; --resume: the run's own)",
                  (long long)o->warmup));
    opts[n - 1].given = &a->warmup_given;
    if (!(a->omit & NL_TRAIN_OMIT_GRAD_ACCUM))
        opts[n++] =
            (nl_opt)NL_OPT_INT("grad-accum", &o->grad_accum, 1, 65536, "K",
                               help_line(a, &k, "micro-batches per step (default %lld)", (long long)o->grad_accum));
    opts[n++] =
        (nl_opt)NL_OPT_FLT("weight-decay", &o->weight_decay, 0, INFINITY, "X",
                           help_line(a, &k, "AdamW decay of 2-D weights (default %g)", (double)o->weight_decay));
    opts[n++] = (nl_opt)NL_OPT_FLT("clip", &o->grad_clip, 0, INFINITY, "X",
                                   help_line(a, &k, "gradient-norm clip, 0 = off (default %g)", (double)o->grad_clip));
    if (!(a->omit & NL_TRAIN_OMIT_PRECISION)) {
        opts[n++] = (nl_opt)NL_OPT_CHOICE("precision", &a->precision, NL_TRAIN_PRECISIONS,
                                          "fp32 (default) | bf16 | fp16 | fp8 (emulated: bf16 + FP8 linears)");
        opts[n - 1].given = &a->precision_given;
    }
    opts[n++] = (nl_opt)NL_OPT_INT(
        "seed", &o->seed, 0, INT64_MAX, "S",
        help_line(a, &k, "initialisation and data seed (default %llu)", (unsigned long long)o->seed));
    if (a->eval_when_asked)
        help_line(a, &k, "validation (and checkpoint) every K steps and at the end (default: none)");
    else
        help_line(a, &k, "validation (and checkpoint) every K steps and at the end (default %lld)",
                  (long long)o->eval_every);
    opts[n++] = (nl_opt)NL_OPT_INT("eval-every", &o->eval_every, 0, 100000000, "K", a->help[k - 1]);
    opts[n - 1].aliases = "save-every";
    opts[n - 1].given = &a->eval_given;
    opts[n++] = (nl_opt)NL_OPT_INT("eval-windows", &o->eval_windows, 1, 1000000, "N",
                                   help_line(a, &k, "validation windows (default %lld)", (long long)o->eval_windows));
    opts[n - 1].given = &a->windows_given;
    opts[n++] =
        (nl_opt)NL_OPT_STR("out", &o->out, "CKPT", "safetensors checkpoint, saved at each validation and the end");
    opts[n++] = (nl_opt)NL_OPT_STR("resume", &o->resume, "CKPT", "continue a run from its checkpoint up to --steps");
    opts[n++] = (nl_opt)NL_OPT_INT("stop-after", &o->stop_after, 1, 100000000, "K",
                                   "stop (and save) after step K of the --steps schedule");
    opts[n++] = (nl_opt)NL_OPT_STR("log", &a->log_csv, "CSV", "per-step log (rank 0)");
    if (!(a->omit & NL_TRAIN_OMIT_SVG)) opts[n++] = (nl_opt)NL_OPT_STR("svg", &a->svg, "PLOT", "plot of the run");
    return n;
}

int nl_cli_train_finish(nl_train_args *a, const char *cmd) {
    nl_train_opts *o = a->o;
    if (!a->data) return nl_cli_usage_error("%s: --data FILE is required", cmd);
    if (!(o->lr > 0)) return nl_cli_usage_error("%s: --lr must be positive, got %g", cmd, (double)o->lr);
    if (!a->lr_min_given) o->lr_min = a->lr_min_is_lr ? o->lr : o->lr / 10.0f;
    if (o->lr_min > o->lr)
        return nl_cli_usage_error("%s: --lr-min %g is above --lr %g (the cosine decays from --lr to --lr-min)", cmd,
                                  (double)o->lr_min, (double)o->lr);
    if (o->resume && !a->warmup_given)
        o->warmup = -1; /* the trainer takes the warmup the checkpoint recorded */
    else if (o->warmup >= o->steps)
        o->warmup = o->steps / 10;
    static const nl_precision prec[] = {NL_PREC_FP32, NL_PREC_BF16, NL_PREC_FP16, NL_PREC_BF16};
    o->precision = prec[a->precision];
    o->tokenizer = "byte";
    /* every output is checked before any work starts (no training lost to a bad path) */
    if ((o->out && nl_check_writable(o->out, "--out")) || (a->log_csv && nl_check_writable(a->log_csv, "--log")) ||
        (a->svg && nl_check_writable(a->svg, "--svg")))
        return nl_cli_fail(cmd);
    return 0;
}

int nl_cli_layout_opts(nl_opt *opts, nl_layout_args *a) {
    unsigned offer = a->offer;
    memset(a, 0, sizeof *a);
    a->offer = offer;
    a->tp = a->pp = a->cp = a->ep = a->microbatches = 1;
    int n = 0;
    if (offer & NL_LAYOUT_DP_TP_PP) {
        opts[n++] =
            (nl_opt)NL_OPT_INT("dp", &a->dp, 1, 65536, "D", "data-parallel replicas (default: the ranks / (tp x pp))");
        opts[n++] = (nl_opt)NL_OPT_INT("tp", &a->tp, 1, 65536, "T", "tensor (Megatron) parallel ranks (default 1)");
        opts[n++] = (nl_opt)NL_OPT_INT("pp", &a->pp, 1, 65536, "P", "pipeline stages (default 1)");
    }
    if (offer & NL_LAYOUT_EP_CP) {
        opts[n++] = (nl_opt)NL_OPT_INT("ep", &a->ep, 1, 65536, "E",
                                       "ranks per expert-parallel group (divides the ranks and the experts; 1)");
        opts[n++] = (nl_opt)NL_OPT_INT(
            "cp", &a->cp, 1, 65536, "C",
            "context parallel: C ranks share each sequence (ring attention); needs --aux 0 --capacity 0, no --ep");
    }
    if (offer & NL_LAYOUT_DP_TP_PP) {
        opts[n++] = (nl_opt)NL_OPT_INT("zero", &a->zero, 0, 3, "Z", "0 = DDP (default), 1, 2, 3 (FSDP full shard)");
        opts[n++] = (nl_opt)NL_OPT_INT("microbatches", &a->microbatches, 1, 65536, "M",
                                       "with --pp: micro-batches per step (default 1)");
        opts[n - 1].aliases = "micro,micro-batch";
        opts[n++] = (nl_opt)NL_OPT_CHOICE("schedule", &a->schedule, "gpipe|1f1b",
                                          "with --pp: the stage schedule (default gpipe)");
        opts[n++] =
            (nl_opt)NL_OPT_FLAG("sp", &a->sp, "with --tp: sequence parallelism (norms/residuals on sequence shards)");
        opts[n++] = (nl_opt)NL_OPT_FLAG("no-overlap", &a->no_overlap,
                                        "DDP: all-reduce the buckets after backward instead of during it");
    }
    opts[n++] = (nl_opt)NL_OPT_CHOICE("impl", &a->impl, "ours|native",
                                      "collectives: our algorithms (default) or the MPI library's");
    if (offer & NL_LAYOUT_TIMEOUT) {
        opts[n++] = (nl_opt)NL_OPT_DBL("timeout", &a->timeout_s, 0, 1e6, "SECONDS",
                                       "collective watchdog: a rank waiting longer ends the job naming the rank "
                                       "that did not arrive (default 600; 0 = off)");
        opts[n - 1].given = &a->timeout_given;
    }
    if (offer & NL_LAYOUT_FAULT)
        opts[n++] = (nl_opt)NL_OPT_STR("inject-fault", &a->inject_fault, "R[:exit|_exit|segv|kill|stop]@S",
                                       "(tests) rank R leaves (or stops) at step S");
    return n;
}

void nl_cli_train_summary(nl_report *r, const nl_trainer *t, const char *preset, long long n_params, double wall_s,
                          double tokens_per_s) {
    const nl_train_log *last = t->n_log ? &t->log[t->n_log - 1] : NULL;
    nl_report_str(r, "preset", "", preset);
    nl_report_int(r, "parameters", "", n_params, NULL);
    nl_report_int(r, "steps", "", (long long)t->step, NULL);
    nl_report_num(r, "train_loss", "", last ? last->loss : NAN, NULL, NULL);
    nl_report_num(r, "val_loss", "", last ? last->val_loss : NAN, NULL, NULL);
    nl_report_num(r, "wall_s", "", wall_s, NULL, NULL);
    nl_report_num(r, "tokens_per_s", "", tokens_per_s, NULL, NULL);
    nl_report_int(r, "skipped_steps", "", (long long)t->scaler.skipped, NULL);
}

void nl_cli_train_stopped(const nl_trainer *t, const nl_train_opts *o) {
    if (!t->stopped) return;
    printf("stopped by %s after step %lld of %lld%s%s\n", t->stopped == SIGINT ? "SIGINT" : "SIGTERM",
           (long long)t->step, (long long)o->steps, o->out ? "; resume with --resume " : " (no --out: nothing saved)",
           o->out ? o->out : "");
}

/* nanolm train: train NanoLM on a text file (byte-level tokens). */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cli_model.h"
#include "nanolm/fp8_linear.h"
#include "nanolm/qat.h"
#include "nanolm/svg.h"
#include "nanolm/train.h"

/* Options: one row here and one case in parse_option() per flag, so that other modules (the
 * distributed runtime: --dp/--tp/--pp/--zero; --precision fp8, --qat) add theirs the same way. */
enum {
    OPT_DATA = 1000,
    OPT_PRESET,
    OPT_STEPS,
    OPT_BATCH,
    OPT_SEQ,
    OPT_LR,
    OPT_LR_MIN,
    OPT_WARMUP,
    OPT_ACCUM,
    OPT_WD,
    OPT_CLIP,
    OPT_PRECISION,
    OPT_LOSS_SCALE,
    OPT_SEED,
    OPT_OUT,
    OPT_RESUME,
    OPT_LOG,
    OPT_SVG,
    OPT_EVAL_EVERY,
    OPT_EVAL_WINDOWS,
    OPT_STOP_AFTER,
    OPT_REPORT_MEMORY,
    OPT_JSON,
    OPT_HELP,
    OPT_FP8_RECIPE,
    OPT_FP8_SCALING,
    OPT_FP8_ACC_BITS,
    OPT_FP8_PROMOTE,
    OPT_NO_LOSS_SCALING,
    OPT_MUP,
    OPT_QAT,
    OPT_RESUME_WEIGHTS
};

typedef struct train_option {
    struct option opt;
    const char *arg, *help;
} train_option;

static const train_option train_options[] = {
    {{"data", required_argument, 0, OPT_DATA}, "FILE", "training text (byte tokens; last 10% = validation)"},
    {{"preset", required_argument, 0, OPT_PRESET},
     "P",
     "stories260k | shakespeare-char | small (default shakespeare-char)"},
    {{"steps", required_argument, 0, OPT_STEPS}, "N", "optimizer steps (default 2000)"},
    {{"batch", required_argument, 0, OPT_BATCH}, "B", "windows per micro-batch (default 12)"},
    {{"seq", required_argument, 0, OPT_SEQ}, "T", "tokens per window (default: the preset's seq_len)"},
    {{"lr", required_argument, 0, OPT_LR}, "X", "peak learning rate (default 1e-3)"},
    {{"lr-min", required_argument, 0, OPT_LR_MIN}, "X", "final learning rate of the cosine (default lr/10)"},
    {{"warmup", required_argument, 0, OPT_WARMUP}, "N", "linear warmup steps (default 100)"},
    {{"grad-accum", required_argument, 0, OPT_ACCUM}, "K", "micro-batches per step (default 1)"},
    {{"weight-decay", required_argument, 0, OPT_WD}, "X", "AdamW decay of 2-D weights (default 0.1)"},
    {{"clip", required_argument, 0, OPT_CLIP}, "X", "gradient-norm clip, 0 = off (default 1.0)"},
    {{"precision", required_argument, 0, OPT_PRECISION}, "P", "fp32 | bf16 | fp16 | fp8 (emulated; default fp32)"},
    {{"loss-scale", required_argument, 0, OPT_LOSS_SCALE}, "X", "fp16: initial dynamic loss scale (default 65536)"},
    {{"fp8-recipe", required_argument, 0, OPT_FP8_RECIPE},
     "R",
     "fp8: e4m3 (everywhere, default) | hybrid (e5m2 grads)"},
    {{"fp8-scaling", required_argument, 0, OPT_FP8_SCALING}, "S", "fp8: block (default) | tensor | delayed | mx"},
    {{"fp8-acc-bits", required_argument, 0, OPT_FP8_ACC_BITS},
     "K",
     "fp8: 0 = fp32 accumulation (default), 2..24 limited"},
    {{"promote-every", required_argument, 0, OPT_FP8_PROMOTE},
     "N",
     "fp8: promote to fp32 every N products (128; 0 never)"},
    {{"fp8-promote", required_argument, 0, OPT_FP8_PROMOTE},
     "N",
     "alias of --promote-every (the spelling of earlier releases)"},
    {{"no-loss-scaling", no_argument, 0, OPT_NO_LOSS_SCALING}, NULL, "fp16: fixed loss scale 1 (no GradScaler)"},
    {{"seed", required_argument, 0, OPT_SEED}, "S", "initialisation and data seed (default 1337)"},
    {{"out", required_argument, 0, OPT_OUT}, "CKPT", "safetensors checkpoint, saved at each validation"},
    {{"resume", required_argument, 0, OPT_RESUME}, "CKPT", "continue a run from its checkpoint"},
    {{"resume-weights", required_argument, 0, OPT_RESUME_WEIGHTS},
     "CKPT",
     "start from a checkpoint's weights (fresh optimizer, step 0)"},
    {{"qat", required_argument, 0, OPT_QAT},
     "S",
     "quantization-aware training: int<b>-g<G> (e.g. int4-g32) | int<b>-channel"},
    {{"log", required_argument, 0, OPT_LOG}, "CSV", "per-step log"},
    {{"svg", required_argument, 0, OPT_SVG}, "PLOT", "loss curves"},
    {{"eval-every", required_argument, 0, OPT_EVAL_EVERY}, "K", "validation every K steps (default 250)"},
    {{"eval-windows", required_argument, 0, OPT_EVAL_WINDOWS}, "N", "validation windows (default 200)"},
    {{"stop-after", required_argument, 0, OPT_STOP_AFTER}, "K", "stop (and save) after step K of the --steps schedule"},
    {{"report-memory", no_argument, 0, OPT_REPORT_MEMORY}, NULL, "print the bytes allocated, exactly"},
    {{"mup", required_argument, 0, OPT_MUP}, "BASE", "muP with base width BASE (fp32; give it again with --resume)"},
    {{"json", no_argument, 0, OPT_JSON}, NULL, "print the summary as JSON"},
    {{"help", no_argument, 0, OPT_HELP}, NULL, "this help"},
};
#define N_TRAIN_OPTIONS (sizeof train_options / sizeof train_options[0])

typedef struct train_cli {
    nl_train_opts o;
    const char *data, *preset, *log_csv, *svg;
    int report_memory, json, help, seq_given, lr_min_given, preset_given;
    int fp8, no_loss_scaling; /* --precision fp8: bf16 model + FP8 linears (nanolm/fp8_linear.h) */
    nl_fp8_recipe fp8r;
    const char *qat_name; /* --qat: fake-quantized linears (nanolm/qat.h) */
    nl_quant_spec qat;
    int from_ckpt;                  /* --resume without --preset: the shape comes from the checkpoint */
    char fp8_desc[160], fp8_id[96]; /* --precision fp8: the recipe in words, and as recorded */
} train_cli;

static void usage(FILE *f) {
    fprintf(f, "usage: nanolm train --data FILE [options]\n\n");
    for (size_t i = 0; i < N_TRAIN_OPTIONS; i++) {
        char lhs[48];
        snprintf(lhs, sizeof lhs, "--%s%s%s", train_options[i].opt.name, train_options[i].arg ? " " : "",
                 train_options[i].arg ? train_options[i].arg : "");
        fprintf(f, "  %-22s %s\n", lhs, train_options[i].help);
    }
}

static int parse_option(train_cli *c, int id, const char *arg) {
    int64_t v;
    double d;
    switch (id) {
    case OPT_DATA: c->data = arg; return 0;
    case OPT_PRESET:
        c->preset = arg;
        c->preset_given = 1;
        return 0;
    case OPT_STEPS:
        if (nl_cli_int("--steps", arg, 1, 100000000, &v)) return NL_EXIT_USAGE;
        c->o.steps = v;
        return 0;
    case OPT_BATCH:
        if (nl_cli_int("--batch", arg, 1, 65536, &v)) return NL_EXIT_USAGE;
        c->o.batch = v;
        return 0;
    case OPT_SEQ:
        if (nl_cli_int("--seq", arg, 1, 1 << 20, &v)) return NL_EXIT_USAGE;
        c->o.seq = v;
        c->seq_given = 1;
        return 0;
    case OPT_WARMUP:
        if (nl_cli_int("--warmup", arg, 0, 100000000, &v)) return NL_EXIT_USAGE;
        c->o.warmup = v;
        return 0;
    case OPT_ACCUM:
        if (nl_cli_int("--grad-accum", arg, 1, 65536, &v)) return NL_EXIT_USAGE;
        c->o.grad_accum = v;
        return 0;
    case OPT_SEED:
        if (nl_cli_int("--seed", arg, 0, INT64_MAX, &v)) return NL_EXIT_USAGE;
        c->o.seed = (uint64_t)v;
        return 0;
    case OPT_EVAL_EVERY:
        if (nl_cli_int("--eval-every", arg, 0, 100000000, &v)) return NL_EXIT_USAGE;
        c->o.eval_every = v;
        return 0;
    case OPT_MUP:
        if (nl_cli_int("--mup", arg, 1, 1 << 20, &v)) return NL_EXIT_USAGE;
        c->o.mup_base_dim = v;
        return 0;
    case OPT_STOP_AFTER:
        if (nl_cli_int("--stop-after", arg, 1, 100000000, &v)) return NL_EXIT_USAGE;
        c->o.stop_after = v;
        return 0;
    case OPT_EVAL_WINDOWS:
        if (nl_cli_int("--eval-windows", arg, 1, 1000000, &v)) return NL_EXIT_USAGE;
        c->o.eval_windows = v;
        return 0;
    case OPT_LR:
        if (nl_cli_double("--lr", arg, &d)) return NL_EXIT_USAGE;
        if (d <= 0) return nl_cli_usage_error("--lr must be positive, got %s", arg);
        c->o.lr = (float)d;
        return 0;
    case OPT_LR_MIN:
        if (nl_cli_double("--lr-min", arg, &d)) return NL_EXIT_USAGE;
        if (d < 0) return nl_cli_usage_error("--lr-min must be >= 0, got %s", arg);
        c->o.lr_min = (float)d;
        c->lr_min_given = 1;
        return 0;
    case OPT_WD:
        if (nl_cli_double("--weight-decay", arg, &d)) return NL_EXIT_USAGE;
        if (d < 0) return nl_cli_usage_error("--weight-decay must be >= 0, got %s", arg);
        c->o.weight_decay = (float)d;
        return 0;
    case OPT_CLIP:
        if (nl_cli_double("--clip", arg, &d)) return NL_EXIT_USAGE;
        if (d < 0) return nl_cli_usage_error("--clip must be >= 0, got %s", arg);
        c->o.grad_clip = (float)d;
        return 0;
    case OPT_PRECISION:
        if (!strcmp(arg, "fp32"))
            c->o.precision = NL_PREC_FP32;
        else if (!strcmp(arg, "bf16"))
            c->o.precision = NL_PREC_BF16;
        else if (!strcmp(arg, "fp16"))
            c->o.precision = NL_PREC_FP16;
        else if (!strcmp(arg, "fp8"))
            c->o.precision = NL_PREC_BF16, c->fp8 = 1;
        else
            return nl_cli_usage_error("unknown --precision '%s' (known: fp32, bf16, fp16, fp8)", arg);
        return 0;
    case OPT_LOSS_SCALE:
        if (nl_cli_double("--loss-scale", arg, &d)) return NL_EXIT_USAGE;
        if (d < 1 || d > 3e38) return nl_cli_usage_error("--loss-scale must be in [1, 3e38], got %s", arg);
        c->o.loss_scale_init = (float)d;
        return 0;
    case OPT_OUT: c->o.out = arg; return 0;
    case OPT_RESUME: c->o.resume = arg; return 0;
    case OPT_RESUME_WEIGHTS: c->o.init_weights = arg; return 0;
    case OPT_QAT:
        if (nl_qat_parse(arg, &c->qat)) return nl_cli_usage_error("--qat: %s", nl_last_error());
        c->qat_name = arg;
        return 0;
    case OPT_LOG: c->log_csv = arg; return 0;
    case OPT_SVG: c->svg = arg; return 0;
    case OPT_REPORT_MEMORY: c->report_memory = 1; return 0;
    case OPT_JSON: c->json = 1; return 0;
    case OPT_FP8_RECIPE:
        if (!strcmp(arg, "e4m3"))
            c->fp8r.fmt_grad = NL_FMT_E4M3;
        else if (!strcmp(arg, "hybrid"))
            c->fp8r.fmt_grad = NL_FMT_E5M2;
        else
            return nl_cli_usage_error("unknown --fp8-recipe '%s' (known: e4m3, hybrid)", arg);
        return 0;
    case OPT_FP8_SCALING:
        if (nl_fp8_scaling_from_name(arg, &c->fp8r.scaling))
            return nl_cli_usage_error("--fp8-scaling: %s", nl_last_error());
        return 0;
    case OPT_FP8_ACC_BITS:
        if (nl_cli_int("--fp8-acc-bits", arg, 0, 24, &v)) return NL_EXIT_USAGE;
        if (v == 1) return nl_cli_usage_error("--fp8-acc-bits must be 0 (fp32) or 2..24, got 1");
        c->fp8r.acc.bits = (int)v;
        return 0;
    case OPT_FP8_PROMOTE:
        if (nl_cli_int("--promote-every", arg, 0, 1 << 20, &v)) return NL_EXIT_USAGE;
        c->fp8r.acc.promote = (int)v;
        return 0;
    case OPT_NO_LOSS_SCALING: c->no_loss_scaling = 1; return 0;
    case OPT_HELP: c->help = 1; return 0;
    }
    return nl_cli_usage_error("train: unhandled option");
}

typedef struct progress_ctx {
    nl_progress bar;
    int quiet;
    int64_t first_step;
} progress_ctx;

static void on_step(void *user, const nl_train_log *r, const nl_train_opts *o) {
    progress_ctx *p = user;
    char extra[160];
    snprintf(extra, sizeof extra, "loss %.4f lr %.2e%s", r->loss, r->lr, r->skipped ? " (skipped)" : "");
    nl_progress_update(&p->bar, r->step - p->first_step,
                       (double)(r->step - p->first_step) *
                           (double)(o->batch * o->seq * (o->grad_accum > 0 ? o->grad_accum : 1)),
                       "tok", extra);
    if (!isnan(r->val_loss) && !p->quiet) {
        printf("step %6lld/%lld  train %.4f  val %.4f  lr %.2e  %.0f tok/s%s\n", (long long)r->step,
               (long long)o->steps, r->loss, r->val_loss, r->lr, r->tokens_per_s, r->skipped ? "  (skipped)" : "");
        fflush(stdout);
    }
}

static nl_status write_svg(const char *path, const nl_trainer *t) {
    int64_t n = t->n_log, nv = 0;
    double *x = nl_malloc((size_t)(2 * n + 1) * sizeof(double), "plot"),
           *y = nl_malloc((size_t)(2 * n + 1) * sizeof(double), "plot");
    if (!x || !y) {
        nl_free(x);
        nl_free(y);
        return NL_ERR_NOMEM;
    }
    double *vx = x + n, *vy = y + n;
    for (int64_t i = 0; i < n; i++) {
        x[i] = (double)t->log[i].step;
        y[i] = t->log[i].loss;
        if (!isnan(t->log[i].val_loss)) {
            vx[nv] = x[i];
            vy[nv++] = t->log[i].val_loss;
        }
    }
    nl_svg_series s[2] = {{"train loss", x, y, (size_t)n, NULL, 0}, {"validation loss", vx, vy, (size_t)nv, NULL, 1}};
    nl_svg_plot_opts po = {.title = "NanoLM training", .xlabel = "step", .ylabel = "loss (nats/token)"};
    nl_status rc = nl_svg_plot(path, &po, s, nv ? 2 : 1);
    nl_free(x);
    nl_free(y);
    return rc;
}

/* SIGTERM / SIGINT: the first one asks the trainer to finish the current step, save and stop
 * (exit 0, what a preempted job needs); a second one ends the process at once, removing the
 * temporary file of a checkpoint being written. Shared with `parallel train` (cmd_parallel.c),
 * whose ranks agree on the stop once per step (nl_train_layout.agree_stop). */
volatile int nl_train_stop_signal;
void nl_train_catch_stop_signals(int on);
static void on_stop_signal(int sig) {
    if (nl_train_stop_signal) {
        nl_atomic_remove_pending();
        _exit(128 + sig);
    }
    nl_train_stop_signal = sig;
}

/* on = 1: catch SIGTERM and SIGINT (the flag starts at 0); on = 0: restore what was there. */
void nl_train_catch_stop_signals(int on) {
    static struct sigaction old_term, old_int;
    if (!on) {
        sigaction(SIGTERM, &old_term, NULL);
        sigaction(SIGINT, &old_int, NULL);
        return;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    nl_train_stop_signal = 0;
    sigaction(SIGTERM, &sa, &old_term);
    sigaction(SIGINT, &sa, &old_int);
}

int nl_cmd_parallel_train(int argc, char **argv); /* src/cli/cmd_parallel.c */

/* The model shape from the preset, train's defaults, the option combinations refused by name and
 * the outputs checked writable, before any work. Returns 0 or the exit status after a message. */
static int check_args(train_cli *c, nl_arch *arch) {
    if (!c->data) return nl_cli_usage_error("train: --data FILE is required");
    if (nl_arch_preset(c->preset, arch)) return nl_cli_usage_error("train: --preset: %s", nl_last_error());
    /* a resumed run takes its shape (and its window) from the checkpoint; --preset beside
     * --resume is checked against it */
    c->from_ckpt = c->o.resume && !c->preset_given;
    if (!c->seq_given) c->o.seq = c->from_ckpt ? 0 : arch->seq_len;
    if (!c->lr_min_given) c->o.lr_min = c->o.lr / 10.0f;
    if (c->o.lr_min > c->o.lr)
        return nl_cli_usage_error("train: --lr-min %g is above --lr %g (the cosine decays from --lr to --lr-min)",
                                  (double)c->o.lr_min, (double)c->o.lr);
    if (c->o.warmup >= c->o.steps) c->o.warmup = c->o.steps / 10;
    if (!c->o.resume && arch->vocab_size != 256)
        return nl_cli_usage_error("train: preset %s has vocab %lld; training reads byte tokens (vocab 256)", c->preset,
                                  (long long)arch->vocab_size);
    c->o.tokenizer = "byte";

    if (c->no_loss_scaling && c->o.precision != NL_PREC_FP16)
        return nl_cli_usage_error("train: --no-loss-scaling applies to --precision fp16 only");
    c->o.no_loss_scaling = c->no_loss_scaling;
    if (c->fp8) {
        if (nl_fp8_acc_validate(&c->fp8r.acc)) return nl_cli_usage_error("train: %s", nl_last_error());
        if (c->fp8r.scaling == NL_FP8_SCALE_BLOCK && c->fp8r.acc.bits &&
            (c->fp8r.acc.promote == 0 || NL_FP8_BLOCK % c->fp8r.acc.promote))
            return nl_cli_usage_error("train: --fp8-scaling block needs --promote-every dividing %d", NL_FP8_BLOCK);
    }
    if (c->qat_name && (c->fp8 || c->o.precision != NL_PREC_FP32))
        return nl_cli_usage_error("train: --qat needs --precision fp32");
    if (c->o.resume && c->o.init_weights)
        return nl_cli_usage_error("train: --resume and --resume-weights exclude each other");
    if (c->fp8) {
        char acc[48];
        if (c->fp8r.acc.bits)
            snprintf(acc, sizeof acc, "%d-bit accumulator, promote %d", c->fp8r.acc.bits, c->fp8r.acc.promote);
        else
            snprintf(acc, sizeof acc, "fp32 accumulation");
        snprintf(c->fp8_desc, sizeof c->fp8_desc, " + FP8 linears (%s/%s, %s scaling, %s)",
                 nl_fmt_name(c->fp8r.fmt_act), nl_fmt_name(c->fp8r.fmt_grad), nl_fp8_scaling_name(c->fp8r.scaling),
                 acc);
        snprintf(c->fp8_id, sizeof c->fp8_id, "%s/%s/%s/acc%d/promote%d", nl_fmt_name(c->fp8r.fmt_act),
                 nl_fmt_name(c->fp8r.fmt_grad), nl_fp8_scaling_name(c->fp8r.scaling), c->fp8r.acc.bits,
                 c->fp8r.acc.promote);
        c->o.fp8 = c->fp8_id;
    }
    c->o.qat = c->qat_name;
    /* every output is checked before any work starts (no training lost to a bad path) */
    if ((c->o.out && nl_check_writable(c->o.out, "--out")) || (c->log_csv && nl_check_writable(c->log_csv, "--log")) ||
        (c->svg && nl_check_writable(c->svg, "--svg")))
        return nl_cli_fail("train");
    return 0;
}

/* The result of a finished run: the JSON document or the "done" lines (QAT and FP8 figures too). */
static void print_result(const train_cli *c, const nl_trainer *t, const nl_fp8_linear *fp8, const double qat_loss[4]) {
    double qat_fp32_start = qat_loss[0], qat_rtn_start = qat_loss[1], qat_end = qat_loss[2], qat_fp32_end = qat_loss[3];
    const nl_train_log *last = t->n_log ? &t->log[t->n_log - 1] : NULL;
    double tps = t->wall_s > 0 ? (double)t->tokens_done / t->wall_s : 0;
    int64_t skipped = t->scaler.skipped;
    if (c->json) {
        cJSON *d = cJSON_CreateObject();
        cJSON_AddStringToObject(d, "preset", t->model.arch.name);
        cJSON_AddNumberToObject(d, "parameters", (double)t->model.n_params);
        cJSON_AddNumberToObject(d, "steps", (double)t->step);
        if (last) {
            cJSON_AddNumberToObject(d, "train_loss", last->loss);
            cJSON_AddNumberToObject(d, "val_loss", last->val_loss);
        }
        cJSON_AddNumberToObject(d, "wall_s", t->wall_s);
        cJSON_AddNumberToObject(d, "tokens_per_s", tps);
        cJSON_AddNumberToObject(d, "skipped_steps", (double)skipped);
        if (c->fp8) {
            cJSON *f8 = cJSON_AddObjectToObject(d, "fp8");
            cJSON_AddStringToObject(f8, "activations", nl_fmt_name(c->fp8r.fmt_act));
            cJSON_AddStringToObject(f8, "gradients", nl_fmt_name(c->fp8r.fmt_grad));
            cJSON_AddStringToObject(f8, "scaling", nl_fp8_scaling_name(c->fp8r.scaling));
            cJSON_AddNumberToObject(f8, "acc_bits", c->fp8r.acc.bits);
            cJSON_AddNumberToObject(f8, "promote", c->fp8r.acc.promote);
            cJSON_AddNumberToObject(f8, "gemms", (double)fp8->stats.gemms);
            cJSON_AddNumberToObject(f8, "saturated", (double)fp8->stats.saturated);
            cJSON_AddNumberToObject(f8, "flushed", (double)fp8->stats.flushed);
            cJSON_AddNumberToObject(f8, "quantized", (double)fp8->stats.quantized);
        }
        if (c->qat_name) {
            cJSON *q = cJSON_AddObjectToObject(d, "qat");
            cJSON_AddStringToObject(q, "scheme", c->qat_name);
            cJSON_AddNumberToObject(q, "val_loss_fp32_start", qat_fp32_start);
            cJSON_AddNumberToObject(q, "val_loss_rtn_start", qat_rtn_start);
            cJSON_AddNumberToObject(q, "val_loss_qat_end", qat_end);
            cJSON_AddNumberToObject(q, "val_loss_fp32_master_end", qat_fp32_end);
            cJSON_AddNumberToObject(q, "rtn_delta", qat_rtn_start - qat_fp32_start);
            cJSON_AddNumberToObject(q, "qat_delta", qat_end - qat_fp32_start);
            nl_qat_recovery qr = nl_qat_recovered(qat_fp32_start, qat_rtn_start, qat_end, qat_fp32_end);
            if (qr.why) {
                cJSON_AddNullToObject(q, "recovered_fraction");
                cJSON_AddStringToObject(q, "recovered_fraction_not_reported", qr.why);
            } else {
                cJSON_AddNumberToObject(q, "recovered_fraction", qr.fraction);
            }
        }
        if (c->report_memory) {
            cJSON *mm = cJSON_AddObjectToObject(d, "memory_bytes");
            cJSON_AddNumberToObject(mm, "parameters", (double)t->mem.params);
            cJSON_AddNumberToObject(mm, "gradients", (double)t->mem.grads);
            cJSON_AddNumberToObject(mm, "optimizer", (double)t->mem.optimizer);
            cJSON_AddNumberToObject(mm, "activations", (double)t->mem.activations);
            cJSON_AddNumberToObject(mm, "low_precision_weights", (double)t->mem.lp_weights);
            cJSON_AddNumberToObject(mm, "token_batch", (double)t->mem.batch);
            cJSON_AddNumberToObject(mm, "total", (double)t->mem.total);
        }
        nl_cli_print_json(d);
    } else if (last) {
        printf("done: %lld steps, train loss %.4f, val loss %.4f, %.1f s, %.0f tokens/s%s", (long long)t->step,
               last->loss, last->val_loss, t->wall_s, tps, c->o.out ? ", checkpoint " : "");
        if (c->o.out) printf("%s", c->o.out);
        if (c->o.precision == NL_PREC_FP16)
            printf(", %lld skipped steps (loss scale %g)", (long long)skipped, t->scaler.scale);
        printf("\n");
        if (c->fp8)
            printf("fp8: %lld GEMMs, %.3g%% of quantized values saturated, %.3g%% flushed to zero\n",
                   (long long)fp8->stats.gemms,
                   100.0 * (double)fp8->stats.saturated / (double)(fp8->stats.quantized + !fp8->stats.quantized),
                   100.0 * (double)fp8->stats.flushed / (double)(fp8->stats.quantized + !fp8->stats.quantized));
        if (c->qat_name) {
            nl_qat_recovery qr = nl_qat_recovered(qat_fp32_start, qat_rtn_start, qat_end, qat_fp32_end);
            char rec[200];
            if (qr.why)
                snprintf(rec, sizeof rec, "recovered fraction not reported: %s", qr.why);
            else
                snprintf(rec, sizeof rec, "%.1f%% of RTN's delta recovered", 100.0 * qr.fraction);
            printf(
                "qat %s: validation loss fake-quantized %.4f (delta vs fp32 start %+.4f, RTN %+.4f: %s); fp32 master "
                "weights %.4f\n",
                c->qat_name, qat_end, qat_end - qat_fp32_start, qr.rtn_delta, rec, qat_fp32_end);
        }
    }
}

int nl_cmd_train(int argc, char **argv) {
    /* hook for the distributed runtime: a layout option hands the run to `nanolm parallel train` */
    for (int i = 1; i < argc; i++)
        if (!strncmp(argv[i], "--dp", 4) || !strncmp(argv[i], "--tp", 4) || !strncmp(argv[i], "--pp", 4) ||
            !strncmp(argv[i], "--zero", 6) || !strncmp(argv[i], "--microbatches", 14) ||
            !strncmp(argv[i], "--schedule", 10))
            return nl_cmd_parallel_train(argc, argv);
    struct option longopts[N_TRAIN_OPTIONS + 1];
    for (size_t i = 0; i < N_TRAIN_OPTIONS; i++) longopts[i] = train_options[i].opt;
    memset(&longopts[N_TRAIN_OPTIONS], 0, sizeof longopts[0]);
    train_cli c;
    memset(&c, 0, sizeof c);
    nl_train_opts_default(&c.o);
    nl_fp8_recipe_default(&c.fp8r);
    c.preset = "shakespeare-char";
    int id;
    while ((id = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        if (id == '?' || id == ':') return nl_cli_bad_option("train", argv);
        int rc = parse_option(&c, id, optarg);
        if (rc) return rc;
    }
    if (c.help) {
        usage(stdout);
        return NL_EXIT_OK;
    }
    if (optind < argc) return nl_cli_usage_error("train: unexpected argument '%s'", argv[optind]);
    nl_arch arch;
    int crc = check_args(&c, &arch);
    if (crc) return crc;
    nl_tokenizer tok;
    nl_data data;
    if (nl_tokenizer_init_byte(&tok)) return nl_cli_fail("train");
    if (nl_data_open(&data, c.data, &tok)) {
        nl_tokenizer_free(&tok);
        nl_data_free(&data);
        return nl_cli_fail("train");
    }
    nl_tokenizer_free(&tok);
    nl_trainer t;
    nl_status init_rc = nl_trainer_init(&t, c.from_ckpt ? NULL : &arch, &c.o);
    if (init_rc) {
        nl_data_free(&data);
        if (init_rc == NL_DONE) { /* the resumed run is already complete */
            fprintf(stderr, "nanolm: train: %s\n", nl_last_error());
            return NL_EXIT_OK;
        }
        return nl_cli_fail(c.o.resume ? "train: --resume" : "train");
    }
    c.o.seq = t.seq;
    if (nl_data_check_window(&data, (int)c.o.seq)) {
        nl_trainer_free(&t);
        nl_data_free(&data);
        return nl_cli_fail("train");
    }
    nl_fp8_linear fp8;
    memset(&fp8, 0, sizeof fp8);
    if (c.fp8 && nl_fp8_linear_install(&fp8, &t.model, &c.fp8r)) {
        nl_trainer_free(&t);
        nl_data_free(&data);
        return nl_cli_fail("train");
    }
    /* QAT: validation loss of the starting weights in fp32 and fake-quantized (= RTN) */
    nl_qat qat;
    memset(&qat, 0, sizeof qat);
    double qat_fp32_start = NAN, qat_rtn_start = NAN, qat_end = NAN, qat_fp32_end = NAN;
    if (c.qat_name &&
        (nl_eval_loss(&t.model, &data, NL_DATA_VAL, c.o.batch, c.o.seq, c.o.eval_windows, &qat_fp32_start, NULL) ||
         nl_qat_install(&qat, &t.model, &c.qat) ||
         nl_eval_loss(&t.model, &data, NL_DATA_VAL, c.o.batch, c.o.seq, c.o.eval_windows, &qat_rtn_start, NULL))) {
        nl_qat_remove(&qat);
        nl_fp8_linear_remove(&fp8);
        nl_trainer_free(&t);
        nl_data_free(&data);
        return nl_cli_fail("train: --qat");
    }
    if (!c.json)
        printf("train %s: %lld parameters, %lld train / %lld validation tokens, batch %lld x %lld, %s%s%s%s\n",
               t.model.arch.name, (long long)t.model.n_params, (long long)nl_data_split_tokens(&data, NL_DATA_TRAIN),
               (long long)nl_data_split_tokens(&data, NL_DATA_VAL), (long long)c.o.batch, (long long)c.o.seq,
               c.o.precision == NL_PREC_BF16   ? "bf16"
               : c.o.precision == NL_PREC_FP16 ? "fp16"
                                               : "fp32",
               c.fp8_desc, c.no_loss_scaling ? " without loss scaling" : "", c.o.resume ? " (resumed)" : "");
    if (c.qat_name && !c.json)
        printf("qat %s (absmax, fake-quantized q/k/v/o/gate/up/down, straight-through backward) from %s:\n"
               "  validation loss at start: fp32 %.4f, fake-quantized (RTN) %.4f, RTN delta %+.4f\n",
               c.qat_name,
               c.o.init_weights ? c.o.init_weights
               : c.o.resume     ? c.o.resume
                                : "random init",
               qat_fp32_start, qat_rtn_start, qat_rtn_start - qat_fp32_start);
    if (c.report_memory && !c.json) {
        const char *hdr[] = {"buffer", "bytes", "MiB"};
        nl_table tb;
        nl_table_init(&tb, 3, hdr);
        struct {
            const char *n;
            size_t b;
        } rows[] = {{"parameters", t.mem.params},
                    {"gradients", t.mem.grads},
                    {"optimizer (AdamW m, v)", t.mem.optimizer},
                    {"activations", t.mem.activations},
                    {"low-precision weights", t.mem.lp_weights},
                    {"token batch", t.mem.batch},
                    {"total", t.mem.total}};
        for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
            nl_table_rowf(&tb, "%s|%zu|%.2f", rows[i].n, rows[i].b, (double)rows[i].b / 1048576.0);
        nl_table_print(&tb, stdout);
        nl_table_free(&tb);
    }
    fflush(stdout);
    progress_ctx pc = {.quiet = c.json, .first_step = t.step};
    nl_progress_begin(&pc.bar, "train", c.o.steps - t.step);
    nl_train_catch_stop_signals(1);
    c.o.stop = &nl_train_stop_signal;
    nl_status rc = nl_trainer_run(&t, &c.o, &data, on_step, &pc);
    nl_train_catch_stop_signals(0);
    nl_progress_end(&pc.bar);
    if (!rc && t.stopped && !c.json)
        printf("stopped by %s after step %lld of %lld%s%s\n", t.stopped == SIGINT ? "SIGINT" : "SIGTERM",
               (long long)t.step, (long long)c.o.steps,
               c.o.out ? "; resume with --resume " : " (no --out: nothing saved)", c.o.out ? c.o.out : "");
    int exit_code = NL_EXIT_OK;
    if (rc) exit_code = nl_cli_fail("train");
    if (c.fp8 && nl_fp8_linear_status(&fp8)) fprintf(stderr, "nanolm: train: %s\n", fp8.error);
    if (c.qat_name && nl_qat_status(&qat)) fprintf(stderr, "nanolm: train: %s\n", qat.error);
    if (!rc && c.qat_name) { /* fake-quantized loss after QAT, then the fp32 master weights alone */
        rc = nl_eval_loss(&t.model, &data, NL_DATA_VAL, c.o.batch, c.o.seq, c.o.eval_windows, &qat_end, NULL);
        nl_qat_remove(&qat);
        if (!rc)
            rc = nl_eval_loss(&t.model, &data, NL_DATA_VAL, c.o.batch, c.o.seq, c.o.eval_windows, &qat_fp32_end, NULL);
        if (rc) exit_code = nl_cli_fail("train: --qat");
    }
    /* logs cover what ran, also after a failure */
    if (c.log_csv && t.n_log && nl_train_log_write_csv(&t, c.log_csv)) exit_code = nl_cli_fail("train: --log");
    if (c.svg && t.n_log && write_svg(c.svg, &t)) exit_code = nl_cli_fail("train: --svg");
    if (!rc) {
        double qat_loss[4] = {qat_fp32_start, qat_rtn_start, qat_end, qat_fp32_end};
        print_result(&c, &t, &fp8, qat_loss);
    }
    nl_qat_remove(&qat);
    nl_fp8_linear_remove(&fp8);
    nl_trainer_free(&t);
    nl_data_free(&data);
    return exit_code;
}
